"""Each rule in one place, at the seams between stages (docs/architecture.md): the
``prob_<label name>`` columns are spelt only by their declaration, and each default of
the forward passes (token limit, batch budget) is a named constant stated once."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

import saleval
from saleval import vocab
from saleval.config.model import (
    DEFAULT_MAX_BATCH,
    DEFAULT_MAX_LENGTH,
    DEFAULT_MAX_TOKENS,
    ModelConfig,
)
from saleval.pipeline import tables
from saleval.pipeline.tables import TableError
from saleval.vocab import PROBS

SRC = Path(saleval.__file__).parent
ROOT = SRC.parents[1]
CODE = [*SRC.rglob("*.py"), *(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]


def _spelt(tree: ast.AST, prefix: str) -> list[int]:
    """Lines where code spells a column family by hand: the prefix alone (``"prob_"``, as
    ``startswith`` and ``removeprefix`` take it) or an f-string starting with it."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value == prefix:
            lines.add(node.lineno)
        elif isinstance(node, ast.JoinedStr) and node.values:
            head = node.values[0]
            if isinstance(head, ast.Constant) and str(head.value).startswith(prefix):
                lines.add(node.lineno)
    return sorted(lines)


def test_prob_columns_are_built_and_parsed_by_their_declaration_only() -> None:
    declared = Path(vocab.__file__)
    by_hand = {
        f"{p.relative_to(ROOT)}:{line}"
        for p in CODE
        if p != declared
        for line in _spelt(ast.parse(p.read_text()), PROBS.prefix)
    }
    assert not by_hand, sorted(by_hand)
    # the scan sees both spellings
    by_hand_example = f'c.startswith("{PROBS.prefix}")\nf"{PROBS.prefix}{{n}}"'
    assert _spelt(ast.parse(by_hand_example), PROBS.prefix) == [1, 2]
    # the table spec checks the family's columns by the same declaration
    assert tables.PREDICTIONS.families == (PROBS,)
    frame = pd.DataFrame(
        {"sample_id": ["a"], "text": ["t"], "label": [0], "pred": [1]}
        | dict(zip(PROBS.columns(["neg", "pos"]), (["0.25"], [0.75])))
    )
    checked = tables.PREDICTIONS.validate(frame)
    assert checked["prob_neg"].dtype == "float64" and PROBS.names(checked.columns) == ["neg", "pos"]
    with pytest.raises(TableError, match="column 'prob_pos' of table 'predictions' is not float64"):
        tables.PREDICTIONS.validate(frame.assign(prob_pos=["high"]))


#: settings whose defaults are the named constants of saleval.config.model
STATED_ONCE = {"max_length", "max_tokens", "max_batch"}
#: the same names for another concept, with its own value
OWN = {
    # the simulated crowd's readers (saleval.crowd.simulation.readers) cut texts to their own limits,
    # whatever token limit the classifier explained has: the sentence encoder at the 256
    # word pieces the embedded all-MiniLM-L6-v2 was trained with, the fine-tuned reader at 128
    "EmbeddingReader.max_length",
    "FinetunedReader.max_length",
}


