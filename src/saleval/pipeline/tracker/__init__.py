"""The MLflow side of a run (docs/architecture.md): the tracking client and store, its
health and journal, what a stage logs, what is read back, and the catch-up of a store
that was down."""
