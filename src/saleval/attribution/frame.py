"""Table-level attribution: a frame of texts in, the PREDICTIONS and ATTRIBUTIONS tables out.

Batches run either directly on the model's device or — when a ``trainer`` config is
given — through Lightning's ``predict`` loop, so ``trainer.accelerator``/``devices``
place the model (GPU when present) exactly as in training. Lightning's loop runs
with ``inference_mode=False`` because gradient methods need autograd.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import lightning as L
import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from saleval.attribution.base import AttributionError, Attributor, build_method, method_name
from saleval.inference import predict_proba
from saleval.models import label_names_of
from saleval.words import Segmentation, segment

TARGETS = ("predicted", "gold")


class _BatchModule(L.LightningModule):
    """``predict_step`` = ``fn(batch of example indices)``; holds the model so Lightning
    moves it to the trainer's device."""

    def __init__(self, model: PreTrainedModel, fn: Callable[[list[int]], list[Any]]) -> None:
        super().__init__()
        self.model = model
        self.fn = fn

    def predict_step(self, batch: list[int], batch_idx: int) -> list[Any]:
        with torch.enable_grad():
            return self.fn(batch)


def make_trainer(trainer_cfg: Mapping[str, Any], progress: bool = False) -> L.Trainer:
    """A predict-only Trainer on one device from a ``conf/trainer`` mapping.

    Attribution runs at full precision (``32-true``) whatever the training precision:
    bf16 is a per-method option for forward-only methods. One device: a multirun
    over methods is the way to use several.
    """
    devices = trainer_cfg.get("devices", "auto")
    if str(devices) in ("auto", "-1"):
        devices = 1
    many = len(devices) > 1 if isinstance(devices, Sequence) else int(devices) > 1
    if many:
        raise AttributionError(
            f"trainer.devices={devices}: attribution runs on one device; sweep methods "
            "over devices with a multirun (-m method=...) instead"
        )
    return L.Trainer(
        accelerator=trainer_cfg.get("accelerator", "auto"),
        devices=devices,
        precision="32-true",
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=progress,
        inference_mode=False,
    )


def _run_batches(
    model: PreTrainedModel,
    fn: Callable[[list[int]], list[Any]],
    order: Sequence[int],
    batch_size: int,
    trainer: L.Trainer | None,
    progress: bool,
    desc: str,
) -> list[Any]:
    """``fn`` over ``order`` in batches (through ``trainer.predict`` when given);
    results back in index order."""
    batches = [list(order[i : i + batch_size]) for i in range(0, len(order), batch_size)]
    if trainer is not None:
        loader = torch.utils.data.DataLoader(
            batches, batch_size=None, shuffle=False, collate_fn=_identity
        )
        outputs = trainer.predict(_BatchModule(model, fn), dataloaders=loader)
        assert outputs is not None
    else:
        outputs = [fn(b) for b in tqdm(batches, desc=desc, disable=not progress, leave=False)]
    results: list[Any] = [None] * len(order)
    for b, out in zip(batches, outputs):
        for i, r in zip(b, out):  # type: ignore[arg-type]
            results[i] = r
    return results


def _identity(x: Any) -> Any:
    return x


def _check_frame(df: pd.DataFrame) -> None:
    missing = [c for c in ("sample_id", "text", "label") if c not in df.columns]
    if missing:
        raise AttributionError(f"explain_frame: input lacks column(s) {missing}")
    dup = df["sample_id"].astype(str).duplicated()
    if dup.any():
        raise AttributionError(
            f"explain_frame: duplicate sample_id {df['sample_id'][dup].iloc[0]!r} "
            f"(row {int(np.flatnonzero(dup.to_numpy())[0])})"
        )


