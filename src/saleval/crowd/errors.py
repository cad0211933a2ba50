"""The crowd package's exceptions, at the bottom of its layers so every module can raise
them without importing the code that uses them. ``DesignError`` and ``SimulationError``
are declared with the schemas whose checks raise them first (:mod:`saleval.config.crowd`)
and named here too, so every crowd module takes its errors from one place."""

from __future__ import annotations

from saleval.config.crowd import DesignError as DesignError
from saleval.config.crowd import SimulationError as SimulationError
from saleval.errors import UserError


class CrowdImportError(UserError, ValueError):
    """Crowd answers cannot be imported; the message names the file, row and field."""


class SamplingError(UserError, ValueError):
    """The requested sample cannot be drawn from the explained samples."""
