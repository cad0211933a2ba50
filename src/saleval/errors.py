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

A warning about a setting, which a user can act on but which does not stop the run, is
said once per process (:func:`warn_once`), however many batches, methods or model loads
meet it.

>>> from saleval.pipeline.records.input_paths import InputError
>>> issubclass(InputError, UserError) and issubclass(InputError, ValueError)
True
"""

from __future__ import annotations

import contextlib
import logging
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


#: the warnings :func:`warn_once` has logged in this process: (logger, message, arguments)
_WARNED: set[tuple[str, ...]] = set()
_WARNED_LOCK = threading.Lock()


def warn_once(logger: logging.Logger, msg: str, *args: object) -> bool:
    """``logger.warning(msg, *args)`` the first time this process meets that logger,
    message and arguments; afterwards nothing. True when it logged.

    For a warning about a setting that the code meets on every batch, method or model
    load (a decoder's attention query, a label word's tokens): the run's log says it
    once. Different arguments (another model class, another word) are another warning.

    >>> log = logging.getLogger("saleval.doctest_warn_once")
    >>> [warn_once(log, "query %s on %s", "all", "GPT2") for _ in range(3)]
    [True, False, False]
    >>> warn_once(log, "query %s on %s", "all", "Llama")
    True
    """
    key = (logger.name, msg, *(repr(a) for a in args))
    with _WARNED_LOCK:
        if key in _WARNED:
            return False
        _WARNED.add(key)
    logger.warning(msg, *args)
    return True


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
