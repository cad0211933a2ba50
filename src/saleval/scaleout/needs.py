"""What a sweep's jobs will use on their node, read from their configs before submitting.

A launcher asks a cluster for resources (``hydra.launcher.gpus_per_node`` on SLURM,
``hydra.launcher.num_gpus`` on Ray); the job's own config decides what it uses. A job whose
trainer runs on a GPU (``trainer=gpu``, ``trainer=ddp``: Lightning's ``accelerator`` ``gpu``
or ``cuda``) started where it got none crashes on its node (``No supported gpu backend
found!``), after it waited in the queue. :func:`sweep_gpus` finds the most GPUs one job
of the sweep uses, so the launcher refuses such a sweep in one line before submitting
(docs/scale-out.md, *Submit a sweep*). ``accelerator: auto`` (the default) takes a GPU where
the node has one and the CPU elsewhere: it fits any node and counts 0.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf

from saleval.modeling.devices import GPU_ACCELERATORS

#: keys of a job's overrides that can change what it runs on
_RELEVANT = ("trainer", "profile", "experiment")


@dataclass(frozen=True)
class GpuUse:
    """GPUs one job uses on its node and the setting that asks for them
    (``trainer=gpu``; ``''`` when it uses none)."""

    gpus: int = 0
    what: str = ""


def trainer_gpus(trainer: Mapping[str, Any] | None) -> int:
    """GPUs a job with this ``trainer`` config takes on its node: none unless its
    accelerator is a GPU; then ``devices`` (a count, or a list of GPU ids), and at least
    one for ``-1``/``auto`` (every GPU of the node).

    >>> [trainer_gpus(t) for t in ({"accelerator": "auto"}, {"accelerator": "cpu", "devices": 2},
    ...     {"accelerator": "gpu", "devices": 1}, {"accelerator": "cuda", "devices": -1},
    ...     {"accelerator": "gpu", "devices": [0, 1]}, {"accelerator": "gpu", "devices": "2"})]
    [0, 0, 1, 1, 2, 2]
    """
    if not trainer or str(trainer.get("accelerator") or "auto").lower() not in GPU_ACCELERATORS:
        return 0
    devices = trainer.get("devices")
    if isinstance(devices, Sequence) and not isinstance(devices, str):
        return max(len(devices), 1)
    try:
        return max(int(str(devices).strip()), 1)
    except ValueError:  # "auto", or a "0,1" id list
        return max(len(str(devices).split(",")), 1) if "," in str(devices) else 1


def _trainer_use(trainer: Any, choice: Any, where: str = "") -> GpuUse:
    gpus = trainer_gpus(trainer)
    if not gpus:
        return GpuUse()
    named = f"trainer={choice}" if choice else f"trainer.accelerator={trainer.get('accelerator')}"
    return GpuUse(gpus, f"{where}{named}")


def job_gpus(cfg: DictConfig) -> GpuUse:
    """What one job composed as ``cfg`` uses: a stage's own ``trainer``, or for
    ``saleval-run`` the trainer of each stage its profile gives trainer overrides,
    composed as the pipeline composes that stage."""
    if "trainer" in cfg:
        choice = OmegaConf.select(cfg, "hydra.runtime.choices.trainer", default=None)
        return _trainer_use(cfg.trainer, choice)
    profile = cfg.get("profile")
    if profile is None or "stages" not in profile:
        return GpuUse()
    from saleval.pipeline.compose import compose_root, stage_overrides

    selected = profile.get("stages_to_run") or list(profile.stages)
    worst = GpuUse()
    for stage in selected:
        overrides = stage_overrides(profile, stage)
        trainer = [o for o in overrides if o.lstrip("+~").startswith("trainer")]
        if not trainer:  # the stage's own default: accelerator auto
            continue
        try:
            stage_cfg = compose_root(str(stage), overrides)
        except Exception:  # the job reports it, before any stage runs (check_profile)
            continue
        if "trainer" in stage_cfg:
            named = next((o for o in trainer if o.lstrip("+~").startswith("trainer=")), None)
            use = _trainer_use(stage_cfg.trainer, named.split("=", 1)[1] if named else None,
                               f"profile stage {stage}: ")  # fmt: skip
            worst = max(worst, use, key=lambda u: u.gpus)
    return worst


def sweep_gpus(
    config: DictConfig, job_overrides: Sequence[Sequence[str]], load: Any = None
) -> GpuUse:
    """The most GPUs one job of a sweep uses. ``config`` is the sweep's config (the
    overrides every job shares); a job whose own overrides touch its trainer, profile or
    recipe is composed with them by ``load(config, overrides)`` (Hydra's
    ``config_loader.load_sweep_config``, what the job itself will do)."""
    worst = job_gpus(config)
    seen: set[tuple[str, ...]] = set()
    for overrides in job_overrides:
        relevant = tuple(sorted(o for o in overrides if o.lstrip("+~").startswith(_RELEVANT)))
        if not relevant or relevant in seen or load is None:
            continue
        seen.add(relevant)
        worst = max(worst, job_gpus(load(config, list(overrides))), key=lambda u: u.gpus)
    return worst
