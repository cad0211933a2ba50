"""The notebook API: explain texts, measure faithfulness, show highlights.

The stages (``saleval-explain``, ``saleval-metrics``) work on run dirs; in a notebook you
hold texts and a model. These functions call the stages' own code on what you hold, so
a number here is the number a stage computes for the same inputs:

* :func:`load_model` — a train run, a ``save_pretrained`` directory, a hub id, or a fresh
  classifier from a ``conf/model`` name (``tiny``, ``minilm``) to try things out;
* :func:`explain` — word scores of every method for your texts
  (:func:`saleval.attribution.explain_frame`, methods composed from ``conf/method`` as
  ``saleval-explain`` composes them);
* :func:`evaluate` — the automated faithfulness metrics per method
  (:func:`saleval.metrics.faithfulness.evaluate`, as ``saleval-metrics``);
* :func:`highlight` — each method's top-k words marked in the text
  (:func:`saleval.analysis.views.highlight_html`, the explain stage's ``views/highlights.html``);
* :func:`read_explanations` — an explain run's tables in the same shape as :func:`explain`.

``docs/api.md`` walks through them. A short example (a random tiny BERT, so the scores
mean nothing):

>>> import saleval
>>> clf = saleval.load_model("tiny", label_names=["neg", "pos"])
>>> words = saleval.explain(["A quiet, lovely film."], clf, methods=["random"])
>>> words[["sample_id", "method", "word"]].drop_duplicates().shape, words["word"].tolist()
((4, 3), ['A', 'quiet', 'lovely', 'film'])
>>> "<mark" in saleval.highlight(words, k=2)
True
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pandas as pd

from saleval import paths
from saleval.pipeline import tables
from saleval.vocab import PROBS

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

    from saleval.attribution import Attributor
    from saleval.metrics.config import MetricsConfig

__all__ = [
    "Classifier",
    "HTMLPage",
    "evaluate",
    "explain",
    "highlight",
    "load_model",
    "load_prompted",
    "read_explanations",
]

#: per-text columns of the frame :func:`explain` returns (from ``predictions.parquet``)
_PER_TEXT = ("text", "label", "pred", "n_words", "truncated")


class Classifier(NamedTuple):
    """A model with its tokenizer and what the run it came from says about it."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerFast
    #: the token limit it was trained with (a train run, a ``conf/model``); None: unknown
    max_length: int | None = None
    #: its name in tables and provenance (``model.name`` of the run, or the checkpoint's)
    name: str | None = None


ModelLike = Classifier | tuple[Any, Any] | str | os.PathLike[str]
"""What the ``model`` argument accepts: see :func:`load_model`."""


class HTMLPage(str):
    """An HTML page as a plain ``str`` that Jupyter renders (``_repr_html_``)."""

    def _repr_html_(self) -> str:
        return str(self)


def _conf_model(name: str) -> Path | None:
    path = paths.conf_dir() / "model" / f"{name}.yaml"
    return path if path.is_file() and not Path(name).exists() else None


