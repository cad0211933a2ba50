"""A run's records and inputs (docs/architecture.md): ``run.json``, the provenance rule,
what ``inputs.<name>`` names and how it is resolved, merged and checked, and where a
run's outputs go and what it is called."""
