"""Perturbation methods (docs/methods.md): LIME over word presence, leave-one-word-out occlusion,
and the original crowd study's Captum-LIME over embedding values.

Word-level perturbation always acts on token ids (:func:`saleval.words.perturb_ids`),
never on decoded strings, so a word is removed exactly as segmented. The perturbed
inputs of a whole batch of examples go through :func:`saleval.modeling.inference.predict_proba`
at once, sorted by length under a token budget — ``removal: delete`` shortens inputs,
and sorting before batching is what makes that pay off (docs/methods.md#batching). ``removal``
(:class:`saleval.vocab.Removal`) is the word the faithfulness metrics use too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from functools import partial

import numpy as np
import torch
from captum._utils.models.linear_model import SkLearnLinearRegression
from captum.attr import Lime as CaptumLimeImpl
from captum.attr._core.lime import get_exp_kernel_similarity_function
from lime.lime_base import LimeBase
from sklearn.metrics.pairwise import pairwise_distances
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from saleval.attribution.base import (
    AttributionError,
    Attributor,
    Texts,
    TokenAttributor,
    one_of,
    register,
    sample_rng,
)
from saleval.attribution.gradient import OUTPUTS, EmbeddingForward
from saleval.config.model import DEFAULT_MAX_TOKENS
from saleval.modeling.devices import model_device
from saleval.modeling.inference import BF16, forward_logits, parse_bf16, use_bf16
from saleval.modeling.interface import InterfaceError, check_replacement
from saleval.vocab import Removal
from saleval.words import RemovalError, perturb_ids, rank_words, removal_token

DISTANCES = ("cosine", "euclidean")


def _probs(logits: np.ndarray) -> np.ndarray:
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=1, keepdims=True)


#: Most perturbed inputs per forward batch of LIME and occlusion (the metrics' and
#: forward_logits's own default is saleval.config.model.DEFAULT_MAX_BATCH, 512). Under the
#: token budget (DEFAULT_MAX_TOKENS) it binds only for inputs of at most 4 tokens: LIME
#: samples that keep two words or fewer. 1,024 dates from the methods' first version; no
#: measurement chose it over 512, and `make run`'s tables were made with it (a batch cut
#: elsewhere can move a score in its last float bits), so it stays a value of its own until
#: one does (docs/benchmarks.md#batch-size).
PERTURBATION_MAX_BATCH = 1024


class _Perturbation(Attributor):
    def __init__(
        self,
        *,
        removal: Removal | str = Removal.delete,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        max_batch: int = PERTURBATION_MAX_BATCH,
        bf16: BF16 = False,
        **kw: object,
    ):
        super().__init__(**kw)  # type: ignore[arg-type]
        try:
            self.removal = Removal(removal)
        except ValueError:
            raise AttributionError(
                f"removal must be one of {[r.value for r in Removal]}, got {removal!r}"
            ) from None
        self.max_tokens = int(max_tokens)
        self.max_batch = int(max_batch)
        self.bf16 = parse_bf16(bf16)

    def prepare(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> None:
        """``removal`` must be possible with this tokenizer (no silent ``delete`` for ``mask``)."""
        name = self.name or self.registry_name
        try:
            token = removal_token(self.removal, tokenizer)
            if token is not None:
                check_replacement(model, tokenizer, token, f"removal: {self.removal}")
        except (RemovalError, InterfaceError) as err:
            raise AttributionError(f"{name}: {err}") from err

    def _forward_each(
        self, texts: Texts, seqs: Sequence[Sequence[list[int]]], probs: bool = True
    ) -> list[np.ndarray]:
        """The perturbed inputs of several texts (``seqs[i]`` of the i-th) through the model
        in one call, sorted and packed (:func:`saleval.modeling.inference.forward_logits`);
        back as one ``(len(seqs[i]), classes)`` array per text: probabilities, or the
        logits with ``probs=False``."""
        model = texts.model
        # what `auto` became on this device (1 = bf16), kept with the method's diagnostics
        self._note("bf16", [float(use_bf16(model_device(model), self.bf16))])
        values = forward_logits(
            model,
            [seq for each in seqs for seq in each],
            tokenizer=texts.tokenizer,
            max_tokens=self.max_tokens,
            max_batch=self.max_batch,
            bf16=self.bf16,
        )
        if probs:
            values = _probs(values)
        ends = np.cumsum([len(each) for each in seqs])
        return np.split(values, ends[:-1]) if len(seqs) else []


def lime_neighbourhood(n_words: int, num_samples: int, rng: np.random.Generator) -> np.ndarray:
    """Binary word-presence rows as ``LimeTextExplainer`` draws them.

    Row 0 is the original (all ones); every other row removes a uniformly drawn number
    1..d of distinct words chosen uniformly (lime_text's ``__data_labels_distances``).
    """
    data = np.ones((num_samples, n_words))
    sizes = rng.integers(1, n_words + 1, num_samples - 1)
    for i, size in enumerate(sizes, start=1):
        data[i, rng.choice(n_words, size, replace=False)] = 0
    return data


def lime_kernel(d: np.ndarray, kernel_width: float) -> np.ndarray:
    """LIME's exponential kernel on distances: sqrt(exp(−d² / width²)) (lime_text)."""
    return np.sqrt(np.exp(-(d**2) / kernel_width**2))


@register("lime", display="LIME", published="LIME", paper_order=7)
class Lime(_Perturbation):
    """LIME (Ribeiro et al. 2016) over word presence, with the ``lime`` package's surrogate.

    Per example: ``num_samples`` neighbourhood rows (:func:`lime_neighbourhood`, row 0
    the original), each removing words by ``removal`` (``delete`` drops the word's
    tokens, ``unk``/``mask`` replace them); distances are cosine distances to the
    original row × 100 and weights LIME's exponential kernel (width 25), as in
    ``LimeTextExplainer(bow=False)``; ``lime.lime_base.LimeBase`` fits its weighted
    ridge surrogate on p(target) with every word as a feature
    (``feature_selection='none'``). A word's score is its surrogate coefficient.
    The neighbourhood is drawn from a generator seeded by (``seed``, sample).
    """

    def __init__(
        self,
        *,
        num_samples: int = 1000,
        kernel_width: float = 25.0,
        distance: str = "cosine",
        feature_selection: str = "none",
        seed: int = 0,
        stable_top_k: int | None = None,
        sample_step: int = 100,
        stable_rounds: int = 2,
        **kw: object,
    ):
        super().__init__(**kw)  # type: ignore[arg-type]
        if int(num_samples) < 2:
            raise AttributionError(f"num_samples must be >= 2, got {num_samples}")
        if stable_top_k is not None and int(stable_top_k) < 1:
            raise AttributionError(f"stable_top_k must be >= 1, got {stable_top_k}")
        if int(sample_step) < 2 or int(stable_rounds) < 1:
            raise AttributionError("sample_step must be >= 2 and stable_rounds >= 1")
        self.stable_top_k = None if stable_top_k is None else int(stable_top_k)
        self.sample_step = int(sample_step)
        self.stable_rounds = int(stable_rounds)
        one_of("distance", distance, DISTANCES)
        self.num_samples = int(num_samples)
        self.kernel_width = float(kernel_width)
        self.distance = distance
        self.feature_selection = feature_selection
        self.seed = int(seed)

    def word_scores(self, texts: Texts) -> list[np.ndarray]:
        """Per example: the neighbourhood, its probabilities, the surrogate's coefficients.

        With ``stable_top_k`` (opt-in) the rows are evaluated ``sample_step`` at a time and
        an example stops once its top-k words stayed the same over ``stable_rounds``
        refits (the idea of S-LIME, Zhou et al. 2021, KDD: sample until the explanation is
        stable; here the test is the top-k set, not S-LIME's LARS test). The rows are the
        first rows of the fixed-size neighbourhood, so an example that never settles gets
        exactly the fixed setting's explanation.
        """
        segs, targets = texts.segs, texts.targets
        data = [
            lime_neighbourhood(seg.n_words, self.num_samples, sample_rng(self.seed, seg.text))
            if seg.n_words
            else np.ones((0, 0))
            for seg in segs
        ]
        step = self.num_samples if self.stable_top_k is None else self.sample_step
        out = [np.zeros(seg.n_words) for seg in segs]
        labels: list[list[np.ndarray]] = [[] for _ in segs]
        used = [0] * len(segs)
        r2 = [0.0] * len(segs)
        stable = [0] * len(segs)
        top: list[frozenset[int] | None] = [None] * len(segs)
        active = [i for i, seg in enumerate(segs) if seg.n_words]
        while active:
            rows = [data[i][used[i] : used[i] + step] for i in active]
            seqs = [
                [perturb_ids(segs[i], r.astype(bool), self.removal, texts.tokenizer) for r in each]
                for i, each in zip(active, rows)
            ]
            left = []
            for i, probs in zip(active, self._forward_each(texts, seqs)):
                labels[i].append(probs)
                used[i] += len(probs)
                out[i], r2[i] = self._fit(data[i][: used[i]], np.vstack(labels[i]), int(targets[i]))
                if self.stable_top_k is not None:
                    now = frozenset(rank_words(out[i])[: self.stable_top_k].tolist())
                    stable[i] = stable[i] + 1 if now == top[i] else 0
                    top[i] = now
                if used[i] < self.num_samples and stable[i] < self.stable_rounds:
                    left.append(i)
            active = left
        for i in range(len(segs)):
            if segs[i].n_words:
                self._note("surrogate_r2", [r2[i]])
                self._note("num_samples", [float(used[i])])
        return out

    def _fit(self, data: np.ndarray, labels: np.ndarray, target: int) -> tuple[np.ndarray, float]:
        """Word scores — the ``lime`` surrogate's coefficients on rows ``data`` (row 0 the
        original) with class probabilities ``labels`` — and the surrogate's R²."""
        distances = pairwise_distances(data, data[:1], metric=self.distance).ravel() * 100
        base = LimeBase(
            partial(lime_kernel, kernel_width=self.kernel_width),
            random_state=np.random.RandomState(self.seed),
        )
        _, weights, score, _ = base.explain_instance_with_data(
            data, labels, distances, target, data.shape[1], feature_selection=self.feature_selection
        )
        scores = np.zeros(data.shape[1])
        for feature, weight in weights:
            scores[int(feature)] = weight
        return scores, float(score)


@register("occlusion", display="Occlusion", paper_order=8)
class Occlusion(_Perturbation):
    """Leave-one-word-out ("word omission"): p(target | x) − p(target | x without w).

    ``removal`` says how the word is removed (``delete`` default, ``unk``,
    ``mask``); ``output: logits`` uses the target logit instead of its probability.
    """

    def __init__(self, *, output: str = "probs", **kw: object):
        super().__init__(**kw)  # type: ignore[arg-type]
        self.output = one_of("output", output, OUTPUTS)

    def word_scores(self, texts: Texts) -> list[np.ndarray]:
        seqs = [
            [list(seg.input_ids)] + [
                perturb_ids(seg, np.arange(seg.n_words) != w, self.removal, texts.tokenizer)
                for w in range(seg.n_words)
            ]
            for seg in texts.segs
        ]  # fmt: skip
        values = self._forward_each(texts, seqs, probs=self.output == "probs")
        return [v[:, int(t)][0] - v[1:, int(t)] for v, t in zip(values, texts.targets)]


@contextlib.contextmanager
def _torch_seed(rng: np.random.Generator) -> Iterator[None]:
    """Seed torch's global generator (Captum's sampler uses it) without leaking the state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(rng.integers(0, 2**63 - 1)))
        yield


@register("captum_lime")
class CaptumLime(TokenAttributor):
    """The original crowd study's LIME (preset ``lu2024``, docs/methods.md): Captum ``Lime`` over
    every single embedding value.

    No feature mask (each of the T×H embedding values is its own feature), the zero
    baseline (a perturbed value becomes 0), ``n_samples`` Bernoulli(½) perturbations
    evaluated ``perturbations_per_eval`` at a time, a linear-regression surrogate, and
    Captum's exponential kernel on the Euclidean distance between the perturbed and
    original embeddings with ``kernel_width`` 1000. A token's score is its values'
    coefficients summed. Each example runs alone at its own length (padding would add
    features and change distances); Captum's sampling is seeded by (``seed``, sample).
    """

    def __init__(
        self,
        *,
        n_samples: int = 40,
        kernel_width: float = 1000.0,
        distance: str = "euclidean",
        perturbations_per_eval: int = 40,
        layer: str = "embeddings",
        output: str = "logits",
        seed: int = 0,
        **kw: object,
    ):
        super().__init__(**kw)  # type: ignore[arg-type]
        one_of("distance", distance, DISTANCES)
        self.n_samples = int(n_samples)
        self.kernel_width = float(kernel_width)
        self.distance = distance
        self.perturbations_per_eval = int(perturbations_per_eval)
        self.layer = layer
        self.output = output
        self.seed = int(seed)

    def prepare(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerFast) -> None:
        """Find ``layer`` in this model before any work."""
        EmbeddingForward(model, tokenizer, self.layer, self.output)

    def token_scores(self, texts: Texts) -> torch.Tensor:
        batch, targets = texts.padded, texts.target_ids
        fwd = EmbeddingForward(texts.model, texts.tokenizer, self.layer, self.output)
        lime = CaptumLimeImpl(
            fwd,
            interpretable_model=SkLearnLinearRegression(),
            similarity_func=get_exp_kernel_similarity_function(self.distance, self.kernel_width),
        )
        out = torch.zeros(batch.input_ids.shape, device=batch.input_ids.device)
        for i, n in enumerate(batch.lengths):
            ids = batch.input_ids[i : i + 1, :n]
            mask = batch.attention_mask[i : i + 1, :n]
            embeds = fwd.embed(ids, mask)
            with _torch_seed(sample_rng(self.seed, batch.texts[i])), torch.no_grad():
                attr = lime.attribute(
                    embeds,
                    baselines=0.0,
                    target=int(targets[i]),
                    additional_forward_args=(ids, mask),
                    n_samples=self.n_samples,
                    perturbations_per_eval=self.perturbations_per_eval,
                )
            out[i, :n] = attr[0].sum(-1)
        return out
