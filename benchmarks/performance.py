"""Issue #10: every method and metric at its default settings, side by side, in one run.

``python -m benchmarks performance [--n 100] [--metrics-n 8] [--quick]`` (``make bench-perf``)
times, on the same model (the embedded MiniLM with an untrained 4-way head: timing
only) and the first ``n`` real AG News test texts, with their predicted classes:

* **engine**: saleval's batched methods (``conf/method/*.yaml`` as the explain stage
  composes them) and :func:`saleval.metrics.faithfulness.evaluate` (``conf/metrics/default``);
* **naive**: a per-example loop over the same libraries and settings — the methods
  by :mod:`benchmarks.naive` (Captum per example, IG all 50 steps in one call from the
  zero baseline, ``lime``'s ``LimeTextExplainer``, occlusion as one padded forward per
  example), every metric here as one padded forward per example of all its perturbed
  inputs (no cross-example batching, no length sorting, no cache);
* **ferret** (``ferret-xai`` in ``.venv-ferret``, run as a subprocess by
  :mod:`benchmarks.ferret_side`) where it has the method: Gradient, Gradient×Input,
  IG×Input, LIME, its leave-one-token-out occlusion (inside tau-LOO) and its AOPC
  comprehensiveness / sufficiency evaluators; same method settings (1000 LIME
  samples, 50 IG steps), ferret's defaults otherwise (token features, [MASK]
  perturbation, forward batches of 8);
* **bounds**: gradient methods against the compute bound (forward/backward passes per
  example, counted, × forward FLOPs at the real token lengths from the model config
  ÷ measured fp32 GEMM throughput on the model's own shapes); LIME, occlusion and
  the metric families against plain batched inference
  (:func:`saleval.modeling.inference.forward_logits`) over the very id sequences they ran.

Both wall and CPU-time (``time.process_time``) ratios are printed: the machine is
shared, and CPU time is the steadier figure there. ``--device cuda`` runs the model, the
engine and the naive loop on the GPU (ferret stays out: its side runs on the CPU), with
the GPU's fp32 and bf16 matmul peak measured in the same run; on a GPU wall time is the
figure that counts (``benchmarks/gpu.py`` runs it so, docs/benchmarks.md#gpu). Prints one markdown table; the
long run writes it to ``--out`` too. ``--quick`` (4 texts, 2 for metrics, LIME 100
samples on every side) is for development only.

The table's rows and targets are :mod:`benchmarks.perf_table`'s; the naive loops and
ferret :mod:`benchmarks.perf_baselines`', the bounds :mod:`benchmarks.perf_bounds`'.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import Setup, Timing, agreement, compose, setup, timed
from benchmarks.naive import naive_method
from benchmarks.perf_baselines import FERRET_PYTHON, naive_metrics, run_ferret
from benchmarks.perf_bounds import (
    count_passes,
    forward_flops,
    gemm_throughput,
    matmul_peak,
    padded_share,
    recording,
    replay,
)
from benchmarks.perf_table import Row, print_row, render
from saleval.attribution import REGISTRY, build_method
from saleval.attribution import attention as A
from saleval.attribution import perturbation as P
from saleval.metrics import faithfulness as F
from saleval.metrics.config import MetricsConfig
from saleval.modeling import inference


def family(kind: str) -> str:
    """The module of :mod:`saleval.attribution` a registered method's class lives in:
    ``gradient`` (timed against the compute bound), ``perturbation`` (against plain
    inference over the inputs it sent through ``forward_logits``), ``attention``, ``random``."""
    return REGISTRY[kind].__module__.rpartition(".")[2]


def _metrics_cfg() -> MetricsConfig:
    cfg = compose(["inputs.model=x", "inputs.explain=x"], "metrics")
    return MetricsConfig.from_config(cfg.metrics)


def device_line(device: torch.device) -> str:
    """What runs the benchmark: the GPU's name and memory, or the CPU's threads."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        return (
            f"{props.name} ({props.total_memory / 2**30:.0f} GiB, {props.multi_processor_count} "
            f"SMs), torch {torch.__version__} (CUDA {torch.version.cuda}), "
            f"{os.cpu_count()} CPU cores"
        )
    return f"CPU, torch {torch.__version__}, {torch.get_num_threads()} threads"


