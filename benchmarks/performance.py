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
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.common import Timing, agreement, compose, setup, speedups, timed
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
from saleval.attribution import REGISTRY, build_method
from saleval.attribution import attention as A
from saleval.attribution import perturbation as P
from saleval.metrics import faithfulness as F
from saleval.metrics.config import MetricsConfig
from saleval.modeling import inference

FAMILIES = (
    "full_text",
    F.COMPREHENSIVENESS,
    F.SUFFICIENCY,
    F.AOPC_MOST,
    F.AOPC_LEAST,
    F.SWITCHING_POINT,
    F.LOG_ODDS_DROP,
)
TOTAL_TARGET = 10.0  # engine ≥ 10× the naive loop, nine methods end to end
BOUND_TARGET = 2.0  # gradient methods within 2× of the compute bound
PLAIN_TARGET = 1.5  # LIME / perturbation metrics within 1.5× of plain batched inference
NAIVE_FLOOR = 1.0  # every method but random at least as fast as the naive loop (issue #25)


def family(kind: str) -> str:
    """The module of :mod:`saleval.attribution` a registered method's class lives in:
    ``gradient`` (timed against the compute bound), ``perturbation`` (against plain
    inference over the inputs it sent through ``forward_logits``), ``attention``, ``random``."""
    return REGISTRY[kind].__module__.rpartition(".")[2]


# ---------------------------------------------------------------------------------
# the table
# ---------------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the table; ratios are engine speed ÷ other speed (or time ÷ bound)."""

    name: str
    n: int
    engine: Timing
    naive: Timing | None = None
    ferret: Timing | None = None
    ferret_note: str = ""
    bound: tuple[float, float] | None = None  # compute bound seconds (wall, CPU)
    plain: Timing | None = None  # plain batched inference over the same inputs
    agree: str = ""
    notes: list[str] = field(default_factory=list)
    padding: float | None = None  # padded share of the engine's token slots

    def target(self) -> str:
        if self.name.startswith("nine methods"):
            return f"≥ {TOTAL_TARGET:g}× naive"
        if self.bound is not None:
            return f"≤ {BOUND_TARGET:g}× compute bound"
        if self.plain is not None:
            return f"≤ {PLAIN_TARGET:g}× plain inference"
        return "—"

    def met(self) -> str:
        if self.name.startswith("nine methods") and self.naive:
            w, c = speedups(self.engine, self.naive)
            return verdict(w >= TOTAL_TARGET, c >= TOTAL_TARGET)
        if self.bound is not None:
            w, c = self.engine.wall / self.bound[0], self.engine.cpu / self.bound[1]
            return verdict(w <= BOUND_TARGET, c <= BOUND_TARGET)
        if self.plain is not None:
            w, c = self.engine.wall / self.plain.wall, self.engine.cpu / self.plain.cpu
            return verdict(w <= PLAIN_TARGET, c <= PLAIN_TARGET)
        return ""


def verdict(wall_ok: bool, cpu_ok: bool) -> str:
    if wall_ok and cpu_ok:
        return "**met**"
    if not wall_ok and not cpu_ok:
        return "**missed**"
    return "met (wall)" if wall_ok else "met (CPU time only)"


def _metrics_cfg() -> MetricsConfig:
    cfg = compose(["inputs.model=x", "inputs.explain=x"], "metrics")
    return MetricsConfig.from_config(cfg.metrics)


# ---------------------------------------------------------------------------------
# compute bound
# ---------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------
# recording the perturbed inputs the engine ran (to replay them as plain inference)
# ---------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------
# metrics: naive per-explanation loop
# ---------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------
# ferret (separate venv, subprocess)
# ---------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------


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


