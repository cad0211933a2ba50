"""docs/extending.md, executed: a new saliency method, metric (with its own settings),
dataset, study variant, crowd source and export format from outside the package
(tests/plugin_metric.py is the metric module; tests/test_metrics_registry.py registers
another in-process)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from mlflow.tracking import MlflowClient
from omegaconf import DictConfig, OmegaConf, open_dict

from saleval import paths
from saleval.attribution import Attributor, Texts, explain_frame
from saleval.config.crowd import Policy, StudyConfig
from saleval.crowd.design import build_study
from saleval.crowd.errors import CrowdImportError
from saleval.crowd.export.formats import ExportInput, register_export, unregister_export
from saleval.crowd.importing.rows import CrowdImport, Rejects, empty_annotations, enforce_policy
from saleval.crowd.importing.source import Capability, CrowdSource, Given, ImportContext, SourceFile
from saleval.modeling.data import load_dataset
from saleval.modeling.models import build_model, load_tokenizer
from saleval.pipeline import tables
from saleval.pipeline.compose import register_configs
from saleval.pipeline.records.input_paths import InputError
from saleval.schema import to_schema
from saleval.testing import explain_frames
from tests.conftest import compose_config
from tests.metrics_support import TINY_CFG


class WordLength(Attributor):
    """A toy saliency method: longer words matter more (docs/extending.md, "A method")."""

    def __init__(self, *, power: float = 1.0, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.power = float(power)

    def word_scores(self, texts: Texts) -> list[np.ndarray]:
        return [np.array([len(w) ** self.power for w in s.words], dtype=float) for s in texts.segs]


def _compose(config_name: str, user_dir: Path, overrides: Sequence[str]) -> DictConfig:
    """As ``saleval-<stage> --config-dir <user_dir> ...`` composes it."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(paths.conf_dir()), version_base="1.3"):
        return compose(config_name, [f"hydra.searchpath=[file://{user_dir}]", *overrides])


def test_a_new_method_by_target_reaches_the_attributions_table() -> None:
    tok = load_tokenizer(TINY_CFG)
    model = build_model(TINY_CFG, ["neg", "pos"], seed=0).eval()
    df = pd.DataFrame(
        {"sample_id": ["a", "b"], "text": ["a tremendously good film", "bad"], "label": [1, 0]}
    )
    methods = {"length": {"_target_": f"{__name__}.WordLength", "power": 2.0}}
    attrs, preds = explain_frame(model, tok, df, methods, max_length=64, progress=False)
    a = attrs[attrs["sample_id"] == "a"].sort_values("word_index")
    assert set(attrs["method"]) == {"length"} and len(preds) == 2
    assert a["score"].tolist() == [1.0, 144.0, 16.0, 16.0]  # len(word) ** 2


def test_a_new_dataset_file_in_a_users_config_dir(tmp_path: Path) -> None:
    rows = [("great plot", "pos"), ("dull", "neg")] * 20
    pd.DataFrame(rows, columns=["review", "sentiment"]).to_csv(
        tmp_path / "reviews.csv", index=False
    )
    (tmp_path / "dataset").mkdir()
    (tmp_path / "dataset" / "reviews.yaml").write_text(
        "name: reviews\n"
        "_target_: saleval.modeling.data.read_local\n"
        f"data_root: {tmp_path}\n"
        "files: {all: reviews.csv}\n"
        "text_column: review\n"
        "label_column: sentiment\n"
        "label_names: [neg, pos]\n"
        "label_descriptions: {neg: Did not like it., pos: Liked it.}\n"
    )
    cfg = _compose("train", tmp_path, ["dataset=reviews", "model=tiny"])
    data = load_dataset(cfg.dataset)
    assert data.label_names == ["neg", "pos"]
    assert sum(len(data[s]) for s in ("train", "validation", "test")) == 40
    # a misspelt key fails when the config is composed, naming it
    (tmp_path / "dataset" / "typo.yaml").write_text("name: typo\ntext_colum: review\n")
    with pytest.raises(Exception, match="text_colum"):
        _compose("train", tmp_path, ["dataset=typo", "model=tiny"])


