"""The old address of :mod:`saleval.modeling.data`, kept because configs recorded by runs made
before the move (and users' own config files) name its classes in ``_target_``; a run
adopting such a run's config resolves them here (docs/architecture.md, "Where things are")."""

from saleval.modeling.data import *  # noqa: F403
