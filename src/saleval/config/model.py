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
class PromptConfig:
    """``model.prompt`` of ``conf/model/prompted.yaml``: how a causal LM is prompted to
    classify (docs/data-and-models.md#prompted-llms)."""

    template: str = "Text: {text}\nAnswer:"  # holds {text} once; what follows is the answer cue
    instruction: str = ""  # opens the prompt (the first user turn in a chat)
    system: str | None = None  # a chat's system message
    chat_template: str = "auto"  # auto: the tokenizer's chat template where it has one; on; off
    # class name -> words appended at the answer position, exactly as written (a class
    # left out: its name, with a leading space when no chat template is used)
    label_words: dict[str, list[str]] = field(default_factory=dict)
    shots: int = 0  # few-shot examples, drawn class-balanced from the training split
    shot_seed: int = 0
    shot_separator: str = "\n\n"
    prefix_cache: bool = True  # compute the template before {text} once (same logits)


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
    prompt: PromptConfig | None = None  # PromptedSource: a causal LM prompted to classify


def is_prompted(cfg: Any) -> bool:
    """Whether a ``conf/model`` node (a config, a mapping or a :class:`ModelConfig`) is a
    causal LM prompted to classify: it has a ``prompt`` section.

    >>> is_prompted({"name": "minilm"}), is_prompted({"prompt": {"shots": 0}})
    (False, True)
    """
    get = getattr(cfg, "get", None)
    prompt = get("prompt") if callable(get) else getattr(cfg, "prompt", None)
    return prompt is not None