def test_a_study_variant_in_a_users_config_dir(tmp_path: Path) -> None:
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "pilot.yaml").write_text(
        "defaults:\n  - main\n  - _self_\nname: pilot\nn_samples: 8\nbundle_size: 8\nrepeats: 3\n"
    )
    cfg = _compose("tasks", tmp_path, ["inputs.explain=x", "study=pilot", "kgrid=smoke"])
    study = to_schema(StudyConfig, cfg.study)
    assert (study.name, study.n_samples, study.repeats) == ("pilot", 8, 3)
    preds, attrs = explain_frames(20, ["neg", "pos"], methods=["random", "lime"])
    design = build_study(preds, attrs, ["neg", "pos"], study, list(cfg.kgrid.ks))
    assert design.tasks["sample_id"].nunique() == 8
    # every study task is answered by `repeats` workers, one bundle each
    assert design.bundles.groupby("task_id").size().eq(3).all()


@pytest.fixture
def plugin_module(monkeypatch) -> Iterator[str]:
    """``tests.plugin_metric`` as a fresh process sees it: not imported yet, so naming it in
    ``metrics.plugins`` imports it and its metric registers; unregistered afterwards."""
    from saleval.metrics import registry as R

    name = "tests.plugin_metric"
    monkeypatch.delitem(sys.modules, name, raising=False)
    yield name
    R.unregister_metric("top_word_drop")
    assert "top_word_drop" not in R.outputs()


def test_a_metric_module_named_in_metrics_plugins_registers_and_runs(plugin_module) -> None:
    from saleval.metrics import faithfulness as F
    from saleval.metrics import registry as R
    from saleval.metrics.config import MetricsConfig
    from saleval.words import segment

    with pytest.raises(ValueError, match="metrics.plugins: cannot import 'no_such_module'"):
        R.import_plugins(["no_such_module"])
    R.import_plugins([plugin_module])
    assert R.direction("top_word_drop") is True
    tok = load_tokenizer(TINY_CFG)
    model = build_model(TINY_CFG, ["neg", "pos"], seed=0).eval()
    seg = segment("a tremendously good film", tok, 64)
    exps = [F.Explanation("a", "length", seg, np.array([1.0, 4.0, 2.0, 2.0]))]
    mcfg = MetricsConfig(ks=[1], plugins=[plugin_module])
    rows = F.evaluate(model, tok, exps, mcfg, progress=False).per_example
    v = rows.set_index(["metric", "k"])["value"]
    # the plugin is comprehensiveness at k = 1 (its default), computed through its own declaration
    assert v["top_word_drop", ""] == pytest.approx(v["comprehensiveness", "1"], abs=1e-6)


def test_a_plugin_metrics_own_setting_reaches_the_metrics_stage(
    plugin_module, make_cfg, tmp_path: Path
) -> None:
    """docs/extending.md: a plugin declares a settings dataclass; ``metrics.settings.<name>``
    sets it on the command line, checked at compose, and the stage's tables show its effect."""
    from hydra.errors import ConfigCompositionException

    from saleval.pipeline import tables
    from saleval.stages import metrics as stage
    from tests.metrics_support import AG_TEXTS, fake_explain_run, fake_train_run, load_tok

    tok = load_tok()
    train = fake_train_run(tmp_path / "train", tok)
    ds = compose_config("train", ["dataset=ag_news"]).dataset
    explain = fake_explain_run(tmp_path / "explain", tok, AG_TEXTS, OmegaConf.to_container(ds))
    given = [f"inputs.model={train}", f"inputs.explain={explain}", "progress=false"]
    plugin = [f"metrics.plugins=[{plugin_module}]", "metrics.ks=[1,2]"]
    with pytest.raises(ConfigCompositionException, match="metrics.settings.top_word_drop.word"):
        make_cfg("metrics", [*given, *plugin, "metrics.settings.top_word_drop.word=2"])
    cfg = make_cfg("metrics", [*given, *plugin, "metrics.settings.top_word_drop.words=2"])
    assert cfg.metrics.settings.top_word_drop.words == 2
    summary = tables.METRICS.read(Path(stage.run(cfg)["run_dir"]))
    value = summary.assign(k=summary["k"].fillna("")).set_index(["method", "metric", "k"])["value"]
    for method in ("random", "first"):
        # words=2: the plugin's value is comprehensiveness at k = 2, not at its default k = 1
        assert value[method, "top_word_drop", ""] == pytest.approx(
            value[method, "comprehensiveness", "2"], abs=1e-6
        )
    # ... which differs from k = 1 here, so the setting is what made the difference
    assert any(
        value[m, "comprehensiveness", "2"] != value[m, "comprehensiveness", "1"]
        for m in ("random", "first")
    )