def _number(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and type(node.value) in (int, float)


def _number_defaults(tree: ast.Module) -> list[str]:
    """Parameters and dataclass fields named in :data:`STATED_ONCE` whose default is a
    number written in place, as ``Class.name`` or ``function.name`` with the line."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            args = node.args
            pairs = list(zip(args.args[len(args.args) - len(args.defaults) :], args.defaults))
            pairs += [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d]
            for arg, default in pairs:
                if arg.arg in STATED_ONCE and _number(default):
                    found.append(f"{node.name}.{arg.arg}:{default.lineno}")
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if (
                    isinstance(item, ast.AnnAssign)
                    and isinstance(item.target, ast.Name)
                    and item.target.id in STATED_ONCE
                    and _number(item.value)
                ):
                    found.append(f"{node.name}.{item.target.id}:{item.lineno}")
    return found


def test_each_forward_pass_default_is_stated_once() -> None:
    written = {
        f"{p.relative_to(SRC)}:{where}"
        for p in SRC.rglob("*.py")
        for where in _number_defaults(ast.parse(p.read_text()))
        if where.rpartition(":")[0] not in OWN
    }
    assert not written, sorted(written)
    # each constant is assigned in one module
    assigned: dict[str, list[str]] = {}
    for p in SRC.rglob("*.py"):
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                for t in node.targets:
                    if isinstance(t, ast.Name) and t.id.startswith("DEFAULT_"):
                        assigned.setdefault(t.id, []).append(str(p.relative_to(SRC)))
    assert {k: v for k, v in assigned.items() if len(v) > 1} == {}
    for name in ("DEFAULT_MAX_LENGTH", "DEFAULT_MAX_TOKENS", "DEFAULT_MAX_BATCH"):
        assert assigned[name] == ["config/model.py"], name
    # and read where the defaults apply
    from saleval.attribution import Lime
    from saleval.attribution.perturbation import PERTURBATION_MAX_BATCH
    from saleval.metrics.config import InferenceConfig
    from saleval.modeling.inference import forward_logits

    assert ModelConfig.max_length == DEFAULT_MAX_LENGTH
    assert InferenceConfig().max_tokens == DEFAULT_MAX_TOKENS
    assert InferenceConfig().max_batch == DEFAULT_MAX_BATCH
    fl = inspect.signature(forward_logits).parameters
    assert (fl["max_tokens"].default, fl["max_batch"].default) == (4096, 512)
    lime = Lime()
    assert (lime.max_tokens, lime.max_batch) == (DEFAULT_MAX_TOKENS, PERTURBATION_MAX_BATCH)
    # a model file states only what differs from the schema
    for path in (ROOT / "conf" / "model").glob("*.yaml"):
        given = OmegaConf.load(path).get("max_length")
        assert given != DEFAULT_MAX_LENGTH, path
    # the scan sees a number written in place
    tree = ast.parse("def f(max_batch=512): ...\nclass C:\n    max_length: int = 256\n")
    assert _number_defaults(tree) == ["f.max_batch:1", "C.max_length:3"]


def _method_lists(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines of list, tuple or set literals that name six or more registered methods and
    nothing else: the method list written out again."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.List | ast.Tuple | ast.Set)
        and len(node.elts) >= 6
        and all(isinstance(e, ast.Constant) and e.value in names for e in node.elts)
    ]


def test_the_method_list_is_not_written_out_again() -> None:
    """What a method is comes from its registration (docs/architecture.md §9) and which
    methods run by default from ``conf/explain.yaml``; no module lists them again."""
    from saleval.attribution import REGISTRY

    names = set(REGISTRY)
    listed = {
        f"{p.relative_to(ROOT)}:{line}"
        for p in CODE
        for line in _method_lists(ast.parse(p.read_text()), names)
    }
    assert not listed, sorted(listed)
    nine = '("random", "all_attention", "last_attention", "vanilla_gradient", "lime", "deeplift")'
    assert _method_lists(ast.parse(nine), names) == [1]


# --- issue #54: each smaller rule in one place ------------------------------------------


#: every source file but this one, which spells what the checks below look for
OTHERS = [p for p in CODE if p.resolve() != Path(__file__).resolve()]


def _where(needle: str, files: list[Path]) -> set[str]:
    """The files (relative to the repo) whose source contains ``needle``."""
    return {str(p.relative_to(ROOT)) for p in files if needle in p.read_text()}


def _gpu_literals(tree: ast.AST) -> list[int]:
    """Lines of set, tuple or list literals naming both ``"gpu"`` and ``"cuda"``: the
    accelerator names written out again."""
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.List | ast.Tuple | ast.Set)
        and {"gpu", "cuda"} <= {e.value for e in node.elts if isinstance(e, ast.Constant)}
    ]


def test_the_device_rule_is_written_once() -> None:
    """Where a setting puts a model is saleval.modeling.devices' alone: the only module
    that asks torch for a GPU, the only one that lists the accelerator names, and the one
    helper for the device a model's parameters are on (docs/data-and-models.md#devices)."""
    from saleval.metrics import config as metrics_config
    from saleval.modeling import devices
    from saleval.scaleout import needs

    own = "src/saleval/modeling/devices.py"
    src = list(SRC.rglob("*.py"))
    assert _where("cuda.is_available", src) == {own}
    assert _where("parameters()).device", OTHERS) == {own}
    listed = {
        f"{p.relative_to(ROOT)}:{line}"
        for p in src
        for line in _gpu_literals(ast.parse(p.read_text()))
        if str(p.relative_to(ROOT)) != own
    }
    assert not listed, sorted(listed)
    assert needs.GPU_ACCELERATORS is devices.GPU_ACCELERATORS
    assert metrics_config.ACCELERATORS is devices.ACCELERATORS
    assert _gpu_literals(ast.parse('x = ("auto", "gpu", "cuda")\ny = {"cuda"}')) == [1]


def test_the_children_of_a_run_are_found_by_one_query() -> None:
    """The MLflow tag that links a child run to its parent is spelt once
    (saleval.pipeline.tracker.tracking_reads.PARENT_TAG); the query for a run's children is
    tracking_reads.children, which every caller (method rows, catch-up, deleting) uses."""
    from saleval.pipeline.tracker import tracking_reads

    assert _where("parentRunId", [*SRC.rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]) == {
        "src/saleval/pipeline/tracker/tracking_reads.py"
    }
    assert tracking_reads.children_filter("abc") == "tags.`mlflow.parentRunId` = 'abc'"
    assert not {f"{p.relative_to(ROOT)}:{n}" for p in OTHERS for n in _child_queries(p.read_text())}
    query = "c.search_runs([e], filter_string=f\"tags.mlflow.parentRunId = '{r}'\")"
    assert _child_queries(query) == [1]


def _child_queries(source: str) -> list[int]:
    """Lines of ``search_runs`` calls that filter by the parent tag written out."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "search_runs"
        and any(
            isinstance(c, ast.Constant) and "parentRunId" in str(c.value) for c in ast.walk(node)
        )
    ]


def _functions_with(tree: ast.AST, source: str) -> set[str]:
    """Names of the functions whose body holds the expression ``source`` (e.g. ``top_k is None``)."""
    wanted = ast.dump(ast.parse(source, mode="eval").body)
    return {
        f.name
        for f in ast.walk(tree)
        if isinstance(f, ast.FunctionDef)
        for node in ast.walk(f)
        if ast.dump(node) == wanted
    }


def test_a_rationale_is_cut_at_k_by_one_rule() -> None:
    """How many words a method's discrete rationale takes (``top_k``, else the human
    rationale's size, clamped to the text) is plausibility.rationale_k, for saleval's
    convention and ERASER's alike: neither module decides it again."""
    import numpy as np

    from saleval.metrics import eraser, plausibility

    for module in (plausibility, eraser):
        tree = ast.parse(Path(module.__file__).read_text())
        assert _functions_with(tree, "top_k is None") <= {"rationale_k"}, module.__name__
    doc = eraser.Document.build("d", [(0, 2)], np.array([0.1, 0.9, 0.5]), top_k=10)
    assert doc.predicted == ((0, 3),)  # clamped to the three tokens, as saleval's side does
    assert plausibility.rationale_k(10, np.zeros(3, dtype=bool)) == 3


def test_the_model_input_and_its_max_length_are_resolved_in_one_place() -> None:
    """The explain and metrics stages both need ``inputs.model`` and fall back to the
    length the train run recorded: saleval.pipeline.records.run_inputs.model_input and
    RunInputs.max_length say each once."""
    stages = [SRC / "stages" / "explain.py", SRC / "stages" / "metrics.py"]
    assert not _where("inputs.model is required", stages)
    assert not _where('parent_provenance["model"]', stages)
    for path in stages:
        text = path.read_text()
        assert "model_input(" in text and "st.inputs.max_length(" in text, path.name


def test_the_aggregator_options_and_default_are_stated_once() -> None:
    """The aggregator options are the files of conf/crowd/aggregator (no module or config
    lists them again), and the schema's default aggregator is the option the YAML's
    defaults list picks: two statements of one default, which this test keeps equal."""
    from saleval.config.crowd import AnswersCrowdConfig
    from saleval.crowd.importing.builtin import aggregator_options

    conf = ROOT / "conf"
    options = aggregator_options()
    assert options == sorted(p.stem for p in (conf / "crowd" / "aggregator").glob("*.yaml"))
    assert len(options) >= 3
    listing = {
        f"{p.relative_to(ROOT)}:{i}"
        for p in [*SRC.rglob("*.py"), *conf.rglob("*.yaml")]
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if sum(o in line for o in options) >= 3
    }
    assert not listing, sorted(listing)
    picked = next(
        d["aggregator"]
        for d in OmegaConf.load(conf / "crowd" / "answers.yaml").defaults
        if isinstance(d, dict | type(OmegaConf.create({}))) and "aggregator" in d
    )
    target = OmegaConf.load(conf / "crowd" / "aggregator" / f"{picked}.yaml")["_target_"]
    assert AnswersCrowdConfig().aggregator == {"_target_": target}


def test_the_tiny_model_is_written_in_its_config_file_only() -> None:
    """The tests build the tiny BERT from conf/model/tiny.yaml (tests.conftest.tiny_model_cfg):
    no test module writes its sizes again as a dict."""
    from tests.conftest import tiny_model_cfg

    def sizes(tree: ast.AST) -> list[int]:
        return [
            node.lineno
            for node in ast.walk(tree)
            if isinstance(node, ast.Dict)
            and {"hidden_size", "num_hidden_layers"}
            <= {k.value for k in node.keys if isinstance(k, ast.Constant)}
        ]

    written = {
        f"{p.relative_to(ROOT)}:{line}"
        for p in (ROOT / "tests").rglob("*.py")
        for line in sizes(ast.parse(p.read_text()))
    }
    assert not written, sorted(written)
    assert sizes(ast.parse('c = {"hidden_size": 32, "num_hidden_layers": 2}')) == [1]
    conf = OmegaConf.load(ROOT / "conf" / "model" / "tiny.yaml")
    assert tiny_model_cfg() == OmegaConf.to_container(conf)
    assert tiny_model_cfg(initializer_range=0.3)["config"]["initializer_range"] == 0.3


def test_method_reuse_lives_in_its_class() -> None:
    """Explain's per-method reuse (which methods are stored, loading them, computing the
    rest, storing what was computed) is saleval.attribution.reuse.MethodReuse: the stage's
    run holds none of that bookkeeping."""
    explain = SRC / "stages" / "explain.py"
    tree = ast.parse(explain.read_text())
    run = next(f for f in tree.body if isinstance(f, ast.FunctionDef) and f.name == "run")
    body = ast.unparse(run)
    for bookkeeping in ('"reused"', ".load(", "sort_values(", ".available("):
        assert bookkeeping not in body, bookkeeping
    assert "reuse.explain(" in body and "reuse.save(" in body
    assert not _where('"reused"', [explain])
