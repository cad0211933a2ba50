"""Schema of ``conf/model``: which classifier, from where (``_target_``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING


@dataclass
class ModelConfig:
    """``conf/model/*.yaml``. ``_target_`` names the source class in :mod:`saleval.modeling.models`
    (``EmbeddedSource``: ``package``; ``PretrainedSource``: ``pretrained``;
    ``RandomSource``: ``tokenizer_package`` + ``config``); each reads only its fields."""

    _target_: str = "saleval.modeling.models.EmbeddedSource"
    name: str = MISSING
    max_length: int = 256
    package: str | None = None  # EmbeddedSource: the registry package carrying it
    pretrained: str | None = None  # PretrainedSource: hub id or local directory
    tokenizer_package: str | None = None  # RandomSource: where its tokenizer comes from
    config: dict[str, Any] = field(default_factory=dict)  # RandomSource: BertConfig fields
