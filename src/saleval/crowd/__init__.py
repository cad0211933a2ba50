"""The crowd side of the study: tasks and bundles (design), the simulated crowd,
the import of answers, quality filters, aggregation, and the annotation app."""