def explain_frame(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    df: pd.DataFrame,
    methods: Mapping[str, Attributor | str | Mapping[str, Any] | None],
    target: str = "predicted",
    max_length: int = 256,
    batch_size: int = 64,
    trainer: Mapping[str, Any] | L.Trainer | None = None,
    progress: bool = False,
    timings: dict[str, dict[str, float]] | None = None,
    diagnostics: dict[str, dict[str, list[float]]] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Predictions and word attributions of every method for ``df(sample_id, text, label)``.

    ``methods``: name → method config (``conf/method`` entry, registry name or built
    attributor; ``None`` disables that entry). ``target``: ``predicted`` (default) or
    ``gold``. ``batch_size``: examples per prediction batch (methods batch by their own
    ``batch_size``). ``trainer``: a ``conf/trainer`` mapping (or a Trainer built with
    ``inference_mode=False``) to run through Lightning's predict loop, or ``None`` to run
    on the model's current device. ``timings`` /
    ``diagnostics`` (optional dicts) receive per-method wall time and examples/s, and
    per-example diagnostics such as IG convergence deltas.

    Returns ``(attributions, predictions)`` matching ``tables.ATTRIBUTIONS`` (plus
    ``target``) and ``tables.PREDICTIONS`` (``prob_<label name>``, ``n_words``, ``truncated``).
    """
    if target not in TARGETS:
        raise AttributionError(f"target must be one of {TARGETS}, got {target!r}")
    _check_frame(df)
    sample_ids = df["sample_id"].astype(str).tolist()
    texts = df["text"].astype(str).tolist()
    labels = df["label"].astype(int).tolist()
    label_names = label_names_of(model)
    segs: list[Segmentation] = [
        segment(t, tokenizer, max_length)
        for t in tqdm(texts, desc="segment", disable=not progress, leave=False)
    ]
    order = [int(i) for i in np.argsort([s.n_tokens for s in segs], kind="stable")]
    model.eval()
    runner = (
        trainer
        if isinstance(trainer, L.Trainer) or trainer is None
        else make_trainer(trainer, progress)
    )

    def _predict(idx: list[int]) -> list[np.ndarray]:
        with torch.no_grad():
            p = predict_proba(
                model,
                [segs[i].input_ids for i in idx],
                pad_token_id=int(tokenizer.pad_token_id or 0),
            )
        return list(p)

    probs = np.vstack(_run_batches(model, _predict, order, batch_size, runner, progress, "predict"))
    preds = probs.argmax(1)
    predictions = pd.DataFrame(
        {
            "sample_id": sample_ids,
            "text": texts,
            "label": labels,
            "pred": preds.astype(np.int64),
            **{f"prob_{name}": probs[:, c] for c, name in enumerate(label_names)},
            "n_words": [s.n_words for s in segs],
            "truncated": [s.truncated for s in segs],
        }
    )
    targets = [int(x) for x in (preds if target == "predicted" else labels)]

    frames: list[pd.DataFrame] = []
    seen: dict[str, str] = {}
    for key, cfg in methods.items():
        if cfg is None:
            continue
        name = method_name(key, cfg)
        if name in seen:
            raise AttributionError(
                f"methods {seen[name]!r} and {key!r} share the name {name!r}; give one a "
                "distinct `name:`"
            )
        seen[name] = key
        attributor = build_method(cfg, key)

        def _attribute(idx: list[int], a: Attributor = attributor) -> list[np.ndarray]:
            return a.attribute(model, tokenizer, [segs[i] for i in idx], [targets[i] for i in idx])

        t0 = time.perf_counter()
        scores = _run_batches(
            model, _attribute, order, attributor.batch_size, runner, progress, name
        )
        seconds = time.perf_counter() - t0
        if timings is not None:
            timings[name] = {"seconds": seconds, "examples_per_s": len(segs) / max(seconds, 1e-9)}
        if diagnostics is not None and attributor.diagnostics:
            diagnostics[name] = attributor.diagnostics
        frames.append(_long_table(name, sample_ids, segs, scores, targets))
    attributions = (
        pd.concat(frames, ignore_index=True) if frames else _long_table("", [], [], [], [])
    )
    return attributions, predictions


def _long_table(
    name: str,
    sample_ids: Sequence[str],
    segs: Sequence[Segmentation],
    scores: Sequence[np.ndarray],
    targets: Sequence[int],
) -> pd.DataFrame:
    """One row per kept word: the layout of ``tables.ATTRIBUTIONS`` (SPEC §3.3)."""
    n = [s.n_words for s in segs]
    return pd.DataFrame(
        {
            "sample_id": np.repeat(np.asarray(sample_ids, dtype=object), n),
            "method": name,
            "word_index": np.concatenate([np.arange(k) for k in n]) if n else [],
            "word": [w for s in segs for w in s.words],
            "char_start": [a for s in segs for a, _ in s.spans],
            "char_end": [b for s in segs for _, b in s.spans],
            "score": np.concatenate(scores) if n else [],
            "target": np.repeat(np.asarray(targets, dtype=np.int64), n),
        }
    ).astype({"word_index": "int64", "char_start": "int64", "char_end": "int64"})
