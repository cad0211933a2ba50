"""Crowd results end to end: the importer's error report, the round trip hand-made task
run + answers → saleval-import → saleval-score, and the published lu2024 files."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig

from saleval import paths
from saleval.crowd.errors import CrowdImportError
from saleval.crowd.importing.long_format import read_answers
from saleval.crowd.importing.published_format import read_lu2024
from saleval.crowd.importing.rows import sha256_file
from saleval.pipeline import tables
from saleval.pipeline.records.input_paths import InputError
from saleval.pipeline.tracker.tracking_reads import method_rows
from saleval.stages import import_, score
from tests.conftest import DATA_ROOT, compose_config
from tests.crowd_support import (
    COMBOS,
    LABELS,
    SAMPLES,
    hand_made_answers,
    hand_made_task_id,
    hand_made_task_run,
)

PUBLISHED = DATA_ROOT / "published" / "lu2024"


@pytest.fixture
def task_run(tmp_path: Path) -> Path:
    return hand_made_task_run(tmp_path)


# --- importer error report -------------------------------------------------------------


BROKEN = """worker_id,task_id,answer,started_at,submitted_at
w1,s0-vanilla_gradient-k2,negative,2024-05-01T12:00:00Z,2024-05-01T12:00:30Z
w1,nope,negative,2024-05-01T12:01:00Z,2024-05-01T12:01:30Z
w1,s1-random-k2,maybe,2024-05-01T12:02:00Z,2024-05-01T12:02:30Z
w1,s0-vanilla_gradient-k2,positive,2024-05-01T12:03:00Z,2024-05-01T12:03:30Z
w1,s0-random-k5,negative,2024-05-01T12:04:00Z,2024-05-01T12:04:30Z
w2,s2-random-k2,positive,yesterday,2024-05-01T12:05:30Z
w2,s3-random-k5,positive,2024-05-01T12:06:00Z,2024-05-01T12:05:00Z
,s1-random-k5,positive,2024-05-01T12:07:00Z,2024-05-01T12:07:30Z
w2,s1-random-k2
w2,s1-random-k2,I DON'T KNOW,2024-05-01T12:08:00+02:00,2024-05-01T12:08:09+02:00
"""


def test_importer_reports_every_problem_with_file_row_field(task_run: Path, tmp_path: Path) -> None:
    path = tmp_path / "broken.csv"
    path.write_text(BROKEN)
    tasks, bundles = tables.TASKS.read(task_run), tables.BUNDLES.read(task_run)
    accepted, rejects, info = read_answers(path, tasks, bundles, LABELS)
    got = [(r.row, r.field) for r in rejects.itertuples()]
    assert got == [
        (2, "task_id"),  # unknown task
        (3, "answer"),  # unknown label
        (4, "task_id"),  # duplicate answer
        (5, "task_id"),  # same sample s0 twice
        (6, "started_at"),  # malformed time
        (7, "submitted_at"),  # submitted before started
        (8, "worker_id"),  # empty worker
        (9, "*"),  # wrong number of fields
    ]
    problems = rejects["problem"].tolist()
    assert "unknown task 'nope'" in problems[0]
    assert "unknown label 'maybe'" in problems[1] and "I don't know" in problems[1]
    assert "first at row 1" in problems[2]
    assert "already answered sample 's0'" in problems[3]
    assert set(rejects["file"]) == {str(path)}
    # nothing lost: every data row is accepted or rejected, never both
    assert set(accepted["row"]) == {1, 10}
    assert set(accepted["row"]) | set(rejects["row"]) == set(range(1, info["n_rows"] + 1))
    assert accepted.set_index("row").loc[10, "answer_code"] == 0
    assert accepted.set_index("row").loc[10, "duration_s"] == 9.0


def test_missing_column_is_one_clear_error(task_run: Path, tmp_path: Path) -> None:
    path = tmp_path / "a.csv"
    path.write_text("worker_id,task_id,started_at,submitted_at\nw1,s0-random-k2,x,y\n")
    with pytest.raises(CrowdImportError, match=r"a\.csv, row header, field answer: missing column"):
        read_answers(path, tables.TASKS.read(task_run), None, LABELS)
    path.write_text("worker_id,task_id,answer\nw1,s0-random-k2,negative\n")
    with pytest.raises(CrowdImportError, match="started_at/submitted_at or duration_s"):
        read_answers(path, tables.TASKS.read(task_run), None, LABELS)


def test_bundle_and_position_resolve_tasks_and_one_bundle_per_worker(
    task_run: Path, tmp_path: Path
) -> None:
    path = tmp_path / "a.csv"
    path.write_text(
        "worker_id,bundle_id,position,answer,duration_s\n"
        "w1,b00,0,negative,3\n"  # s0 vanilla_gradient k2
        "w1,b00,9,negative,3\n"  # no such position
        "w1,b01,1,negative,3\n"  # a second bundle
        "w1,b00,1,positive,-2\n"  # negative duration
    )
    accepted, rejects, _ = read_answers(
        path, tables.TASKS.read(task_run), tables.BUNDLES.read(task_run), LABELS
    )
    assert accepted["task_id"].tolist() == ["s0-vanilla_gradient-k2"]
    assert [(r.row, r.field) for r in rejects.itertuples()] == [
        (2, "position"),
        (3, "bundle_id"),
        (4, "duration_s"),
    ]


_CORRUPTIONS = {
    "label": ("answer", "Politics"),
    "task": ("task_id", "no-such-task"),
    "time": ("started_at", "12:00 o'clock"),
    "worker": ("worker_id", ""),
    "index": ("answer", "7"),
}


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    corrupt=st.dictionaries(st.integers(0, 47), st.sampled_from(sorted(_CORRUPTIONS)), max_size=20),
    dupes=st.lists(st.integers(0, 47), max_size=5),
)
def test_generated_bad_rows_nothing_lost_in_report_mode(
    task_run: Path, tmp_path: Path, corrupt: dict[int, str], dupes: list[int]
) -> None:
    tasks, bundles = tables.TASKS.read(task_run), tables.BUNDLES.read(task_run)
    answers = hand_made_answers(bundles[~bundles["is_gold"]], spam=False)  # 48 valid rows
    for i, kind in corrupt.items():
        fld, value = _CORRUPTIONS[kind]
        answers.loc[i, fld] = value
    answers = pd.concat([answers, answers.iloc[dupes]], ignore_index=True)
    path = tmp_path / "gen.csv"
    answers.to_csv(path, index=False)
    accepted, rejects, info = read_answers(path, tasks, bundles, LABELS)
    good = set(range(1, 49)) - {i + 1 for i in corrupt}
    assert set(accepted["row"]) == good
    assert set(rejects["row"]) == set(range(1, info["n_rows"] + 1)) - good
    fields = rejects.groupby("row")["field"].apply(set)
    for i, kind in corrupt.items():
        assert _CORRUPTIONS[kind][0] in fields[i + 1]


# --- stages: round trip ------------------------------------------------------------------


def _import(
    make_cfg: Callable[..., DictConfig], overrides: list[str], name: str = "import"
) -> dict:
    return import_.run(make_cfg("import", overrides, name=name))


def test_round_trip_answers_import_score(
    task_run: Path, tmp_path: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    bundles = tables.BUNDLES.read(task_run)
    answers = tmp_path / "export" / "answers.csv"
    answers.parent.mkdir()
    hand_made_answers(bundles).to_csv(answers, index=False)
    expert = tmp_path / "expert.csv"  # experts: right on s0's tasks, wrong on s1's
    expert.write_text(
        "task_id,answer\n"
        + "".join(f"{hand_made_task_id('s0', m, k)},negative\n" for m, k in COMBOS)
        + "".join(f"{hand_made_task_id('s1', m, k)},I don't know\n" for m, k in COMBOS)
    )
    out = _import(
        make_cfg,
        [f"inputs.tasks={task_run}", f"inputs.answers={answers}", f"crowd.expert.path={expert}"],
    )
    run = Path(out["run_dir"])
    for f in ("annotations.parquet", "aggregated.csv", "rejects.csv", "import_report.json"):
        assert (run / f).is_file(), f
    report = json.loads((run / "import_report.json").read_text())
    assert report["simulated"] is False and report["n_rejected_rows"] == 0
    assert report["source"]["sha256"] == sha256_file(answers)
    assert report["dataset"] == "imdb"
    speed = report["filters"][0]
    assert (speed["name"], speed["workers"], speed["n_answers"]) == (
        "min_bundle_seconds",
        ["spammer"],
        5,
    )
    ann = tables.ANNOTATIONS.read(run)
    assert len(ann) == 60 and "spammer" not in set(ann["worker_id"])
    agg = tables.AGGREGATED.read(run).set_index(["sample_id", "method", "k"])
    assert len(agg) == 16 and (agg["n_answers"] == 3).all()
    # vanilla_gradient: 3/3 correct; random k=2: 3/3 wrong label; random k=5: 2 wrong + 1 IDK
    assert agg.xs("vanilla_gradient", level="method")["correct"].eq(1).all()
    assert agg.xs("random", level="method")["correct"].eq(0).all()
    assert report["agreement"]["krippendorff_alpha"] is not None
    # crowd correct exactly on vanilla_gradient: agrees with experts on s0's 2 vanilla
    # tasks and on s1's 2 random tasks → 4 of 8
    assert report["expert"] == {
        "n_tasks": 8,
        "agreement": 0.5,
        "expert_accuracy": 0.5,
        "crowd_accuracy": 0.5,
    }

    sc = score.run(make_cfg("score", [f"inputs.crowd={run}"], name="score"))
    srun = Path(sc["run_dir"])
    for f in (
        "accuracy.csv",
        "scores.csv",
        "flips.csv",
        "scores.md",
        "scores.tex",
        "accuracy_vs_k.png",
        "flip_histogram.png",
        "aggregated.csv",
    ):
        assert (srun / f).is_file(), f
    scores = tables.SCORES.read(srun).set_index("method")
    # p = [[1, 1], [0, 0]]: Σ = 2, columns 1 and 1, K² = 4 → w = 0.5, s = 100 and 0
    assert scores["score"].to_dict() == pytest.approx({"vanilla_gradient": 100.0, "random": 0.0})
    assert scores["rank"].to_dict() == {"vanilla_gradient": 1, "random": 2}
    flips = tables.FLIPS.read(srun).set_index("method")
    assert (
        flips.loc["vanilla_gradient", "flips"] == 0 and flips.loc["vanilla_gradient", "aids"] == 0
    )
    assert flips.loc["random", "aids"] == 4  # never recognised: counted as aids (docs/scores.md)
    assert "SIMULATED" not in (srun / "scores.md").read_text()
    client = MlflowClient()
    srun_info = client.get_run(sc["run_id"])
    assert srun_info.data.tags["stage"] == "score"
    assert srun_info.data.tags["parent.crowd"] == out["run_id"]
    rows = method_rows(sc["run_id"]).set_index("method")
    assert rows.loc["vanilla_gradient", "human_score"] == pytest.approx(100.0)
    assert rows.loc["random", "accuracy_k5"] == 0.0
    irun = client.get_run(out["run_id"])
    assert (
        irun.data.tags["stage"] == "import"
        and irun.data.tags["answers_sha256"] == report["source"]["sha256"]
    )
    assert irun.data.metrics["filter_min_bundle_seconds_workers"] == 1.0


def test_simulated_answers_are_marked_everywhere(
    task_run: Path, tmp_path: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    sim = tmp_path / "simulate_run"
    sim.mkdir()
    hand_made_answers(tables.BUNDLES.read(task_run), spam=False).assign(simulated=True).to_csv(
        sim / "answers.csv", index=False
    )
    (sim / "run.json").write_text(
        json.dumps({"run_id": "sim-run", "simulated": "true", "status": "FINISHED"})
    )
    (sim / "config.yaml").write_text("seed: 1\n")
    out = _import(make_cfg, [f"inputs.tasks={task_run}", f"inputs.answers={sim}"])
    run = Path(out["run_dir"])
    assert json.loads((run / "import_report.json").read_text())["simulated"] is True
    assert json.loads((run / "run.json").read_text())["simulated"] == "true"
    sc = score.run(make_cfg("score", [f"inputs.crowd={run}"], name="score"))
    srun = Path(sc["run_dir"])
    assert (srun / "scores.md").read_text().startswith("# SIMULATED crowd:")
    assert "SIMULATED" in (srun / "scores.tex").read_text()
    assert json.loads((srun / "score_report.json").read_text())["simulated"] is True
    assert MlflowClient().get_run(sc["run_id"]).data.tags["simulated"] == "true"


def test_strict_policy_fails_and_writes_only_the_rejects(
    task_run: Path, tmp_path: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    path = tmp_path / "broken.csv"
    path.write_text(BROKEN)
    cfg = make_cfg(
        "import", [f"inputs.tasks={task_run}", f"inputs.answers={path}", "crowd.policy=strict"]
    )
    with pytest.raises(CrowdImportError, match=r"broken\.csv, row 2, field task_id: unknown task"):
        import_.run(cfg)
    run = Path(cfg.run_dir)
    assert not any((run / f).exists() for f in ("annotations.parquet", "aggregated.csv"))
    # the rejects are kept where the printed summary says (issue #28): nothing imported
    assert tables.REJECTS.read(run)["row"].nunique() == 8
    # report mode: the good rows go on, the rejects are written (their bundles are too short
    # for the speed filter, which would leave no answer: an error of its own)
    overrides = [
        f"inputs.tasks={task_run}",
        f"inputs.answers={path}",
        "crowd.filters.min_bundle_seconds=null",
    ]
    out = _import(make_cfg, overrides, name="report")
    rejects = tables.REJECTS.read(Path(out["run_dir"]))
    assert rejects["row"].nunique() == 8 and out["n_accepted"] == 2


def test_forward_prediction_round_trip_writes_outcomes(
    tmp_path: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    task_run = hand_made_task_run(tmp_path, target="prediction")
    tasks = tables.TASKS.read(task_run)
    preds = {"s0": 0, "s1": 0, "s2": 1, "s3": 1}  # s0 TN, s1 FN, s2 FP, s3 TP
    tasks["gold_label"] = tasks["sample_id"].map(SAMPLES).fillna(1).astype(int)
    tasks["pred"] = tasks["sample_id"].map(preds).fillna(1).astype(int)
    tasks["label"] = tasks["pred"]
    tables.TASKS.write(tasks, task_run)
    answers = tmp_path / "answers.csv"
    hand_made_answers(tables.BUNDLES.read(task_run)).to_csv(answers, index=False)
    out = _import(make_cfg, [f"inputs.tasks={task_run}", f"inputs.answers={answers}"])
    sc = score.run(make_cfg("score", [f"inputs.crowd={out['run_dir']}"], name="score"))
    outcomes = pd.read_csv(Path(sc["run_dir"]) / "outcomes.csv", dtype={"k": str})
    pooled = outcomes[(outcomes["k"] == "all") & (outcomes["method"] == "vanilla_gradient")]
    # the crowd answered the gold label: right about the model exactly where it was right
    assert pooled.set_index("outcome")["accuracy"].to_dict() == {
        "FN": 0.0,
        "FP": 0.0,
        "TN": 100.0,
        "TP": 100.0,
    }
    assert "Forward prediction" in (Path(sc["run_dir"]) / "scores.md").read_text()


def test_misclassified_study_writes_count_tables(
    tmp_path: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    task_run = hand_made_task_run(tmp_path)
    cfg_text = (task_run / "config.yaml").read_text().replace("correct", "misclassified")
    (task_run / "config.yaml").write_text(cfg_text)
    answers = tmp_path / "answers.csv"
    hand_made_answers(tables.BUNDLES.read(task_run)).to_csv(answers, index=False)
    out = _import(make_cfg, [f"inputs.tasks={task_run}", f"inputs.answers={answers}"])
    sc = score.run(make_cfg("score", [f"inputs.crowd={out['run_dir']}"], name="score"))
    counts = pd.read_csv(Path(sc["run_dir"]) / "counts.csv").set_index(["method", "k"])
    assert counts["recognised"].to_dict() == {
        ("vanilla_gradient", 2): 4,
        ("vanilla_gradient", 5): 4,
        ("random", 2): 0,
        ("random", 5): 0,
    }
    md = (Path(sc["run_dir"]) / "scores.md").read_text()
    assert "(misclassified samples)" in md and "Misclassified samples recognised" in md


# --- the published lu2024 files -------------------------------------------------------------

needs_published = pytest.mark.skipif(not PUBLISHED.is_dir(), reason="published lu2024 data absent")


@needs_published
@pytest.mark.parametrize("fname,dataset", [("IMDB.csv", "imdb"), ("AGNEWS.csv", "ag_news")])
def test_published_file_imports_without_rejects_and_scores(
    fname: str, dataset: str, make_cfg: Callable[..., DictConfig]
) -> None:
    src = PUBLISHED / fname
    common = ["crowd=lu2024", f"crowd.path={src}", f"dataset={dataset}"]
    out = _import(make_cfg, common)
    run = Path(out["run_dir"])
    report = json.loads((run / "import_report.json").read_text())
    assert report["n_rows"] == 4100 and report["n_rejected_rows"] == 0 and report["n_tasks"] == 4000
    assert len(tables.REJECTS.read(run)) == 0
    agg = tables.AGGREGATED.read(run)
    assert agg["sample_id"].nunique() == 100 and len(agg) == 4000
    assert agg.groupby("sample_id")["label"].first().value_counts().nunique() == 1  # balanced

    direct = score.run(make_cfg("score", common, name="score_direct"))
    via_import = score.run(make_cfg("score", [f"inputs.crowd={run}"], name="score_import"))
    assert direct["scores"] == pytest.approx(via_import["scores"])
    assert direct["ranks"] == via_import["ranks"]
    srun = Path(direct["run_dir"])
    for f in (
        "aggregated.csv",
        "accuracy.csv",
        "scores.csv",
        "flips.csv",
        "scores.md",
        "scores.tex",
        "accuracy_vs_k.png",
        "flip_histogram.png",
    ):
        assert (srun / f).is_file(), f
    # accuracy equals an independent pandas reading of the Correct column
    raw = pd.read_csv(src, sep="\t", quoting=csv.QUOTE_NONE, dtype=str, keep_default_na=False)
    raw = raw[raw["Saliency"] != "N/A"]
    want = raw.assign(c=raw["Correct"].astype(int)).groupby(["Saliency", "Words"])["c"].mean() * 100
    acc = tables.ACCURACY.read(srun).set_index(["method", "k"])["accuracy"]
    assert acc[("integrated_gradients", 5)] == pytest.approx(want[("Integrated_Gradient", "5")])
    assert acc[("lime", 40)] == pytest.approx(want[("LIME", "40")])
    assert len(acc) == 40
    flips = tables.FLIPS.read(srun)
    assert (flips["flips"] + flips["aids"] + flips["always"] == 100).all()


def test_broken_published_rows_are_reported(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text(
        "Text\tLabel\tSaliency\tWords\tCorrect\n"
        "a b c\t1\tN/A\tAll\tN/A\n"
        "a . \t1\tLIME\t5\t1\n"
        "a . \t1\tSHAP\t5\t1\n"  # unknown method
        "a . \t0\tRandom\t5\t1\n"  # label differs from its sample's
        "a . \t1\tLIME\t5\t0\n"  # repeated (method, k)
        "a . \t1\tRandom\tten\tyes\n"  # bad k and Correct
        "a b c \t1\tDeepLIFT\t2\t1\n"  # shows 3 words for k = 2
        "oops\n"
    )
    agg, rejects, _ = read_lu2024(path, LABELS, "imdb")
    assert agg[["sample_id", "method", "k", "correct"]].values.tolist() == [
        ["lu2024-imdb-0", "lime", 5, 1]
    ]
    assert [(r.row, r.field) for r in rejects.itertuples()] == [
        (3, "Saliency"),
        (4, "Label"),
        (5, "Words"),
        (6, "Words"),
        (6, "Correct"),
        (7, "Text"),
        (8, "*"),
    ]


def test_a_missing_input_fails_before_the_run_starts(
    task_run: Path, tmp_path: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    with pytest.raises(CrowdImportError, match="needs inputs.tasks=<tasks run> and inputs.answers"):
        import_.run(make_cfg("import", [f"inputs.tasks={task_run}"]))
    missing = tmp_path / "nope.csv"
    with pytest.raises(InputError, match=f"inputs.answers={missing}: no such file or directory"):
        import_.run(make_cfg("import", [f"inputs.tasks={task_run}", f"inputs.answers={missing}"]))
    assert not (tmp_path / "import").exists()  # no run dir was made


def test_published_needs_path_and_dataset(make_cfg: Callable[..., DictConfig]) -> None:
    with pytest.raises(Exception, match="crowd.path"):
        score.run(make_cfg("score", ["crowd=lu2024", "dataset=imdb"]))
    with pytest.raises(Exception, match="dataset=imdb or dataset=ag_news"):
        score.run(make_cfg("score", ["crowd=lu2024", f"crowd.path={PUBLISHED / 'IMDB.csv'}"]))
    with pytest.raises(Exception, match="inputs.crowd"):
        score.run(make_cfg("score", []))


@pytest.mark.parametrize("root", ["import", "score"])
def test_every_crowd_option_composes_for_import_and_score(root: str) -> None:
    for opt in sorted(p.stem for p in (paths.conf_dir() / "crowd").glob("*.yaml")):
        cfg = compose_config(root, [f"crowd={opt}", "dataset=imdb"])
        assert cfg.crowd.name == opt and cfg.crowd.policy in ("report", "strict")


def test_aggregator_option_changes_the_aggregation(
    task_run: Path, tmp_path: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    answers = tmp_path / "answers.csv"
    hand_made_answers(tables.BUNDLES.read(task_run)).to_csv(answers, index=False)
    out = _import(
        make_cfg,
        [
            f"inputs.tasks={task_run}",
            f"inputs.answers={answers}",
            "crowd/aggregator=dawid_skene",
            "+crowd.aggregator.n_iter=20",
        ],
    )
    report = json.loads((Path(out["run_dir"]) / "import_report.json").read_text())
    assert report["aggregator"] == {"name": "DawidSkene", "n_iter": 20}
    agg = tables.AGGREGATED.read(Path(out["run_dir"]))
    assert agg["correct"].astype(bool).equals(agg["method"].eq("vanilla_gradient").astype(bool))


# --- hardened reading: duplicate columns, encodings, label text in MLflow ----------------


@pytest.mark.parametrize("names", [("answer", "answer"), ("Answer", "answer")])
def test_duplicate_column_names_are_rejected_naming_them(
    task_run: Path, tmp_path: Path, names: tuple[str, str]
) -> None:
    path = tmp_path / "dup.csv"
    path.write_text(
        f"worker_id,task_id,{names[0]},{names[1]},duration_s\nw1,s0-random-k2,negative,positive,3\n"
    )
    with pytest.raises(CrowdImportError) as err:
        read_answers(path, tables.TASKS.read(task_run), None, LABELS)
    msg = str(err.value)
    assert f"dup.csv, row header: duplicate column names {names[0]!r} and {names[1]!r}" in msg


CP1252 = (
    "worker_id,task_id,answer,duration_s\n"
    "w1,s0-random-k2,negative,3\n"
    "Jos\x92e,s1-random-k2,positive,4\n"  # \x92 is cp1252's right single quote
    "w3,s2-random-k2,negative,5\n"
).encode("latin-1")


def test_undecodable_byte_is_a_located_reject_and_an_encoding_reads_it(
    task_run: Path, tmp_path: Path
) -> None:
    path = tmp_path / "excel.csv"
    path.write_bytes(CP1252)
    tasks = tables.TASKS.read(task_run)
    accepted, rejects, _ = read_answers(path, tasks, None, LABELS)
    assert sorted(accepted["row"]) == [1, 3]  # the rest of the file is read
    assert [(r.row, r.field) for r in rejects.itertuples()] == [(2, "worker_id")]
    problem = rejects["problem"].iloc[0]
    assert "byte 0x92 at character 4 is not valid utf-8" in problem and "cp1252" in problem
    accepted, rejects, _ = read_answers(path, tasks, None, LABELS, encoding="cp1252")
    assert rejects.empty and "Jos\u2019e" in set(accepted["worker_id"])
    with pytest.raises(CrowdImportError, match="crowd.encoding='nope'"):
        read_answers(path, tasks, None, LABELS, encoding="nope")
    path.write_bytes(b"worker_id,task\x92id,answer,duration_s\n")
    with pytest.raises(CrowdImportError, match=r"excel\.csv, row header, column 2: byte 0x92"):
        read_answers(path, tasks, None, LABELS)


def test_stage_encoding_option_and_strict_located_error(
    task_run: Path, tmp_path: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    path = tmp_path / "excel.csv"
    path.write_bytes(CP1252)
    base = [f"inputs.tasks={task_run}", f"inputs.answers={path}"]
    cfg = make_cfg("import", [*base, "crowd.policy=strict"])
    with pytest.raises(CrowdImportError, match=r"excel\.csv, row 2, field worker_id: byte 0x92"):
        import_.run(cfg)
    out = _import(
        make_cfg,
        [
            *base,
            "crowd.encoding=cp1252",
            "crowd.policy=strict",
            "crowd.filters.min_bundle_seconds=null",
        ],
        name="cp1252",
    )
    assert out["n_accepted"] == 3


def test_any_label_text_is_logged_to_mlflow(mlflow_uri: str) -> None:
    import mlflow

    from saleval.pipeline.tracker import tracking

    odd = {"R&D": "a", "R?D": "b", "<b>bold</b>": "c", "it's (new)": "d", "Sci/Tech": "e"}
    with mlflow.start_run() as run:
        tracking.log_params({"dataset": {"label_descriptions": odd}})
    params = MlflowClient().get_run(run.info.run_id).data.params
    logged = {k: v for k, v in params.items() if k.startswith("dataset.label_descriptions.")}
    assert sorted(logged.values()) == sorted(odd.values())  # five labels, five params
    assert params["dataset.label_descriptions.Sci/Tech"] == "e"  # valid keys unchanged