def load_model(
    source: ModelLike,
    label_names: Sequence[str] | None = None,
    device: str | None = None,
    seed: int = 0,
) -> Classifier:
    """Model and tokenizer from wherever a classifier lives, in eval mode.

    ``source``: a saleval train run (its dir, ``runs:/<id>`` or ``latest``; its
    ``model.max_length`` comes along), a ``save_pretrained`` directory or hub id (as
    ``saleval-explain inputs.model=...`` takes), a ``(model, tokenizer)`` pair, or the name
    of a ``conf/model`` file: ``tiny`` or ``minilm`` (offline) build a *fresh* classifier
    whose head is untrained — handy for trying the API, meaningless as explanations; they
    need ``label_names``. ``label_names`` given with any other source are checked against
    the model's classes (the same names in another order are put in yours, as
    :func:`saleval.modeling.models.align_labels` does for the stages). ``device``: where to put a
    model loaded here (None: the GPU when there is one); a model you pass in stays where
    it is unless ``device`` is given.
    """
    import torch

    from saleval.modeling.devices import device_for
    from saleval.modeling.models import (
        align_labels,
        build_model,
        checkpoint_name,
        load_tokenizer,
        load_trained,
    )
    from saleval.pipeline.records.run_inputs import resolve_input, run_or_checkpoint
    from saleval.pipeline.records.run_record import RunRecord

    conf = None if isinstance(source, tuple) else _conf_model(str(source))
    if isinstance(source, Classifier):
        clf = source
    elif isinstance(source, tuple):
        clf = Classifier(source[0], source[1])
    elif conf is not None:
        from saleval.stages.run import compose_stage

        if not label_names:
            raise ValueError(
                f"load_model({str(source)!r}) builds a fresh classifier from {conf}: "
                "pass label_names=[...] (its classes, in index order)"
            )
        mcfg = compose_stage("train", [f"model={source}"]).model
        model = build_model(mcfg, list(label_names), attn_implementation="eager", seed=seed)
        clf = Classifier(model.eval(), load_tokenizer(mcfg), int(mcfg.max_length), str(mcfg.name))
    else:
        run, checkpoint = run_or_checkpoint(str(source))
        if run:
            run_dir = resolve_input("model", run)
            prov = RunRecord.read(run_dir).provenance_of_run(run_dir)
            model, tok = load_trained(run_dir)
            clf = Classifier(model, tok, prov.max_length, prov.model)
        else:
            model, tok = load_trained(str(checkpoint))
            clf = Classifier(model, tok, None, checkpoint_name(str(checkpoint)))
    if label_names is not None and conf is None:  # your class order; checked, or permuted
        align_labels(clf.model, list(label_names), where=f"load_model({source!r})")
    loaded_here = isinstance(source, str | os.PathLike)
    if device is not None or loaded_here:
        where = torch.device(device) if device else device_for("auto")
        torch.nn.Module.to(clf.model, where)  # Module.to: transformers' wrapper confuses mypy
    return clf


def load_prompted(
    lm: str | os.PathLike[str],
    label_names: Sequence[str],
    train: pd.DataFrame | None = None,
    device: str | None = None,
    **prompt: Any,
) -> Classifier:
    """A causal LM (its directory, or a hub id) prompted to classify, as ``model=prompted``
    builds it (docs/data-and-models.md#prompted-llms). ``prompt``: the ``model.prompt``
    settings (``template``, ``instruction``, ``label_words``, ``shots``, ...); ``train``
    (sample_id, text, label) gives the few-shot examples.

    ``load_prompted(dir, ["negative", "positive"], template="Review: {text}\nSentiment:")``
    """
    import torch

    from saleval.config.model import ModelConfig, PromptConfig
    from saleval.modeling import prompted
    from saleval.modeling.devices import device_for
    from saleval.modeling.models import checkpoint_name

    node = ModelConfig(
        _target_="saleval.modeling.models.PromptedSource",
        name="prompted",
        pretrained=str(lm),
        prompt=PromptConfig(**prompt),
    )
    model, tok, _ = prompted.build(node, str(lm), list(label_names), train)
    where = torch.device(device) if device else device_for("auto")
    torch.nn.Module.to(model, where)
    return Classifier(model, tok, int(node.max_length), f"{checkpoint_name(str(lm))}-prompted")


