"""The base of every error a user can fix from the message alone.

A stage raises a subclass of :class:`UserError` for bad input it detects itself (a run dir
that is not one, a file with a bad row, runs chained across datasets, a profile that does not
compose...); its message names the file, row, field or key and what to do. The console
scripts (:mod:`saleval.cli`) print such an error as one line and exit with status
:data:`EXIT_USER_ERROR`; any other exception is a bug or an environment problem and keeps its
traceback. Each module keeps its own class (``InputError``, ``DataError``, ``ProvenanceError``,
``CrowdImportError``...) and its builtin base, so ``except ValueError`` callers are unchanged.

A process told to stop from outside is neither: :class:`Stopped`, which
:func:`sigterm_raises` raises, the one way a SIGTERM becomes an exception here (the SLURM
job, the explain job across its ranks, the annotation server).

>>> from saleval.pipeline.input_paths import InputError
>>> issubclass(InputError, UserError) and issubclass(InputError, ValueError)
True
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

#: the exit status of a console script stopped by a :class:`UserError` (argparse's, too)
EXIT_USER_ERROR = 2


class UserError(Exception):
    """Input, data or configuration the user can fix; the message says how."""


class Stopped(BaseException):
    """The process was told to stop from outside (``scancel``, a preempting scheduler: its
    SIGTERM). A ``BaseException``, like ``KeyboardInterrupt``, so no ``except Exception``
    on the way swallows it: the stage that runs ends its run as KILLED, not FAILED
    (docs/scale-out.md, *When a job dies*)."""


def _stopped(signum: int) -> BaseException:
    return Stopped(f"the process got {signal.Signals(signum).name}")


@contextlib.contextmanager
def sigterm_raises(error: Callable[[int], BaseException] = _stopped) -> Iterator[None]:
    """While the block runs, SIGTERM raises ``error(signum)`` in the main thread (a
    :class:`Stopped` unless the caller needs another exception), so a process told to stop
    from outside unwinds like Ctrl-C: ``finally`` blocks run and the stage ends its run
    KILLED. The handler that was there before comes back when the block ends. Elsewhere
    than the main thread nothing changes: Python runs signal handlers there only.

    >>> import os
    >>> before = signal.getsignal(signal.SIGTERM)
    >>> with sigterm_raises():
    ...     os.kill(os.getpid(), signal.SIGTERM)
    Traceback (most recent call last):
    ...
    saleval.errors.Stopped: the process got SIGTERM
    >>> signal.getsignal(signal.SIGTERM) is before
    True
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, _frame: object) -> None:
        raise error(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        # None: a handler installed outside Python, which cannot be put back; the default
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