def resolve_device(name: str) -> torch.device:
    """``--device``: ``cpu``, ``cuda`` (fails without a GPU) or ``auto`` (the GPU when present)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {name}: torch {torch.__version__} sees no GPU")
    return device


@dataclass
class Bench:
    """One run's shared state: the texts and model, the methods' settings, the device's
    peaks, and where the table so far is saved."""

    args: argparse.Namespace
    s: Setup
    device: torch.device
    settings: dict[str, dict[str, Any]]
    nine: list[str]  # the explain stage's default methods (conf/explain.yaml)
    methods: list[str]  # those run (``--only``)
    matmul: dict[str, float]
    peak: dict[str, tuple[float, float]]
    head: str

    @property
    def n(self) -> int:
        return len(self.s.texts)

    def save_partial(self, done: list[Row]) -> None:
        """The table so far, in ``--out``: a run stopped from outside (a time limit) keeps
        the rows it finished."""
        if self.args.out:
            Path(self.args.out).parent.mkdir(parents=True, exist_ok=True)
            text = render(done, self.n, self.peak, "", self.matmul)
            Path(self.args.out).write_text(
                f"{self.head} **Partial: the run has not finished.**\n\n{text}\n"
            )


def peaks(
    s: Setup, device: torch.device, peak_size: int | None
) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """The device's matmul peak (large square products), then GEMM throughput on the
    model's own shapes (best of 3; the strictest bound)."""
    cfg, lengths = s.model.config, [seg.n_tokens for seg in s.segs]
    matmul = {
        label: matmul_peak(dtype, device, peak_size)
        for dtype, label in ((torch.float32, "fp32"), (torch.bfloat16, "bf16"))
    }
    print(f"  matmul peak: fp32 {matmul['fp32'] / 1e12:.2f} TFLOP/s, "
          f"bf16 {matmul['bf16'] / 1e12:.2f} TFLOP/s", flush=True)  # fmt: skip
    mean_len = round(float(np.mean(lengths)))
    peak: dict[str, tuple[float, float]] = {}
    for dtype, label in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        best = (0.0, 0.0)
        for n_rows in (16, 32, 100):
            w, c = gemm_throughput(cfg, n_rows, mean_len, dtype, device)
            print(f"  GEMMs {label} {n_rows:3d}×{mean_len} tokens: {w / 1e9:6.1f} GFLOP/s wall, "
                  f"{c / 1e9:6.1f} GFLOP/CPU-s", flush=True)  # fmt: skip
            best = (max(best[0], w), max(best[1], c))
        peak[label] = best
    return matmul, peak


