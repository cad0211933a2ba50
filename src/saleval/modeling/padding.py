"""Padding a decoder as training pads it (docs/data-and-models.md#train-your-checkpoint).

A decoder checkpoint usually has no pad token, and its head (or, prompted, the answer
position) is found in a padded batch only through the pad id. Training, loading a
checkpoint to explain it and prompting an LLM all set it the same way, here.
"""

from __future__ import annotations

import logging
import weakref

from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from saleval.errors import UserError

log = logging.getLogger(__name__)


class PaddingError(UserError, ValueError):
    """A model cannot be padded: neither its tokenizer nor its config names a pad token."""


#: the pad token a loaded checkpoint adopted from its tokenizer (:func:`adopt_pad`)
ADOPTED_PAD: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()


def prepare_for_training(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast
) -> dict[str, str]:
    """Make a fresh classifier trainable in padded batches; returns what was set (recorded
    in the train run's ``metrics.json``).

    A decoder checkpoint (GPT-2, Llama) usually has no pad token, and its head finds the
    token it reads by ``config.pad_token_id``: the tokenizer's pad token becomes its eos
    token where it has none (the usual choice), and the config's pad id the tokenizer's.
    Both are saved with the trained model, so every later stage pads the same way.
    """
    notes: dict[str, str] = {}
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is None:
            raise PaddingError(
                f"{type(model).__name__}: the tokenizer has neither a pad nor an eos token, so "
                "batches cannot be padded: add a pad token to the checkpoint's tokenizer"
            )
        tokenizer.pad_token = tokenizer.eos_token
        notes["pad_token"] = (
            f"{tokenizer.eos_token} (the eos token; the tokenizer had no pad token)"
        )
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id
        notes["config_pad_token_id"] = f"{tokenizer.pad_token_id} (the tokenizer's pad token)"
    for key, note in notes.items():
        log.info("%s: %s set to %s", type(model).__name__, key, note)
    return notes


def adopt_pad(model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> dict[str, str]:
    """A loaded checkpoint pads as training pads (:func:`prepare_for_training`): a config
    without ``pad_token_id`` takes the tokenizer's pad token (or its eos token where it has
    none). What was set is remembered for the run's tags
    (:func:`saleval.modeling.interface.model_tags`: ``model.pad_adopted``)."""
    has_pad = getattr(model.config, "pad_token_id", None) is not None
    if has_pad and tokenizer.pad_token_id is not None:
        return {}
    if tokenizer.pad_token_id is None and tokenizer.eos_token is None:
        return {}  # nothing to adopt: check_padding names the problem if padding matters
    notes = prepare_for_training(model, tokenizer)
    if notes:
        ADOPTED_PAD[model] = "; ".join(f"{k}={v}" for k, v in notes.items())
    return notes
