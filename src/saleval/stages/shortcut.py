"""``saleval-shortcut``: saliency faithfulness against a planted shortcut (docs/shortcut.md,
docs/architecture.md).

data (source + planted tokens) → two models (original, mixed) → verification (fails
loudly, before any saliency) → every method configuration of ``method`` on the
synthetic test set. Writes ``shortcut_results.csv``, ``verification.json``,
``shortcut_table.md`` (published layout), ``shortcut_per_example.parquet``,
``data/*.parquet`` and both models (``original/model``, ``mixed/model``).
``-m shortcut=st,tic,op dataset=...`` sweeps; each job also refreshes the sweep's
combined table (``<sweep dir>/shortcut_table.md``).

Reads no run: the source ``dataset`` and the ``shortcut`` kind (st, tic, op).

Main options: ``shortcut``, ``dataset``, ``model``, ``method`` (the method list),
``trainer``, ``explain.n_samples``.

Example::

    saleval-shortcut shortcut=st dataset=sst2 model=minilm
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from saleval.config.model import is_prompted
from saleval.errors import UserError
from saleval.pipeline import tables
from saleval.pipeline.records.jsonfiles import write_json
from saleval.pipeline.stage import Stage
from saleval.vocab import Target

TABLE_MD = "shortcut_table.md"


def dataset_label(cfg: DictConfig) -> str:
    """The dataset column: the dataset's name, ``_binary`` when classes were mapped."""
    return f"{cfg.dataset.name}_binary" if cfg.get("label_map") is not None else cfg.dataset.name


def run(cfg: DictConfig) -> dict[str, Any]:
    # torch, transformers (and Lightning) load when a run starts, not on import (saleval.cli)
    import torch

    from saleval.modeling.devices import device_for
    from saleval.modeling.models import load_trained
    from saleval.shortcut import experiment as ex
    from saleval.shortcut.report import published_table, to_markdown, uncertainty_markdown
    from saleval.shortcut.verify import require

    if is_prompted(cfg.model):  # before any run dir: the protocol fine-tunes its models
        raise UserError(
            "model=prompted: the synthetic-shortcut protocol fine-tunes a model on planted "
            "tokens, and a prompted LLM is not fine-tuned; use a fine-tunable model "
            "(model=minilm, model.pretrained=<dir>)"
        )
    kind = str(cfg.shortcut.kind)
    with Stage(cfg, "shortcut", tags={"shortcut": kind, "unit": str(cfg.shortcut.unit)}) as st:
        reference = _reference(cfg)
        data, tokenizer = ex.prepare_data(cfg)
        for path in ex.write_data(data, st.run_dir):
            st.log_file(path, ex.DATA_DIR)
        st.log_metrics({k: v for k, v in data.info.items() if isinstance(v, int | float)})
        models, fits = ex.train_pair(cfg, data, tokenizer, st.run_dir, st.tracking.child_run)
        # verification and the sweep run outside a Trainer: on the device the fit used
        device = device_for(cfg.trainer.accelerator)
        for m in models.values():
            torch.nn.Module.to(m, device)  # in place (transformers' typed `to` wraps it)
        for name, fit_metrics in fits.items():
            st.log_metrics({f"{name}_{k}": v for k, v in fit_metrics.items() if _num(v)})
        max_length = int(cfg.model.max_length)
        report, mixed_pred = ex.verify_models(
            models, tokenizer, data, cfg.shortcut.verify, max_length
        )
        info = {**report.to_dict(), "data": data.info, "training": fits}
        write_json(st.path("verification.json"), info)
        st.log_file(st.path("verification.json"))
        st.log_metrics({f"verify_{k}": v for k, v in report.to_dict().items() if _num(v)})
        st.tracking.set_tags({"verification": "passed" if report.passed else "failed"})
        require(report)  # raises VerificationError: no saliency on a model without the shortcut

        model, _ = load_trained(st.run_dir / "mixed", attn_implementation="eager")
        torch.nn.Module.to(model, device)
        del models  # the sweep's eager copy replaces them (GPU memory)
        pool = data.synthetic_test.assign(pred=mixed_pred)
        methods = ex.select_methods(
            cfg.method, cfg.explain.n_samples, cfg.explain.budget, cfg.explain.skip
        )
        examples = ex.explain_pool(pool, cfg.explain.n_samples, int(cfg.seed))
        target_col = {Target.prediction: "pred", Target.gold: "label"}[cfg.explain.target]
        summary, per_example = ex.saliency_sweep(
            model,
            tokenizer,
            examples,
            examples[target_col].tolist(),
            methods,
            max_length,
            progress=cfg.progress,
            unit=cfg.shortcut.unit,
        )
        results = summary.assign(dataset=dataset_label(cfg), shortcut=kind)
        st.write(tables.SHORTCUT_RESULTS, results)
        per_example.to_parquet(st.path("shortcut_per_example.parquet"), index=False)
        st.log_file(st.path("shortcut_per_example.parquet"))
        unit = str(cfg.shortcut.unit)
        st.path(TABLE_MD).write_text(
            to_markdown(published_table(results), "Shortcut results", unit)
            + uncertainty_markdown(results)
            + _reference_markdown(cfg, reference, results)
        )
        st.log_file(st.path(TABLE_MD))
        # one child run per method configuration (its name is the run's `method`)
        rows = summary.drop(columns=["method"]).rename(columns={"config": "method"})
        st.tracking.log_method_rows(
            rows.drop(columns=["k"], errors="ignore"), table="shortcut_results"
        )
        _refresh_sweep_table(st, cfg, reference)
        return {
            "run_dir": str(st.run_dir),
            "run_id": st.tracking.run_id,
            "verification": report.to_dict(),
            "results": results,
            "objective": float(summary["precision"].mean()),
        }


def _reference(cfg: DictConfig) -> Any:
    """The ``reference`` file, read (and checked) before any model is trained."""
    from saleval.shortcut.report import read_reference

    return read_reference(cfg.reference) if cfg.get("reference") else None


def _reference_markdown(cfg: DictConfig, reference: Any, results: Any) -> str:
    """Published results beside ours when ``reference`` names a file (else nothing)."""
    from saleval.shortcut.report import beside_reference

    if reference is None:
        return ""
    return beside_reference(results, reference, str(cfg.reference))


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _refresh_sweep_table(st: Stage, cfg: DictConfig, reference: Any) -> None:
    """In a Hydra multirun, rebuild the combined table of every finished job so far."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from saleval.shortcut.report import (
        combine_runs,
        published_table,
        to_markdown,
        uncertainty_markdown,
    )

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    sweep_dir = st.run_dir.parent  # hydra.sweep.dir/<job number>
    jobs = sorted(p for p in sweep_dir.iterdir() if tables.SHORTCUT_RESULTS.path(p).is_file())
    results = combine_runs(jobs)
    units = sorted(set(results["unit"])) if "unit" in results else ["word"]
    path = sweep_dir / TABLE_MD
    runs = f"{len(jobs)} run{'' if len(jobs) == 1 else 's'}"
    title = f"Shortcut results (sweep {sweep_dir.name}, {runs})"
    path.write_text(
        to_markdown(published_table(results), title, " and ".join(units))
        + uncertainty_markdown(results)
        + _reference_markdown(cfg, reference, results)
    )
    st.log_file(path, "sweep")
