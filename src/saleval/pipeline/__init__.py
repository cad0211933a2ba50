"""saleval.pipeline: the stage machinery: the stage table, a run's lifecycle, its inputs and provenance, the typed tables, MLflow (docs/architecture.md, "Where things are")."""
