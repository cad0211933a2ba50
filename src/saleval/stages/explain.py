"""``saleval-explain``: word saliency of a trained model (docs/methods.md, docs/architecture.md).

Reads ``inputs.model`` (a train run), explains ``data.split`` of ``dataset`` (all of
it, ``data.n_samples`` seeded class-balanced samples, or ``data.sample_ids``; from
``data.population``: all, the correctly classified or the misclassified ones) with
every method in ``method``, on ``trainer.accelerator`` (``trainer=ddp``: the examples
sharded over every GPU by Lightning's predict loop, the same tables as on one; see
:mod:`saleval.attribution.frame`). Writes ``attributions.parquet``
and ``predictions.parquet``; logs the explained samples as the run's input, per method
(one child run each) wall time, examples/s and IG/DeepLIFT convergence deltas, and the
views (``views/highlights.html``, ``views/overlap.csv``,
``views/overlap.png``), and ``method_timings.csv`` (per method: seconds, whether its
scores were reused from an earlier run, mean diagnostics).

Main options: ``inputs.model``, ``method`` (the list of methods; ``method=[lime,occlusion]``),
``data.n_samples``, ``data.population``, ``data.split``, ``trainer`` (cpu, gpu, ddp),
``progress``.

Example::

    saleval-explain inputs.model=latest data.n_samples=40 data.population=correct
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig

from saleval import paths
from saleval.config.model import is_prompted
from saleval.modeling.data import load_dataset
from saleval.modeling.data_checks import DataError
from saleval.pipeline import tables
from saleval.pipeline.records.fingerprints import fingerprint
from saleval.pipeline.records.run_inputs import model_input
from saleval.pipeline.stage import Stage
from saleval.pipeline.tracker import tracking_models
from saleval.vocab import Population, Target

if TYPE_CHECKING:
    from saleval.attribution.reuse import MethodReuse

log = logging.getLogger(__name__)

TIMINGS = "method_timings.csv"
#: ``SALEVAL_METHOD_REUSE=0`` turns per-method reuse off everywhere (timing runs, the tests)
REUSE_ENV = "SALEVAL_METHOD_REUSE"


def draw_samples(
    df: pd.DataFrame,
    n: int | None,
    seed: int,
    sample_ids: Sequence[str] | None = None,
    n_classes: int | None = None,
) -> pd.DataFrame:
    """Explicit ``sample_ids`` (in that order), or ``n`` seeded, class-balanced rows.

    Balanced: each class gets ⌊n/C⌋ rows (the first n mod C classes one more); a class
    with too few rows gives all it has and the rest is drawn from the others.
    """
    if sample_ids is not None:
        ids = [str(s) for s in sample_ids]
        index = pd.Index(df["sample_id"].astype(str))
        missing = [s for s in ids if s not in index]
        if missing:
            raise DataError(f"data.sample_ids: {missing[:5]} not in the split")
        return df.iloc[index.get_indexer(ids)].reset_index(drop=True)
    if n is None or n >= len(df):
        return df.reset_index(drop=True)
    rng = np.random.default_rng(seed)
    classes = sorted(df["label"].unique()) if n_classes is None else list(range(n_classes))
    quota = {c: n // len(classes) + (i < n % len(classes)) for i, c in enumerate(classes)}
    picked: list[int] = []
    for c in classes:
        rows = np.flatnonzero(df["label"].to_numpy() == c)
        picked.extend(rng.permutation(rows)[: quota[c]].tolist())
    rest = np.setdiff1d(np.arange(len(df)), picked)
    picked.extend(rng.permutation(rest)[: n - len(picked)].tolist())
    return df.iloc[sorted(picked)].reset_index(drop=True)


def filter_population(
    model: Any, tokenizer: Any, df: pd.DataFrame, population: Population, max_length: int
) -> pd.DataFrame:
    """Keep the samples the model classifies correctly / wrongly (docs/study-design.md#samples)."""
    from saleval.modeling.inference import predict_proba

    population = Population(population)
    if population == Population.all:
        return df
    ids = tokenizer(df["text"].astype(str).tolist(), truncation=True, max_length=max_length)
    pred = predict_proba(model, ids["input_ids"], tokenizer=tokenizer).argmax(1)
    right = pred == df["label"].to_numpy()
    return df[right if population == Population.correct else ~right].reset_index(drop=True)


def method_rows(
    timings: Mapping[str, Mapping[str, float]], diag: Mapping[str, Any]
) -> pd.DataFrame:
    """One row per method: ``seconds``, ``examples_per_second`` and the mean diagnostics
    (``convergence_delta_abs_mean``: the IG / DeepLIFT completeness gap; ``<key>_mean``),
    logged as the method's child run (:func:`saleval.pipeline.tracker.tracking.log_method_rows`).

    >>> method_rows({"lime": {"seconds": 2.0, "examples_per_s": 5.0}},
    ...             {"lime": {"convergence_delta": [-1.0, 3.0]}}).to_dict("records")
    [{'method': 'lime', 'seconds': 2.0, 'examples_per_second': 5.0, 'convergence_delta_abs_mean': 2.0}]
    """
    names = {"examples_per_s": "examples_per_second"}
    rows = []
    for m, t in timings.items():
        row: dict[str, Any] = {"method": m, **{names.get(k, k): v for k, v in t.items()}}
        for key, vals in (diag.get(m) or {}).items():
            if key == "convergence_delta":
                row[f"{key}_abs_mean"] = float(np.mean(np.abs(vals)))
            else:
                row[f"{key}_mean"] = float(np.mean(vals))
        rows.append(row)
    return pd.DataFrame(rows, columns=None if rows else ["method"])


def method_reuse(cfg: DictConfig, st: Stage) -> MethodReuse:
    """This run's :class:`saleval.attribution.reuse.MethodReuse`: each method's fingerprint
    (its settings, the samples, the model's train run, the device, the scoring code) and
    the store under the output root. Off (nothing found, nothing stored) where reuse is
    turned off, or unsafe: several processes (each must run the same methods), a model
    that is no train run, or a parent without a fingerprint."""
    from saleval.attribution.reuse import MethodReuse, MethodStore, code_digest, method_identity
    from saleval.modeling.devices import device_for, one_process
    from saleval.modeling.inference import bf16_native

    parent = st.inputs.parents["model"].fingerprint if "model" in st.inputs.parents else None
    off = not cfg.reuse_methods or os.environ.get(REUSE_ENV, "1") == "0"
    if off or not parent or not one_process(cfg.trainer):
        return MethodReuse()
    dev = device_for(cfg.trainer.accelerator)
    device = {"type": dev.type, "bf16_native": bf16_native(dev)}
    code = code_digest()
    methods = st.resolved.get("method") or {}
    prints = {
        k: fingerprint(method_identity(st.resolved, k, v, device, code), {"model": parent})
        for k, v in methods.items()
        if v is not None
    }
    return MethodReuse(MethodStore(paths.output_root(cfg) / "cache" / "explain"), prints)


SELF_EXPLANATIONS = "self_explanations.csv"


def self_explanations(predictions: pd.DataFrame, target: Any) -> pd.DataFrame | None:
    """One row per explained text of the ``self_explain`` method's reply: the reply, the
    text's words it named (in its order), the items that are no word of the text, and
    whether it named none (docs/methods.md#self-explanation); None when it did not run."""
    from saleval.attribution.self_explain import ANSWERS

    if not ANSWERS:
        return None
    col = "label" if Target(target) is Target.gold else "pred"
    rows = []
    for sid, text, t in zip(predictions["sample_id"], predictions["text"], predictions[col]):
        got = ANSWERS.get((str(text), int(t)))
        if got is not None:
            rows.append({"sample_id": sid, "target": int(t), "reply": got.answer,
                         "named": " ".join(got.named), "not_in_text": " ".join(got.unknown),
                         "no_word": got.no_word})  # fmt: skip
    return pd.DataFrame(rows)


def _model(
    cfg: DictConfig, st: Stage, data: Any, run: str | None, checkpoint: Any, prompting: bool
) -> tuple[Any, Any]:
    """The classifier explained: a train run's or a checkpoint's, or a causal LM prompted
    to classify, built here, whose prompt is kept with the run so that the metrics (and
    anyone) rebuild exactly this classifier (docs/data-and-models.md#prompted-llms)."""
    from saleval.modeling import prompted, prompts
    from saleval.modeling.models import MODEL_DIR, checkpoint_name, load_trained

    if checkpoint and prompting and prompts.prompt_dir(checkpoint) is None:
        model, tokenizer, pspec = prompted.build(
            cfg.model, str(checkpoint), data.label_names, data["train"]
        )
        pspec.save(st.path(MODEL_DIR))
        st.provide(model=f"{checkpoint_name(checkpoint)}-prompted")
    else:
        model, tokenizer = load_trained(st.inputs["model"] if run else str(checkpoint))
        if checkpoint:
            st.provide(model=checkpoint_name(checkpoint))
    if isinstance(tokenizer, prompts.PromptTokenizer):
        st.tracking.set_tags(prompts.describe(tokenizer.spec))
    return model, tokenizer


def run(cfg: DictConfig) -> dict[str, Any]:
    # torch, transformers (and Lightning) load when a run starts, not on import (saleval.cli)
    import torch

    from saleval.analysis import views
    from saleval.attribution import explain_frame, method_name
    from saleval.modeling import prompts
    from saleval.modeling.devices import device_for, single_device
    from saleval.modeling.interface import effective_max_length, model_tags
    from saleval.modeling.models import align_labels

    prompting = cfg.get("model") is not None and is_prompted(cfg.model)
    pretrained = cfg.model.get("pretrained") if prompting else None  # the causal LM prompted
    spec, run, checkpoint = model_input(
        cfg, str(pretrained) if pretrained else None, " (model=prompted: model.pretrained=<dir>)"
    )
    # from a train run: the dataset and the model's name come from it unless given (checked
    # then); a checkpoint of the user's own brings no provenance, so dataset= is required
    inputs = {"model": run} if run else {}
    tags = {"checkpoint": checkpoint} if checkpoint else {}
    inherits = ("dataset", "model")
    with Stage(cfg, "explain", inputs, tags=tags, inherits=inherits, requires=["dataset"]) as st:
        data = load_dataset(cfg.dataset)
        model, tokenizer = _model(cfg, st, data, run, checkpoint, prompting)
        align_labels(model, data.label_names, where=f"inputs.model={spec}")
        # the explain run's own choice, recorded so the metrics re-segment the same way
        max_length = effective_max_length(st.inputs.max_length(cfg.max_length), model, tokenizer)
        st.provide(max_length=max_length)
        st.tracking.set_tags(model_tags(model, tokenizer))
        if single_device(cfg.trainer):  # the population's predictions on the job's device
            torch.nn.Module.to(model, device_for(cfg.trainer.accelerator))
        pool = filter_population(
            model, tokenizer, data[cfg.data.split], cfg.data.population, max_length
        )
        df = draw_samples(
            pool, cfg.data.n_samples, int(cfg.seed), cfg.data.sample_ids, len(data.label_names)
        )
        if st.is_main:
            st.tracking.log_methods([method_name(k, m) for k, m in cfg.method.items()])
            tracking_models.log_dataset(df, f"{data.name}/{cfg.data.split}", "explain", "label")
        timings: dict[str, dict[str, float]] = {}
        diag: dict[str, dict[str, list[float]]] = {}
        from saleval.attribution.self_explain import ANSWERS

        ANSWERS.clear()  # this run's replies only
        reuse = method_reuse(cfg, st)  # off unless the model is a train run
        methods = {k: m for k, m in cfg.method.items() if m is not None}

        def explain(chosen: Mapping[str, Any]) -> tuple[pd.DataFrame, pd.DataFrame]:
            return explain_frame(
                model, tokenizer, df, dict(chosen), target=Target(cfg.target),
                max_length=max_length,
                batch_size=int(cfg.batch_size), trainer=cfg.trainer,
                progress=bool(cfg.progress), timings=timings, diagnostics=diag,
            )  # fmt: skip

        attributions, predictions = reuse.explain(
            methods, explain, Target(cfg.target), timings, diag
        )
        if st.is_main:
            reuse.save(methods, attributions, timings, diag, st.tracking.run_id)
        if not st.is_main:  # DDP rank > 0 (torchrun, srun): same tables; rank 0 writes them
            return {"run_dir": str(st.run_dir), "run_id": None, "n_samples": len(df)}
        predictions["split"] = str(cfg.data.split)
        if isinstance(tokenizer, prompts.PromptTokenizer):  # the exact prompt of each text
            predictions["prompt"] = [
                tokenizer.encode_text(str(t), max_length).prompt for t in predictions["text"]
            ]
            predictions["special_tokens"] = tokenizer.spec.add_special_tokens
        st.write(tables.PREDICTIONS, predictions)
        st.write(tables.ATTRIBUTIONS, attributions)
        metrics = {
            "n_samples": len(df),
            "accuracy": float((predictions["pred"] == predictions["label"]).mean()),
        }
        st.log_metrics(metrics)
        answers = self_explanations(predictions, cfg.target)
        if answers is not None:  # what the LLM replied per text, words named and not
            answers.to_csv(st.path(SELF_EXPLANATIONS), index=False)
            st.log_file(st.path(SELF_EXPLANATIONS))
        rows = method_rows(timings, diag)
        rows.to_csv(st.path(TIMINGS), index=False)  # per method: seconds, reused, diagnostics
        st.tracking.log_method_rows(rows, table="method_timings")
        samples = cfg.view.samples if isinstance(cfg.view.samples, int) else list(cfg.view.samples)
        for path in views.write_views(
            st.path("views"), predictions, attributions, samples, int(cfg.view.k),
            int(cfg.view.overlap_k), data.label_names,
        ):  # fmt: skip
            st.log_file(path, "views")
        return {"run_dir": str(st.run_dir), "run_id": st.tracking.run_id, **metrics}
