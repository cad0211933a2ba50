"""saleval.modeling: datasets, models, fine-tuning and batched inference (docs/architecture.md, "Where things are")."""
