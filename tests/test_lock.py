"""The environment is the lock's (issue #39): every package of requirements.lock is
installed at its locked version, and the lock holds what the project asks for."""

from __future__ import annotations

from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from saleval.testing.lock import locked, mismatches

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"


def test_installed_versions_are_the_locked_ones() -> None:
    assert mismatches(LOCK) == [], "run `make setup` (it installs from the lock)"


def test_the_lock_pins_every_dependency_but_torch_and_satisfies_pyproject() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = locked(LOCK.read_text())
    wanted = [Requirement(r) for r in project["dependencies"]]
    for extra, reqs in project["optional-dependencies"].items():
        if extra in ("dev", "ray", "postgres"):  # what the lock is compiled for
            wanted += [Requirement(r) for r in reqs if not r.startswith("saleval[")]
    for req in wanted:
        name = canonicalize_name(req.name)
        if name == "torch":  # installed first, from the CPU build on disk
            assert name not in pins
            continue
        assert name in pins, f"{req} is not in requirements.lock; run `make lock`"
        assert req.specifier.contains(pins[name], prereleases=True), (req, pins[name])
    text = LOCK.read_text()
    assert "saleval @" not in text and text.count("--hash=sha256:") >= len(pins)
