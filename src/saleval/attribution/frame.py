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

With a ``trainer`` config the job runs inside a predict-only Lightning Trainer, which
places the model on ``trainer.accelerator`` (GPU when present) and starts the processes
and their process group (gloo on CPU, NCCL on GPU). Its loader holds one item per rank,
so each rank's ``predict_step`` runs the job once, over its own batches. The loop runs
with ``inference_mode=False`` because gradient methods need autograd.

How the processes start matters inside a Hydra app. Lightning's plain ``ddp`` launcher
re-runs the command line for ranks > 0: the whole stage again, a ``-m`` sweep or a
``saleval-run`` pipeline from its start, or the pytest session. Attribution is
predict-only, so :func:`make_trainer` runs a ``ddp`` config as ``ddp_spawn``: the workers
run only this job and the calling process, the only one that writes tables and logs,
gets the result back. Lightning returns no predictions from spawned workers, so local
rank 0 leaves the result in a temporary file of the caller's. Where the processes exist
already (``torchrun``; ``srun`` with one task per device) each rank runs the stage, the
job joins the ranks as they are, and every rank gets the full result from the predict
loop; :class:`saleval.pipeline.stage.Stage` keeps ranks > 0 from writing or logging anything.
``ddp_fork`` / ``ddp_notebook`` (no pickling; CPU, or CUDA not yet initialised) are used
as given.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import lightning as L
import numpy as np
import pandas as pd
import torch
from lightning.pytorch.strategies import DDPStrategy

# Lightning's own launcher classes: the same checks its predict loop and DDP strategy make.
from lightning.pytorch.strategies.launchers import (
    _MultiProcessingLauncher,
    _SubprocessScriptLauncher,
)
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from saleval.attribution.base import AttributionError, Attributor, build_method, method_name
from saleval.config.model import DEFAULT_MAX_LENGTH
from saleval.errors import sigterm_raises
from saleval.modeling.devices import device_for
from saleval.modeling.inference import n_labels_of, predict_proba
from saleval.modeling.interface import check_padding
from saleval.modeling.models import label_names_of
from saleval.progress import bar
from saleval.vocab import PROBS, Target
from saleval.words import Segmentation, segment

#: one phase's per-batch function: example indices -> (one output per example, diagnostics)
_BatchFn = Callable[[list[int]], tuple[list[Any], dict[str, list[float]]]]


def make_trainer(trainer_cfg: Mapping[str, Any]) -> L.Trainer:
    """A predict-only Trainer for attribution from a ``conf/trainer`` mapping.

    Always full precision (``32-true``): bf16 is a per-method option for forward-only
    methods. ``devices: auto`` means one device (one GPU when there is one), so several
    devices are an explicit choice (``trainer=ddp``, ``trainer.devices=N``); they need a
    DDP strategy, and one that would re-run the command line is started by spawning
    instead (module docstring).
    """
    devices = trainer_cfg.get("devices", "auto")
    if str(devices) == "auto":
        devices = 1
    num_nodes = int(trainer_cfg.get("num_nodes") or 1)
    strategy = trainer_cfg.get("strategy") or "auto"
    accelerator = trainer_cfg.get("accelerator", "auto")
    device_for(accelerator)  # a GPU asked for where there is none: one line, before Lightning

    def build(strategy: Any) -> L.Trainer:
        return L.Trainer(
            accelerator=accelerator,
            devices=devices,
            num_nodes=num_nodes,
            strategy=strategy,
            precision="32-true",
            logger=False,
            enable_checkpointing=False,
            enable_model_summary=False,
            enable_progress_bar=False,  # one item per rank: the job shows its own bars
            inference_mode=False,
        )

    trainer = build(strategy)
    world = trainer.num_nodes * trainer.num_devices
    if world == 1:  # no process group for one process (`ddp` would start one here)
        return build("auto") if isinstance(trainer.strategy, DDPStrategy) else trainer
    if not isinstance(trainer.strategy, DDPStrategy):
        raise AttributionError(
            f"trainer.strategy={strategy!r} on {world} devices: attribution on several devices "
            "needs a DDP strategy (ddp, ddp_spawn, ddp_fork)"
        )
    env = trainer.strategy.cluster_environment
    external = env is not None and env.creates_processes_externally
    if isinstance(trainer.strategy.launcher, _SubprocessScriptLauncher) and not external:
        trainer = build("ddp_spawn")
    return trainer


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
    """Everything one rank needs to explain its batches; picklable for spawned workers."""

    tokenizer: PreTrainedTokenizerFast
    segs: list[Segmentation]
    labels: list[int]
    target: Target
    batch_size: int
    methods: list[tuple[str, Attributor]]
    progress: bool = False
    #: where local rank 0 of spawned workers leaves the result for the calling process
    result_path: str | None = None

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


