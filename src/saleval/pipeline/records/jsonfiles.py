"""JSON reports that strict parsers accept: one writer for every ``*.json`` a stage writes.

Python's ``json`` writes ``NaN`` and ``Infinity`` by default, which JSON does not have
(RFC 8259 §6), so JavaScript's ``JSON.parse``, ``jq`` and most other tools reject the file.
A value that is not a number (e.g. ``val_accuracy`` of a run that never validated) is
written as ``null`` instead. This module imports nothing of saleval.

>>> import numpy as np
>>> plain({"acc": float("nan"), "n": np.int64(3), "xs": (np.float32(0.5), float("inf"))})
{'acc': None, 'n': 3, 'xs': [0.5, None]}
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np


def plain(obj: Any) -> Any:
    """``obj`` as plain JSON values: non-finite floats become None, numpy scalars and
    arrays Python numbers and lists, mappings' keys strings, anything else its ``str``."""
    if isinstance(obj, Mapping):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [plain(v) for v in obj]
    if isinstance(obj, set | frozenset):
        return [plain(v) for v in sorted(obj, key=str)]
    if isinstance(obj, np.ndarray):
        return plain(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, str | int | bool):
        return obj
    return str(obj)


def write_json(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` as indented, strict JSON (``allow_nan=False`` after :func:`plain`)."""
    path = Path(path)
    path.write_text(json.dumps(plain(obj), indent=2, allow_nan=False) + "\n")
    return path
