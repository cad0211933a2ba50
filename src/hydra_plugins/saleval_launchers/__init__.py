"""saleval's Hydra launchers (docs/scale-out.md), where Hydra looks for plugins.

Hydra instantiates a launcher only from a class defined under the ``hydra_plugins``
package, so the classes are named here; their code is in :mod:`saleval.scaleout`, which
imports nothing heavy at import time (Hydra imports this module whenever an app starts).
"""

from __future__ import annotations

from saleval.scaleout.ray import RayLauncher as _RayLauncher
from saleval.scaleout.slurm import SlurmLauncher as _SlurmLauncher


class SlurmLauncher(_SlurmLauncher):
    """``hydra/launcher=slurm`` (conf/hydra/launcher/slurm.yaml)."""


class RayLauncher(_RayLauncher):
    """``hydra/launcher=ray`` (conf/hydra/launcher/ray.yaml)."""