def test_a_plugin_named_only_in_yaml_registers_before_compose(
    plugin_module, tmp_path: Path
) -> None:
    """A metrics group file of the user's own names the plugin and sets its settings: the
    module registers before the config is composed, so its settings are checked there,
    like every other key, a misspelt one failing with its name."""
    from hydra.errors import ConfigCompositionException

    user = tmp_path / "conf"
    (user / "metrics").mkdir(parents=True)
    mine = "defaults:\n  - default\n  - _self_\nname: mine\nplugins: [{m}]\n{settings}"
    good = "settings:\n  top_word_drop:\n    words: 2\n"
    (user / "metrics" / "mine.yaml").write_text(mine.format(m=plugin_module, settings=good))
    (user / "metrics" / "typo.yaml").write_text(
        mine.format(m=plugin_module, settings=good.replace("words", "word"))
    )
    given = [f"hydra.searchpath=[file://{user}]", "inputs.model=x", "inputs.explain=y"]
    cfg = compose_config("metrics", [*given, "metrics=mine"])
    assert cfg.metrics.settings.top_word_drop.words == 2
    assert plugin_module in sys.modules  # imported to compose, not when the stage runs
    with pytest.raises(ConfigCompositionException, match="top_word_drop.word"):
        compose_config("metrics", [*given, "metrics=typo"])
    # a command-line setting of a YAML-named plugin is checked the same way
    cfg = compose_config(
        "metrics", [*given, "metrics=mine", "metrics.settings.top_word_drop.words=3"]
    )
    assert cfg.metrics.settings.top_word_drop.words == 3
    with pytest.raises(ConfigCompositionException, match="top_word_drop.wrods"):
        compose_config(
            "metrics", [*given, "metrics=mine", "metrics.settings.top_word_drop.wrods=3"]
        )


def test_the_console_script_registers_a_yaml_named_plugin_first(
    plugin_module, tmp_path: Path
) -> None:
    """``saleval-metrics --config-dir <dir> metrics=mine``: the same, in a fresh process."""
    import os
    import subprocess

    user = tmp_path / "conf"
    (user / "metrics").mkdir(parents=True)
    body = "defaults:\n  - default\n  - _self_\nplugins: [{m}]\nsettings:\n  top_word_drop:\n"
    (user / "metrics" / "mine.yaml").write_text(body.format(m=plugin_module) + "    words: 2\n")
    (user / "metrics" / "typo.yaml").write_text(body.format(m=plugin_module) + "    word: 2\n")

    def job(group: str) -> subprocess.CompletedProcess[str]:
        args = ["--config-dir", str(user), f"metrics={group}", "inputs.model=x"]
        return subprocess.run(
            [sys.executable, "-c", "import sys\nfrom saleval.cli import metrics\nsys.exit(metrics())",
             *args, "inputs.explain=y", "--cfg", "job"],
            capture_output=True, text=True, timeout=300, cwd=paths.project_root(),
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )  # fmt: skip

    ok = job("mine")
    assert ok.returncode == 0, ok.stderr
    assert "top_word_drop:\n      words: 2" in ok.stdout
    typo = job("typo")
    assert typo.returncode != 0 and "top_word_drop.word" in typo.stderr, typo.stderr


