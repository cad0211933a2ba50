"""What an ``inputs.<name>`` value names, checked before a stage starts (docs/architecture.md, section 2).

A stage's inputs are run dirs, ``runs:/<id>``, ``latest``, a sweep dir, an answers file or
(``inputs.model``) a checkpoint: a ``save_pretrained`` directory or a hub id. A local path
that does not exist is reported at once, naming the path, instead of after the stage has
imported its libraries and read its other inputs (the console scripts call
:func:`check_input_paths` first; :mod:`saleval.pipeline.records.run_inputs` applies the same rule when it
resolves a run). This module imports no library, so the check costs nothing.

>>> input_path_problem("model", "/no/such/dir", "outputs")  # doctest: +ELLIPSIS
'inputs.model=/no/such/dir: no such file or directory; pass a saleval-train run dir, ...'
>>> input_path_problem("model", "bert-base-uncased", "outputs") is None  # a hub id
True
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from saleval import paths
from saleval.errors import UserError
from saleval.pipeline import stage_table

#: a value that means "not given": the stage says what it needs
UNSET = ("???", "", "None")
LATEST = "latest"
#: the inputs that also take a checkpoint (a hub id is not a local path)
TAKES_CHECKPOINT = ("model",)
#: a hub repo id: ``name`` or ``org/name`` (what is not local may still be one of these)
_HUB_ID = re.compile(r"[\w.-]+(/[\w.-]+)?")


class InputError(UserError, ValueError):
    """An ``inputs.<name>`` value does not point at a usable run."""


def latest_link(output_root: str | Path, stage: str) -> Path:
    """``<output root>/<stage>/latest``: a link to the stage's last finished run."""
    return Path(output_root, stage, LATEST)


def is_local_path(spec: str) -> bool:
    """Whether ``spec`` names a local file or directory rather than a hub id: it exists, or
    it cannot be a hub id (absolute, ``./``, ``~``, two or more ``/``), or its first part
    is a local directory (``outputs/train``).

    >>> is_local_path("sentence-transformers/all-MiniLM-L6-v2"), is_local_path("./model")
    (False, True)
    >>> is_local_path("/tmp"), is_local_path("outputs/train/2026-01-01/12-00-00")
    (True, True)
    """
    if os.path.exists(os.path.expanduser(spec)) or spec.startswith((".", "~", os.sep)):
        return True
    return not _HUB_ID.fullmatch(spec) or os.path.isdir(spec.split("/")[0])


def input_path_problem(name: str, spec: str, output_root: str | Path) -> str | None:
    """Why ``inputs.<name>=<spec>`` cannot be read, when that is known without reading it:
    ``latest`` with no finished run of the producing stage, or a local path that does not
    exist. None for anything else (``runs:/`` ids and hub ids are checked when used)."""
    if spec in UNSET or spec.startswith("runs:/"):
        return None
    if spec == LATEST:
        stage = stage_table.producers().get(name, name)
        link = latest_link(output_root, stage)
        if link.exists():
            return None
        if link.is_symlink():  # its run dir was deleted (or moved) after it finished
            return (
                f"inputs.{name}=latest: {link} points at {os.readlink(link)}, which no longer "
                f"exists (deleted or moved): pass a run dir, or rerun saleval-{stage}"
            )
        return (
            f"inputs.{name}=latest: {link} does not exist; no saleval-{stage} run has finished "
            "there yet: pass a run dir"
        )
    local = is_local_path(spec) if name in TAKES_CHECKPOINT else True
    if local and not Path(spec).expanduser().exists():
        return f"inputs.{name}={spec}: no such file or directory; pass {what_it_takes(name)}"
    return None


def accepted_stages(name: str) -> tuple[str, ...]:
    """The stages whose runs ``inputs.<name>`` takes: its producer in the stage table, and
    for ``answers`` the annotation app's runs too.

    >>> accepted_stages("answers"), accepted_stages("runs")
    (('simulate', 'annotate'), ())
    """
    producer = stage_table.producers().get(name)
    return ((producer,) if producer else ()) + _ALSO_FROM.get(name, ())


def kind_problem(name: str, run: Path, kind: str | None, stage: str) -> str | None:
    """Why ``inputs.<name>=<run>``, a saleval-``kind`` run, is not what saleval-``stage``
    reads there (``inputs.crowd`` takes an import run...), naming what to pass instead;
    None when it is (or when the input takes any run)."""
    accepted = accepted_stages(name)
    if accepted and kind and kind not in accepted:
        return f"inputs.{name}={run} is a saleval-{kind} run; saleval-{stage} reads {what_it_takes(name)}"
    return None


def what_it_takes(name: str) -> str:
    """What ``inputs.<name>`` accepts, for the message that refuses a value.

    >>> what_it_takes("explain")
    'a saleval-explain run dir, runs:/<id> or latest'
    >>> what_it_takes("answers")
    'a saleval-simulate or saleval-annotate run dir, runs:/<id> or latest; or an answers file'
    """
    stages = accepted_stages(name)
    runs = f"a {' or '.join(f'saleval-{s}' for s in stages)} run dir" if stages else "a run dir"
    also = _ALSO_TAKES.get(name)
    tail = f"{runs}, runs:/<id> or latest"
    return f"{tail}; or {also}" if also else tail


#: inputs that take another stage's runs besides their producer's: the annotation app's
#: answers; a simulated crowd on the published study's tasks (``crowd=lu2024``), whose run
#: holds the aggregated table score reads
_ALSO_FROM: dict[str, tuple[str, ...]] = {"answers": ("annotate",), "crowd": ("simulate",)}
#: inputs that take something besides runs
_ALSO_TAKES = {"model": "a save_pretrained directory or a hub id", "answers": "an answers file"}


def _specs(inputs: Any) -> Iterator[tuple[str, str]]:
    """(input name, value) for each string an ``inputs`` mapping holds (lists item by item)."""
    for name, value in inputs.items():
        values = value if isinstance(value, list | tuple) else [value]
        for v in values:
            if isinstance(v, str | os.PathLike):
                yield str(name), str(v)


def check_input_paths(cfg: Any) -> None:
    """Raise :class:`InputError` for the first ``inputs.*`` value that names nothing
    (:func:`input_path_problem`); a config without ``inputs`` passes."""
    from omegaconf import OmegaConf

    node = OmegaConf.select(cfg, "inputs", default=None)
    if node is None or not OmegaConf.is_dict(node):
        return
    root = paths.output_root(cfg)
    plain = OmegaConf.to_container(node, resolve=True)
    assert isinstance(plain, dict)
    for name, spec in _specs(plain):
        problem = input_path_problem(name, spec, root)
        if problem:
            raise InputError(problem)
