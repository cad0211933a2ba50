"""Where the project, its configs, its outputs and the shared data live.

The project root is found once here so that every stage (console script, test or
pipeline) resolves ``outputs/`` and the data root the same way, whatever the cwd.
"""

from __future__ import annotations

import os
from pathlib import Path

_PKG_DIR = Path(__file__).resolve().parent


def project_root() -> Path:
    """The repository root for an editable install, else ``SALEVAL_ROOT`` or the cwd."""
    env = os.environ.get("SALEVAL_ROOT")
    if env:
        return Path(env).resolve()
    candidate = _PKG_DIR.parents[1]  # src/saleval -> repo root
    if (candidate / "pyproject.toml").is_file() and (candidate / "conf").is_dir():
        return candidate
    return Path.cwd().resolve()


def conf_dir() -> Path:
    """Hydra config tree: the repo's ``conf/`` or the copy packed into a wheel."""
    packed = _PKG_DIR / "conf"
    if packed.is_dir():
        return packed
    return project_root() / "conf"


def default_data_root() -> Path:
    """``SALEVAL_DATA_ROOT`` or ``../shared/data`` seen from the project root."""
    env = os.environ.get("SALEVAL_DATA_ROOT")
    if env:
        return Path(env).resolve()
    return (project_root().parent / "shared" / "data").resolve()


def register_resolvers() -> None:
    """``${saleval.root:}`` and ``${saleval.data_root:}``, the places above as the configs
    name them (``conf/paths/default.yaml``); idempotent. Whatever composes a config
    registers them first (:func:`saleval.pipeline.compose.register_configs`, the console
    scripts)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("saleval.root"):
        OmegaConf.register_new_resolver("saleval.root", lambda: str(project_root()))
    if not OmegaConf.has_resolver("saleval.data_root"):
        OmegaConf.register_new_resolver("saleval.data_root", lambda: str(default_data_root()))