def run(args: argparse.Namespace) -> list[Row]:
    device = resolve_device(args.device)
    s = setup(args.n, device)
    mcfg = _metrics_cfg()
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
    nine = list(s.method_cfg)  # the explain stage's default methods (conf/explain.yaml)
    methods = [m for m in nine if not args.only or m in args.only]

    # the device's matmul peak (large square products), then GEMM throughput on the
    # model's own shapes (best of 3; the strictest bound)
    matmul = {
        label: matmul_peak(dtype, device, args.peak_size)
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
    flops_all = sum(forward_flops(cfg, L) for L in lengths)
    head = f"{n} AG News test texts on {device_line(device)}."

    def save_partial(done: list[Row]) -> None:
        """The table so far, in ``--out``: a run stopped from outside (a time limit) keeps
        the rows it finished."""
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            text = render(done, n, peak, "", matmul)
            Path(args.out).write_text(f"{head} **Partial: the run has not finished.**\n\n{text}\n")

    rows: list[Row] = []
    engine_scores: dict[str, list[np.ndarray]] = {}
    for kind in methods:
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
        engine_scores[kind] = scores
        row = Row(kind, n, t_eng, padding=pads.fraction if pads.real else None)
        if family(kind) == "perturbation":
            row.plain = replay(s.model, calls)
            row.notes.append(f"{row.plain.n} perturbed inputs")
        if family(kind) == "gradient":
            passes = tally["passes"] / k
            flops = passes * flops_all
            row.bound = (flops / peak["fp32"][0], flops / peak["fp32"][1])
            row.notes.append(f"{passes:.0f} forward-equivalent passes/example")
        if not args.no_naive:
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
        rows.append(row)
        print_row(row, flush=True)
        save_partial(rows)

    # opt-in: the forward-only methods with bf16 autocast (not the default: scores move)
    if args.bf16:
        for kind in [m for m in methods if family(m) == "perturbation"]:
            m = build_method({**settings[kind], "bf16": True}, kind)
            m.attribute(s.model, s.tok, s.segs[:2], s.targets[:2])  # warm-up
            with recording(P, "forward_logits") as calls:
                t_b, scores_b = timed(lambda m=m: m.attribute(s.model, s.tok, s.segs, s.targets), n)
            fp32 = next(r for r in rows if r.name == kind)
            row = Row(
                f"{kind} (bf16: true)", n, t_b, naive=fp32.naive, plain=replay(s.model, calls)
            )
            row.agree = agreement(engine_scores[kind], scores_b) + " vs fp32"
            row.notes.append("naive column: the fp32 naive loop")
            rows.append(row)
            print_row(row, flush=True)
            save_partial(rows)

    # metrics on the first metrics_n samples × every method's scores
    mn = min(args.metrics_n, n)
    items = [
        F.Explanation(str(i), kind, s.segs[i], engine_scores[kind][i])
        for kind in methods
        for i in range(mn)
    ]
    metric_rows: list[Row] = []
    if not args.no_metrics and items:
        F.evaluate(s.model, s.tok, items[:2], mcfg)  # warm-up
        with recording(inference, "predict_proba") as calls:
            t_all, res = timed(lambda: F.evaluate(s.model, s.tok, items, mcfg), len(items))
        by_desc: dict[str, list[Any]] = {}  # the cache's calls per family ("desc")
        for c in calls:
            desc = str(c[1].get("desc"))
            by_desc.setdefault("full_text" if desc == "full texts" else desc, []).append(c)
        naive_t: dict[str, Timing] = {}
        naive_vals: dict[tuple[str, str, str, str], float] = {}
        if not args.no_naive_metrics:
            with inference.attention_implementation(s.model, "sdpa"):
                naive_t, naive_vals = naive_metrics(s, items, mcfg)
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
            metric_rows.append(row)
        if naive_vals:
            eng_vals = {
                (r.sample_id, r.method, r.metric, r.k): r.value
                for r in res.per_example.itertuples()
                if (r.sample_id, r.method, r.metric, r.k) in naive_vals
            }
            diff = max(abs(eng_vals[k] - naive_vals[k]) for k in eng_vals)
        total = Row("metrics: all families", len(items), t_all)
        if naive_vals:
            total.agree = f"{diff:.0e} (abs, {len(eng_vals)} metric values)"
        total.plain = replay(s.model, calls)
        total.padding = padded_share(calls)
        if naive_t:
            total.naive = sum(naive_t.values(), Timing(0, 0, len(items)))
        metric_rows.append(total)
        if args.bf16:
            cfg16 = dataclasses.replace(
                mcfg, inference=dataclasses.replace(mcfg.inference, bf16="true")
            )
            with recording(inference, "predict_proba") as calls16:
                t16, res16 = timed(lambda: F.evaluate(s.model, s.tok, items, cfg16), len(items))
            row = Row("metrics: all families (bf16: true)", len(items), t16, naive=total.naive)
            row.plain = replay(s.model, calls16)
            a, b = res.per_example["value"].to_numpy(), res16.per_example["value"].to_numpy()
            row.agree = f"{np.nanmax(np.abs(a - b)):.0e} (abs) vs fp32"
            metric_rows.append(row)
        for row in metric_rows:
            print_row(row, flush=True)
        save_partial(rows + metric_rows)

    # ferret
    ferret, why = (None, "not run (--no-ferret)")
    if device.type != "cpu":
        why = f"not run on {device.type}: the ferret side runs on the CPU in its own venv"
    elif not args.no_ferret:
        ferret, why = run_ferret(
            s, min(args.ferret_n or n, n), mn, mn * len(methods), settings["lime"]["num_samples"],
            int(settings["integrated_gradients"]["n_steps"]), args.ferret_python,
            args.ferret_timeout,
        )  # fmt: skip
    fmap = {
        "vanilla_gradient": "gradient",
        "input_x_gradient": "gradient_x_input",
        "integrated_gradients": "integrated_gradients_x_input",
        "lime": "lime",
        "occlusion": "leave_one_out",
        f"metric: {F.COMPREHENSIVENESS}": "aopc_comprehensiveness",
        f"metric: {F.SUFFICIENCY}": "aopc_sufficiency",
    }
    for row in rows + metric_rows:
        key = fmap.get(row.name)
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

    # nine methods end to end (the fp32 defaults; bf16 rows follow it)
    base = [r for r in rows if r.name in nine]
    if len(base) > 1:
        name = "nine methods end to end" if len(base) == 9 else f"{len(base)} methods total"
        tot = Row(name, n, sum((r.engine for r in base), Timing(0, 0, n)))
        if all(r.naive for r in base):
            tot.naive = sum((r.naive for r in base if r.naive), Timing(0, 0, n))
        rows.insert(len(base), tot)
    table = render(rows + metric_rows, n, peak, why if ferret is None else "", matmul)
    table += f"\nLoad average at the end: {os.getloadavg()[0]:.1f} ({os.cpu_count()} cores)."
    print(table)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(f"{head}\n\n{table}\n")
    return rows + metric_rows


def _ratio(engine: Timing, other: Timing | None) -> str:
    if other is None:
        return "—"
    w, c = speedups(engine, other)
    return f"{w:.1f}× / {c:.1f}×"


def print_row(row: Row, flush: bool = True) -> None:
    bits = [f"  {row.name:32s} engine {row.engine.rate:9.2f} ex/s"]
    if row.naive:
        bits.append(f"naive {row.naive.rate:9.2f} ex/s  ×{_ratio(row.engine, row.naive)}")
    if row.bound:
        bits.append(
            f"÷bound {row.engine.wall / row.bound[0]:.2f}/{row.engine.cpu / row.bound[1]:.2f}"
        )
    if row.plain:
        bits.append(
            f"÷plain {row.engine.wall / row.plain.wall:.2f}/{row.engine.cpu / row.plain.cpu:.2f}"
        )
    if row.padding is not None:
        bits.append(f"padded {row.padding:.1%}")
    if row.agree:
        bits.append(f"Δ {row.agree}")
    print("   ".join(bits + row.notes), flush=flush)


def naive_floor(rows: list[Row]) -> str:
    """The floor every method but ``random`` must clear: at least as fast as the naive loop
    (wall and CPU time) in the same run; ``random`` draws numbers and has no loop to beat."""
    methods = [r for r in rows if r.naive and r.name in REGISTRY and r.name != "random"]
    below = [r for r in methods if min(speedups(r.engine, r.naive)) < 1.0]  # type: ignore[arg-type]
    verdict = (
        "met"
        if not below
        else "missed (" + ", ".join(f"{r.name} {_ratio(r.engine, r.naive)}" for r in below) + ")"
    )
    return (
        f"Every method but random at ≥ {NAIVE_FLOOR:g}× the naive loop (wall and CPU), "
        f"{len(methods)} compared: **{verdict}**."
    )


def render(
    rows: list[Row],
    n: int,
    peak: dict[str, tuple[float, float]],
    ferret_why: str,
    matmul: dict[str, float] | None = None,
) -> str:
    head = (
        "| method / metric | n | engine ex/s | naive ex/s | engine vs naive (wall / CPU) "
        "| ferret ex/s | engine vs ferret (wall / CPU) | ÷ compute bound (wall / CPU) "
        "| ÷ plain inference (wall / CPU) | padded tokens | target | met? |\n"
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"
    )
    lines = [head]
    for r in rows:
        bound = (
            f"{r.engine.wall / r.bound[0]:.2f} / {r.engine.cpu / r.bound[1]:.2f}"
            if r.bound
            else "—"
        )
        plain = (
            f"{r.engine.wall / r.plain.wall:.2f} / {r.engine.cpu / r.plain.cpu:.2f}"
            if r.plain
            else "—"
        )
        fer = (
            f"{r.ferret.rate:.2f}" + (f" ({r.ferret_note})" if r.ferret_note else "")
            if r.ferret
            else "—"
        )
        lines.append(
            f"| {r.name} | {r.n} | {r.engine.rate:.2f} | "
            f"{f'{r.naive.rate:.2f}' if r.naive else '—'} | {_ratio(r.engine, r.naive)} | "
            f"{fer} | {_ratio(r.engine, r.ferret)} | {bound} | {plain} | "
            f"{'—' if r.padding is None else f'{r.padding:.1%}'} | {r.target()} "
            f"| {r.met()} |"
        )
    foot = [
        "",
        f"Compute bound: fp32 GEMM peak {peak['fp32'][0] / 1e9:.1f} GFLOP/s wall "
        f"({peak['fp32'][1] / 1e9:.1f} per CPU-second); bf16 {peak['bf16'][0] / 1e9:.1f} "
        f"({peak['bf16'][1] / 1e9:.1f}). engine vs X > 1× = engine faster; ÷ bound / plain "
        "= engine time over that floor.",
    ]
    if matmul:
        foot.append(
            f"Matmul peak of the device (square products, this run): fp32 "
            f"{matmul['fp32'] / 1e12:.2f} TFLOP/s, bf16 {matmul['bf16'] / 1e12:.2f} TFLOP/s."
        )
    foot.append(naive_floor(rows))
    foot += [f"{r.name}: {'; '.join(r.notes)}." for r in rows if r.notes]
    agree = [f"{r.name} {r.agree}" for r in rows if r.agree]
    if agree:
        foot.append(
            "Largest difference of engine and naive scores (÷ largest score): "
            + ", ".join(agree)
            + "."
        )
    if ferret_why:
        foot.append(f"ferret: {ferret_why}")
    return "\n".join(lines + foot)


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
