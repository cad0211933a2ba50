"""Per-method reuse between explain runs (saleval.attribution.reuse, docs/methods.md#reuse):
a sweep over one method's settings computes every other method once."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from saleval.pipeline import tables
from saleval.stages import explain

BASE = [
    "data.n_samples=6",
    "method=[random,vanilla_gradient,lime]",
    "method.lime.num_samples=20",
    "trainer=cpu",
    "progress=false",
    "view.samples=0",
]


def _run(make_cfg, tiny_train_run: Path, out: Path, name: str, *extra: str) -> Path:
    cfg = make_cfg(
        "explain",
        [f"inputs.model={tiny_train_run}", f"paths.output_root={out}", *BASE, *extra],
        name=name,
    )
    return Path(explain.run(cfg)["run_dir"])


def _timings(run_dir: Path) -> pd.Series:
    return pd.read_csv(run_dir / explain.TIMINGS).set_index("method")["reused"]


@pytest.mark.slow
def test_a_sweep_recomputes_only_the_method_it_varies(
    make_cfg, tiny_train_run: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv(explain.REUSE_ENV, "1")
    out = tmp_path / "out"
    first = _run(make_cfg, tiny_train_run, out, "a")
    assert _timings(first).eq(0).all()  # nothing stored yet
    second = _run(make_cfg, tiny_train_run, out, "b", "method.lime.num_samples=30")
    assert _timings(second).to_dict() == {"random": 1.0, "vanilla_gradient": 1.0, "lime": 0.0}
    a, b = tables.ATTRIBUTIONS.read(first), tables.ATTRIBUTIONS.read(second)
    same = ["random", "vanilla_gradient"]
    pd.testing.assert_frame_equal(
        a[a["method"].isin(same)].reset_index(drop=True),
        b[b["method"].isin(same)].reset_index(drop=True),
    )
    assert b["method"].unique().tolist() == ["random", "vanilla_gradient", "lime"]  # config order
    assert (
        not a[a["method"] == "lime"]["score"]
        .reset_index(drop=True)
        .equals(b[b["method"] == "lime"]["score"].reset_index(drop=True))
    )
    # other samples: nothing matches, everything is computed
    third = _run(make_cfg, tiny_train_run, out, "c", "data.n_samples=5")
    assert _timings(third).eq(0).all()
    # reuse off: the same numbers, computed
    monkeypatch.setenv(explain.REUSE_ENV, "0")
    fourth = _run(make_cfg, tiny_train_run, out, "d")
    assert "reused" not in pd.read_csv(fourth / explain.TIMINGS).columns
    c = tables.ATTRIBUTIONS.read(fourth)
    pd.testing.assert_series_equal(a["score"], c["score"], rtol=1e-5, atol=1e-7)
