"""The crowd package's exceptions, at the bottom of its layers so every module can raise
them (configs validate values with them) without importing the code that uses them."""

from __future__ import annotations

from saleval.errors import UserError


class CrowdImportError(UserError, ValueError):
    """Crowd answers cannot be imported; the message names the file, row and field."""


class SamplingError(UserError, ValueError):
    """The requested sample cannot be drawn from the explained samples."""


class DesignError(UserError, ValueError):
    """The study cannot be built as configured, or a built design breaks a constraint."""


class SimulationError(UserError, ValueError):
    """The simulated crowd cannot run as configured on these tasks."""
