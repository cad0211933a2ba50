"""The performance benchmark's table (:mod:`benchmarks.performance`): one row per method
and metric family, the engine's speed beside the naive loop's, ferret's, the compute
bound and plain batched inference, each against its target."""

from __future__ import annotations

from dataclasses import dataclass, field

from benchmarks.common import Timing, speedups
from saleval.attribution import REGISTRY

TOTAL_TARGET = 10.0  # engine ≥ 10× the naive loop, nine methods end to end
BOUND_TARGET = 2.0  # gradient methods within 2× of the compute bound
PLAIN_TARGET = 1.5  # LIME / perturbation metrics within 1.5× of plain batched inference
NAIVE_FLOOR = 1.0  # every method but random at least as fast as the naive loop (issue #25)


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
