"""The base of every error a user can fix from the message alone.

A stage raises a subclass of :class:`UserError` for bad input it detects itself (a run dir
that is not one, a file with a bad row, runs chained across datasets, a profile that does not
compose...); its message names the file, row, field or key and what to do. The console
scripts (:mod:`saleval.cli`) print such an error as one line and exit with status
:data:`EXIT_USER_ERROR`; any other exception is a bug or an environment problem and keeps its
traceback. Each module keeps its own class (``InputError``, ``DataError``, ``ProvenanceError``,
``CrowdImportError``...) and its builtin base, so ``except ValueError`` callers are unchanged.

>>> from saleval.pipeline.input_paths import InputError
>>> issubclass(InputError, UserError) and issubclass(InputError, ValueError)
True
"""

from __future__ import annotations

#: the exit status of a console script stopped by a :class:`UserError` (argparse's, too)
EXIT_USER_ERROR = 2


class UserError(Exception):
    """Input, data or configuration the user can fix; the message says how."""


class Stopped(BaseException):
    """The process was told to stop from outside (``scancel``, a preempting scheduler: its
    SIGTERM). A ``BaseException``, like ``KeyboardInterrupt``, so no ``except Exception``
    on the way swallows it: the stage that runs ends its run as KILLED, not FAILED
    (docs/scale-out.md, *When a job dies*)."""
