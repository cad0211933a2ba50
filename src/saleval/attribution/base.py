"""The ``attribute`` protocol, the method registry and the one entry point other stages call.

Shape of the protocol (Captum's; docs/methods.md): an :class:`Attributor` is built from a
method config — its *structural* settings (baseline, n_steps, removal, word
reducer, batch size) go to the constructor — and is then called per batch with the
model, tokenizer, segmented texts and target classes, which reach it together as one
:class:`Texts`. Token-level methods (:class:`TokenAttributor`) return a
``(batch, tokens)`` tensor over the right-padded batch (``texts.padded``) and share one
token→word step (:func:`saleval.words.token_to_word_scores`); word-level methods (LIME,
occlusion, random) score words directly. Sorting, batching, the attention kernels and the
checks of every score are :meth:`Attributor.attribute`'s, once for every method, so a
method writes only its own computation (docs/extending.md, *A saliency method*).
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar, cast

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from saleval.attribution.catalog import REGISTRY, known_methods, load
from saleval.errors import UserError
from saleval.modeling.devices import model_device
from saleval.modeling.first_token import last_block_at_first_token
from saleval.modeling.inference import (
    attention_implementation,
    count_padding,
    length_groups,
    n_labels_of,
)
from saleval.modeling.interface import ModelInterface, check_padding, interface
from saleval.words import REDUCERS, Segmentation, token_to_word_scores


class AttributionError(UserError, ValueError):
    """A method config or an attribution input is unusable; the message says which."""


def register(
    name: str,
    *,
    display: str | None = None,
    published: str | None = None,
    paper_order: int | None = None,
) -> Callable[[type[Attributor]], type[Attributor]]:
    """Class decorator: make a method buildable by its registry name, and say what it is.

    What a method is travels with its class, as Captum keeps a method's name on its
    class (docs/extending.md, *A saliency method*): ``display``, how tables and plots name
    it (default: ``name``); ``published``, its name in the original crowd study's
    published results (Lu et al. 2024), which ``crowd=lu2024`` reads; ``paper_order``,
    its row in that paper's tables. Two methods cannot share a published name or a row.
    The package's own methods give them as literals: :mod:`saleval.attribution.catalog`
    reads them from the source, so a stage that only names methods loads none.
    """

    def deco(cls: type[Attributor]) -> type[Attributor]:
        for other, known in known_methods().items():
            if other == name:
                continue
            if published is not None and known.published == published:
                raise ValueError(f"{name}: published name {published!r} is {other}'s")
            if paper_order is not None and known.paper_order == paper_order:
                raise ValueError(f"{name}: paper_order {paper_order} is {other}'s")
        REGISTRY[name] = cls
        cls.registry_name = name
        cls.display_name = display or name
        cls.published_name = published
        cls.paper_order = paper_order
        return cls

    return deco


@dataclass
class Batch:
    """Right-padded token ids of a list of segmentations, on the model's device, and how
    the model is fed them (:class:`saleval.modeling.interface.ModelInterface`)."""

    input_ids: torch.Tensor  # (B, T) long
    attention_mask: torch.Tensor  # (B, T) long: 1 real token, 0 padding
    keep_own: torch.Tensor  # (B, T) bool: special tokens and padding (baselines keep these)
    lengths: list[int]
    texts: list[str]
    interface: ModelInterface

    @classmethod
    def from_segs(
        cls, segs: Sequence[Segmentation], interface: ModelInterface, device: torch.device
    ) -> Batch:
        count_padding([s.n_tokens for s in segs], max(s.n_tokens for s in segs))
        ids, mask = interface.pad([s.input_ids for s in segs])
        keep = torch.ones(ids.shape, dtype=torch.bool)
        for i, s in enumerate(segs):
            keep[i, : s.n_tokens] = torch.as_tensor(s.special, dtype=torch.bool)
        return cls(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            keep_own=keep.to(device),
            lengths=[s.n_tokens for s in segs],
            texts=[s.text for s in segs],
            interface=interface,
        )

    def inputs(
        self, input_ids: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """The model's keyword arguments for this batch (or for ``input_ids`` and
        ``attention_mask`` of the same model, e.g. expanded over IG's steps)."""
        ids = self.input_ids if input_ids is None else input_ids
        mask = self.attention_mask if attention_mask is None else attention_mask
        return self.interface.inputs(ids, mask)

    def rows(self, idx: torch.Tensor) -> Batch:
        """The examples ``idx`` of this batch."""
        keep = idx.tolist()
        return Batch(
            input_ids=self.input_ids[idx],
            attention_mask=self.attention_mask[idx],
            keep_own=self.keep_own[idx],
            lengths=[self.lengths[i] for i in keep],
            texts=[self.texts[i] for i in keep],
            interface=self.interface,
        )


