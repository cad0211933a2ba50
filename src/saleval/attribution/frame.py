"""Table-level attribution: a frame of texts in, the PREDICTIONS and ATTRIBUTIONS tables out.

The work (:class:`_Job`) runs in phases: the predictions, then each method. A phase
sorts the examples by length and cuts them into batches (``batch_size`` for the
predictions, each method's own ``batch_size`` after that); on ``W`` devices batch ``b``
belongs to rank ``b mod W`` (interleaved, so every rank gets short and long texts).
After each phase the ranks swap their batches (``torch.distributed.all_gather_object``:
no shared filesystem needed) and put them back in batch order. So every rank holds what
one device computes, from the same batches and hence the same numbers (up to the
floating-point noise of another thread count); the predicted classes are known
everywhere before the methods run; and the tables have the same rows in the same order
on any number of devices. A failure on one rank is raised on every rank, so no rank is
left waiting in a collective.

With a ``trainer`` config for one process (:func:`saleval.modeling.devices.one_process`:
one device of one node, no ranks beside it) the job runs here, on the device
``trainer.accelerator`` names (:func:`saleval.modeling.devices.device_for`), as it does with
no config on the model's own device; a SIGTERM raises :class:`saleval.errors.Stopped` in
it. On several devices or nodes, or in ranks a launcher started, it runs inside a
predict-only Lightning Trainer (:mod:`saleval.attribution.distributed`, which says how the
processes start and the result comes back); only then is Lightning imported.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from saleval.attribution.base import AttributionError, Attributor, build_method, method_name
from saleval.config.model import DEFAULT_MAX_LENGTH
from saleval.errors import sigterm_raises
from saleval.modeling.devices import device_for, one_process
from saleval.modeling.inference import n_labels_of, predict_proba
from saleval.modeling.interface import check_padding
from saleval.modeling.models import label_names_of
from saleval.progress import bar
from saleval.vocab import PROBS, Target
from saleval.words import Segmentation, segment

if TYPE_CHECKING:
    import lightning as L

#: one phase's per-batch function: example indices -> (one output per example, diagnostics)
_BatchFn = Callable[[list[int]], tuple[list[Any], dict[str, list[float]]]]


def _all_gather(obj: Any, world: int) -> list[Any]:
    """``obj`` of every rank, in rank order (pickled: any picklable object)."""
    if world == 1:
        return [obj]
    out: list[Any] = [None] * world
    torch.distributed.all_gather_object(out, obj)
    return out


def _phase(
    fn: _BatchFn,
    order: Sequence[int],
    batch_size: int,
    rank: int,
    world: int,
    desc: str,
    progress: bool,
) -> tuple[list[Any], dict[str, list[float]], float]:
    """``fn`` over this rank's batches of ``order``; every rank's outputs in example order.

    Also returns the per-example diagnostics in batch order (as one device appends them)
    and the phase's wall time, which includes waiting for the slowest rank.
    """
    t0 = time.perf_counter()
    batches = [list(order[i : i + batch_size]) for i in range(0, len(order), batch_size)]
    done: list[tuple[int, list[Any], dict[str, list[float]]]] = []
    error: Exception | None = None
    try:
        for b in bar(
            range(rank, len(batches), world),
            desc=desc,
            disable=not progress or rank != 0,
            leave=False,
        ):
            out, diag = fn(batches[b])
            done.append((b, out, diag))
    except Exception as err:
        if world == 1:
            raise
        error = err
    shards = _all_gather(
        (done, None if error is None else f"{type(error).__name__}: {error}"), world
    )
    if error is not None:
        raise error
    failed = [(r, msg) for r, (_, msg) in enumerate(shards) if msg]
    if failed:
        raise AttributionError(f"{desc}: rank {failed[0][0]} failed: {failed[0][1]}")
    results: list[Any] = [None] * len(order)
    diagnostics: dict[str, list[float]] = {}
    for b, out, diag in sorted((x for part, _ in shards for x in part), key=lambda x: x[0]):
        for i, r in zip(batches[b], out):
            results[i] = r
        for key, vals in diag.items():
            diagnostics.setdefault(key, []).extend(vals)
    return results, diagnostics, time.perf_counter() - t0


def _targets(probs: np.ndarray, labels: Sequence[int], target: Target) -> list[int]:
    return [int(x) for x in (probs.argmax(1) if target is Target.prediction else labels)]


@dataclass
class _Job:
    """Everything one rank needs to explain its batches; picklable for spawned workers
    (:mod:`saleval.attribution.distributed` runs :meth:`run` on each rank)."""

    tokenizer: PreTrainedTokenizerFast
    segs: list[Segmentation]
    labels: list[int]
    target: Target
    batch_size: int
    methods: list[tuple[str, Attributor]]
    progress: bool = False

    def run(self, model: PreTrainedModel, rank: int = 0, world: int = 1) -> dict[str, Any]:
        """Probabilities, then every method's scores (full, in example order) on every rank,
        with each method's wall time and per-example diagnostics."""
        order = [int(i) for i in np.argsort([s.n_tokens for s in self.segs], kind="stable")]

        def _predict(idx: list[int]) -> tuple[list[Any], dict[str, list[float]]]:
            seqs = [self.segs[i].input_ids for i in idx]
            p = predict_proba(model, seqs, tokenizer=self.tokenizer)
            return list(p), {}

        rows, _, _ = _phase(_predict, order, self.batch_size, rank, world, "predict", self.progress)
        n_labels = n_labels_of(model)
        probs = np.vstack(rows) if rows else np.zeros((0, n_labels))
        targets = _targets(probs, self.labels, self.target)
        scores: dict[str, list[np.ndarray]] = {}
        seconds: dict[str, float] = {}
        diagnostics: dict[str, dict[str, list[float]]] = {}
        # one line per method in a job's log; at a terminal a bar over the batches' bars
        for name, a in bar(self.methods, "methods", disable=not self.progress or rank != 0):

            def _attribute(
                idx: list[int], a: Attributor = a
            ) -> tuple[list[Any], dict[str, list[float]]]:
                before = {k: len(v) for k, v in a.diagnostics.items()}
                out = a.attribute(
                    model, self.tokenizer, [self.segs[i] for i in idx], [targets[i] for i in idx]
                )
                return out, {k: v[before.get(k, 0) :] for k, v in a.diagnostics.items()}

            scores[name], diagnostics[name], seconds[name] = _phase(
                _attribute, order, a.batch_size, rank, world, name, self.progress
            )
        return {"probs": probs, "scores": scores, "seconds": seconds, "diagnostics": diagnostics}


