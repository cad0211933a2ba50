"""The crowd package's exceptions, at the bottom of its layers so every module can raise
them without importing the code that uses them. ``DesignError`` and ``SimulationError``
live with the schemas whose checks raise them first (:mod:`saleval.config.crowd`), and
are imported from there."""

from __future__ import annotations

from saleval.errors import UserError


class CrowdImportError(UserError, ValueError):
    """Crowd answers cannot be imported; the message names the file, row and field."""


class SamplingError(UserError, ValueError):
    """The requested sample cannot be drawn from the explained samples."""
