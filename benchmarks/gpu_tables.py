"""The GPU check's tables (:mod:`benchmarks.gpu`): what each step wrote, as markdown.

A pipeline step's table is read from its run dir and log (a stopped run still has the
stages it finished); the performance step's is the benchmark's own, written row by row.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from benchmarks.gpu_steps import Outcome, Step, shown

_STAGE_LINE = re.compile(r"^\[saleval-run\] (\w+)\s+(ran|reused|given)\s+([\d.]+)? ?s?")


def stage_times(run_dir: Path, log: str) -> list[tuple[str, float, str]]:
    """(stage, seconds, how) of every finished stage: ``pipeline.json``, else the log lines
    ``saleval-run`` prints as each stage ends (a stopped run writes no pipeline.json)."""
    pipeline = run_dir / "pipeline.json"
    if pipeline.is_file():
        stages = json.loads(pipeline.read_text())["stages"]
        return [
            (name, float(s["seconds"]), "reused" if s.get("reused") else "ran")
            for name, s in stages.items()
        ]
    out = []
    for line in log.splitlines():
        m = _STAGE_LINE.match(line.strip())
        if m:
            out.append((m.group(1), float(m.group(3) or 0.0), m.group(2)))
    return out


def pipeline_tables(step: Step, outcome: Outcome, log: Path) -> str:
    """Per-stage seconds, per-method seconds, per-metric-family seconds and forward passes,
    the training figures, and the method ranking (beside the published crowd's where the
    dataset is one of the published studies)."""
    import pandas as pd

    assert step.run_dir is not None
    run_dir = step.run_dir
    text = log.read_text(errors="replace") if log.is_file() else ""
    parts = [head(step, outcome)]
    stages = stage_times(run_dir, text)
    if stages:
        rows = ["| stage | seconds | |", "| --- | ---: | --- |"]
        rows += [f"| {s} | {sec:.1f} | {how} |" for s, sec, how in stages]
        rows.append(f"| **total** | **{sum(sec for _, sec, _ in stages):.1f}** | |")
        parts.append("\n".join(rows))
    else:
        parts.append("No stage finished.")
    train = run_dir / "train" / "metrics.json"
    if train.is_file():
        t = json.loads(train.read_text())
        parts.append(
            f"Training: {t.get('epochs')} epochs, {t.get('steps')} steps over "
            f"{t.get('n_train')} texts in {float(t.get('seconds', 0)):.1f} s of fit; "
            f"validation accuracy {float(t.get('val_accuracy', 0)):.3f}, test accuracy "
            f"{float(t.get('test_accuracy', 0)):.3f} ({t.get('n_test')} texts); "
            f"bf16 training {'yes' if t.get('bf16_training') else 'no'}."
        )
    timings = run_dir / "explain" / "method_timings.csv"
    if timings.is_file():
        m = pd.read_csv(timings)
        rows = ["| method | seconds | texts/s | bf16 |", "| --- | ---: | ---: | ---: |"]
        for r in m.to_dict("records"):
            bf16 = r.get("bf16_mean")
            rows.append(
                f"| {r['method']} | {float(r['seconds']):.2f} | "
                f"{float(r['examples_per_second']):.2f} | "
                f"{'' if bf16 is None or pd.isna(bf16) else f'{float(bf16):.0f}'} |"
            )
        parts.append("\n".join(rows))
    families = run_dir / "metrics" / "metric_timings.csv"
    if families.is_file():
        t = pd.read_csv(families)
        rows = ["| metric family | seconds | inputs | new forward passes |",
                "| --- | ---: | ---: | ---: |"]  # fmt: skip
        rows += [
            f"| {r.metric} | {r.seconds:.1f} | {r.n_sequences} | {r.n_forward} |"
            for r in t.itertuples()
        ]
        rows.append(
            f"| **all** | **{t['seconds'].sum():.1f}** | {int(t['n_sequences'].sum())} "
            f"| {int(t['n_forward'].sum())} |"
        )
        parts.append("\n".join(rows))
    ranking = ranking_table(run_dir)
    if ranking:
        parts.append(ranking)
    return "\n\n".join(parts) + "\n"


def ranking_table(run_dir: Path) -> str:
    """The (SIMULATED) method scores s_j and ranks of the run's score stage, beside the
    published crowd's on the same samples where ``pipeline.json`` has them."""
    import pandas as pd

    scores = run_dir / "score" / "scores.csv"
    if not scores.is_file():
        return ""
    ours = pd.read_csv(scores).sort_values("score", ascending=False)
    published: dict[str, Any] = {}
    pipeline = run_dir / "pipeline.json"
    if pipeline.is_file():
        published = json.loads(pipeline.read_text()).get("published_ranking") or {}
    theirs = published.get("published") or {}
    their_rank = {m: i + 1 for i, m in enumerate(sorted(theirs, key=lambda m: -theirs[m]))}
    head = "| method | s_j ours (SIMULATED) | rank |"
    rows = [head + (" s_j published (people) | rank |" if theirs else ""),
            "| --- | ---: | ---: |" + (" ---: | ---: |" if theirs else "")]  # fmt: skip
    for i, r in enumerate(ours.itertuples(), start=1):
        rank = int(r.rank) if "rank" in ours.columns else i  # the score stage's, ties shared
        row = f"| {r.method} | {float(r.score):.1f} | {rank} |"
        if theirs:
            p = theirs.get(str(r.method))
            row += " — | — |" if p is None else f" {p:.1f} | {their_rank[str(r.method)]} |"
        rows.append(row)
    out = "\n".join(rows)
    if published:
        rho = published.get("spearman")
        out += (
            f"\n\nSpearman's rho of the two rankings over the {len(published.get('methods', []))} "
            f"methods both have: {'n/a' if rho is None else f'{rho:.2f}'} (ranks above: "
            "ours over every method of the run, published over the methods both have)."
        )
    return out


def performance_table(step: Step, outcome: Outcome, log: Path) -> str:
    """The benchmark's own table (written row by row to ``step.out_name``) under a head."""
    own = step.run_dir / step.out_name if step.run_dir else None
    body = own.read_text() if own and own.is_file() else "No row finished.\n"
    return head(step, outcome) + "\n\n" + body


def head(step: Step, outcome: Outcome) -> str:
    return (
        f"### {step.key}. {step.title}\n\n{outcome.status}, {outcome.seconds:.0f} s of "
        f"{outcome.limit:.0f} s allowed (budget {outcome.budget:.0f} s)"
        + (f"; {outcome.note}" if outcome.note else "")
        + f".\n\n`{shown(step.command)}`"
    )