@dataclass(frozen=True)
class Texts:
    """One batch of texts a method scores: the model and tokenizer, the texts (sorted by
    length, segmented) and the class each is explained for; the right-padded ids and the
    targets as a tensor are made on first use, on the model's device."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerFast
    segs: Sequence[Segmentation]
    targets: Sequence[int]

    @cached_property
    def padded(self) -> Batch:
        """The texts' token ids, right-padded with the model's own pad id (:class:`Batch`)."""
        iface = interface(self.model, self.tokenizer)
        return Batch.from_segs(self.segs, iface, model_device(self.model))

    @cached_property
    def target_ids(self) -> torch.Tensor:
        """``targets`` as a ``(B,)`` long tensor beside the padded ids."""
        return torch.as_tensor(
            list(self.targets), dtype=torch.long, device=self.padded.input_ids.device
        )


T = TypeVar("T")


def one_of(setting: str, value: T, options: Sequence[T]) -> T:
    """``value`` when it is one of ``options``; else one line naming the setting and them.

    >>> one_of("query", "cls", ("all", "cls"))
    'cls'
    >>> one_of("query", "CLS", ("all", "cls"))
    Traceback (most recent call last):
    ...
    saleval.attribution.base.AttributionError: query must be one of ('all', 'cls'), got 'CLS'
    """
    if value not in options:
        raise AttributionError(f"{setting} must be one of {options}, got {value!r}")
    return value


def sample_rng(seed: int, text: str) -> np.random.Generator:
    """A generator seeded by (seed, sample): the same text gets the same draws in any batch."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return np.random.default_rng([int(seed), *np.frombuffer(digest[:16], dtype=np.uint32)])