def start(args: argparse.Namespace) -> Bench:
    """The texts, the model, the methods' settings and the device's peaks."""
    device = resolve_device(args.device)
    s = setup(args.n, device)
    n, cfg = len(s.texts), s.model.config
    lengths = [seg.n_tokens for seg in s.segs]
    print(
        f"{n} AG News test texts, {min(lengths)}-{max(lengths)} tokens (mean "
        f"{np.mean(lengths):.0f}); MiniLM-L6 (d={cfg.hidden_size}, d_ff={cfg.intermediate_size}, "
        f"{cfg.num_hidden_layers} layers), eager attention; {device_line(device)}; "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    settings = {k: dict(v) for k, v in s.method_cfg.items()}
    if args.lime_samples:
        settings["lime"]["num_samples"] = args.lime_samples
    nine = list(s.method_cfg)
    methods = [m for m in nine if not args.only or m in args.only]
    matmul, peak = peaks(s, device, args.peak_size)
    head = f"{n} AG News test texts on {device_line(device)}."
    return Bench(args, s, device, settings, nine, methods, matmul, peak, head)


def method_row(b: Bench, kind: str, flops_all: float) -> tuple[Row, list[np.ndarray]]:
    """One method: the engine timed (with its perturbed inputs replayed as plain inference,
    or its passes against the compute bound) and the naive loop beside it."""
    s, n, settings = b.s, b.n, b.settings
    # warm-up on two texts (first-call allocations, kernel selection), which also
    # counts the forward rows (with / without grad) that give the compute bound
    k = min(2, n)
    warm = {**settings[kind], **({"num_samples": 50} if kind == "lime" else {})}
    with count_passes(s.model) as tally:
        build_method(warm, kind).attribute(s.model, s.tok, s.segs[:k], s.targets[:k])
    m = build_method(dict(settings[kind]), kind)
    # each method timed on its own: the attention methods' shared forward pass (an
    # explain run computes it once for both) is cleared first
    A._SHARED.clear()
    with recording(P, "forward_logits") as calls, inference.padding_tally() as pads:
        t_eng, scores = timed(lambda m=m: m.attribute(s.model, s.tok, s.segs, s.targets), n)
    row = Row(kind, n, t_eng, padding=pads.fraction if pads.real else None)
    if family(kind) == "perturbation":
        row.plain = replay(s.model, calls)
        row.notes.append(f"{row.plain.n} perturbed inputs")
    if family(kind) == "gradient":
        passes = tally["passes"] / k
        flops = passes * flops_all
        row.bound = (flops / b.peak["fp32"][0], flops / b.peak["fp32"][1])
        row.notes.append(f"{passes:.0f} forward-equivalent passes/example")
    if not b.args.no_naive:
        # a per-example user loads the model as Hugging Face does by default (sdpa);
        # only the attention methods need the eager weights
        impl = "eager" if kind.endswith("attention") else "sdpa"

        def naive_all(
            kind: str = kind, impl: str = impl, texts: list[str] = s.texts, how: Any = None
        ) -> list[np.ndarray]:
            with inference.attention_implementation(s.model, impl):
                return [
                    naive_method(kind, s.model, s.tok, how or settings[kind], t, seg, y)
                    for t, seg, y in zip(texts, s.segs, s.targets)
                ]

        naive_all(texts=s.texts[:1], how=warm)  # warm-up
        row.naive, naive_scores = timed(naive_all, n)
        if kind != "lime":  # lime's own word split differs
            row.agree = agreement(scores, naive_scores)
    return row, scores


def bf16_rows(b: Bench, rows: list[Row], engine_scores: dict[str, list[np.ndarray]]) -> None:
    """Opt-in: the forward-only methods with bf16 autocast (not the default: scores move)."""
    s, n = b.s, b.n
    for kind in [m for m in b.methods if family(m) == "perturbation"]:
        m = build_method({**b.settings[kind], "bf16": True}, kind)
        m.attribute(s.model, s.tok, s.segs[:2], s.targets[:2])  # warm-up
        with recording(P, "forward_logits") as calls:
            t_b, scores_b = timed(lambda m=m: m.attribute(s.model, s.tok, s.segs, s.targets), n)
        fp32 = next(r for r in rows if r.name == kind)
        row = Row(f"{kind} (bf16: true)", n, t_b, naive=fp32.naive, plain=replay(s.model, calls))
        row.agree = agreement(engine_scores[kind], scores_b) + " vs fp32"
        row.notes.append("naive column: the fp32 naive loop")
        rows.append(row)
        print_row(row, flush=True)
        b.save_partial(rows)


def family_rows(b: Bench, items: list[F.Explanation], mcfg: MetricsConfig) -> tuple[list[Row], Any]:
    """Every metric family timed in one engine call, each beside its naive loop and the
    plain inference over the inputs it sent, then all of them (the last row); and the
    engine's result."""
    s = b.s
    F.evaluate(s.model, s.tok, items[:2], mcfg)  # warm-up
    with recording(inference, "predict_proba") as calls:
        t_all, res = timed(lambda: F.evaluate(s.model, s.tok, items, mcfg), len(items))
    by_desc: dict[str, list[Any]] = {}  # the cache's calls per family ("desc")
    for c in calls:
        desc = str(c[1].get("desc"))
        by_desc.setdefault("full_text" if desc == "full texts" else desc, []).append(c)
    naive_t: dict[str, Timing] = {}
    naive_vals: dict[tuple[str, str, str, str], float] = {}
    if not b.args.no_naive_metrics:
        with inference.attention_implementation(s.model, "sdpa"):
            naive_t, naive_vals = naive_metrics(s, items, mcfg)
    out: list[Row] = []
    for rec in res.timings.itertuples():
        eng = Timing(float(rec.seconds), float(rec.cpu_seconds), len(items))
        row = Row(f"metric: {rec.metric}", len(items), eng)
        if rec.n_forward:
            row.plain = replay(s.model, by_desc.get(rec.metric, []))
        else:
            row.notes.append("every input already cached by an earlier family")
        row.notes.append(f"{rec.n_sequences} inputs, {rec.n_forward} new forwards")
        if by_desc.get(rec.metric):
            row.padding = padded_share(by_desc[str(rec.metric)])
        row.naive = naive_t.get(str(rec.metric))
        out.append(row)
    total = Row("metrics: all families", len(items), t_all)
    if naive_vals:
        eng_vals = {
            (r.sample_id, r.method, r.metric, r.k): r.value
            for r in res.per_example.itertuples()
            if (r.sample_id, r.method, r.metric, r.k) in naive_vals
        }
        diff = max(abs(eng_vals[k] - naive_vals[k]) for k in eng_vals)
        total.agree = f"{diff:.0e} (abs, {len(eng_vals)} metric values)"
    total.plain = replay(s.model, calls)
    total.padding = padded_share(calls)
    if naive_t:
        total.naive = sum(naive_t.values(), Timing(0, 0, len(items)))
    out.append(total)
    return out, res


def metric_rows(b: Bench, engine_scores: dict[str, list[np.ndarray]], done: list[Row]) -> list[Row]:
    """The metrics on the first ``metrics_n`` samples × every method's scores (and, with
    ``--bf16``, all families in bf16)."""
    s, mcfg = b.s, _metrics_cfg()
    mn = min(b.args.metrics_n, b.n)
    items = [
        F.Explanation(str(i), kind, s.segs[i], engine_scores[kind][i])
        for kind in b.methods
        for i in range(mn)
    ]
    if b.args.no_metrics or not items:
        return []
    rows, res = family_rows(b, items, mcfg)
    if b.args.bf16:
        cfg16 = dataclasses.replace(
            mcfg, inference=dataclasses.replace(mcfg.inference, bf16="true")
        )
        with recording(inference, "predict_proba") as calls16:
            t16, res16 = timed(lambda: F.evaluate(s.model, s.tok, items, cfg16), len(items))
        row = Row("metrics: all families (bf16: true)", len(items), t16, naive=rows[-1].naive)
        row.plain = replay(s.model, calls16)
        a, c = res.per_example["value"].to_numpy(), res16.per_example["value"].to_numpy()
        row.agree = f"{np.nanmax(np.abs(a - c)):.0e} (abs) vs fp32"
        rows.append(row)
    for row in rows:
        print_row(row, flush=True)
    b.save_partial(done + rows)
    return rows


#: saleval's row -> ferret's name for the same method or evaluator
FERRET_NAMES = {
    "vanilla_gradient": "gradient",
    "input_x_gradient": "gradient_x_input",
    "integrated_gradients": "integrated_gradients_x_input",
    "lime": "lime",
    "occlusion": "leave_one_out",
    f"metric: {F.COMPREHENSIVENESS}": "aopc_comprehensiveness",
    f"metric: {F.SUFFICIENCY}": "aopc_sufficiency",
}


def ferret_columns(b: Bench, rows: list[Row]) -> str:
    """ferret's timings on the rows it has a method for; returns why it did not run ("")."""
    ferret, why = (None, "not run (--no-ferret)")
    mn = min(b.args.metrics_n, b.n)
    if b.device.type != "cpu":
        why = f"not run on {b.device.type}: the ferret side runs on the CPU in its own venv"
    elif not b.args.no_ferret:
        ferret, why = run_ferret(
            b.s, min(b.args.ferret_n or b.n, b.n), mn, mn * len(b.methods),
            b.settings["lime"]["num_samples"], int(b.settings["integrated_gradients"]["n_steps"]),
            b.args.ferret_python, b.args.ferret_timeout,
        )  # fmt: skip
    for row in rows:
        key = FERRET_NAMES.get(row.name)
        if ferret is None:
            row.ferret_note = why if key else "no such method in ferret"
        elif key is None:
            row.ferret_note = "no such method in ferret"
        elif key in ferret["timings"]:
            f = ferret["timings"][key]
            row.ferret = Timing(f["wall"], f["cpu"], f["n"])
            if f["n"] != row.n:
                row.ferret_note = f"n={f['n']}"
    if ferret is not None:
        print(f"ferret side: {ferret.get('versions')}")
    return why if ferret is None else ""


def run(args: argparse.Namespace) -> list[Row]:
    b = start(args)
    s, n = b.s, b.n
    flops_all = sum(forward_flops(s.model.config, seg.n_tokens) for seg in s.segs)
    rows: list[Row] = []
    engine_scores: dict[str, list[np.ndarray]] = {}
    for kind in b.methods:
        row, engine_scores[kind] = method_row(b, kind, flops_all)
        rows.append(row)
        print_row(row, flush=True)
        b.save_partial(rows)
    if args.bf16:
        bf16_rows(b, rows, engine_scores)
    metrics = metric_rows(b, engine_scores, rows)
    ferret_why = ferret_columns(b, rows + metrics)
    # nine methods end to end (the fp32 defaults; bf16 rows follow it)
    base = [r for r in rows if r.name in b.nine]
    if len(base) > 1:
        name = "nine methods end to end" if len(base) == 9 else f"{len(base)} methods total"
        tot = Row(name, n, sum((r.engine for r in base), Timing(0, 0, n)))
        if all(r.naive for r in base):
            tot.naive = sum((r.naive for r in base if r.naive), Timing(0, 0, n))
        rows.insert(len(base), tot)
    table = render(rows + metrics, n, b.peak, ferret_why, b.matmul)
    table += f"\nLoad average at the end: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)."
    print(table)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(f"{b.head}\n\n{table}\n")
    return rows + metrics


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks performance")
    p.add_argument("--n", type=int, default=100, help="AG News test texts (all nine methods)")
    p.add_argument("--metrics-n", type=int, default=8,
                   help="texts whose nine explanations each go through the metrics")  # fmt: skip
    p.add_argument("--ferret-n", type=int, default=None, help="texts on the ferret side (≤ n)")
    p.add_argument("--only", nargs="*", help="methods to run (default: all nine)")
    p.add_argument("--lime-samples", type=int, default=None, help="override LIME num_samples")
    p.add_argument("--quick", action="store_true", help="development: n 4, metrics 2, LIME 100")
    p.add_argument("--smoke", action="store_true",
                   help="the test suite's run: n 2, metrics 1, LIME 20 (checks it runs, not speed)")  # fmt: skip
    p.add_argument("--no-naive", action="store_true", help="skip the naive loop of the methods")
    p.add_argument("--no-naive-metrics", action="store_true")
    p.add_argument("--no-metrics", action="store_true")
    p.add_argument("--no-ferret", action="store_true")
    p.add_argument("--bf16", action="store_true", help="also LIME, occlusion, metrics in bf16")
    p.add_argument("--ferret-python", type=Path, default=FERRET_PYTHON)
    p.add_argument("--ferret-timeout", type=float, default=4 * 3600)
    p.add_argument("--threads", type=int, default=None, help="torch threads")
    p.add_argument("--device", default="cpu", help="cpu | cuda | auto (the GPU when present)")
    p.add_argument("--peak-size", type=int, default=None,
                   help="side of the square matmuls of the peak (default: 8192 GPU, 1024 CPU)")  # fmt: skip
    p.add_argument("--out", default=None, help="also write the table here")
    args = p.parse_args(argv)
    if args.quick:
        args.n, args.metrics_n = min(args.n, 4), min(args.metrics_n, 2)
        args.lime_samples = args.lime_samples or 100
    if args.smoke:
        args.n, args.metrics_n = min(args.n, 2), 1
        args.lime_samples = args.lime_samples or 20
        args.peak_size = args.peak_size or 256
    if args.threads:
        torch.set_num_threads(args.threads)
    run(args)
    return 0
