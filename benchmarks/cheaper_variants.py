"""Issue #25: what the opt-in cheaper settings save and what they change, on the default study.

``python -m benchmarks cheaper_variants [--root DIR]`` runs ``saleval-run`` (the defaults)
and ``saleval-run +experiment=cheaper_variants`` (integrated gradients with its steps
chosen by the completeness check, LIME sampling until its top-k is stable) in one output
root — the second run reuses the train run and the seven unchanged methods — and prints:

* per method: the forward passes each example cost (IG: steps run, the completeness
  check's two extra rows aside; LIME: rows sampled) under both settings, and the saving;
* per method: how its explanations moved (mean per-text Spearman of the word scores,
  the share of texts whose top-5 words are the same set);
* per column of the comparison table (the SIMULATED human score and every metric): the
  method's value under both settings and the Spearman correlation of the nine-method
  ranking between the two runs.

``--fixed DIR --cheap DIR`` only compares two finished ``saleval-run`` directories;
``--root DIR --name NAME [overrides]`` adds another cheaper run (other tolerances, say)
to an existing root, reusing everything the two runs share.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import spearmanr

ROOT = Path(__file__).resolve().parents[1]
CHEAPER = ("integrated_gradients", "lime")
#: per method: the diagnostic holding each example's forward passes, and the fixed setting's
PASSES = {"integrated_gradients": "ig_steps_run_mean", "lime": "num_samples_mean"}


def _run(root: Path, name: str, *overrides: str) -> Path:
    run_dir = root / name
    script = Path(sys.executable).parent / "saleval-run"
    cmd = [str(script), f"paths.output_root={root}", f"run_dir={run_dir}", *overrides]
    print(" ".join(cmd), flush=True)
    t0 = time.perf_counter()
    code = subprocess.run(cmd, env={**os.environ, "HF_HUB_OFFLINE": "1"}).returncode
    if code != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {code}")
    print(f"  {name}: {time.perf_counter() - t0:.0f} s", flush=True)
    return run_dir


def passes(fixed: Path, cheap: Path) -> str:
    """Forward passes per example under both settings (the explain runs' diagnostics)."""
    a = pd.read_csv(fixed / "explain" / "method_timings.csv").set_index("method")
    b = pd.read_csv(cheap / "explain" / "method_timings.csv").set_index("method")
    lines = ["| method | passes/example, fixed | passes/example, cheaper | saved | seconds, fixed "
             "| seconds, cheaper |", "| --- | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for m in CHEAPER:
        col = PASSES[m]
        if m not in b.index or col not in b.columns or pd.isna(b.loc[m, col]):
            raise SystemExit(
                f"{cheap / 'explain' / 'method_timings.csv'}: no {col} for {m}; --cheap must be "
                "a run with the cheaper settings (saleval-run +experiment=cheaper_variants)"
            )
        fix = float(a.loc[m, "n_steps_mean"] if m == "integrated_gradients" else a.loc[m, col])
        got = float(b.loc[m, col])
        lines.append(f"| {m} | {fix:.0f} | {got:.1f} | {1 - got / fix:.0%} | "
                     f"{a.loc[m, 'seconds']:.1f} | {b.loc[m, 'seconds']:.1f} |")  # fmt: skip
    return "\n".join(lines)


def explanations(fixed: Path, cheap: Path, k: int = 5) -> str:
    """Per method: mean per-text Spearman of the word scores, and top-k sets kept."""
    a = pd.read_parquet(fixed / "explain" / "attributions.parquet")
    b = pd.read_parquet(cheap / "explain" / "attributions.parquet")
    lines = ["| method | per-text Spearman, mean (min) | same top-5 set |", "| --- | ---: | ---: |"]
    for m in CHEAPER:
        rhos, same = [], []
        for sid, g in a[a["method"] == m].groupby("sample_id"):
            x = g.sort_values("word_index")["score"].to_numpy()
            h = b[(b["method"] == m) & (b["sample_id"] == sid)]
            y = h.sort_values("word_index")["score"].to_numpy()
            if len(x) > 1:
                rhos.append(float(spearmanr(x, y).statistic))
            same.append(
                set(np.argsort(-x, kind="stable")[:k]) == set(np.argsort(-y, kind="stable")[:k])
            )
        lines.append(
            f"| {m} | {np.nanmean(rhos):.3f} ({np.nanmin(rhos):.2f}) | {np.mean(same):.0%} |"
        )
    return "\n".join(lines)


def rankings(fixed: Path, cheap: Path) -> str:
    """Every comparison column: IG's and LIME's values, and the 9-method ranking's Spearman."""
    a = pd.read_csv(fixed / "compare" / "comparison.csv").set_index("method")
    b = pd.read_csv(cheap / "compare" / "comparison.csv").set_index("method").loc[a.index]
    cols = [c for c in a.columns if not c.endswith("_rank") and c != "simulated"]
    head = "| column | " + " | ".join(f"{m}, fixed → cheaper" for m in CHEAPER)
    lines = [head + " | ranking Spearman |", "| --- |" + " ---: |" * (len(CHEAPER) + 1)]
    for c in cols:
        rho = float(spearmanr(a[c], b[c]).statistic)
        vals = " | ".join(f"{a.loc[m, c]:.3f} → {b.loc[m, c]:.3f}" for m in CHEAPER)
        lines.append(f"| {c} | {vals} | {rho:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks cheaper_variants")
    p.add_argument("--root", type=Path, default=None, help="output root (default: a new one)")
    p.add_argument("--fixed", type=Path, default=None, help="a finished saleval-run dir")
    p.add_argument("--cheap", type=Path, default=None, help="the cheaper settings' run dir")
    p.add_argument("--out", type=Path, default=None, help="also write the tables here")
    p.add_argument("--name", default="cheap", help="the cheaper run's directory in the root")
    p.add_argument("rest", nargs="*", help="more overrides for the cheaper run, e.g. "
                   "method.integrated_gradients.convergence_tolerance=0.2")  # fmt: skip
    args = p.parse_args(argv)
    if args.fixed and args.cheap:
        fixed, cheap = args.fixed, args.cheap
    else:
        root = args.root or ROOT / "outputs" / "cheaper_variants" / time.strftime("%Y%m%d-%H%M%S")
        fixed = _run(root, "fixed")
        cheap = _run(root, args.name, "+experiment=cheaper_variants", *args.rest)
    text = "\n\n".join([passes(fixed, cheap), explanations(fixed, cheap), rankings(fixed, cheap)])
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