def _method_configs(
    methods: str | Sequence[str | Attributor] | Mapping[str, Any] | None, seed: int | None
) -> dict[str, Any]:
    """Method key → config, each ``conf/method`` name composed as ``saleval-explain`` does.

    A mapping's value for a ``conf/method`` name is merged onto that file's settings
    (``{"lime": {"num_samples": 100}}``; ``None``: the file as it is); other keys pass
    through as :func:`saleval.attribution.explain_frame` takes them (a config with
    ``_target_`` or ``kind``, a registry name, an :class:`~saleval.attribution.Attributor`).
    """
    from omegaconf import OmegaConf

    from saleval.attribution import Attributor
    from saleval.stages.run import compose_stage

    if isinstance(methods, str):
        methods = [methods]
    given: dict[str, Any] = {}
    if methods is None:
        names: list[str] | None = None
    elif isinstance(methods, Mapping):
        given = dict(methods)
        names = [k for k in given if (paths.conf_dir() / "method" / f"{k}.yaml").is_file()]
    else:
        names = []
        for m in methods:
            if isinstance(m, Attributor):
                given[m.name or m.registry_name] = m
            else:
                names.append(str(m))
    overrides = [] if names is None else [f"method=[{','.join(names)}]"]
    overrides += [] if seed is None else [f"seed={int(seed)}"]
    cfg = compose_stage("explain", overrides)
    names_of_files = set(names or [])
    composed = OmegaConf.to_container(cfg.method, resolve=True) if cfg.method else {}
    assert isinstance(composed, dict)
    out: dict[str, Any] = {str(k): v for k, v in composed.items()}
    for key, value in given.items():
        if key in names_of_files and value is None:
            continue  # the file's settings as they are
        if key in names_of_files and isinstance(value, Mapping):
            out[key] = {**out[key], **dict(value)}
        else:
            out[key] = value
    return out


def _texts_frame(
    texts: Sequence[str] | pd.Series | pd.DataFrame,
    labels: Sequence[int | str] | None,
    label_names: Sequence[str],
) -> pd.DataFrame:
    """``sample_id, text[, label]`` for explain_frame; label names become class indices."""
    if isinstance(texts, str):
        raise TypeError("explain() takes a list of texts; wrap a single text in a list")
    if isinstance(texts, pd.DataFrame):
        if "text" not in texts.columns:
            raise ValueError(f"texts: a DataFrame needs a 'text' column; has {list(texts.columns)}")
        df = texts.copy()
        if "sample_id" not in df.columns:
            df.insert(0, "sample_id", df.index.astype(str))
    elif isinstance(texts, pd.Series):
        df = pd.DataFrame({"sample_id": texts.index.astype(str), "text": texts.to_numpy()})
    else:
        df = pd.DataFrame({"sample_id": [str(i) for i in range(len(texts))], "text": list(texts)})
    if labels is not None:
        if len(labels) != len(df):
            raise ValueError(f"labels: {len(labels)} labels for {len(df)} texts")
        df["label"] = list(labels)
    if "label" in df.columns:
        index = {n: i for i, n in enumerate(label_names)}
        codes = []
        for row, v in enumerate(df["label"]):
            if isinstance(v, str):
                if v not in index:
                    raise ValueError(f"labels, row {row}: {v!r} is not one of {list(label_names)}")
                v = index[v]
            codes.append(v)
        df["label"] = pd.array(codes, dtype="Int64")
    return df.reset_index(drop=True)


def _frame(
    predictions: pd.DataFrame, attributions: pd.DataFrame, max_length: int, model: str | None
) -> pd.DataFrame:
    """One row per (text, method, word): the attribution columns, then the text's own."""
    per_text = [c for c in predictions.columns if c in _PER_TEXT or PROBS.holds(c)]
    out = attributions.merge(
        predictions[["sample_id", *per_text]], on="sample_id", how="left", validate="many_to_one"
    )
    out = out[[c for c in out.columns if c != "text"] + ["text"]]  # long text last
    out.attrs.update(max_length=int(max_length), model=model)
    return out


