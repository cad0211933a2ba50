"""An attribution job on several processes, through a predict-only Lightning Trainer.

:func:`saleval.attribution.frame.explain_frame` comes here where a job is more than this
process: several devices or nodes, or ranks a launcher started (``torchrun``, ``srun``), or
a Trainer the caller built. One process alone runs the job itself, without Lightning
(:func:`saleval.modeling.devices.one_process`): a Trainer would only place the model, which
:func:`saleval.modeling.devices.device_for` does, and Lightning, imported only here, would
turn a SIGTERM into its own exit (docs/benchmarks.md#explain-in-one-process).

The Trainer places the model on ``trainer.accelerator`` and starts the processes and their
process group (gloo on CPU, NCCL on GPU). Its loader holds one item per rank, so each
rank's ``predict_step`` runs the job once, over its own batches. The loop runs with
``inference_mode=False`` because gradient methods need autograd.

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
from collections.abc import Callable, Mapping
from typing import Any, cast

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy

# Lightning's own launcher classes: the same checks its predict loop and DDP strategy make.
from lightning.pytorch.strategies.launchers import (
    _MultiProcessingLauncher,
    _SubprocessScriptLauncher,
)
from transformers import PreTrainedModel

from saleval.attribution.base import AttributionError
from saleval.errors import sigterm_raises
from saleval.modeling.devices import device_for

#: the job one rank runs: (model, rank, world size) -> its full result, the same on every rank
Job = Callable[[PreTrainedModel, int, int], dict[str, Any]]


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
    """Holds the model (Lightning moves it to each rank's device); runs the job once per rank.
    Where ``result_path`` is given (spawned workers), local rank 0 leaves the result there."""

    def __init__(self, model: PreTrainedModel, job: Job, result_path: str | None = None) -> None:
        super().__init__()
        self.model = model
        self.job = job
        self.result_path = result_path

    def predict_step(self, batch: int, batch_idx: int) -> dict[str, Any]:
        rank, world = self.trainer.global_rank, self.trainer.world_size
        if int(batch) != rank:
            raise AttributionError(f"rank {rank} of {world} got work item {batch}, not its own")
        _register_output_capture(self.model)
        with torch.enable_grad(), sigterm_raises(_as_ctrl_c):
            result = self.job(self.model, rank, world)
        if self.result_path is not None and self.trainer.local_rank == 0:
            with open(self.result_path, "wb") as f:
                pickle.dump(result, f, protocol=pickle.HIGHEST_PROTOCOL)
        return result


def _only(items: list[Any]) -> Any:
    return items[0]


def predict(
    trainer: Mapping[str, Any] | L.Trainer, model: PreTrainedModel, job: Job
) -> dict[str, Any]:
    """``job`` through ``trainer.predict`` (a ``conf/trainer`` mapping: :func:`make_trainer`),
    one loader item per rank; the full result back in the calling process."""
    runner = trainer if isinstance(trainer, L.Trainer) else make_trainer(trainer)
    world = runner.num_nodes * runner.num_devices
    # a list is a map-style dataset (len + getitem); the stubs want a Dataset subclass
    ranks = cast("torch.utils.data.Dataset[int]", list(range(world)))
    loader: torch.utils.data.DataLoader[int] = torch.utils.data.DataLoader(
        ranks, batch_size=1, shuffle=False, collate_fn=_only
    )
    if not isinstance(runner.strategy.launcher, _MultiProcessingLauncher):
        outputs = runner.predict(_JobModule(model, job), dataloaders=loader)
        assert outputs is not None and len(outputs) == 1
        return outputs[0]  # type: ignore[return-value]
    with tempfile.TemporaryDirectory(prefix="saleval-explain-") as tmp:
        path = os.path.join(tmp, "result.pkl")
        runner.predict(_JobModule(model, job, path), dataloaders=loader)
        if not os.path.isfile(path):
            raise AttributionError("the attribution workers returned no result")
        with open(path, "rb") as f:
            return pickle.load(f)
