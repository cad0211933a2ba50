"""The bounds ``benchmarks/performance.py`` holds each method and metric against: forward
FLOPs at the real token lengths, forward/backward passes counted per example, measured
GEMM throughput on the model's own shapes, and plain batched inference replayed over the
very id sequences a method or metric ran.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any

import torch

from benchmarks.common import Timing, synchronize, timed
from saleval.config.model import DEFAULT_MAX_BATCH, DEFAULT_MAX_TOKENS
from saleval.modeling import inference


def forward_flops(config: Any, length: int) -> float:
    """Forward FLOPs of one sequence: per layer 2·L·(4d² + 2·d·d_ff) + 4·L²·d."""
    d, ff, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    return layers * (2 * length * (4 * d * d + 2 * d * ff) + 4 * length * length * d)


@contextmanager
def count_passes(model: Any) -> Any:
    """Forward-equivalent passes: rows run without grad count 1, with grad 3 (backward ≈ 2×)."""
    tally = {"passes": 0.0, "calls": 0}

    def hook(module: Any, args: Any, kwargs: Any, out: Any) -> None:
        rows = out.logits.shape[0]
        tally["passes"] += rows * (3 if out.logits.requires_grad else 1)
        tally["calls"] += 1

    handle = model.register_forward_hook(hook, with_kwargs=True)
    try:
        yield tally
    finally:
        handle.remove()


#: FLOPs per timed round of :func:`gemm_throughput` and :func:`matmul_peak`: a few ms of
#: a CPU core's work here, a few ms of a GPU's too (at its far higher rate)
ROUND_FLOPS = {"cpu": 2e9, "cuda": 5e11}


def _rounds(device: torch.device, flops: float) -> int:
    return max(1, int(ROUND_FLOPS.get(device.type, 2e9) / flops))


def _best_of_3(step: Any, reps: int) -> tuple[float, float]:
    """Best wall and CPU seconds of one ``step()`` over 3 rounds of ``reps`` (GPU work
    waited for: :func:`benchmarks.common.synchronize`)."""
    with torch.inference_mode():
        step()
        synchronize()
        best_wall = best_cpu = math.inf
        for _ in range(3):
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(reps):
                step()
            synchronize()
            best_wall = min(best_wall, (time.perf_counter() - t0) / reps)
            best_cpu = min(best_cpu, (time.process_time() - c0) / reps)
    return best_wall, best_cpu


def gemm_throughput(
    config: Any, rows: int, length: int, dtype: torch.dtype, device: torch.device | str = "cpu"
) -> tuple[float, float]:
    """FLOP/s (per wall second, per CPU second) of one encoder layer's GEMMs at ``rows``
    sequences of ``length`` tokens on ``device``: Q, K, V, O, the two FFN matmuls and both
    attention bmms."""
    dev = torch.device(device)
    d, ff, h = config.hidden_size, config.intermediate_size, config.num_attention_heads
    r = rows * length

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, dtype=dtype, device=dev)

    x = rand(r, d)
    wd = [rand(d, d) for _ in range(4)]
    w1, w2 = rand(ff, d), rand(d, ff)
    hx = rand(r, ff)
    q = rand(rows * h, length, d // h)
    k = rand(rows * h, d // h, length)
    a = rand(rows * h, length, length)
    flops = 2 * r * (4 * d * d + 2 * d * ff) + 4 * rows * length * length * d

    def layer() -> None:
        for w in wd:
            torch.nn.functional.linear(x, w)
        torch.nn.functional.linear(x, w1)
        torch.nn.functional.linear(hx, w2)
        torch.bmm(q, k)
        torch.bmm(a, q)

    best_wall, best_cpu = _best_of_3(layer, _rounds(dev, flops))
    return flops / best_wall, flops / max(best_cpu, 1e-12)


def matmul_peak(
    dtype: torch.dtype, device: torch.device | str = "cpu", size: int | None = None
) -> float:
    """The device's matmul peak in FLOP/s (wall): best of 3 rounds of square
    ``size``×``size`` products in ``dtype`` (default size 8,192 on a GPU, where smaller
    products leave it idle between kernels; 1,024 on a CPU). fp32 runs at PyTorch's
    default ``highest`` matmul precision (no TF32), which is what the engine runs."""
    dev = torch.device(device)
    n = size or (8192 if dev.type == "cuda" else 1024)
    a = torch.randn(n, n, dtype=dtype, device=dev)
    b = torch.randn(n, n, dtype=dtype, device=dev)
    flops = 2.0 * n**3
    wall, _ = _best_of_3(lambda: torch.mm(a, b), _rounds(dev, flops))
    return flops / wall


@contextmanager
def recording(module: Any, name: str) -> Any:
    """Wrap ``module.name`` (a batched-inference function) to keep every call's
    sequences and keyword arguments; the wrapped call itself is unchanged."""
    calls: list[tuple[list[Sequence[int]], dict[str, Any]]] = []
    original = getattr(module, name)

    def wrapper(model: Any, sequences: Sequence[Sequence[int]], **kw: Any) -> Any:
        calls.append((list(sequences), kw))
        return original(model, sequences, **kw)

    setattr(module, name, wrapper)
    try:
        yield calls
    finally:
        setattr(module, name, original)


def padded_share(calls: list[tuple[list[Sequence[int]], dict[str, Any]]]) -> float:
    """Padded share of the token slots the recorded calls' length-sorted batches held."""
    with inference.padding_tally() as tally:
        for seqs, kw in calls:
            lengths = [len(x) for x in seqs]
            max_tokens = int(kw.get("max_tokens", DEFAULT_MAX_TOKENS))
            max_batch = int(kw.get("max_batch", DEFAULT_MAX_BATCH))
            for idx in inference.length_batches(lengths, max_tokens, max_batch):
                inference.count_padding([lengths[i] for i in idx], max(lengths[i] for i in idx))
    return tally.fraction


def replay(model: Any, calls: list[tuple[list[Sequence[int]], dict[str, Any]]]) -> Timing:
    """Plain :func:`saleval.modeling.inference.forward_logits` over the recorded calls."""
    keep = ("tokenizer", "max_tokens", "max_batch", "bf16")

    def run() -> None:
        for seqs, kw in calls:
            inference.forward_logits(model, seqs, **{k: v for k, v in kw.items() if k in keep})

    t, _ = timed(run, sum(len(c[0]) for c in calls))
    return t
