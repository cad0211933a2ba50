"""The shortcut experiment, step by step (docs/shortcut.md): data → two models → verification
→ saliency sweep. The ``saleval-shortcut`` stage strings these together; each step is
a plain function so tests can run or replace one at a time.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from saleval.config.shortcut import RankUnit
from saleval.metrics.shortcut import (
    mean_rank,
    mean_rank_interval,
    precision_at_k,
    precision_interval,
)
from saleval.modeling.data import load_dataset
from saleval.modeling.interface import interface
from saleval.modeling.models import (
    MODEL_DIR,
    build_model,
    load_tokenizer,
    load_trained,
)
from saleval.modeling.padding import prepare_for_training
from saleval.modeling.training import TextDataModule, fit
from saleval.pipeline.records.fingerprints import fingerprint
from saleval.pipeline.records.jsonfiles import write_json
from saleval.progress import bar
from saleval.shortcut.generate import ShortcutData, build_shortcut_data
from saleval.shortcut.rules import ShortcutRule, extend_vocabulary, prepare_source, rule_from_config
from saleval.shortcut.verify import VerificationReport, accuracy, chance_accuracy, verify
from saleval.words import Segmentation, piece_segment, rank_words, segment

log = logging.getLogger(__name__)

DATA_DIR = "data"
MODEL_NAMES = ("original", "mixed")


# ---------------------------------------------------------------------------------
# 1. data
# ---------------------------------------------------------------------------------


def prepare_data(cfg: DictConfig) -> tuple[ShortcutData, PreTrainedTokenizerFast]:
    """Source dataset (binary, token-free) → mixed train/validation and synthetic test."""
    rule = rule_from_config(cfg.shortcut)
    raw = load_dataset(cfg.dataset)
    label_map = cfg.label_map
    source, dropped = prepare_source(raw, rule, None if label_map is None else list(label_map))
    tokenizer = load_tokenizer(cfg.model)
    extend_vocabulary(tokenizer, rule)
    data = build_shortcut_data(
        source,
        rule,
        tokenizer,
        seed=int(cfg.seed),
        max_length=int(cfg.model.max_length),
        synthetic_fraction=float(cfg.shortcut.synthetic_fraction),
        distractor_fraction=float(cfg.shortcut.distractor_fraction),
        synthetic_test_size=int(cfg.shortcut.synthetic_test_size),
    )
    data.info.update(dropped)
    data.info["data_source"] = raw.source
    return data, tokenizer


def write_data(data: ShortcutData, run_dir: Path) -> list[Path]:
    """The generated sets as Parquet under ``data/`` (ground truth included)."""
    out = Path(run_dir, DATA_DIR)
    out.mkdir(parents=True, exist_ok=True)
    files = {
        "mixed_train.parquet": data.mixed["train"],
        "mixed_validation.parquet": data.mixed["validation"],
        "synthetic_test.parquet": data.synthetic_test,
    }
    paths = []
    for name, df in files.items():
        df.to_parquet(out / name, index=False)
        paths.append(out / name)
    return paths


# ---------------------------------------------------------------------------------
# 2. two models
# ---------------------------------------------------------------------------------


def train_classifier(
    cfg: DictConfig,
    rule: ShortcutRule,
    tokenizer: PreTrainedTokenizerFast,
    label_names: Sequence[str],
    splits: Mapping[str, pd.DataFrame],
    workdir: Path,
) -> tuple[PreTrainedModel, dict[str, float]]:
    """One classifier with the shortcut tokens in its vocabulary, fitted on ``splits``
    and saved to ``workdir/model``. Both models go through here: same architecture,
    same seed, same trainer settings; only the data differ."""
    L.seed_everything(int(cfg.seed), workers=True)
    model = build_model(cfg.model, label_names, seed=int(cfg.seed))
    extend_vocabulary(tokenizer, rule, model)
    prepare_for_training(model, tokenizer)
    dm = TextDataModule.from_config(
        {s: df[["sample_id", "text", "label"]] for s, df in splits.items()},
        tokenizer,
        int(cfg.model.max_length),
        cfg.trainer.loader,
        interface=interface(model, tokenizer),
    )
    t0 = time.perf_counter()
    metrics = fit(model, dm, cfg.trainer, workdir)
    metrics["seconds"] = time.perf_counter() - t0
    model.save_pretrained(workdir / MODEL_DIR)
    tokenizer.save_pretrained(workdir / MODEL_DIR)
    write_json(workdir / "metrics.json", metrics)
    model.eval()
    return model, metrics


def original_cache_key(cfg: DictConfig, rule: ShortcutRule) -> str:
    """What determines the original model: the same for st, tic and op (no planted
    tokens in its data, all three tokens in its vocabulary), so a sweep trains it once."""
    resolved = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    assert isinstance(resolved, dict)
    dataset = {k: v for k, v in resolved["dataset"].items() if k != "data_root"}
    what = {
        "dataset": dataset,
        "label_map": resolved.get("label_map"),
        "model": resolved["model"],
        "trainer": {k: v for k, v in resolved["trainer"].items() if "progress" not in k},
        "seed": int(cfg.seed),
        "vocabulary": rule.vocabulary,
    }
    return fingerprint(what, {})


def train_pair(
    cfg: DictConfig,
    data: ShortcutData,
    tokenizer: PreTrainedTokenizerFast,
    run_dir: Path,
    child_run: Callable[[str, Mapping[str, str]], AbstractContextManager[Any]],
) -> tuple[dict[str, PreTrainedModel], dict[str, dict[str, Any]]]:
    """The original and the mixed model, saved under ``original/`` and ``mixed/``, each
    trained inside a child run of the stage's run (``child_run(name, tags)``: the stage's
    :meth:`~saleval.pipeline.tracker.stage_tracking.StageTracking.child_run`), so that the two
    models' per-epoch curves do not interleave under the same metric names.

    With ``original_cache`` set, an original model trained earlier under the same
    :func:`original_cache_key` is copied instead of retrained (logged as ``reused``).
    """
    models: dict[str, PreTrainedModel] = {}
    metrics: dict[str, dict[str, Any]] = {}
    cache_root = cfg.original_cache
    cached = (
        Path(str(cache_root), f"original-{original_cache_key(cfg, data.rule)}")
        if cache_root
        else None
    )
    orig_dir = run_dir / "original"
    if cached is not None and (cached / MODEL_DIR / "config.json").is_file():
        log.info("original model: reusing %s", cached)
        shutil.copytree(cached, orig_dir, dirs_exist_ok=True)
        models["original"], _ = load_trained(orig_dir, attn_implementation=None)
        metrics["original"] = {
            **json.loads((orig_dir / "metrics.json").read_text()),
            "reused_from": str(cached),
        }
    else:
        with child_run("original", {"shortcut_model": "original"}):
            models["original"], metrics["original"] = train_classifier(
                cfg, data.rule, tokenizer, data.label_names, data.original, orig_dir
            )
        if cached is not None:
            tmp = cached.with_name(cached.name + ".tmp")
            shutil.copytree(orig_dir, tmp, dirs_exist_ok=True)
            if cached.exists():  # a sibling job got there first
                shutil.rmtree(tmp)
            else:
                tmp.replace(cached)
    with child_run("mixed", {"shortcut_model": "mixed"}):
        models["mixed"], metrics["mixed"] = train_classifier(
            cfg, data.rule, tokenizer, data.label_names, data.mixed, run_dir / "mixed"
        )
    return models, metrics


# ---------------------------------------------------------------------------------
# 3. verification
# ---------------------------------------------------------------------------------


def verify_models(
    models: Mapping[str, PreTrainedModel],
    tokenizer: PreTrainedTokenizerFast,
    data: ShortcutData,
    thresholds: Mapping[str, float],
    max_length: int,
) -> tuple[VerificationReport, np.ndarray]:
    """Accuracies of both models on the synthetic and the original test set, checked.

    Returns the report and the mixed model's predictions on the synthetic test set.
    """
    acc: dict[str, float] = {}
    preds: dict[str, np.ndarray] = {}
    for name in MODEL_NAMES:
        acc[f"{name}_synthetic"], preds[name] = accuracy(
            models[name], tokenizer, data.synthetic_test, max_length
        )
        acc[f"{name}_test"], _ = accuracy(
            models[name], tokenizer, data.original["test"], max_length
        )
    report = verify(
        **acc,
        chance=chance_accuracy(data.synthetic_test["label"]),
        n_synthetic=len(data.synthetic_test),
        n_test=len(data.original["test"]),
        thresholds=thresholds,
    )
    return report, preds["mixed"]


# ---------------------------------------------------------------------------------
# 4. saliency sweep
# ---------------------------------------------------------------------------------


def explain_pool(synthetic_test: pd.DataFrame, n: int | None, seed: int) -> pd.DataFrame:
    """``n`` examples of the synthetic test set, seeded, labels alternating 0, 1, 0, 1 …

    Every prefix is (nearly) balanced, so a configuration run on fewer examples
    (``explain.budget``) sees the first examples of the same pool as the others.
    """
    rng = np.random.default_rng(seed)
    by_label = [
        rng.permutation(synthetic_test.index[synthetic_test["label"] == c].to_numpy())
        for c in (0, 1)
    ]
    order = [int(i) for pair in zip(*by_label) for i in pair]
    longer = max(by_label, key=len)
    order += [int(i) for i in longer[min(len(b) for b in by_label) :]]
    if n is not None:
        order = order[: int(n)]
    return synthetic_test.loc[order].reset_index(drop=True)


def select_methods(
    methods: Mapping[str, Any],
    n_samples: int | None,
    budget: Mapping[str, int] | Sequence[Sequence[Any]] | None = None,
    skip: Sequence[str] = (),
) -> dict[str, tuple[Any, int | None]]:
    """Method configurations to run and how many examples each explains.

    ``skip`` holds glob patterns over configuration names (``ig_*_1000_*``);
    ``budget`` is a list of ``[pattern, n]`` pairs (or a mapping): the first matching
    pattern caps that configuration's examples, so the expensive variants can run on
    fewer examples on a CPU. Every result row records its own ``n``.
    """
    if budget is None:
        caps: list[tuple[str, int]] = []
    elif isinstance(budget, Mapping):
        caps = [(str(k), int(v)) for k, v in budget.items()]
    else:
        caps = []
        for entry in budget:
            if len(entry) != 2:
                raise ValueError(f"explain.budget entries are [pattern, n] pairs, got {entry}")
            caps.append((str(entry[0]), int(entry[1])))
    out: dict[str, tuple[Any, int | None]] = {}
    for key, mcfg in methods.items():
        if any(fnmatch.fnmatchcase(key, pat) for pat in skip):
            log.info("method %s skipped (explain.skip)", key)
            continue
        n = n_samples
        for pat, cap in caps:
            if fnmatch.fnmatchcase(key, pat):
                n = cap if n is None else min(cap, int(n))
                break
        out[key] = (mcfg, n)
    if not out:
        raise ValueError(f"no method configuration left after explain.skip={list(skip)}")
    return out


def piece_truth(seg: Segmentation, gt_tokens: Sequence[int]) -> list[int]:
    """Token positions in the input ids (``gt_tokens``, ``[CLS]`` = 0) → piece indices of
    a :func:`piece_segment`."""
    out = []
    for t in gt_tokens:
        if not 0 <= int(t) < seg.n_tokens or seg.token_word[int(t)] < 0:
            raise ValueError(
                f"shortcut token position {t} is not a word piece of {seg.text[:60]!r} "
                f"({seg.n_tokens} tokens; was the data made with another tokenizer/max_length?)"
            )
        out.append(seg.token_word[int(t)])
    return out


def segment_units(
    examples: pd.DataFrame, tokenizer: PreTrainedTokenizerFast, max_length: int, unit: str
) -> tuple[list[Segmentation], list[list[int]]]:
    """The examples' segmentations and ground truth in ``unit`` (:class:`RankUnit`):
    words and ``gt_words``, or pieces and ``gt_tokens`` mapped onto them."""
    if RankUnit(unit) is RankUnit.piece:
        segs = [piece_segment(t, tokenizer, max_length) for t in examples["text"]]
        gts = [piece_truth(s, g) for s, g in zip(segs, examples["gt_tokens"])]
    else:
        segs = [segment(t, tokenizer, max_length) for t in examples["text"]]
        gts = [list(map(int, g)) for g in examples["gt_words"]]
    for i, (seg, gt) in enumerate(zip(segs, gts)):
        if not gt or max(gt) >= seg.n_words:
            raise ValueError(
                f"example {examples['sample_id'].iloc[i]}: ground truth {gt} outside its "
                f"{seg.n_words} {unit}s (was the data made with another tokenizer/max_length?)"
            )
    return segs, gts


def score_method(
    scores: Sequence[np.ndarray], ground_truth: Sequence[Sequence[int]]
) -> tuple[list[float], list[float]]:
    """Per-example precision@k and rank of the ground truth for one method's scores.

    Unit-agnostic: ``scores`` has one value per unit (word or piece, see
    :func:`segment_units`) and ``ground_truth`` indexes the same units.
    """
    prec, ranks = [], []
    for s, gt in zip(scores, ground_truth):
        r = rank_words(s, ties="against", against=gt)
        prec.append(precision_at_k([r], [gt]))
        ranks.append(mean_rank([r], [gt]))
    return prec, ranks


def saliency_sweep(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    examples: pd.DataFrame,
    targets: Sequence[int],
    methods: Mapping[str, Any],
    max_length: int,
    progress: bool = True,
    unit: str = RankUnit.word,
    level: float = 0.95,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Precision@k and mean rank of every method configuration on ``examples``.

    ``methods`` maps a configuration name to its config, or to ``(config, n)`` to
    explain only the first ``n`` examples (see :func:`select_methods`). ``unit``
    (:class:`RankUnit`) is what the methods score and the rankings order. Returns the
    summary (one row per configuration: method family, config name, unit, precision and
    mean_rank with their ``level`` intervals, n, k, seconds) and the per-example values.
    """
    from saleval.attribution import attribute_words, build_method, method_name

    segs, gts = segment_units(examples, tokenizer, max_length, unit)
    summary, per_example = [], []
    for key, entry in bar(list(methods.items()), desc="shortcut sweep", disable=not progress):
        mcfg, n = entry if isinstance(entry, tuple) else (entry, None)
        n = len(segs) if n is None else min(int(n), len(segs))
        attributor = build_method(mcfg, key)
        config = method_name(key, mcfg)
        t0 = time.perf_counter()
        scores = attribute_words(model, tokenizer, segs[:n], list(targets)[:n], attributor)
        seconds = time.perf_counter() - t0
        prec, ranks = score_method(scores, gts[:n])
        family = type(attributor).registry_name
        k = len(gts[0])
        p_lo, p_hi = precision_interval(prec, k, level)
        r_lo, r_hi = mean_rank_interval(ranks, level, best=k)
        summary.append(
            {
                "method": family,
                "config": config,
                "unit": str(RankUnit(unit)),
                "precision": float(np.mean(prec)),
                "precision_ci_low": p_lo,
                "precision_ci_high": p_hi,
                "mean_rank": float(np.mean(ranks)),
                "mean_rank_ci_low": r_lo,
                "mean_rank_ci_high": r_hi,
                "n": n,
                "k": k,
                "seconds": seconds,
            }
        )
        per_example.append(
            pd.DataFrame(
                {
                    "sample_id": examples["sample_id"].to_numpy()[:n],
                    "method": family,
                    "config": config,
                    "target": np.asarray(targets, dtype=np.int64)[:n],
                    "unit": str(RankUnit(unit)),
                    "n_units": [s.n_words for s in segs[:n]],
                    "precision": prec,
                    "rank": ranks,
                }
            )
        )
        log.info(
            "%s: P@k %.3f, mean rank %.2f (n=%d, %.1fs)",
            config,
            summary[-1]["precision"],
            summary[-1]["mean_rank"],
            n,
            seconds,
        )
    return pd.DataFrame(summary), pd.concat(per_example, ignore_index=True)