def _tables(frame: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The frame of :func:`explain` back as ``(predictions, attributions)`` tables."""
    need = [*tables.ATTRIBUTIONS.columns, "text", "pred"]
    missing = [c for c in need if c not in frame.columns]
    if missing:
        raise ValueError(
            f"explanations lack column(s) {missing}: pass the frame saleval.explain() or "
            "saleval.read_explanations() returned"
        )
    attr_cols = [*tables.ATTRIBUTIONS.columns, *(["target"] if "target" in frame else [])]
    pred_cols = ["sample_id"] + [c for c in frame.columns if c in _PER_TEXT or PROBS.holds(c)]
    predictions = frame[pred_cols].drop_duplicates("sample_id").reset_index(drop=True)
    return predictions, frame[attr_cols].reset_index(drop=True)


def explain(
    texts: Sequence[str] | pd.Series | pd.DataFrame,
    model: ModelLike,
    methods: str | Sequence[str | Attributor] | Mapping[str, Any] | None = None,
    *,
    target: str = "prediction",
    labels: Sequence[int | str] | None = None,
    max_length: int | None = None,
    batch_size: int = 64,
    seed: int | None = None,
    device: str | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """Word scores of every method for every text: one row per (text, method, word).

    ``texts``: a list (sample ids ``"0"``, ``"1"``, ...), a Series (its index gives the
    ids) or a DataFrame with ``text`` (and optionally ``sample_id``, ``label``).
    ``model``: anything :func:`load_model` takes. ``methods``: ``conf/method`` names
    (``"lime"``, ``"preset/lu2024"``) with their settings there; a mapping
    ``{name: overrides}`` changes some (``{"lime": {"num_samples": 200}, "random": None}``,
    None keeping the file's); None: the methods ``saleval-explain`` runs by default.
    ``target``: explain the model's ``prediction`` (no labels needed) or the ``gold``
    label (``labels`` required: class indices or names). ``max_length``: None takes the
    train run's, else :data:`saleval.config.model.DEFAULT_MAX_LENGTH` (256), as the explain
    stage does; the model's position limit caps it
    (:func:`saleval.modeling.interface.effective_max_length`). ``seed``: None takes the explain
    stage's default, so seeded methods (random, LIME) give the stage's numbers.

    Columns: ``sample_id, method, word_index, word, char_start, char_end, score, target``
    (the class explained), then per text ``label`` (when given), ``pred``,
    ``prob_<class>``, ``n_words``, ``truncated`` and ``text``. ``.attrs["max_length"]``
    records the token limit, which :func:`evaluate` re-segments with.
    """
    from saleval.attribution import explain_frame
    from saleval.modeling.interface import effective_max_length
    from saleval.modeling.models import label_names_of

    clf = load_model(model, device=device)
    df = _texts_frame(texts, labels, label_names_of(clf.model))
    length = effective_max_length(max_length or clf.max_length, clf.model, clf.tokenizer)
    attributions, predictions = explain_frame(
        clf.model,
        clf.tokenizer,
        df,
        _method_configs(methods, seed),
        target=target,
        max_length=length,
        batch_size=batch_size,
        progress=progress,
    )
    return _frame(predictions, attributions, length, clf.name)


def read_explanations(run: str | os.PathLike[str]) -> pd.DataFrame:
    """An explain run (dir, ``runs:/<id>`` or ``latest``) as the frame :func:`explain` returns."""
    from saleval.pipeline.records.run_inputs import resolve_input
    from saleval.pipeline.records.run_record import RunRecord

    run_dir = resolve_input("explain", str(run))
    prov = RunRecord.read(run_dir).provenance_of_run(run_dir)
    if prov.max_length is None:
        raise ValueError(f"{run_dir}: run.json records no max_length; is it an explain run?")
    return _frame(
        tables.PREDICTIONS.read(run_dir),
        tables.ATTRIBUTIONS.read(run_dir),
        prov.max_length,
        prov.model,
    )


def _metrics_config(metrics: str | Mapping[str, Any] | MetricsConfig, kgrid: str) -> MetricsConfig:
    """A ``conf/metrics`` name (or overrides of ``default``), composed as ``saleval-metrics``
    composes it."""
    from omegaconf import OmegaConf

    from saleval.metrics.config import MetricsConfig
    from saleval.stages.run import compose_stage

    if isinstance(metrics, MetricsConfig):
        return metrics
    name = metrics if isinstance(metrics, str) else "default"
    cfg = compose_stage("metrics", [f"metrics={name}", f"kgrid={kgrid}"])
    node = OmegaConf.to_container(cfg.metrics, resolve=True)
    assert isinstance(node, dict)
    if isinstance(metrics, Mapping):
        node = OmegaConf.to_container(OmegaConf.merge(node, dict(metrics)))
    return MetricsConfig.from_config(node)  # type: ignore[arg-type]


def evaluate(
    explanations: pd.DataFrame,
    model: ModelLike,
    *,
    metrics: str | Mapping[str, Any] | MetricsConfig = "default",
    kgrid: str = "paper",
    columns: str | Sequence[str] = "summary",
    per_example: bool = False,
    max_length: int | None = None,
    device: str | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """The automated faithfulness metrics of every method: one row per method.

    Computed by ``saleval-metrics``' engine (:func:`saleval.metrics.faithfulness.evaluate`) on the
    model's prediction, after re-segmenting each text exactly as it was explained (with
    the frame's ``attrs["max_length"]``, or ``max_length``). ``metrics``: a
    ``conf/metrics`` name (``default``, ``quick``, ``mask``, ``unk``) or overrides of
    ``default`` (``{"aopc_k": 5}``); ``kgrid``: the ``conf/kgrid`` whose ks the per-k
    metrics use. ``columns``: ``summary`` (each metric's grid average, or its only k),
    ``all`` (every ``metric@k``) or a list of names, as ``saleval-compare`` names them.
    ``per_example``: the long per-(sample, method, metric, k) table instead
    (``metrics_per_example.parquet``'s layout). Definitions: ``docs/metrics.md``.
    """
    from saleval.analysis.metric_columns import select_columns, wide_metrics
    from saleval.metrics import faithfulness

    length = max_length or explanations.attrs.get("max_length")
    if not length:
        raise ValueError(
            "evaluate: the explanations frame records no max_length (attrs lost by an "
            "operation?): pass max_length=<the token limit they were explained with>"
        )
    mcfg = _metrics_config(metrics, kgrid)
    clf = load_model(model, device=device)
    predictions, attributions = _tables(explanations)
    items = faithfulness.explanations_from_tables(
        predictions,
        attributions,
        clf.tokenizer,
        int(length),
        None if mcfg.methods is None else [str(m) for m in mcfg.methods],
        where="explanations",
    )
    result = faithfulness.evaluate(clf.model, clf.tokenizer, items, mcfg, progress=progress)
    if per_example:
        return result.per_example
    summary = faithfulness.summarize(result.per_example)
    methods = list(dict.fromkeys(summary["method"]))
    wide = wide_metrics(summary, select_columns(summary, columns), ["method"])
    return wide.reindex(methods).rename_axis(columns=None)


def highlight(
    explanations: pd.DataFrame,
    k: int = 10,
    samples: int | Sequence[str] = 5,
    methods: Sequence[str] | None = None,
    title: str = "Saliency highlights",
) -> HTMLPage:
    """Each method's top ``k`` words marked in the text, darker for higher ranks.

    The explain stage's ``views/highlights.html`` (:func:`saleval.analysis.views.highlight_html`,
    ranking by :func:`saleval.words.rank_words`: ties in text order) for the first
    ``samples`` texts or the given sample ids; ``methods`` picks and orders the rows. A
    ``str`` that Jupyter shows as HTML; write it to a file to open it in a browser.
    """
    from saleval.analysis.views import highlight_html

    predictions, attributions = _tables(explanations)
    if methods is not None:
        missing = sorted(set(methods) - set(attributions["method"]))
        if missing:
            raise ValueError(f"highlight: method(s) {missing} not in the explanations")
        order = {m: i for i, m in enumerate(methods)}
        attributions = attributions[attributions["method"].isin(order)]
        attributions = attributions.sort_values("method", key=lambda s: s.map(order), kind="stable")
    label_names = PROBS.names(predictions.columns)
    return HTMLPage(highlight_html(predictions, attributions, samples, k, label_names, title))
