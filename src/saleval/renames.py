"""Where moved code lives now: one table from each old dotted address to its new one.

A run records the code that built its parts by dotted path: ``_target_`` in its
``config.yaml`` (a dataset reader, a model source, a crowd source, a method) and the
modules of ``metrics.plugins``. Code that moves leaves those paths behind, so a stage
that adopts an older run reads its config through :func:`rewrite_config`
(:func:`saleval.pipeline.run_record.read_run_config`): one rule, "an old path maps to
its new one", instead of a module kept at every old address (docs/architecture.md,
*Old addresses*). A move adds a row here; nothing else changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: old dotted prefix (a module, or one name of a module) -> where it is now
RENAMES: Mapping[str, str] = {
    # the root modules grouped into packages (issue #27)
    "saleval.data": "saleval.modeling.data",
    "saleval.models": "saleval.modeling.models",
    # every metric in one package
    "saleval.faithfulness": "saleval.metrics.faithfulness",
    "saleval.metrics_config": "saleval.metrics.config",
    "saleval.metrics_registry": "saleval.metrics.registry",
    "saleval.plausibility": "saleval.metrics.plausibility",
    "saleval.shortcut.metrics": "saleval.metrics.shortcut",
    # the crowd's schemas beside every other schema
    "saleval.crowd.config": "saleval.config.crowd",
    # layers that only point down (issue #38): scoring a simulated crowd is analysis
    "saleval.crowd.validation": "saleval.analysis.validation",
    "saleval.crowd.published.published_ranking_agreement": (
        "saleval.analysis.validation.published_ranking_agreement"
    ),
    # the crowd package, one subpackage per concept (issue #47)
    **{
        f"saleval.crowd.{old}": f"saleval.crowd.{new}"
        for old, new in {
            "reading": "importing.rows",
            "source": "importing.source",
            "long_format": "importing.long_format",
            "lu2024": "importing.published_format",
            "published": "importing.published_study",
            "quality": "importing.quality",
            "aggregation": "importing.aggregation",
            "importer": "importing.builtin",
            "readers": "simulation.readers",
            "lexicon": "simulation.lexicon",
            "simulate": "simulation.workers",
            "sampling": "design.sampling",
            "exports": "export.formats",
        }.items()
    },
    # the annotation store in its three layers, one module each
    **{
        f"saleval.annotate.store.{name}": f"saleval.annotate.{module}.{name}"
        for module, names in {
            "store_db": (  # LeasePolicy is gone: its fields are annotate.* (AnnotateConfig)
                "SCHEMA_VERSION",
                "SYNCHRONOUS",
                "StoreDatabase",
                "StoreError",
                "utcnow",
            ),
            "store_leases": ("Assignment", "BundleRefused", "LeaseStore", "ResumeRequired"),
            "store_answers": ("AnnotationStore", "AnswerRejected", "AnswerResult", "NextTask"),
        }.items()
        for name in names
    },
    # the pay rule beside the planner, shared with the annotation app (issue #54)
    "saleval.analysis.planning.Costing": "saleval.analysis.costing.Costing",
    "saleval.analysis.planning.cheapest": "saleval.analysis.costing.cheapest",
    # the MLflow side: datasets and models logged, runs read back (issue #54)
    **{
        f"saleval.pipeline.tracking.{name}": f"saleval.pipeline.tracker.{module}.{name}"
        for module, names in {
            "tracking_models": ("log_dataset", "log_hf_model"),
            # PARENT_TAG and children: tracking reads them too, so those addresses stand
            "tracking_reads": (
                "children_filter",
                "method_rows",
                "download_run",
                "find_runs",
            ),
        }.items()
        for name in names
    },
    # pipeline/ split by concept (issue #54): the run records and inputs, the MLflow side
    **{
        f"saleval.pipeline.{module}": f"saleval.pipeline.{package}.{module}"
        for package, modules in {
            "records": [
                "run_record",
                "provenance",
                "run_inputs",
                "merge",
                "input_paths",
                "run_outputs",
                "jsonfiles",
                "run_naming",
                "dead_runs",
                "slurm_state",
            ],
            "tracker": [
                "tracking",
                "tracking_health",
                "tracking_journal",
                "tracking_models",
                "tracking_reads",
                "catch_up",
                "stage_tracking",
            ],
        }.items()
        for module in modules
    },
    # a parent's config.yaml is read beside its record; the provenance rule in its module
    "saleval.pipeline.run_inputs.read_run_config": (
        "saleval.pipeline.records.run_record.read_run_config"
    ),
    # "the embeddings" of every family beside the one forward (issue #54)
    "saleval.modeling.interface.EmbeddingPoint": "saleval.modeling.embedding.EmbeddingPoint",
    "saleval.modeling.interface.embedding_point": "saleval.modeling.embedding.embedding_point",
    # a run's identity (its fingerprint) beside the rest of its record (issue #54)
    **{
        f"saleval.pipeline.stage.{name}": f"saleval.pipeline.records.fingerprints.{name}"
        for name in ("fingerprint", "stage_fingerprint")
    },
    # the Trainer for several processes in its own module, imported only for them
    "saleval.attribution.frame.make_trainer": "saleval.attribution.distributed.make_trainer",
}

#: the config keys whose values are dotted paths of code
TARGET = "_target_"
PLUGINS = ("metrics", "plugins")


def renamed(path: str) -> str:
    """Where ``path`` is now: its longest prefix (whole dotted parts) that the table
    names, replaced; ``path`` itself when nothing of it moved.

    >>> renamed("saleval.data.read_ag_news")
    'saleval.modeling.data.read_ag_news'
    >>> renamed("saleval.faithfulness.engine")
    'saleval.metrics.faithfulness.engine'
    >>> renamed("saleval.database.x"), renamed("saleval.modeling.data.read_imdb")
    ('saleval.database.x', 'saleval.modeling.data.read_imdb')
    """
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        new = RENAMES.get(".".join(parts[:n]))
        if new is not None:
            return ".".join([new, *parts[n:]])
    return path


def rewrite_config(node: Any, where: str = "") -> list[str]:
    """Rewrite, in place, every ``_target_`` and ``metrics.plugins`` entry of a plain
    config tree (dicts and lists) that names an old address; returns ``key: old -> new``
    for each.

    >>> cfg = {"dataset": {"_target_": "saleval.data.read_sst2"}, "metrics": {"plugins": ["x"]}}
    >>> rewrite_config(cfg), cfg["dataset"]["_target_"]
    (['dataset._target_: saleval.data.read_sst2 -> saleval.modeling.data.read_sst2'], \
'saleval.modeling.data.read_sst2')
    """
    changes: list[str] = []
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{where}.{key}" if where else str(key)
            if key == TARGET and isinstance(value, str) and renamed(value) != value:
                node[key] = renamed(value)
                changes.append(f"{path}: {value} -> {node[key]}")
            elif tuple(path.split(".")) == PLUGINS and isinstance(value, list):
                for i, module in enumerate(value):
                    if isinstance(module, str) and renamed(module) != module:
                        value[i] = renamed(module)
                        changes.append(f"{path}[{i}]: {module} -> {value[i]}")
            else:
                changes.extend(rewrite_config(value, path))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            changes.extend(rewrite_config(value, f"{where}[{i}]"))
    return changes