@dataclass
class VerdictSource(CrowdSource):
    """A toy platform whose export gives each task's majority answer, ``task_id,majority``
    (docs/extending.md, "A crowd source"); its fields are its config."""

    format: ClassVar[str] = "verdicts"
    _target_: str = f"{__name__}.VerdictSource"
    name: str = "verdicts"
    policy: Policy = Policy.report

    def locate(self, given: Given) -> SourceFile:
        if "tasks" not in given.inputs:
            raise CrowdImportError("crowd=verdicts needs inputs.tasks=<tasks run>")
        path, answers_run = given.find("answers", "verdicts.csv")
        parents = {
            "tasks": given.inputs["tasks"],
            **({"answers": answers_run} if answers_run else {}),
        }
        return SourceFile.at(path, parents=parents, requires=("dataset",))

    def import_(self, ctx: ImportContext) -> CrowdImport:
        tasks = tables.TASKS.read(ctx.runs["tasks"])
        verdicts = pd.read_csv(ctx.file.path, dtype=str, keep_default_na=False)
        rejects = Rejects(str(ctx.file.path))
        for row, answer in enumerate(verdicts["majority"], 1):
            if answer not in ctx.label_names:
                rejects.add(row, "majority", f"unknown label {answer!r}; use one of the labels")
        enforce_policy(rejects.frame(), self.policy, ctx.file.path)
        study = tasks[~tasks["is_gold"].astype(bool)].merge(verdicts, on="task_id", how="left")
        named = study["label"].map(lambda y: ctx.label_names[int(y)])
        aggregated = study[["sample_id", "method", "k", "label"]].assign(
            correct=(study["majority"] == named).astype("int64")
        )
        report = {"format": self.format, "policy": str(self.policy), "n_rows": len(verdicts)}
        return CrowdImport(empty_annotations(), aggregated, rejects.frame(), report)


def test_a_crowd_source_in_a_users_config_dir(tmp_path: Path, mlflow_uri: str) -> None:
    from saleval.stages import import_
    from tests.crowd_support import LABELS, hand_made_task_run

    task_run = hand_made_task_run(tmp_path)
    tasks = tables.TASKS.read(task_run)
    verdicts = tmp_path / "verdicts.csv"
    study = tasks[~tasks["is_gold"]]
    majority = [LABELS[y] if m == "vanilla_gradient" else LABELS[1 - y]
                for y, m in zip(study["label"], study["method"])]  # fmt: skip
    rows = {"task_id": [*study["task_id"], "gold-1"], "majority": [*majority, "maybe"]}
    pd.DataFrame(rows).to_csv(verdicts, index=False)
    (tmp_path / "crowd").mkdir()
    (tmp_path / "crowd" / "verdicts.yaml").write_text(f"_target_: {__name__}.VerdictSource\n")
    overrides = ["crowd=verdicts", f"inputs.tasks={task_run}", f"inputs.answers={verdicts}"]
    cfg = _compose("import", tmp_path, overrides)
    with open_dict(cfg):
        cfg.run_dir = str(tmp_path / "import")
        cfg.tracking.artifact_root = str(tmp_path / "mlartifacts")
    out = import_.run(cfg)
    run = Path(out["run_dir"])
    agg = tables.AGGREGATED.read(run)
    assert len(agg) == 16 and out["crowd_accuracy"] == 50.0
    assert set(agg.loc[agg["correct"] == 1, "method"]) == {"vanilla_gradient"}
    report = json.loads((run / "import_report.json").read_text())
    assert report["format"] == "verdicts" and report["dataset"] == "imdb"  # from the task run
    assert report["source"]["path"] == str(verdicts.resolve())
    assert json.loads((run / "run.json").read_text())["parent_dirs"]["tasks"] == str(task_run)
    assert not (run / "filtered.csv").exists()  # the toy source has no filters
    rejects = tables.REJECTS.read(run)
    assert rejects[["row", "field"]].values.tolist() == [[17, "majority"]]