def _register_output_capture(model: torch.nn.Module) -> None:
    """Let an unpickled model record attentions again in a freshly spawned process.

    Transformers registers what a model class can record (``output_attentions``,
    ``output_hidden_states``) in a process-wide table when an instance is built;
    unpickling skips ``__init__``, so in a spawned worker the attention methods would get
    no weights. Registers every sub-model as ``PreTrainedModel.__init__`` does.
    """
    try:
        from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY
    except ImportError:  # a transformers without the table records outputs without it
        return
    for mod in model.modules():
        if isinstance(mod, PreTrainedModel) and str(type(mod)) not in _CAN_RECORD_REGISTRY:
            _CAN_RECORD_REGISTRY[mod] = getattr(mod, "_can_record_outputs", None)


def _as_ctrl_c(signum: int) -> KeyboardInterrupt:
    """SIGTERM stops the explain job as Ctrl-C does. While it runs, Lightning replaces the
    SIGTERM handler with one that only sets a flag, which its loops read between batches;
    the whole job is one predict batch, so without this a user's or a scheduler's SIGTERM
    would go unheard until the job ended. A ``KeyboardInterrupt``, not
    :class:`saleval.errors.Stopped`: Lightning shuts down on it as on Ctrl-C, stopping the
    other ranks of a multi-process job too."""
    return KeyboardInterrupt(f"SIGTERM ({signum})")


class _JobModule(L.LightningModule):
    """Holds the model (Lightning moves it to each rank's device); runs the job once per rank."""

    def __init__(self, model: PreTrainedModel, job: _Job) -> None:
        super().__init__()
        self.model = model
        self.job = job

    def predict_step(self, batch: int, batch_idx: int) -> dict[str, Any]:
        rank, world = self.trainer.global_rank, self.trainer.world_size
        if int(batch) != rank:
            raise AttributionError(f"rank {rank} of {world} got work item {batch}, not its own")
        _register_output_capture(self.model)
        with torch.enable_grad(), sigterm_raises(_as_ctrl_c):
            result = self.job.run(self.model, rank, world)
        if self.job.result_path is not None and self.trainer.local_rank == 0:
            with open(self.job.result_path, "wb") as f:
                pickle.dump(result, f, protocol=pickle.HIGHEST_PROTOCOL)
        return result


def _only(items: list[Any]) -> Any:
    return items[0]


def _run_on(trainer: L.Trainer, model: PreTrainedModel, job: _Job) -> dict[str, Any]:
    """The job through ``trainer.predict``: one loader item per rank; the full result back."""
    world = trainer.num_nodes * trainer.num_devices
    # a list is a map-style dataset (len + getitem); the stubs want a Dataset subclass
    ranks = cast("torch.utils.data.Dataset[int]", list(range(world)))
    loader: torch.utils.data.DataLoader[int] = torch.utils.data.DataLoader(
        ranks, batch_size=1, shuffle=False, collate_fn=_only
    )
    if not isinstance(trainer.strategy.launcher, _MultiProcessingLauncher):
        outputs = trainer.predict(_JobModule(model, job), dataloaders=loader)
        assert outputs is not None and len(outputs) == 1
        return outputs[0]  # type: ignore[return-value]
    with tempfile.TemporaryDirectory(prefix="saleval-explain-") as tmp:
        path = os.path.join(tmp, "result.pkl")
        trainer.predict(_JobModule(model, replace(job, result_path=path)), dataloaders=loader)
        if not os.path.isfile(path):
            raise AttributionError("the attribution workers returned no result")
        with open(path, "rb") as f:
            return pickle.load(f)


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
    ``batch_size``). ``trainer``: a ``conf/trainer`` mapping (see :func:`make_trainer`;
    ``devices`` > 1 shards the batches over DDP ranks), or a Trainer built with
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
    if trainer is None:
        result = job.run(model)
    else:
        runner = trainer if isinstance(trainer, L.Trainer) else make_trainer(trainer)
        result = _run_on(runner, model, job)

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
