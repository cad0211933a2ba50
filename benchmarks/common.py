"""What every benchmark of the methods starts from: the model, the texts, timing.

One set-up so the benchmarks measure the same thing: the embedded MiniLM with an
untrained 4-way head (timing only; its predicted classes are the targets), loaded with
eager attention as the explain stage loads it, the first ``n`` real AG News test texts
segmented at the model's ``max_length``, and every method's settings as
``saleval-explain`` composes them (``conf/method/*.yaml``, the nine of
``conf/explain.yaml``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from saleval.modeling import inference
from saleval.modeling.data import load_dataset
from saleval.modeling.models import build_model, load_tokenizer
from saleval.stages.run import compose_stage
from saleval.words import Segmentation, segment


def compose(overrides: list[str], config_name: str = "explain") -> DictConfig:
    """A stage's root config as its console script composes it."""
    return compose_stage(config_name, overrides)


@dataclass
class Setup:
    model: Any
    tok: Any
    texts: list[str]
    targets: list[int]
    segs: list[Segmentation]
    #: method key -> its settings (``_target_`` and every field), as the explain stage has them
    method_cfg: dict[str, dict[str, Any]]


def setup(n: int, device: str | torch.device = "cpu") -> Setup:
    """The model as the explain stage loads it (eager attention), texts, predicted classes;
    the model on ``device`` (every method and metric runs where the model is)."""
    cfg = compose(["dataset=ag_news"])  # explain: the dataset and every method's config
    model_cfg = compose(["model=minilm"], "train").model  # the explain root has no model node
    data = load_dataset(cfg.dataset)
    texts = data["test"]["text"].head(n).tolist()
    tok = load_tokenizer(model_cfg)
    torch.manual_seed(0)
    model = build_model(model_cfg, data.label_names, attn_implementation="eager", seed=0).eval()
    torch.nn.Module.to(model, torch.device(device))  # in place (transformers' typed `to`)
    segs = [segment(t, tok, int(model_cfg.max_length)) for t in texts]
    targets = inference.forward_logits(model, [s.input_ids for s in segs]).argmax(1).tolist()
    methods = OmegaConf.to_container(cfg.method, resolve=True)
    assert isinstance(methods, dict)
    return Setup(model, tok, texts, targets, segs, {str(k): dict(v) for k, v in methods.items()})


@dataclass
class Timing:
    """Wall and CPU seconds (this process, all threads) for ``n`` examples.

    CPU time is the steadier figure on a shared machine: wall time there depends on
    the neighbours' load. On a GPU, wall time is the figure: CPU time there counts the
    host's work and its waiting for the device.
    """

    wall: float
    cpu: float
    n: int

    @property
    def rate(self) -> float:
        return self.n / max(self.wall, 1e-12)

    def __add__(self, other: Timing) -> Timing:
        return Timing(self.wall + other.wall, self.cpu + other.cpu, self.n)


def synchronize() -> None:
    """Wait for the GPU's queued work, so a clock read after it counts that work (CUDA
    kernels run asynchronously: without this a timer sees only their launch)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], n: int) -> tuple[Timing, Any]:
    synchronize()
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    synchronize()
    return Timing(time.perf_counter() - t0, time.process_time() - c0, n), out


def speedups(engine: Timing, other: Timing) -> tuple[float, float]:
    """How many times faster the engine is per example (wall, CPU time)."""
    scale = engine.n / other.n
    return other.wall * scale / engine.wall, other.cpu * scale / max(engine.cpu, 1e-12)


def agreement(a: list[np.ndarray], b: list[np.ndarray]) -> str:
    """Largest absolute difference of two methods' scores over the largest score of ``a``."""
    diff = max(float(np.abs(x - y).max(initial=0)) for x, y in zip(a, b))
    scale = max(float(np.abs(x).max(initial=0)) for x in a)
    return f"{diff / max(scale, 1e-12):.0e}"
