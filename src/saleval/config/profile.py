"""Schema of ``conf/profile``: per-stage overrides for ``saleval-run``."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING


@dataclass
class ProfileConfig:
    """``stages.<stage>`` lists that stage's override strings; ``common`` applies to every
    stage (``key: value`` → ``key=value``). Stage names are checked by ``saleval-run``
    (``import`` cannot be a dataclass field), and every override by composing each stage's
    config before any stage runs."""

    name: str = MISSING
    dataset: str = MISSING  # the dataset group option every stage uses (via common)
    model: str = MISSING  # the model group option the train stage uses
    common: dict[str, str] = field(default_factory=dict)
    stages: dict[str, list[str]] = field(default_factory=dict)
    stages_to_run: list[str] | None = None  # null: every stage
    # free values the override lists may interpolate (``${profile.params.reduction}``), so
    # a recipe can sweep one setting of one stage (conf/experiment, docs/recipes.md)
    params: dict[str, str] = field(default_factory=dict)
