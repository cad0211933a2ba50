"""What the metrics tests share: fake parent runs (no training, no explain stage), the
tiny model, and a hand-built classifier whose metrics have closed forms.

The run dirs look like what saleval-train / saleval-explain / saleval-import /
saleval-score write: config.yaml, run.json and the declared tables.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import torch
from omegaconf import OmegaConf

from saleval.metrics.config import MetricsConfig, SwitchingConfig
from saleval.modeling.models import build_model, load_tokenizer
from saleval.pipeline import tables
from saleval.vocab import PROBS
from saleval.words import segment
from tests.conftest import tiny_model_cfg

TINY_CFG = tiny_model_cfg()


def load_tok():
    return load_tokenizer(TINY_CFG)


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


# --- a hand-built classifier (tests/test_faithfulness.py's module docstring) ---------------
# Its logits count token ids: every ``good`` adds 1 to class 1, every ``bad`` adds 1.5 to
# class 0, and ``[CLS]`` adds a bias of 0.25 to class 1, so with g goods and b bads left
# p(1|x) = σ(0.25 + g − 1.5 b) and every metric has a closed form.


class CountModel(torch.nn.Module):
    """Logits = sum over (unpadded) tokens of a per-id weight row: a bag-of-ids classifier."""

    def __init__(self, tok, weights: dict[str, tuple[float, float]]) -> None:
        super().__init__()
        w = torch.zeros(tok.vocab_size, 2)
        for token, row in weights.items():
            w[tok.convert_tokens_to_ids(token)] = torch.tensor(row)
        self.w = torch.nn.Parameter(w, requires_grad=False)
        self.config = SimpleNamespace(num_labels=2)
        self.calls = 0

    def forward(self, input_ids, attention_mask, **_):
        self.calls += 1
        logits = (self.w[input_ids] * attention_mask[..., None]).sum(dim=1)
        return SimpleNamespace(logits=logits)


WEIGHTS = {"good": (0.0, 1.0), "bad": (1.5, 0.0), "[CLS]": (0.0, 0.25)}


def sig(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def p1(goods: int, bads: int) -> float:
    """Hand formula of the model: p(class 1) with this many goods and bads left."""
    return sig(0.25 + goods - 1.5 * bads)


TEXT = "good bad good, unbelievably plot"  # words: good bad good unbelievably plot
SCORES = {
    # good0, bad, good2, unbelievably, plot
    "oracle": [3.0, 0.0, 2.0, 1.0, 0.5],  # order: good0 good2 unbelievably plot bad
    "neutral_first": [3.0, 1.0, 2.0, 5.0, 4.0],  # unbelievably plot good0 good2 bad
    "bad_first": [1.0, 9.0, 2.0, 3.0, 4.0],  # bad plot unbelievably good2 good0
}
CFG = MetricsConfig(
    ks=[1, 2, 3],
    eraser_grid=[0.2, 0.5],
    aopc_k=3,
    log_odds_fraction=0.2,
    switching=SwitchingConfig(chunk=2),
)


#: three AG News texts for fake explain runs
AG_TEXTS = {
    "ag-1": "Stocks rally as oil prices fall; investors cheer (Reuters)",
    "ag-2": "Red Sox beat Yankees 5-3 in extra innings at Fenway Park",
    "ag-3": "NASA probe sends unbelievably sharp images of Saturn's rings",
}
