"""Sweep dirs for tests: a directory laid out as a Hydra ``-m`` run, whose jobs are explain
runs written by the pipeline's own writers, and the tasks config that reads them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from omegaconf import DictConfig

from saleval.testing import explain_frames, make_explain_run

LABELS = ["World", "Sports", "Business", "Sci/Tech"]  # conf/dataset/ag_news.yaml


def fake_sweep(root: Path, jobs: Sequence[Callable[[Path], Path]]) -> Path:
    """A dir laid out as a Hydra ``-m`` run: ``multirun.yaml`` and one dir per job."""
    root.mkdir(parents=True)
    (root / "multirun.yaml").write_text("hydra: {}\n")
    for i, make in enumerate(jobs):
        make(root / str(i))
    return root


def explain_job(methods: Sequence[str], n: int = 6, dataset: str = "ag_news", seed: int = 0):
    def make(run_dir: Path) -> Path:
        labels = LABELS if dataset == "ag_news" else ["negative", "positive"]
        # every job draws the same methods, so jobs of one seed hold the same texts
        preds, attrs = explain_frames(n, labels, methods=["random", "lime"], seed=seed)
        attrs = attrs[attrs["method"].isin(list(methods))]
        return make_explain_run(run_dir, preds, attrs, dataset)

    return make


def tasks_cfg(make_cfg: Callable[..., DictConfig], explain: str, name: str) -> DictConfig:
    return make_cfg(
        "tasks",
        [
            f"inputs.explain={explain}",
            "study.n_samples=4",
            "study.population=correct",
            "study.balance_by=none",
            "study.methods=[random,lime]",
            "study.bundle_size=4",
            "study.repeats=1",
            "kgrid.ks=[5]",
        ],
        name=name,
    )
