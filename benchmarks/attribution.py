"""The batched attribution engine against the naive per-example loop, method by method.

Same model, texts and targets as every benchmark (:mod:`benchmarks.common`: the
embedded MiniLM with an untrained 4-way head, real AG News test texts), every method
at the settings ``saleval-explain`` composes by default (``conf/method/*.yaml``), on
both sides: the engine (:mod:`saleval.attribution`) and the naive reference
(:mod:`benchmarks.naive`: Captum and ``lime`` one example at a time; IG and DeepLIFT
from the zero baseline, the engine's default).

Prints examples/s of both and the speed-up per method, and, except for LIME (whose
words are lime's own split), the largest score difference relative to the largest
score. ``--ig-chunks`` times IG's ``internal_batch_size`` instead (the measured default).
``python -m benchmarks performance`` sets the same rows beside metrics, compute bounds
and ferret.

    python -m benchmarks attribution [--n 32] [--lime-samples 200] [--only lime ...] [--ig-chunks]

LIME runs 200 samples by default (not the method's 1000) to keep the run short on a
small CPU; both sides use the same number, and the cost per sample is what differs.
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import torch

from benchmarks.common import agreement, setup, speedups, timed
from benchmarks.naive import naive_method
from saleval.attribution import build_method


def compare(args: argparse.Namespace) -> None:
    s = setup(args.n)
    n_tok = [seg.n_tokens for seg in s.segs]
    print(
        f"{len(s.texts)} AG News test texts, {min(n_tok)}-{max(n_tok)} tokens "
        f"(mean {np.mean(n_tok):.0f}); MiniLM-L6; torch threads {torch.get_num_threads()}"
    )
    settings: dict[str, dict[str, Any]] = {k: dict(v) for k, v in s.method_cfg.items()}
    settings["lime"]["num_samples"] = args.lime_samples
    rows = []
    for kind in settings:
        if args.only and kind not in args.only:
            continue
        n = len(s.texts)
        engine = build_method(dict(settings[kind]), kind)
        t_engine, scores = timed(lambda e=engine: e.attribute(s.model, s.tok, s.segs, s.targets), n)
        t_naive, naive = timed(
            lambda k=kind: [
                naive_method(k, s.model, s.tok, settings[k], t, seg, y)
                for t, seg, y in zip(s.texts, s.segs, s.targets)
            ],
            n,
        )
        agree = "n/a (lime's own word split)" if kind == "lime" else agreement(scores, naive)
        wall, cpu = speedups(t_engine, t_naive)
        rows.append((kind, t_engine.rate, t_naive.rate, wall, cpu, agree))
        print(
            f"  {kind:22s} engine {t_engine.rate:8.2f} ex/s   naive {t_naive.rate:8.2f} ex/s   "
            f"wall x{wall:5.1f}   cpu x{cpu:5.1f}   max|Δ|/max|s| {agree}",
            flush=True,
        )
    print()
    print(
        "| method | engine ex/s | naive ex/s | speed-up (wall) | speed-up (CPU time) "
        "| max abs diff / max abs score |"
    )
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for kind, e, nv, r, rc, agree in rows:
        print(f"| {kind} | {e:.2f} | {nv:.2f} | {r:.1f}x | {rc:.1f}x | {agree} |")


def ig_chunks(args: argparse.Namespace) -> None:
    """Wall time of IG (its default config) per internal_batch_size (rows per chunk)."""
    s = setup(args.n)
    ig = s.method_cfg["integrated_gradients"]
    print(f"IG n_steps={ig['n_steps']} on {len(s.segs)} texts, batch_size {args.ig_batch} examples")
    print("| internal_batch_size (rows/chunk) | wall s | CPU s | examples/s |")
    print("| ---: | ---: | ---: | ---: |")
    for ibs in args.ig_sizes:
        settings = {**ig, "batch_size": args.ig_batch, "internal_batch_size": ibs}
        m = build_method(settings, "integrated_gradients")
        t, _ = timed(lambda m=m: m.attribute(s.model, s.tok, s.segs, s.targets), len(s.segs))
        label = "all (Captum default)" if ibs is None else str(ibs)
        print(f"| {label} | {t.wall:.1f} | {t.cpu:.1f} | {t.rate:.2f} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks attribution")
    p.add_argument("--n", type=int, default=32, help="number of AG News test texts")
    p.add_argument("--lime-samples", type=int, default=200, help="LIME num_samples on both sides")
    p.add_argument("--only", nargs="*", help="methods to run (default: all)")
    p.add_argument("--ig-chunks", action="store_true", help="time IG internal_batch_size")
    p.add_argument("--ig-batch", type=int, default=8, help="examples per IG batch (--ig-chunks)")
    p.add_argument(
        "--ig-sizes",
        type=lambda s: None if s == "all" else int(s),
        nargs="*",
        default=[None, 8, 16, 32, 64, 128, 256],
        help="internal_batch_size values to time (--ig-chunks; 'all' = Captum's default)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch threads")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    ig_chunks(args) if args.ig_chunks else compare(args)
    return 0
