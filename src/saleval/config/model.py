"""Schema of ``conf/model``: which classifier, from where (``_target_``); and the defaults
every forward pass shares, stated once here, below every module that feeds a model (the
model loader and training, inference, the methods, the metrics' ``metrics.inference``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

#: The token limit texts are cut to when neither the config nor a train run gives one,
#: ``[CLS]`` and ``[SEP]`` included (docs/data-and-models.md).
DEFAULT_MAX_LENGTH = 256

#: Padded tokens per forward batch. Measured on the 2-core native-bf16 host (2026-11-24,
#: 284 occlusion inputs of 25-75 tokens, the embedded MiniLM): 2,048-4,096 tokens per
#: batch ran fastest in fp32 and bf16; 8,192 was 1.15x and 16,384 1.56x slower (larger
#: activations fall out of the caches). docs/benchmarks.md#batch-size.
DEFAULT_MAX_TOKENS = 4096

#: Most sequences per forward batch (the metrics' ``metrics.inference.max_batch`` and
#: forward_logits), whatever the token budget leaves room for: it binds only for inputs of
#: at most DEFAULT_MAX_TOKENS // DEFAULT_MAX_BATCH = 8 tokens (the metrics' shortest
#: perturbations). A cap on a batch's rows, not a measured optimum
#: (docs/benchmarks.md#batch-size); LIME and occlusion keep their own
#: (saleval.attribution.perturbation.PERTURBATION_MAX_BATCH).
DEFAULT_MAX_BATCH = 512


@dataclass
class ModelConfig:
    """``conf/model/*.yaml``. ``_target_`` names the source class in :mod:`saleval.modeling.models`
    (``EmbeddedSource``: ``package``; ``PretrainedSource``: ``pretrained``;
    ``RandomSource``: ``tokenizer_package`` + ``config``); each reads only its fields."""

    _target_: str = "saleval.modeling.models.EmbeddedSource"
    name: str = MISSING
    max_length: int = DEFAULT_MAX_LENGTH
    package: str | None = None  # EmbeddedSource: the registry package carrying it
    pretrained: str | None = None  # PretrainedSource: hub id or local directory
    tokenizer_package: str | None = None  # RandomSource: where its tokenizer comes from
    config: dict[str, Any] = field(default_factory=dict)  # RandomSource: BertConfig fields
