"""``python -m benchmarks cls_only [--smoke] [--n N] [--repeats R]``: the default run's
explain and metrics work with the last block computed at the first token only, against the
whole model, side by side in one process (issue #54, docs/benchmarks.md#first-token).

What runs is what ``make run`` explains and measures: the embedded MiniLM loaded as the
explain stage loads it (:func:`benchmarks.common.setup`: eager attention, the first ``n``
AG News test texts), every default method of ``conf/explain.yaml`` with its own settings,
and the default metrics (``conf/metrics/default``) on every method's scores. Each is timed
with the fast path on and off (:func:`saleval.modeling.first_token.whole_model`), the two
alternating so that a drift in the host's load hits both, best of ``--repeats``.

The outputs of the two paths are compared, not assumed: every method's word scores (the
largest difference over the largest score) and every metric value. The benchmark exits 1
when any of them differs by more than float noise, so it is also the check that the fast
path changes no number of the default run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import torch

from benchmarks.common import compose, setup, timed
from saleval.attribution import attention, build_method
from saleval.metrics import faithfulness as F
from saleval.metrics.config import MetricsConfig
from saleval.modeling import first_token
from saleval.modeling.devices import device_for

#: the largest difference the two paths may show: relative to the largest score or value
TOLERANCE = 1e-4


def _best_of(fn: Callable[[], Any], repeats: int) -> tuple[dict[bool, float], dict[bool, Any]]:
    """Seconds (best of ``repeats``) and the output of ``fn`` with the fast path on and off."""
    secs: dict[bool, float] = {}
    out: dict[bool, Any] = {}
    for _ in range(repeats):
        for fast in (False, True):
            # the attention methods share one forward pass per batch (docs/methods.md):
            # forgotten, so that each timing computes it
            attention._SHARED.clear()
            with contextlib.nullcontext() if fast else first_token.whole_model():
                t, got = timed(fn, 1)
            secs[fast] = min(secs.get(fast, float("inf")), t.wall)
            out[fast] = got
    return secs, out


def _score_gap(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    diff = max(float(np.abs(x - y).max(initial=0)) for x, y in zip(a, b))
    scale = max(float(np.abs(y).max(initial=0)) for y in b)
    return diff / max(scale, 1e-12)


def _metric_gap(a: pd.DataFrame, b: pd.DataFrame) -> float:
    keys = ["sample_id", "method", "metric", "k"]
    both = a.merge(b, on=keys, suffixes=("_fast", "_whole"), validate="one_to_one")
    assert len(both) == len(a) == len(b), "the two paths computed different metric rows"
    x, y = both["value_fast"].to_numpy(float), both["value_whole"].to_numpy(float)
    nan = np.isnan(x) | np.isnan(y)
    assert (np.isnan(x) == np.isnan(y)).all(), "one path gave NaN where the other did not"
    diff = float(np.abs(x[~nan] - y[~nan]).max(initial=0))
    return diff / max(float(np.abs(y[~nan]).max(initial=0)), 1e-12)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks cls_only")
    p.add_argument("--n", type=int, default=8, help="AG News test texts (every default method)")
    p.add_argument(
        "--metrics-n", type=int, default=4, help="texts whose scores go through the metrics"
    )
    p.add_argument("--repeats", type=int, default=3, help="timings per path (best of)")
    p.add_argument("--lime-samples", type=int, default=None, help="override LIME num_samples")
    p.add_argument("--device", default="cpu", help="cpu | gpu | auto (saleval's accelerator names)")
    p.add_argument("--smoke", action="store_true",
                   help="checks it runs, not speed: 2 texts, 1 through the metrics, LIME 20, IG 8 "
                   "steps, 1 repeat")  # fmt: skip
    args = p.parse_args(argv)
    if args.smoke:
        args.n, args.metrics_n, args.repeats = min(args.n, 2), 1, 1
        args.lime_samples = args.lime_samples or 20
    device = device_for(args.device, "--device")
    s = setup(args.n, device)
    with first_token.last_block_at_first_token(s.model) as applies:
        pass  # the first entry probes the model once; the cost of every later one:
    t0 = time.perf_counter()
    for _ in range(1000):
        with first_token.last_block_at_first_token(s.model):
            pass
    check_us = (time.perf_counter() - t0) * 1e3
    settings = {k: dict(v) for k, v in s.method_cfg.items()}
    if args.lime_samples and "lime" in settings:
        settings["lime"]["num_samples"] = args.lime_samples
    if args.smoke and "integrated_gradients" in settings:
        settings["integrated_gradients"]["n_steps"] = 8
    for conf in settings.values():  # warm-up (caches, kernels), untimed: the first text
        build_method(conf).attribute(s.model, s.tok, s.segs[:1], s.targets[:1])
    lengths = [seg.n_tokens for seg in s.segs]
    print(
        f"{len(s.texts)} AG News test texts, {min(lengths)}-{max(lengths)} tokens; MiniLM-L6 "
        f"as the explain stage loads it; fast path {'applies' if applies else 'DOES NOT apply'}; "
        f"{device}, {torch.get_num_threads()} threads, host {platform.processor() or platform.machine()}, "
        f"load average {os.getloadavg()[0]:.1f}; best of {args.repeats}",
        flush=True,
    )
    rows: list[tuple[str, float, float, float]] = []
    scores: dict[str, list[np.ndarray]] = {}
    for key, conf in settings.items():
        method = build_method(conf)
        secs, out = _best_of(
            lambda m=method: m.attribute(s.model, s.tok, s.segs, s.targets), args.repeats
        )
        scores[key] = out[True]
        rows.append((key, secs[False], secs[True], _score_gap(out[True], out[False])))
    mcfg = MetricsConfig.from_config(
        compose(["inputs.model=x", "inputs.explain=x"], "metrics").metrics
    )
    mn = min(args.metrics_n, len(s.texts))
    items = [
        F.Explanation(str(i), k, s.segs[i], v[i]) for k, v in scores.items() for i in range(mn)
    ]
    secs, out = _best_of(lambda: F.evaluate(s.model, s.tok, items, mcfg).per_example, args.repeats)
    rows.append((f"metrics ({len(items)} explanations)", secs[False], secs[True],
                 _metric_gap(out[True], out[False])))  # fmt: skip
    whole, fast = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print(
        "\n| method / metrics | whole model (s) | first token only (s) | speed-up | largest difference |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    for name, w, f, gap in rows:
        print(f"| {name} | {w:.2f} | {f:.2f} | {w / max(f, 1e-9):.2f}× | {gap:.0e} |")
    print(f"| all of the above | {whole:.2f} | {fast:.2f} | {whole / max(fast, 1e-9):.2f}× | — |")
    print(f"\nEntering and leaving the fast path (the check, once per batch group or forward "
          f"call): {check_us:.0f} µs")  # fmt: skip
    worst = max(r[3] for r in rows)
    print(f"\nLargest difference of the two paths (÷ largest score or value): {worst:.1e}"
          f" (allowed {TOLERANCE:.0e})")  # fmt: skip
    return 0 if applies and worst <= TOLERANCE else 1


if __name__ == "__main__":
    raise SystemExit(main())
