"""Issue #25: a study at paper scale, timed per stage, per method and per metric.

``python -m benchmarks paper_scale [--profile lu2024] [--root DIR] [-- saleval-run overrides]``
runs ``saleval-run profile=<profile>`` (default ``lu2024``: the published study's 100 IMDB
samples) in a fresh output root with every core, then prints one markdown table from
what the run recorded: each stage's seconds (``pipeline.json``), each method's seconds
and whether it was reused (the explain run's ``method_timings.csv``), each metric
family's seconds, inputs and new forward passes, hence the probability cache's hit rate
(the metrics run's ``metric_timings.csv``). The host line says which CPU, how many
threads, whether bf16 is native (``bf16: auto`` uses it only then) and the load average
before and after: a figure means little without them (docs/benchmarks.md).

``--from-run DIR`` only builds the table from a finished ``saleval-run`` directory.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]


def host_line() -> str:
    """CPU model, cores, torch threads, native bf16, load average."""
    import torch

    from saleval.modeling.inference import bf16_native

    model = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    native = bf16_native(torch.device("cpu"))
    return (
        f"{model}, {os.cpu_count()} cores, torch {torch.__version__} with "
        f"{torch.get_num_threads()} threads, bf16 {'native' if native else 'emulated'}, "
        f"load average {os.getloadavg()[0]:.1f}"
    )


def table(pipeline_dir: Path) -> str:
    """Markdown tables of one finished ``saleval-run`` directory (module docstring)."""
    info = json.loads((pipeline_dir / "pipeline.json").read_text())
    stages = info["stages"]
    lines = ["| stage | seconds | reused |", "| --- | ---: | --- |"]
    for name, s in stages.items():
        lines.append(f"| {name} | {float(s['seconds']):.1f} | {'yes' if s.get('reused') else ''} |")
    total = sum(float(s["seconds"]) for s in stages.values())
    lines.append(f"| **total** | **{total:.1f}** | |")
    out = ["\n".join(lines)]
    explain = Path(stages["explain"]["run_dir"]) if "explain" in stages else None
    if explain and (explain / "method_timings.csv").is_file():
        m = pd.read_csv(explain / "method_timings.csv")
        rows = ["| method | seconds | examples/s | reused |", "| --- | ---: | ---: | --- |"]
        for r in m.itertuples():
            reused = "yes" if float(getattr(r, "reused", 0) or 0) else ""
            rows.append(
                f"| {r.method} | {r.seconds:.1f} | {r.examples_per_second:.2f} | {reused} |"
            )
        out.append("\n".join(rows))
    metrics = Path(stages["metrics"]["run_dir"]) if "metrics" in stages else None
    if metrics and (metrics / "metric_timings.csv").is_file():
        t = pd.read_csv(metrics / "metric_timings.csv")
        rows = [
            "| metric family | seconds | inputs | new forward passes | served by the cache |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for r in t.itertuples():
            hit = 1 - r.n_forward / r.n_sequences if r.n_sequences else float("nan")
            rows.append(
                f"| {r.metric} | {r.seconds:.1f} | {r.n_sequences} | {r.n_forward} | {hit:.0%} |"
            )
        n, f = int(t["n_sequences"].sum()), int(t["n_forward"].sum())
        rows.append(
            f"| **all** | **{t['seconds'].sum():.1f}** | {n} | {f} | {1 - f / max(n, 1):.0%} |"
        )
        out.append("\n".join(rows))
    return "\n\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks paper_scale")
    p.add_argument("--profile", default="lu2024", help="the saleval-run profile to time")
    p.add_argument("--root", type=Path, default=None, help="output root (default: a new one)")
    p.add_argument("--from-run", type=Path, default=None, help="only tabulate this run dir")
    p.add_argument("--out", type=Path, default=None, help="also write the tables here")
    args, overrides = p.parse_known_args(argv)
    overrides = [o for o in overrides if o != "--"]
    if args.from_run is None:
        root = args.root or ROOT / "outputs" / "paper_scale" / time.strftime("%Y%m%d-%H%M%S")
        before = host_line()
        run_dir = root / "run"
        script = Path(sys.executable).parent / "saleval-run"  # the console script
        cmd = [str(script), f"profile={args.profile}", f"paths.output_root={root}",
               f"run_dir={run_dir}", *overrides]  # fmt: skip
        t0 = time.perf_counter()
        print(" ".join(cmd), flush=True)
        code = subprocess.run(cmd, env={**os.environ, "HF_HUB_OFFLINE": "1"}).returncode
        wall = time.perf_counter() - t0
        if code != 0:
            print(f"saleval-run exited {code} after {wall:.0f} s", file=sys.stderr)
            return code
        head = (f"`saleval-run profile={args.profile}` {' '.join(overrides)}: {wall:.0f} s "
                f"wall.\nHost before: {before}.\nHost after: {host_line()}.")  # fmt: skip
        pipeline_dir = run_dir
    else:
        head, pipeline_dir = f"Run {args.from_run}.", args.from_run
    text = head + "\n\n" + table(pipeline_dir)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
