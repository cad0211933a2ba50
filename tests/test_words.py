"""Tokens → words on tricky text (docs/methods.md#words) and batched inference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from saleval.modeling.inference import forward_logits, length_batches, predict_proba
from saleval.modeling.models import build_model, load_tokenizer
from saleval.words import perturb_ids, segment, token_to_word_scores, word_spans
from tests.conftest import tiny_model_cfg

MODEL_CFG = tiny_model_cfg()


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(MODEL_CFG)


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("State-of-the-art stuff", ["State-of-the-art", "stuff"]),
        ("don't stop, it's 1990s", ["don't", "stop", "it's", "1990s"]),
        ("(AP) -- Oil rose $10.5 ... to 3.5%!!!", ["AP", "Oil", "rose", "$10.5", "to", "3.5"]),
        ("Café Übermensch naïve", ["Café", "Übermensch", "naïve"]),
        ("see http://x.com/a?b=1 now", ["see", "http://x.com/a?b=1", "now"]),
        ("Great.<br /><br />Really", ["Great", "Really"]),
        ("!!! ... -- ?", []),
    ],
)
def test_word_spans_on_tricky_text(text: str, words: list[str]) -> None:
    assert [text[s:e] for s, e in word_spans(text)] == words


def test_pieces_map_to_their_word_by_offsets(tok) -> None:
    text = "Unbelievably, the naïve café-owner's URL http://x.io works."
    seg = segment(text, tok, 128)
    assert seg.words == [
        "Unbelievably",
        "the",
        "naïve",
        "café-owner's",
        "URL",
        "http://x.io",
        "works",
    ]
    pieces = tok.convert_ids_to_tokens(seg.input_ids)
    by_word: dict[int, list[str]] = {}
    for p, w in zip(pieces, seg.token_word):
        if w >= 0:
            by_word.setdefault(w, []).append(p)
    assert "".join(x.removeprefix("##") for x in by_word[0]) == "unbelievably"
    assert "".join(by_word[2]).replace("##", "") == "naive"  # accents stripped by the tokenizer
    assert "".join(by_word[3]).replace("##", "") == "cafe-owner's"
    # special tokens and edge punctuation ("," ".") belong to no word
    assert seg.token_word[0] == -1 and seg.token_word[-1] == -1
    comma = pieces.index(",")
    assert seg.token_word[comma] == -1
    for s, e in seg.spans:
        assert text[s:e] in seg.words


def test_truncation_drops_words_cut_off(tok) -> None:
    text = "alpha beta unbelievably gamma"
    full = segment(text, tok, 64)
    n_pieces_unbeliev = sum(1 for w in full.token_word if w == 2)
    assert n_pieces_unbeliev > 1
    # keep [CLS] alpha beta + the first piece of 'unbelievably' + [SEP]
    cut = segment(text, tok, 5)
    assert cut.truncated
    assert cut.words == ["alpha", "beta"]
    assert all(w in (-1, 0, 1) for w in cut.token_word)


def test_token_to_word_reducers(tok) -> None:
    seg = segment("unbelievably good", tok, 64)
    scores = np.arange(seg.n_tokens, dtype=float)
    pieces = [t for t, w in enumerate(seg.token_word) if w == 0]
    assert token_to_word_scores(scores, seg, "sum")[0] == pytest.approx(sum(pieces))
    assert token_to_word_scores(scores, seg, "max")[0] == pytest.approx(max(pieces))
    assert token_to_word_scores(scores, seg, "mean")[0] == pytest.approx(np.mean(pieces))
    with pytest.raises(ValueError, match="reduction"):
        token_to_word_scores(scores, seg, "median")


def test_perturb_ids_delete_mask_unk(tok) -> None:
    seg = segment("the movie was unbelievably good, really", tok, 64)
    keep = np.ones(seg.n_words, dtype=bool)
    keep[3] = False  # unbelievably
    n_pieces = sum(1 for w in seg.token_word if w == 3)
    deleted = perturb_ids(seg, keep)
    assert len(deleted) == seg.n_tokens - n_pieces
    assert deleted[0] == tok.cls_token_id and deleted[-1] == tok.sep_token_id
    masked = perturb_ids(seg, keep, "mask", tok)
    assert len(masked) == seg.n_tokens and masked.count(tok.mask_token_id) == n_pieces
    assert perturb_ids(seg, keep, "unk", tok).count(tok.unk_token_id) == n_pieces
    only = perturb_ids(seg, ~keep, keep_other=False)
    assert tok.convert_ids_to_tokens(only)[0] == "[CLS]" and "," not in tok.convert_ids_to_tokens(
        only
    )
    assert len(only) == 2 + n_pieces


def test_length_batches_respect_budget_and_cover_everything() -> None:
    lengths = [5, 100, 7, 50, 3, 100, 9]
    batches = list(length_batches(lengths, max_tokens=200, max_batch=4))
    seen = np.concatenate(batches)
    assert sorted(seen.tolist()) == list(range(len(lengths)))
    for b in batches:
        assert max(lengths[i] for i in b) * len(b) <= 200 or len(b) == 1


def test_batched_inference_equals_one_by_one(tok) -> None:
    torch.manual_seed(0)
    model = build_model(MODEL_CFG, ["a", "b", "c"]).eval()
    texts = ["short", "a somewhat longer text with more words in it", "mid length text here"]
    seqs = [tok(t)["input_ids"] for t in texts]
    batched = forward_logits(model, seqs, max_tokens=10_000)
    single = np.vstack([forward_logits(model, [s]) for s in seqs])
    np.testing.assert_allclose(batched, single, atol=1e-5)
    p = predict_proba(model, seqs)
    np.testing.assert_allclose(p.sum(1), 1.0, atol=1e-6)