@dataclass
class VerdictFileSource(CrowdSource):
    """A toy platform whose export is already one verdict per sample × method × k
    (``sample_id,method,k,label,correct``): it provides verdicts, so ``saleval-score``
    scores it with no import run and without knowing its class."""

    format: ClassVar[str] = "verdict-file"
    capabilities: ClassVar[frozenset[Capability]] = frozenset({Capability.verdicts})
    _target_: str = f"{__name__}.VerdictFileSource"
    name: str = "verdict_file"
    policy: Policy = Policy.report
    path: str = ""

    def locate(self, given: Given) -> SourceFile:
        provides = {"target": "gold", "population": "correct"}
        return SourceFile.at(Path(self.path).resolve(), provides=provides, tag="verdicts")

    def import_(self, ctx: ImportContext) -> CrowdImport:
        aggregated = tables.AGGREGATED.read(ctx.file.path)
        report = {"format": self.format, "n_rows": len(aggregated)}
        return CrowdImport(
            empty_annotations(), aggregated, Rejects(str(ctx.file.path)).frame(), report
        )


def test_a_source_that_provides_verdicts_is_scored_without_an_import(
    tmp_path: Path, mlflow_uri: str
) -> None:
    from saleval.stages import score

    rows = [
        {"sample_id": f"s{i}", "method": m, "k": k, "label": i % 2, "correct": int(m == "good" or i % 3 == 0)}
        for i in range(12) for m in ("good", "random") for k in (1, 5)
    ]  # fmt: skip
    verdicts = tmp_path / "verdicts.csv"
    pd.DataFrame(rows).to_csv(verdicts, index=False)
    (tmp_path / "crowd").mkdir()
    (tmp_path / "crowd" / "verdict_file.yaml").write_text(
        f"_target_: {__name__}.VerdictFileSource\npath: ''\n"
    )
    overrides = [
        "crowd=verdict_file",
        f"crowd.path={verdicts}",
        "dataset=imdb",
        "scoring.bootstrap.n=20",
        "scoring.test_resamples=99",
    ]
    cfg = _compose("score", tmp_path, overrides)
    with open_dict(cfg):
        cfg.run_dir = str(tmp_path / "score")
        cfg.tracking.artifact_root = str(tmp_path / "mlartifacts")
    run = Path(score.run(cfg)["run_dir"])
    scores = tables.SCORES.read(run).set_index("method")["score"]
    assert scores["good"] == pytest.approx(100.0) and scores["random"] < 50.0
    info = json.loads((run / "run.json").read_text())
    assert info["provenance"]["target"] == "gold" and info["provenance"]["population"] == "correct"
    client = MlflowClient()
    tags = client.get_run(info["run_id"]).data.tags
    assert tags["verdicts_path"] == str(verdicts.resolve())
    # a source without the capability is refused, naming it
    (tmp_path / "crowd" / "plain.yaml").write_text(f"_target_: {__name__}.VerdictSource\n")
    cfg = _compose("score", tmp_path, ["crowd=plain", "dataset=imdb"])
    with pytest.raises(InputError, match="crowd=verdicts answers must go through saleval-import"):
        score.run(cfg)


