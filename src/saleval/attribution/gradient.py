"""Gradient-family methods on the embedding layer (docs/methods.md): Captum, whole padded batches.

All four attribute to one tensor of the model's forward (docs/methods.md#embeddings) — by
default "the embeddings", the input to the first block as the model's own modules build
it (for BERT: word + position + token-type embeddings after LayerNorm, as in the original
crowd study; for GPT-2 word + position; for Llama the token embeddings), or ``layer:
word_embeddings``, the output of ``get_input_embeddings()``
(:func:`saleval.modeling.embedding.embedding_point`, one definition for every family).
:class:`EmbeddingForward` runs the classifier with that tensor replaced by a given one (a
forward hook, which is also how Captum's ``Layer*`` methods work internally), so Captum's
``Saliency``, ``InputXGradient``, ``IntegratedGradients`` and ``DeepLift`` see the
embeddings as their input. Working on the tensor rather than through
``LayerIntegratedGradients``/``LayerDeepLift`` lets baselines live in embedding
space: Captum's layer methods take baselines as *input ids*, which cannot express the
zero-embedding baseline.

Baselines (IG, DeepLIFT): ``zero`` (the zero vector), ``pad``/``mask``/``unk`` (the
embedding layer's output for ids where every word token is replaced by that token).
Special tokens and padding keep their own embedding in every baseline, so their
attribution is exactly zero and padding cannot move any score — except ``zero_all``: the
zero vector at every real position, ``[CLS]`` and ``[SEP]`` included, which is what
Captum's IG and DeepLIFT do when called on the embeddings with no baseline, as the
original crowd study's code did (Lu et al. 2024). Padding keeps its own embedding there
too (it is masked out of attention, and the original code explained one unpadded text at
a time), so batched and single-text runs agree.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch
from captum.attr import DeepLift, InputXGradient, IntegratedGradients, Saliency
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from saleval.attribution.base import (
    AttributionError,
    Batch,
    Texts,
    TokenAttributor,
    one_of,
    register,
)
from saleval.modeling.embedding import embedding_point
from saleval.modeling.interface import EMBEDDING_LAYERS as LAYERS
from saleval.modeling.interface import InterfaceError, interface

OUTPUTS = ("logits", "probs")
BASELINES = ("zero", "zero_all", "pad", "mask", "unk")
REDUCTIONS = ("l1", "l2", "mean", "sum")
# Captum's IG quadrature rules (captum.attr._utils.approximation_methods).
ONE_STEP_ALPHA = {
    "riemann_right": 1.0,
    "riemann_left": 0.0,
    "riemann_middle": 0.5,
    "gausslegendre": 0.5,
}
IG_METHODS = (
    "gausslegendre",
    "riemann_right",
    "riemann_left",
    "riemann_middle",
    "riemann_trapezoid",
)


class EmbeddingForward(nn.Module):
    """``f(embeds, ids, mask)``: the classifier with its ``layer`` tensor set to ``embeds``.

    ``layer`` (:func:`saleval.modeling.embedding.embedding_point`): ``embeddings``, the input
    to the first block, or ``word_embeddings``. The model is fed as its tokenizer feeds
    it (:class:`saleval.modeling.interface.ModelInterface`); ``input_ids`` still reach it, so
    a decoder head finds its last non-pad token. ``output``: ``logits`` or ``probs``
    (softmax). The softmax is functional on purpose: an ``nn.Softmax`` module would get
    DeepLIFT's rescale rule.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerFast | None = None,
        layer: str = "embeddings",
        output: str = "logits",
    ):
        super().__init__()
        one_of("output", output, OUTPUTS)
        one_of("layer", layer, LAYERS)
        self.model = model
        self.interface = interface(model, tokenizer)
        try:
            self.point = embedding_point(model, tokenizer, layer)
        except InterfaceError as err:
            raise AttributionError(str(err)) from err
        self.output = output

    def embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The layer's own tensor for ``input_ids`` (no gradient)."""
        return self.point.capture(self.model, self.interface.inputs(input_ids, attention_mask))

    def forward(
        self, embeds: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> torch.Tensor:
        with self.point.replaced(embeds):
            logits = self.model(**self.interface.inputs(input_ids, attention_mask)).logits
        return torch.softmax(logits, dim=-1) if self.output == "probs" else logits


def make_baseline(
    fwd: EmbeddingForward,
    tokenizer: PreTrainedTokenizerFast,
    batch: Batch,
    embeds: torch.Tensor,
    kind: str,
) -> torch.Tensor:
    """Baseline embeddings; special tokens and padding keep their own (docs/methods.md)."""
    keep = batch.keep_own.unsqueeze(-1)
    if kind == "zero":
        return torch.where(keep, embeds, torch.zeros_like(embeds))
    if kind == "zero_all":
        padding = (batch.attention_mask == 0).unsqueeze(-1)
        return torch.where(padding, embeds, torch.zeros_like(embeds))
    token = {
        "pad": tokenizer.pad_token_id,
        "mask": tokenizer.mask_token_id,
        "unk": tokenizer.unk_token_id,
    }.get(one_of("baseline", kind, BASELINES))
    if token is None:
        raise AttributionError(f"baseline {kind}: the tokenizer has no {kind} token")
    ids = torch.where(batch.keep_own, batch.input_ids, torch.full_like(batch.input_ids, token))
    base = fwd.embed(ids, batch.attention_mask)
    return torch.where(keep, embeds, base)


def captum_attribute(
    algorithm: Any, inputs: torch.Tensor, batch: Batch, targets: torch.Tensor, **kw: Any
) -> Any:
    """``algorithm.attribute`` (a Captum algorithm over an :class:`EmbeddingForward`) on
    ``inputs``, embeddings of ``batch``, for ``targets``; the batch's ids and mask pass
    through to the forward."""
    args = (batch.input_ids, batch.attention_mask)
    return algorithm.attribute(inputs, target=targets, additional_forward_args=args, **kw)


@dataclass(frozen=True)
class BaselinePath:
    """The straight line from a baseline's embeddings to the input's that IG integrates
    along and DeepLIFT compares across, for one padded batch and its targets."""

    fwd: EmbeddingForward
    embeds: torch.Tensor  # the input's, requiring grad
    base: torch.Tensor
    batch: Batch
    targets: torch.Tensor

    def rows(self, idx: torch.Tensor) -> BaselinePath:
        """The path of the examples ``idx`` only."""
        sub = self.batch.rows(idx)
        return BaselinePath(self.fwd, self.embeds[idx], self.base[idx], sub, self.targets[idx])

    def attribute(self, algorithm: Any, inputs: torch.Tensor | None = None, **kw: Any) -> Any:
        """:func:`captum_attribute` on this path's batch (on ``inputs``, else the input's
        embeddings)."""
        at = self.embeds if inputs is None else inputs
        return captum_attribute(algorithm, at, self.batch, self.targets, **kw)

    def output_gap(self) -> torch.Tensor:
        """f(x) − f(baseline) at each example's target: what completeness compares with."""
        b = self.batch
        args = (b.input_ids, b.attention_mask)
        with torch.no_grad():
            rows = torch.arange(len(self.targets), device=self.targets.device)
            at = self.targets
            return self.fwd(self.embeds, *args)[rows, at] - self.fwd(self.base, *args)[rows, at]


class _EmbeddingMethod(TokenAttributor):
    """A method over the embedding layer's output: one set-up of the forward over
    embeddings and of the batch's embeddings."""

    def __init__(self, *, layer: str = "embeddings", output: str = "logits", **kw: object):
        super().__init__(**kw)  # type: ignore[arg-type]
        self.layer = one_of("layer", layer, LAYERS)
        self.output = one_of("output", output, OUTPUTS)

    def prepare(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> None:
        """Find ``layer`` in this model once, before any work (an unsupported model is one line)."""
        EmbeddingForward(model, tokenizer, self.layer, self.output)

    def _setup(self, texts: Texts) -> tuple[EmbeddingForward, torch.Tensor]:
        """The forward over embeddings and the batch's embeddings, requiring grad."""
        fwd = EmbeddingForward(texts.model, texts.tokenizer, self.layer, self.output)
        batch = texts.padded
        return fwd, fwd.embed(batch.input_ids, batch.attention_mask).requires_grad_()


class _BaselineMethod(_EmbeddingMethod):
    """An embedding method that compares the input with a baseline (IG, DeepLIFT): one
    check of ``baseline`` and one set-up of the path from it to the input."""

    def __init__(self, *, baseline: str = "zero", **kw: object):
        super().__init__(**kw)  # type: ignore[arg-type]
        self.baseline = one_of("baseline", baseline, BASELINES)

    def _path(self, texts: Texts) -> BaselinePath:
        """The path from the baseline's embeddings (:func:`make_baseline`) to the input's."""
        fwd, embeds = self._setup(texts)
        base = make_baseline(fwd, texts.tokenizer, texts.padded, embeds, self.baseline)
        return BaselinePath(fwd, embeds, base, texts.padded, texts.target_ids)


def reduce_hidden(grad: torch.Tensor, reduction: str) -> torch.Tensor:
    """Gradient ``(B, T, H)`` → token score ``(B, T)``: l1 (|g| summed, Captum Saliency),
    l2 (Euclidean norm), mean or sum of the signed gradient."""
    if reduction == "l1":
        return grad.abs().sum(-1)
    if reduction == "l2":
        return grad.norm(dim=-1)
    if reduction == "mean":
        return grad.mean(-1)
    one_of("reduction", reduction, REDUCTIONS)
    return grad.sum(-1)


@register(
    "vanilla_gradient", display="Vanilla Gradient", published="Vanilla_Gradient", paper_order=3
)
class VanillaGradient(_EmbeddingMethod):
    """Gradient of the target output w.r.t. the embeddings (Captum ``Saliency``), reduced
    over the hidden dimension by ``reduction`` (``l1`` default, ``l2``, ``mean``, ``sum``)."""

    def __init__(self, *, reduction: str = "l1", **kw: object):
        super().__init__(**kw)  # type: ignore[arg-type]
        self.reduction = one_of("reduction", reduction, REDUCTIONS)

    def token_scores(self, texts: Texts) -> torch.Tensor:
        fwd, embeds = self._setup(texts)
        abs_ = self.reduction in ("l1", "l2")
        grad = captum_attribute(Saliency(fwd), embeds, texts.padded, texts.target_ids, abs=abs_)
        return reduce_hidden(grad, self.reduction)


@register("input_x_gradient", display="InputXGrad", published="InputXGrad", paper_order=4)
class InputXGradientMethod(_EmbeddingMethod):
    """Gradient · embedding per token (Captum ``InputXGradient`` summed over the hidden dim)."""

    def token_scores(self, texts: Texts) -> torch.Tensor:
        fwd, embeds = self._setup(texts)
        attr = captum_attribute(InputXGradient(fwd), embeds, texts.padded, texts.target_ids)
        return attr.sum(-1)


# Padded tokens per IG chunk: rows = this ÷ the batch's width, at most internal_batch_size.
# Measured (2026-11-24, native-bf16 2-core host, 3 texts of 256 tokens, 50 steps): 10-25
# rows (2,560-6,400 tokens) 13.0 s, 50 rows 15.2 s, 100 rows (25,600 tokens) 17.9 s; short
# AG News texts (48 tokens) ran within noise from 25 to 200 rows. Large activations fall
# out of the caches, as in saleval.config.model.DEFAULT_MAX_TOKENS.
DEFAULT_INTERNAL_MAX_TOKENS = 4096

# Rows (examples × steps) per forward/backward chunk, measured on this shared 2-core CPU
# with the embedded MiniLM (`python -m benchmarks attribution --ig-chunks`, 50 steps):
# 8 texts in batches of 8: 4-16 rows 99-143 s, 32 rows 56 s, 64-256 rows 36-88 s, all 400
# rows at once (Captum's default) 72-77 s. 32 texts, CPU seconds: naive per-example Captum
# (50 rows) 142; batches of 8 × 32 rows 152, 8 × all 130, 1 × 64 rows 115, 1 × all 97,
# 4 × 100 rows 94. Small chunks lose, ~100 rows win; with bert-base at 256 tokens a
# 100-row chunk holds ~8 GB of activations (lower it there on small machines).
DEFAULT_INTERNAL_BATCH_SIZE = 100


@register(
    "integrated_gradients",
    display="Integrated Gradients",
    published="Integrated_Gradient",
    paper_order=5,
)
class IntegratedGradientsMethod(_BaselineMethod):
    """Captum IG from a baseline to the embeddings, summed over the hidden dim.

    ``n_steps`` interpolation points (integrated with ``method``, Gauss–Legendre by
    default) are batched ``internal_batch_size`` rows at a time, fewer where a chunk would
    pass ``internal_max_tokens`` padded tokens (``null`` for both: all at once, Captum's
    default, memory growing with batch × n_steps). Opt-in ``convergence_tolerance``
    (e.g. 0.05) picks the steps per example instead (:meth:`_adaptive`); the default keeps
    the fixed ``n_steps``. Completeness
    (Σ attributions = f(x) − f(baseline)) is checked per example: the convergence
    deltas land in ``diagnostics["convergence_delta"]``.

    Texts join a batch only at equal length (``max_padding`` 0): each text's ``n_steps``
    rows are already a large batch, and padding a text to a longer neighbour cost more
    than the larger batch gained (docs/benchmarks.md#length-aware-batching).
    """

    default_max_padding = 0.0

    def __init__(
        self,
        *,
        baseline: str = "zero",
        n_steps: int = 50,
        method: str = "gausslegendre",
        internal_batch_size: int | None = DEFAULT_INTERNAL_BATCH_SIZE,
        internal_max_tokens: int | None = DEFAULT_INTERNAL_MAX_TOKENS,
        convergence_tolerance: float | None = None,
        min_steps: int = 8,
        **kw: object,
    ):
        kw.setdefault("batch_size", 4)  # few examples: their n_steps rows are the batch
        super().__init__(baseline=baseline, **kw)
        self.method = one_of("method", method, IG_METHODS)
        if int(n_steps) < 1:
            raise AttributionError(f"n_steps must be >= 1, got {n_steps}")
        self.n_steps = int(n_steps)
        self.internal_batch_size = int(internal_batch_size) if internal_batch_size else None
        self.internal_max_tokens = int(internal_max_tokens) if internal_max_tokens else None
        if convergence_tolerance is not None and not float(convergence_tolerance) > 0:
            raise AttributionError(
                f"convergence_tolerance must be > 0, got {convergence_tolerance}"
            )
        if int(min_steps) < 2:
            raise AttributionError(f"min_steps must be >= 2, got {min_steps}")
        self.convergence_tolerance = (
            None if convergence_tolerance is None else float(convergence_tolerance)
        )
        self.min_steps = int(min_steps)

    def chunk_rows(self, batch: Batch) -> int | None:
        """Rows per forward/backward chunk: ``internal_batch_size``, lowered so a chunk holds
        at most ``internal_max_tokens`` padded tokens (at least one example's worth of rows:
        Captum splits steps, never examples)."""
        rows = self.internal_batch_size
        if self.internal_max_tokens:
            width = int(batch.input_ids.shape[1])
            by_tokens = max(len(batch.lengths), self.internal_max_tokens // max(width, 1))
            rows = by_tokens if rows is None else min(rows, by_tokens)
        return rows

    def token_scores(self, texts: Texts) -> torch.Tensor:
        path = self._path(texts)
        n = len(path.targets)
        if self.convergence_tolerance is not None and self.n_steps > 1:
            return self._adaptive(path)
        one = self.n_steps == 1
        attr, delta = self._one_step(path) if one else self._integrate(path, self.n_steps)
        self._note("convergence_delta", delta.detach().cpu().tolist())
        self._note("n_steps", [float(self.n_steps)] * n)
        return attr.sum(-1)

    def _integrate(self, path: BaselinePath, n_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Captum IG with ``n_steps`` points: attributions ``(B, T, H)`` and completeness gaps."""
        attr, delta = path.attribute(
            IntegratedGradients(path.fwd, multiply_by_inputs=True),
            baselines=path.base,
            n_steps=n_steps,
            method=self.method,
            internal_batch_size=self.chunk_rows(path.batch),
            return_convergence_delta=True,
        )
        return attr, delta

    def _adaptive(self, path: BaselinePath) -> torch.Tensor:
        """Opt-in (``convergence_tolerance``): per example, the fewest steps of ``min_steps``,
        doubled up to ``n_steps``, whose completeness gap |Σ attributions − (f(x) − f(b))|
        is within the tolerance of |f(x) − f(b)| (the check Sundararajan et al. 2017, §3,
        recommend). Examples that never meet it get ``n_steps``, as the fixed setting does.
        Records ``n_steps`` (used) and ``ig_steps_run`` (every step tried) per example."""
        tol = float(self.convergence_tolerance or 0.0)
        gap = path.output_gap().abs()
        embeds, n = path.embeds, len(path.targets)
        out = torch.zeros(embeds.shape[:2], device=embeds.device)
        deltas = torch.zeros(n, device=embeds.device)
        used = [0.0] * n
        tried = [0.0] * n
        todo = list(range(n))
        steps = min(self.min_steps, self.n_steps)
        while todo:
            idx = torch.as_tensor(todo, device=embeds.device)
            attr, delta = self._integrate(path.rows(idx), steps)
            ok = delta.abs() <= tol * gap[idx].clamp_min(1e-6)
            left = []
            for j, i in enumerate(todo):
                tried[i] += steps
                if bool(ok[j]) or steps >= self.n_steps:
                    out[i], deltas[i], used[i] = attr[j].sum(-1), delta[j], float(steps)
                else:
                    left.append(i)
            todo, steps = left, min(2 * steps, self.n_steps)
        self._note("convergence_delta", deltas.detach().cpu().tolist())
        self._note("n_steps", used)
        self._note("ig_steps_run", tried)
        return out

    def _one_step(self, path: BaselinePath) -> tuple[torch.Tensor, torch.Tensor]:
        """One-node quadrature, which Captum's rules refuse (they assert n_steps > 1):
        (x − b) · ∇f(b + α(x − b)) with α = 1 (riemann_right), 0 (left), ½ (middle, and the
        one-point Gauss–Legendre rule). Riemann-right from the zero baseline is input×gradient.
        """
        alpha = ONE_STEP_ALPHA.get(self.method)
        if alpha is None:
            raise AttributionError(f"n_steps=1 is not defined for method {self.method}")
        embeds, base = path.embeds, path.base
        point = (base + alpha * (embeds - base)).detach().requires_grad_()
        grad = path.attribute(Saliency(path.fwd), point, abs=False)
        attr = (embeds - base).detach() * grad
        return attr, attr.sum(dim=(1, 2)) - path.output_gap()


@register("deeplift", display="DeepLIFT", published="DeepLIFT", paper_order=6)
class DeepLiftMethod(_BaselineMethod):
    """Captum DeepLIFT (rescale rule) from a baseline to the embeddings, summed over hidden.

    What Captum does on BERT (docs/methods.md, measured with Captum 0.9): its rescale rule is
    attached by forward hooks only to ``nn.Module`` non-linearities in its list (ReLU,
    ELU, Sigmoid, Tanh, Softmax, ...). In a Hugging Face BERT that is just the pooler's
    ``nn.Tanh``; the GELU of every feed-forward block is a ``GELUActivation`` module
    Captum does not know, and the attention softmax and LayerNorm are function calls,
    so all of those pass *plain gradients* evaluated at the input. The result is
    therefore DeepLIFT-rescale at the pooler and gradient×(x − baseline) elsewhere —
    not an exact DeepLIFT, and its summation-to-delta property holds only
    approximately (the deltas land in ``diagnostics["convergence_delta"]``). The other
    families (RoBERTa, DeBERTa-v2, DistilBERT, ELECTRA, ModernBERT, GPT-2, Llama) have no
    such module at all, so there DeepLIFT from the ``zero`` baseline is input × gradient
    (the per-family table: docs/methods.md#deeplift).
    """

    def token_scores(self, texts: Texts) -> torch.Tensor:
        path = self._path(texts)
        with warnings.catch_warnings():  # Captum warns about its hooks on every call
            warnings.filterwarnings("ignore", message="Setting forward, backward hooks")
            attr, delta = path.attribute(
                DeepLift(path.fwd, multiply_by_inputs=True),
                baselines=path.base,
                return_convergence_delta=True,
            )
        self._note("convergence_delta", delta.detach().cpu().tolist())
        return attr.sum(-1)
