"""saleval: which word-saliency method helps people, and do automated metrics agree?

The package is a pipeline of Hydra stages (``saleval.stages``) that exchange the
typed tables declared in :mod:`saleval.tables` and log every run to MLflow
(:mod:`saleval.tracking`).
"""

__version__ = "0.1.0"
