"""The environment lock (``requirements.lock``, docs/benchmarks.md#install): what a fresh
clone installs, and whether the installed versions are the locked ones.

``make lock`` writes the lock with pip-tools (``pip-compile --generate-hashes`` over
``pyproject.toml`` with the ``dev`` extra, which includes every optional part the tests
use) and then :func:`strip_self` takes out the project itself, which the ``dev`` extra
names (``saleval[ray,postgres]``) and which is installed editable, not from the lock.
torch is not in the lock: it is installed first, pinned in ``pyproject.toml``, from the
CPU build on this machine's disk (a hashed PyPI torch would be the multi-GB CUDA build).

    python -m saleval.testing.lock check requirements.lock   # 0: installed == locked
    python -m saleval.testing.lock strip-self requirements.lock
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

from packaging.markers import Marker
from packaging.utils import canonicalize_name

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._\-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$")


def locked(text: str) -> dict[str, str]:
    """Every ``name==version`` of a lock whose environment marker holds here, by the
    package's canonical name.

    >>> locked("a-b==1.0 \\\\\\n    --hash=sha256:00\\nc==2 ; python_version < '3'\\n")
    {'a-b': '1.0'}
    """
    out: dict[str, str] = {}
    for line in text.splitlines():
        m = _PIN.match(line.strip())
        if not m:
            continue
        name, version, marker = m.groups()
        if marker and not Marker(marker).evaluate():
            continue
        out[canonicalize_name(name)] = version
    return out


def mismatches(lock: str | Path) -> list[str]:
    """One line per locked package that is missing here or installed at another version."""
    out = []
    for name, want in sorted(locked(Path(lock).read_text()).items()):
        try:
            got = metadata.version(name)
        except metadata.PackageNotFoundError:
            out.append(f"{name}: locked {want}, not installed")
            continue
        if got != want:
            out.append(f"{name}: locked {want}, installed {got}")
    return out


def strip_self(text: str, project: str = "saleval") -> str:
    """The lock without the project's own entry (``saleval @ file:///...`` and its comment
    lines, and the warning pip-compile writes above it).

    >>> print(strip_self("a==1\\n# WARNING: x\\n# y\\nsaleval @ file:///p\\n    # via z\\nb==2\\n"))
    a==1
    b==2
    <BLANKLINE>
    """
    lines = text.splitlines()
    keep: list[str] = []
    skipping = False
    for line in lines:
        if re.match(rf"^{re.escape(project)}\s*@", line):
            while keep and keep[-1].startswith("# "):  # pip-compile's warning about it
                keep.pop()
            skipping = True
            continue
        if skipping and line.startswith("    "):
            continue
        skipping = False
        keep.append(line)
    return "\n".join(keep) + "\n"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] not in ("check", "strip-self"):
        print(__doc__)
        return 2
    path = Path(args[1])
    if args[0] == "strip-self":
        path.write_text(strip_self(path.read_text()))
        return 0
    bad = mismatches(path)
    for line in bad:
        print(f"{path}: {line}; run `make setup` (it installs from the lock) or `make lock`")
    if not bad:
        print(f"{path}: all {len(locked(path.read_text()))} locked packages installed as locked")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