class Attributor(abc.ABC):
    """A saliency method: ``attribute(model, tokenizer, segs, targets)`` → word scores.

    ``name``: the unique name written in the attributions table (defaults to the
    method's config key). ``batch_size``: examples per call of the per-batch
    computation (memory bound). ``word_reduce``: how pieces merge into words.
    """

    registry_name = "?"
    #: what the method is (:func:`register`): how tables name it, its name in the published
    #: crowd results, its row in the paper's tables
    display_name: str | None = None
    published_name: str | None = None
    paper_order: int | None = None
    #: methods that read attention weights run the model's eager attention; all others
    #: run the fused sdpa kernels (same outputs, faster; saleval.modeling.inference).
    needs_attention_weights = False
    #: padded share of a batch's token slots up to which texts of other lengths join it
    #: (:func:`saleval.modeling.inference.length_groups`); a method whose per-text work is already a
    #: large batch sets it low (docs/methods.md#batching)
    default_max_padding = 1.0

    def __init__(
        self,
        *,
        name: str | None = None,
        batch_size: int = 16,
        word_reduce: str = "sum",
        max_padding: float | None = None,
    ) -> None:
        one_of("word_reduce", word_reduce, REDUCERS)
        if int(batch_size) < 1:
            raise AttributionError(f"batch_size must be >= 1, got {batch_size}")
        pad = self.default_max_padding if max_padding is None else float(max_padding)
        if not 0.0 <= pad <= 1.0:
            raise AttributionError(f"max_padding must lie in [0, 1], got {max_padding}")
        self.name = name
        self.batch_size = int(batch_size)
        self.word_reduce = word_reduce
        self.max_padding = pad
        #: per-example diagnostics of the last calls (e.g. IG convergence deltas)
        self.diagnostics: dict[str, list[float]] = {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"

    def attribute(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerFast,
        segs: Sequence[Segmentation],
        targets: Sequence[int],
    ) -> list[np.ndarray]:
        """Word scores for every segmentation, in the caller's order.

        Inputs are sorted by length and cut into batches of at most ``batch_size`` whose
        padding stays within ``max_padding`` (:func:`saleval.modeling.inference.length_groups`);
        padding never changes a score beyond float noise (each method masks it).
        """
        if len(segs) != len(targets):
            raise AttributionError(f"{len(segs)} texts but {len(targets)} targets")
        n_labels = n_labels_of(model)
        for i, t in enumerate(targets):
            if not 0 <= int(t) < n_labels:
                raise AttributionError(f"example {i}: target {t} outside 0..{n_labels - 1}")
        model.eval()
        # the model's padding checked and the method's settings checked against this model
        # before any work (both remembered per model): one line, not a failure mid-run
        check_padding(model, tokenizer, [s.input_ids for s in segs])
        self.prepare(model, tokenizer)
        out: list[np.ndarray | None] = [None] * len(segs)
        groups = length_groups([s.n_tokens for s in segs], self.batch_size, self.max_padding)
        # methods that read only the logits run the fused attention kernels and, where the
        # head reads the first token alone, the last block there alone
        # (saleval.modeling.first_token): same scores, less work
        impl = contextlib.ExitStack()
        if not self.needs_attention_weights:
            impl.enter_context(attention_implementation(model, "sdpa"))
            impl.enter_context(last_block_at_first_token(model))
        with impl:
            for idx in groups:
                texts = Texts(
                    model, tokenizer, [segs[i] for i in idx], [int(targets[i]) for i in idx]
                )
                scores = self.word_scores(texts)
                for i, got in zip(idx, scores):
                    out[i] = np.asarray(got, dtype=np.float64)
        for i, (seg, s) in enumerate(zip(segs, out)):
            assert s is not None
            if s.shape != (seg.n_words,):
                raise AttributionError(
                    f"{self!r}: example {i} got {s.shape} scores for {seg.n_words} words"
                )
            if not np.isfinite(s).all():
                raise AttributionError(f"{self!r}: example {i} got non-finite scores {s}")
        return out  # type: ignore[return-value]

    __call__ = attribute

    def prepare(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> None:
        """Check this method's settings against ``model`` and ``tokenizer`` before any work
        (a removal token the tokenizer lacks, a query the model has no row for); raise an
        :class:`AttributionError` naming the setting and the alternatives. Nothing to check
        by default."""
        return None

    @abc.abstractmethod
    def word_scores(self, texts: Texts) -> list[np.ndarray]:
        """One score per kept word for each text of one batch."""

    def _note(self, key: str, values: Sequence[float]) -> None:
        self.diagnostics.setdefault(key, []).extend(float(v) for v in values)


class TokenAttributor(Attributor):
    """A method that scores tokens of a padded batch; words come from the shared merge."""

    # measured (docs/benchmarks.md#length-aware-batching): gradients and DeepLIFT of 16 AG
    # News texts ran 1.35x faster with batches held to 25 % padding than cut by count alone,
    # and 1.6x faster than one text at a time (small batches waste the GEMMs)
    default_max_padding = 0.25

    def word_scores(self, texts: Texts) -> list[np.ndarray]:
        with torch.enable_grad():
            tok = self.token_scores(texts)
        tok_np = tok.detach().float().cpu().numpy()
        return [
            token_to_word_scores(tok_np[i, : s.n_tokens], s, self.word_reduce)
            for i, s in enumerate(texts.segs)
        ]

    @abc.abstractmethod
    def token_scores(self, texts: Texts) -> torch.Tensor:
        """``(B, T)`` scores over ``texts.padded``; entries at padding positions are ignored."""


def _plain(cfg: Any) -> dict[str, Any]:
    try:
        from omegaconf import DictConfig, OmegaConf

        if isinstance(cfg, DictConfig):
            out = OmegaConf.to_container(cfg, resolve=True)
            assert isinstance(out, dict)
            return cast(dict[str, Any], out)  # a method config's keys are str
    except ImportError:  # pragma: no cover
        pass
    return dict(cfg)


def build_method(cfg: Attributor | str | Mapping[str, Any], key: str | None = None) -> Attributor:
    """An :class:`Attributor` from a method config entry.

    Accepts a built attributor, a registry name (``"lime"``), or a mapping with
    ``_target_`` (a class path, as in ``conf/method/*.yaml``) or ``kind`` (a registry
    name); with neither, ``key`` is looked up in the registry.
    """
    if isinstance(cfg, Attributor):
        return cfg
    if isinstance(cfg, str):
        key = key or cfg
        cfg = {"kind": cfg}
    conf = _plain(cfg)
    target = conf.pop("_target_", None)
    kind = conf.pop("kind", None)
    if target:
        import hydra.utils

        try:
            cls = hydra.utils.get_class(str(target))
        except Exception as err:
            raise AttributionError(f"method {key}: cannot import _target_={target}: {err}") from err
    else:
        kind = kind or key
        found = load(str(kind))
        if found is None:
            raise AttributionError(
                f"method {key}: unknown method {kind!r}; known: "
                f"{sorted(known_methods())} (or give _target_)"
            )
        cls = found
    if not (isinstance(cls, type) and issubclass(cls, Attributor)):
        raise AttributionError(f"method {key}: {target} is not an Attributor")
    if conf.get("name") is None:
        conf["name"] = key or cls.registry_name
    try:
        return cls(**conf)
    except TypeError as err:
        raise AttributionError(f"method {key}: bad settings for {cls.__name__}: {err}") from err


def method_name(key: str, cfg: Attributor | str | Mapping[str, Any] | None) -> str:
    """The name written in the attributions table: an explicit ``name`` or the config key."""
    if isinstance(cfg, Attributor):
        return cfg.name or key
    if isinstance(cfg, Mapping):
        name = cfg.get("name")
        if name:
            return str(name)
    return key


def attribute_words(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerFast,
    segs: Sequence[Segmentation],
    targets: Sequence[int],
    method_cfg: Attributor | str | Mapping[str, Any],
) -> list[np.ndarray]:
    """One finite score per kept word of every example (same order as ``segs``).

    ``method_cfg``: a ``conf/method`` entry (mapping with ``_target_`` or ``kind``), a
    registry name, or a built :class:`Attributor`. Runs on the model's device.
    """
    return build_method(method_cfg).attribute(model, tokenizer, segs, targets)