def test_an_export_format_is_written_into_every_task_run(
    tmp_path: Path, make_cfg: Callable[..., DictConfig]
) -> None:
    from saleval.stages import tasks as tasks_stage
    from tests.crowd_support import synthetic_explain, write_explain_run

    @register_export("jsonl", "bundles.jsonl")
    def write_jsonl(inputs: ExportInput, path: Path) -> None:
        """One JSON object per bundle: its task ids and texts, in order."""
        merged = inputs.bundles.merge(inputs.tasks[["task_id", "display_text"]], on="task_id")
        with path.open("w") as fh:
            for bid, g in merged.sort_values(["bundle_id", "position"]).groupby("bundle_id"):
                items = [{"id": t, "text": x} for t, x in zip(g["task_id"], g["display_text"])]
                fh.write(json.dumps({"bundle_id": bid, "tasks": items}) + "\n")

    try:
        with pytest.raises(ValueError, match="'bundles.jsonl' is written by export jsonl"):
            register_export("other", "bundles.jsonl")(write_jsonl)
        preds, attrs = synthetic_explain(40, 20)
        explain = write_explain_run(tmp_path / "explain", preds, attrs)
        overrides = [f"inputs.explain={explain}", "study=smoke", "kgrid=smoke", "dataset=ag_news"]
        out = tasks_stage.run(make_cfg("tasks", overrides))
    finally:
        unregister_export("jsonl")
    run = Path(out["run_dir"])
    lines = [json.loads(x) for x in (run / "bundles.jsonl").read_text().splitlines()]
    assert len(lines) == out["n_bundles"] and all(len(x["tasks"]) == 8 for x in lines)
    assert (run / "bundles_wide.csv").is_file() and (run / "instructions.md").is_file()
    run_id = json.loads((run / "run.json").read_text())["run_id"]
    assert "bundles.jsonl" in {a.path for a in MlflowClient().list_artifacts(run_id)}


class MostConfident:
    """A toy aggregator (docs/extending.md, "An aggregation rule"): per task, the answer of
    the worker who answered most tasks, "I don't know" (code 0) naming nothing."""

    def fit(self, data: pd.DataFrame) -> MostConfident:
        self.busiest = data["worker"].value_counts().idxmax()
        return self

    def fit_predict(self, data: pd.DataFrame) -> pd.Series:
        self.fit(data)
        theirs = data[data["worker"] == self.busiest].set_index("task")["label"]
        out = theirs.where(theirs != 0).reindex(sorted(data["task"].unique()))
        return out.astype("Int64").rename("agg_label")


def test_an_aggregator_in_a_users_config_dir(tmp_path: Path) -> None:
    """``saleval-import --config-dir <dir> crowd/aggregator=most_confident``: the class is
    built from the YAML's ``_target_`` and aggregates A[i, j, k] as the built-in ones do;
    its extra keys would reach it as ``+crowd.aggregator.<key>``."""
    from saleval.crowd.importing import aggregation
    from saleval.crowd.importing.source import crowd_source

    (tmp_path / "crowd" / "aggregator").mkdir(parents=True)
    (tmp_path / "crowd" / "aggregator" / "most_confident.yaml").write_text(
        f"_target_: {__name__}.MostConfident\n"
    )
    cfg = _compose("import", tmp_path, ["crowd/aggregator=most_confident"])
    aggregator = crowd_source(cfg.crowd).build_aggregator()
    assert isinstance(aggregator, MostConfident)
    # w0 answered most (a gold task too): label 0 (code 1) on t0, "I don't know" on t1
    ann = pd.DataFrame({
        "task_id": ["t0", "t0", "t0", "t1", "t1", "t1", "g0"],
        "worker_id": ["w0", "w1", "w2", "w0", "w1", "w2", "w0"],
        "answer_code": [1, 2, 2, 0, 1, 1, 1], "label": [0] * 7,
    })  # fmt: skip
    tasks = pd.DataFrame({
        "task_id": ["t0", "t1", "g0"], "sample_id": ["s0", "s1", "g"], "method": ["lime"] * 3,
        "k": [1, 1, 1], "label": [0, 0, 0], "is_gold": [False, False, True],
    })  # fmt: skip
    got = aggregation.aggregate(ann, tasks, aggregator).set_index("sample_id")
    strict = aggregation.aggregate(ann, tasks).set_index("sample_id")
    assert got["correct"].tolist() == [1, 0]  # w0's label 0; then nothing named
    assert strict["correct"].tolist() == [0, 1]  # the study's rule: code 2 wins t0, 1 wins t1
