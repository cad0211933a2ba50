"""Progress that reads well where it lands (docs/scale-out.md#job-logs).

At a terminal a loop shows a tqdm bar. Where stderr is a file (a SLURM job's log, a Ray
worker, ``make run > log``), a bar's redraws (``\\r``, escape codes) would all be kept, one
long line per bar; there a loop says instead, in plain log lines, where it stands: at most
one line per tenth of its length and one at its end (:func:`bar`), and an inner loop
(``leave=False``: the batches of one step) says nothing, since its step's own line follows.
Training epochs get one line each (:class:`saleval.modeling.training.EpochLines`).

>>> list(bar(range(3), "demo", disable=True))
[0, 1, 2]
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger("saleval.progress")

#: a file-bound loop says where it stands at most this many times (plus its end)
LINES = 10


def interactive(stream: Any = None) -> bool:
    """Whether ``stream`` (default: stderr, where progress goes) is a terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced or closed
        return False


def bar(
    iterable: Iterable[T],
    desc: str,
    total: int | None = None,
    disable: bool | None = False,
    leave: bool = True,
) -> Iterable[T]:
    """``iterable``, with its progress shown as the module docstring says. ``disable``:
    False shows it, True hides it, None (tqdm's meaning) shows it at a terminal only."""
    if disable:
        return iterable
    if interactive():
        from tqdm.auto import tqdm

        return tqdm(iterable, desc=desc, total=total, leave=leave)
    if not leave or disable is None:
        return iterable
    if total is None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    return _lines(iterable, desc, total)


def line(desc: str, done: int, total: int | None, seconds: float) -> str:
    """One progress line.

    >>> line("methods", 3, 9, 42.4)
    'methods: 3/9 (33%), 42 s'
    >>> line("records", 120, None, 5)
    'records: 120, 5 s'
    """
    share = f"/{total} ({100 * done / total:.0f}%)" if total else ""
    return f"{desc}: {done}{share}, {seconds:.0f} s"


def _lines(iterable: Iterable[T], desc: str, total: int | None) -> Iterator[T]:
    t0 = time.perf_counter()
    every = max(1, -(-total // LINES)) if total else None
    last = t0
    done = 0
    for item in iterable:
        yield item
        done += 1
        now = time.perf_counter()
        due = (done % every == 0) if every else (now - last >= 30)
        if due and done != total:
            log.info(line(desc, done, total, now - t0))
            last = now
    log.info(line(desc, done, total, time.perf_counter() - t0))
