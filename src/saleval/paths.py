"""Where the project, its configs, its outputs and the shared data live.

The project root is found once here so that every stage (console script, test or
pipeline) resolves ``outputs/`` and the data root the same way, whatever the cwd: the
output root is :func:`output_root` everywhere, in the configs (``paths.output_root``'s
default) as in the code that finds runs (``latest``), downloads runs or links them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

_PKG_DIR = Path(__file__).resolve().parent
#: the folder under the project root (``paths.root_dir``) where run dirs, the ``latest``
#: links, the MLflow store and downloaded runs go unless ``paths.output_root`` says otherwise
OUTPUTS = "outputs"


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


def outputs_under(root_dir: str | Path) -> Path:
    """The default output root of a project root: ``<root_dir>/outputs``; the one place
    the default is stated (``paths.output_root``'s default calls it through the
    ``${saleval.outputs:<root_dir>}`` resolver)."""
    return Path(root_dir, OUTPUTS)


def output_root(cfg: Any = None) -> Path:
    """The output root a composed config names (``paths.output_root``), else the default
    under its ``paths.root_dir`` or, with no config, under :func:`project_root`: never a
    folder relative to the working directory unless the config says so. ``cfg`` may also
    be the output root itself (a path a caller was given), which is returned as it is.

    >>> from omegaconf import OmegaConf
    >>> output_root(OmegaConf.create({"paths": {"output_root": "/data/runs"}}))
    PosixPath('/data/runs')
    >>> output_root(OmegaConf.create({"paths": {"root_dir": "/lab/saleval"}}))
    PosixPath('/lab/saleval/outputs')
    >>> output_root() == project_root() / "outputs", output_root("runs")
    (True, PosixPath('runs'))
    """
    if isinstance(cfg, str | os.PathLike):
        return Path(cfg)
    if cfg is not None:
        from omegaconf import OmegaConf

        given = OmegaConf.select(cfg, "paths.output_root", default=None)
        if given:
            return Path(str(given))
        root_dir = OmegaConf.select(cfg, "paths.root_dir", default=None)
        if root_dir:
            return outputs_under(str(root_dir))
    return outputs_under(project_root())


def register_resolvers() -> None:
    """``${saleval.root:}``, ``${saleval.data_root:}`` and ``${saleval.outputs:<root dir>}``,
    the places above as the configs name them (``conf/paths/default.yaml``); idempotent. Whatever composes a config
    registers them first (:func:`saleval.pipeline.compose.register_configs`, the console
    scripts)."""
    from omegaconf import OmegaConf

    if not OmegaConf.has_resolver("saleval.root"):
        OmegaConf.register_new_resolver("saleval.root", lambda: str(project_root()))
    if not OmegaConf.has_resolver("saleval.data_root"):
        OmegaConf.register_new_resolver("saleval.data_root", lambda: str(default_data_root()))
    if not OmegaConf.has_resolver("saleval.outputs"):
        OmegaConf.register_new_resolver("saleval.outputs", lambda root: str(outputs_under(root)))