def _run(
    job: _Job, model: PreTrainedModel, trainer: Mapping[str, Any] | L.Trainer | None
) -> dict[str, Any]:
    """The job's result, computed where ``trainer`` says (module docstring): here, on the
    model's device (None) or on its ``accelerator`` (one process), else in Lightning's ranks."""
    if trainer is None:
        return job.run(model)
    if isinstance(trainer, Mapping) and one_process(trainer):
        torch.nn.Module.to(model, device_for(trainer.get("accelerator", "auto")))
        # a scheduler's or a user's SIGTERM ends the job (a stage's run: KILLED)
        with sigterm_raises():
            return job.run(model)
    from saleval.attribution.distributed import predict  # Lightning's import: only here

    return predict(trainer, model, job.run)


def _check_frame(df: pd.DataFrame, target: Target) -> None:
    """The columns ``explain_frame`` needs: ``label`` only when the gold class is explained."""
    need = ["sample_id", "text"] + (["label"] if target is Target.gold else [])
    missing = [c for c in need if c not in df.columns]
    if missing:
        why = " (target=gold explains each text's gold label)" if "label" in missing else ""
        raise AttributionError(f"explain_frame: input lacks column(s) {missing}{why}")
    if target is Target.gold and df["label"].isna().any():
        row = int(np.flatnonzero(df["label"].isna().to_numpy())[0])
        raise AttributionError(
            f"explain_frame: row {row} (sample_id {df['sample_id'].iloc[row]!r}) has no label; "
            "target=gold needs every text's gold label (or use target=prediction)"
        )
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
    target: Target | str = Target.prediction,
    max_length: int = DEFAULT_MAX_LENGTH,
    batch_size: int = 64,
    trainer: Mapping[str, Any] | L.Trainer | None = None,
    progress: bool = False,
    timings: dict[str, dict[str, float]] | None = None,
    diagnostics: dict[str, dict[str, list[float]]] | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Predictions and word attributions of every method for ``df(sample_id, text[, label])``.

    ``label`` (the gold class index) is needed only for ``target=gold``; without it the
    predictions table has no ``label`` column.

    ``methods``: name → method config (``conf/method`` entry, registry name or built
    attributor; ``None`` disables that entry). ``target``
    (:class:`saleval.vocab.Target`): ``prediction`` (default) or ``gold``. ``batch_size``: examples per prediction batch (methods batch by their own
    ``batch_size``). ``trainer``: a ``conf/trainer`` mapping (one process: here, on the
    device its ``accelerator`` names; ``devices`` > 1 shards the batches over DDP ranks, see
    :func:`saleval.attribution.distributed.make_trainer`), or a Trainer built with
    ``inference_mode=False`` and used as given, to run through Lightning's predict loop;
    ``None`` runs in this process on the model's current device. ``timings`` /
    ``diagnostics`` (optional dicts) receive per-method wall time and examples/s, and
    per-example diagnostics such as IG convergence deltas.

    Returns ``(attributions, predictions)`` matching ``tables.ATTRIBUTIONS`` (plus
    ``target``) and ``tables.PREDICTIONS`` (``prob_<label name>``, ``n_words``, ``truncated``),
    the same on any number of devices.
    """
    try:
        target = Target(target)
    except ValueError:
        raise AttributionError(
            f"target must be one of {[t.value for t in Target]}, got {target!r}"
        ) from None
    _check_frame(df, target)
    sample_ids = df["sample_id"].astype(str).tolist()
    texts = df["text"].astype(str).tolist()
    # gold labels: every one for target=gold (checked); any (missing ones <NA>) otherwise
    gold = df["label"].astype("Int64") if "label" in df.columns else None
    labels = [] if gold is None or gold.isna().any() else gold.astype(int).tolist()
    label_column: dict[str, Any] = {}
    if gold is not None:
        label_column["label"] = gold.array if gold.isna().any() else np.asarray(labels, np.int64)
    label_names = label_names_of(model)
    segs: list[Segmentation] = [
        segment(t, tokenizer, max_length)
        for t in bar(texts, desc="segment", disable=not progress, leave=False)
    ]
    attributors = _attributors(methods)
    model.eval()
    # before any work: a padded batch must give each text its own logits, and every method's
    # settings must suit this model (a removal token it lacks, a query it has no row for);
    # one line here rather than a failure after the earlier methods ran
    check_padding(model, tokenizer, [s.input_ids for s in segs])
    for _, a in attributors:
        a.prepare(model, tokenizer)
    job = _Job(tokenizer, segs, labels, target, int(batch_size), attributors, progress)
    result = _run(job, model, trainer)
    probs: np.ndarray = result["probs"]
    predictions = pd.DataFrame(
        {
            "sample_id": sample_ids,
            "text": texts,
            **label_column,
            "pred": probs.argmax(1).astype(np.int64),
            **dict(zip(PROBS.columns(label_names), probs.T)),
            "n_words": [s.n_words for s in segs],
            "truncated": [s.truncated for s in segs],
        }
    )
    targets = _targets(probs, labels, target)
    frames = [
        _long_table(name, sample_ids, segs, result["scores"][name], targets)
        for name, _ in attributors
    ]
    for name, _ in attributors:
        seconds = float(result["seconds"][name])
        if timings is not None:
            timings[name] = {"seconds": seconds, "examples_per_s": len(segs) / max(seconds, 1e-9)}
        if diagnostics is not None and result["diagnostics"][name]:
            diagnostics[name] = result["diagnostics"][name]
    attributions = (
        pd.concat(frames, ignore_index=True) if frames else _long_table("", [], [], [], [])
    )
    return attributions, predictions


def _attributors(
    methods: Mapping[str, Attributor | str | Mapping[str, Any] | None],
) -> list[tuple[str, Attributor]]:
    """The methods built, by their names; two entries may not share a name (their rows
    would mix in every table)."""
    attributors: list[tuple[str, Attributor]] = []
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
        attributors.append((name, build_method(cfg, key)))
    return attributors


def _long_table(
    name: str,
    sample_ids: Sequence[str],
    segs: Sequence[Segmentation],
    scores: Sequence[np.ndarray],
    targets: Sequence[int],
) -> pd.DataFrame:
    """One row per kept word: the layout of ``tables.ATTRIBUTIONS`` (docs/methods.md#batching)."""
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
