"""Where a stage computes: one rule from an ``accelerator`` setting to a torch device.

Every place that puts a model on a device asks :func:`device_for`: training
(``trainer.accelerator``, before Lightning builds its Trainer), the explain and train stages
and the shortcut protocol (``trainer.accelerator``, for what runs outside a Trainer), and the
metrics (``metrics.inference.accelerator``). So the same setting means the same device
everywhere, and asking for a GPU on a machine without one is the same one-line
:class:`DeviceError` wherever it is asked, before any work: never the CPU unasked, and
never a Lightning traceback after minutes of loading (docs/data-and-models.md#devices).

The names are Lightning's: ``auto`` (the GPU when torch sees one, else the CPU), ``cpu``,
``gpu`` and ``cuda`` (both the GPU). The launchers read :data:`GPU_ACCELERATORS` to count
the GPUs a job takes on its node (:mod:`saleval.scaleout.needs`).

Nothing here imports torch at import time: the launchers and the config checks read the
names on hosts and in processes that never load a model.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from saleval.errors import UserError

if TYPE_CHECKING:
    import torch

#: the accelerator settings saleval places a model by (Lightning's names)
ACCELERATORS: tuple[str, ...] = ("auto", "cpu", "gpu", "cuda")
#: those that need a GPU on the machine (``auto`` takes one only where there is one)
GPU_ACCELERATORS = frozenset({"gpu", "cuda"})


class DeviceError(UserError, RuntimeError):
    """An accelerator setting names a device this machine does not have, or no device."""


def device_for(accelerator: object = "auto", setting: str = "trainer.accelerator") -> torch.device:
    """The device ``accelerator`` means on this machine; ``setting`` is the key that gave it,
    named in the error.

    ``auto`` (or nothing): the GPU when torch sees one, else the CPU. ``gpu``/``cuda``: the
    GPU, and a :class:`DeviceError` where there is none. Why not fall back to the CPU: a
    run that asked for a GPU and silently got the CPU is a run that takes hours instead of
    minutes, with nothing in its output to say why.

    >>> device_for("cpu").type, device_for(None, "metrics.inference.accelerator").type in ("cpu", "cuda")
    ('cpu', True)
    """
    import torch

    accel = str(accelerator or "auto").lower()
    if accel not in ACCELERATORS:
        raise DeviceError(
            f"{setting}={accelerator}: saleval places models on one of {', '.join(ACCELERATORS)}"
        )
    gpu = torch.cuda.is_available()
    if accel in GPU_ACCELERATORS and not gpu:
        raise DeviceError(
            f"{setting}={accelerator}, but torch sees no GPU (torch {torch.__version__}, "
            f"torch.cuda.is_available() is False): set {setting}=cpu or {setting}=auto, or "
            "install a CUDA build of torch"
        )
    return torch.device("cuda" if accel != "cpu" and gpu else "cpu")


def model_device(model: torch.nn.Module) -> torch.device:
    """The device ``model``'s parameters are on: where its inputs must be put and where its
    forward passes run (a stage placed it there by :func:`device_for`)."""
    return next(model.parameters()).device


def single_device(trainer_cfg: Mapping[str, Any] | None = None) -> bool:
    """Whether a ``conf/trainer`` node runs on one device of one node (``devices`` 1 or
    ``auto``, as attribution reads it): then a stage may place the model itself, on
    :func:`device_for` of its ``accelerator``; on several, Lightning's launcher places it.

    >>> single_device({"devices": "auto"}), single_device({"devices": 2})
    (True, False)
    """
    cfg = trainer_cfg or {}
    devices = str(cfg.get("devices", "auto"))
    return devices in ("1", "auto") and int(cfg.get("num_nodes") or 1) == 1


#: where a launcher that starts the ranks itself says how many there are: ``torchrun``,
#: ``srun`` (one task per device)
_WORLD_VARS = ("WORLD_SIZE", "SLURM_NTASKS")


def one_process(trainer_cfg: Mapping[str, Any] | None = None) -> bool:
    """Whether a job on a ``conf/trainer`` node is this process alone: one device of one
    node (:func:`single_device`) and no ranks a launcher started beside it. Then it needs no
    process group and no Trainer: attribution runs in the process
    (:func:`saleval.attribution.frame.explain_frame`), and the explain stage may reuse a
    method's stored scores, which several ranks would each have to agree on.

    >>> one_process({"devices": 1}), one_process({"devices": 1, "num_nodes": 2})
    (True, False)
    """
    ranks = max(int(os.environ.get(v) or 1) for v in _WORLD_VARS)
    return single_device(trainer_cfg) and ranks == 1
