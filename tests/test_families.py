"""Every classifier a researcher brings (issue #43): tiny random checkpoints of seven families
— RoBERTa, DeBERTa-v2, DistilBERT, ELECTRA, ModernBERT (encoders), GPT-2 and Llama
(decoders), each with a tokenizer trained in the session (byte-level BPE, Unigram with
``▁``, WordPiece) — explained as the model computes: the stages end to end, and every
number that can be computed independently on the plain model checked against it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import spearmanr
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from saleval.attribution import AttributionError, Texts, build_method, explain_frame
from saleval.attribution.gradient import EmbeddingForward
from saleval.modeling import inference
from saleval.modeling.embedding import embedding_point
from saleval.modeling.interface import (
    InterfaceError,
    classifier_reads,
    effective_max_length,
    model_tags,
)
from saleval.modeling.models import align_labels, load_trained
from saleval.pipeline import tables
from saleval.testing.families import FAMILIES, FFN, HEADS, HIDDEN, INIT, LAYERS, POSITIONS
from saleval.words import segment, token_to_word_scores

ALL = sorted(FAMILIES)
DECODERS = sorted(f for f, fam in FAMILIES.items() if fam.decoder)
TEXTS = [
    "a gorgeously strange and moving film .",
    "bad",
    "the plot is thin , but the acting is wonderful and the music soars",
    "it 's a charming , often hilarious ride",
    "dull , lifeless and far too long",
    "an unexpectedly sweet story",
    "i could n't sit through it",
    "one of the year 's best , most daring movies , with a cast that never lets it down",
]
#: the classes the tiny checkpoints name (SST-2's)
LABELS = ["negative", "positive"]


def _load(path: Path):
    model, tok = load_trained(path)
    return model, tok


def _alone(model, tok, text: str, **kw):
    """The plain model on one text, as its tokenizer feeds it: no saleval code involved."""
    enc = tok(text, return_tensors="pt", truncation=True, max_length=64)
    return model(**enc, **kw), enc


# --- the stages end to end -------------------------------------------------------------


@pytest.mark.parametrize("family", ALL)
def test_every_method_metric_and_view_through_the_stages(
    family, family_checkpoints, make_cfg
) -> None:
    """``saleval-explain`` on the checkpoint with every default method at its defaults
    (highlights included), then ``saleval-metrics`` on that run."""
    from saleval.stages import explain, metrics

    ckpt = family_checkpoints[family]
    cfg = make_cfg(
        "explain",
        [f"inputs.model={ckpt}", "dataset=sst2", "dataset.max_test=40", "data.n_samples=4",
         "data.population=all", "progress=false", "view.samples=2", "view.overlap_k=3"],
        name=f"explain-{family}",
    )  # fmt: skip
    out = explain.run(cfg)
    run_dir = Path(out["run_dir"])
    attributions = tables.ATTRIBUTIONS.read(run_dir)
    assert set(attributions["method"]) == set(cfg.method)
    assert attributions["score"].notna().all() and np.isfinite(attributions["score"]).all()
    assert (run_dir / "views" / "highlights.html").is_file()
    info = json.loads((run_dir / "run.json").read_text())
    assert info["provenance"]["model"] == f"my-{family}"
    assert info["provenance"]["max_length"] == POSITIONS  # 256, capped by its 128 positions
    m = make_cfg(
        "metrics",
        [f"inputs.model={ckpt}", f"inputs.explain={run_dir}", "kgrid=smoke", "progress=false"],
        name=f"metrics-{family}",
    )
    got = tables.METRICS.read(Path(metrics.run(m)["run_dir"]))
    assert set(got["method"]) == set(cfg.method)


@pytest.mark.parametrize("family", ALL)
def test_one_training_step_from_the_checkpoint(family, family_checkpoints, make_cfg) -> None:
    """README's command: ``saleval-train dataset=sst2 model.pretrained=<dir>`` trains that
    checkpoint (the default model group is minilm), whatever its family."""
    from saleval.stages import train

    ckpt = family_checkpoints[family]
    cfg = make_cfg(
        "train",
        [f"model.pretrained={ckpt}", "dataset=sst2", "trainer=smoke",
         "trainer.limit_train_batches=1", "dataset.max_train=32", "dataset.max_validation=16",
         "dataset.max_test=16", "tracking.log_model=false"],
        name=f"train-{family}",
    )  # fmt: skip
    out = train.run(cfg)
    run_dir = Path(out["run_dir"])
    saved = json.loads((run_dir / "model" / "config.json").read_text())
    original = json.loads((ckpt / "config.json").read_text())
    assert saved["architectures"] == original["architectures"]
    assert saved["model_type"] == original["model_type"]
    info = json.loads((run_dir / "run.json").read_text())
    assert info["provenance"]["model"] == f"my-{family}"
    assert info["provenance"]["max_length"] == POSITIONS
    assert json.loads((run_dir / "metrics.json").read_text())["steps"] == 1
    # the weights moved from the checkpoint's: it is what was trained
    before = AutoModelForSequenceClassification.from_pretrained(ckpt).state_dict()
    after = AutoModelForSequenceClassification.from_pretrained(run_dir / "model").state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


# --- equal to the plain model ----------------------------------------------------------


@pytest.mark.parametrize("family", ALL)
def test_explained_logits_equal_the_models_own_for_a_padded_batch(
    family, family_checkpoints
) -> None:
    """Every forward saleval runs on a padded batch — the gradient methods' forward over
    either embedding layer, the batched forward of LIME, occlusion and the metrics, the
    attention methods' eager pass — gives each text the logits the plain model gives it
    alone."""
    model, tok = _load(family_checkpoints[family])
    segs = [segment(t, tok, 64) for t in TEXTS]
    with torch.no_grad():
        own = torch.stack([_alone(model, tok, t)[0].logits[0] for t in TEXTS])
    texts = Texts(model, tok, segs, [0] * len(segs))
    batch = texts.padded
    assert batch.attention_mask.sum(1).tolist() != [batch.input_ids.shape[1]] * len(segs)
    with torch.no_grad():
        for layer in ("embeddings", "word_embeddings"):
            fwd = EmbeddingForward(model, tok, layer)
            x = fwd.embed(batch.input_ids, batch.attention_mask)
            got = fwd(x, batch.input_ids, batch.attention_mask)
            torch.testing.assert_close(got, own, atol=1e-5, rtol=1e-4)
        model.set_attn_implementation("eager")
        eager = model(**batch.inputs(), output_attentions=True).logits
    torch.testing.assert_close(eager, own, atol=1e-5, rtol=1e-4)
    batched = inference.forward_logits(model, [s.input_ids for s in segs], tokenizer=tok)
    np.testing.assert_allclose(batched, own.numpy(), atol=1e-5, rtol=1e-4)


#: the families whose head reads the first token alone and whose last block is laid out as
#: BERT's: their last block runs at that token alone (saleval.modeling.first_token)
FIRST_TOKEN = {"roberta", "electra"}


@pytest.mark.parametrize("family", ALL)
def test_the_last_block_runs_at_the_first_token_where_the_model_reads_only_it(
    family, family_checkpoints
) -> None:
    """The fast path is chosen from what the model reads (classifier_reads) and how its
    last block is laid out, not from its class: on for every family that reads position 0
    through a BERT-style block, off for the others; where on, the logits and the gradient
    methods' scores are the whole model's to float noise."""
    from saleval.modeling import first_token
    from saleval.modeling.interface import blocks_of

    model, tok = _load(family_checkpoints[family])
    model.eval()
    with first_token.last_block_at_first_token(model) as on:
        pass
    blocks = blocks_of(model)
    assert blocks is not None
    reads_first = classifier_reads(model, tok) == "first"
    assert on == (reads_first and first_token.bert_layout(blocks[-1])) == (family in FIRST_TOKEN)
    if not on:
        return
    segs = [segment(t, tok, 64) for t in TEXTS]
    kinds = ("vanilla_gradient", "integrated_gradients")

    def run():
        logits = inference.forward_logits(model, [s.input_ids for s in segs], tokenizer=tok)
        scores = [build_method({"kind": k, "n_steps": 8} if k == "integrated_gradients" else
                               {"kind": k}).attribute(model, tok, segs, [1] * len(segs))
                  for k in kinds]  # fmt: skip
        return logits, scores

    fast = run()
    with first_token.whole_model():
        whole = run()
    np.testing.assert_allclose(fast[0], whole[0], rtol=1e-5, atol=1e-6)
    for kind, a, b in zip(kinds, fast[1], whole[1]):
        for x, y in zip(a, b):
            assert np.abs(x - y).max(initial=0) <= 1e-4 * max(np.abs(y).max(initial=0), 1e-12), kind


def _independent_gradient(model, tok, text: str, target: int, layer: str) -> np.ndarray:
    """|∂ logit / ∂ embeddings| summed over the hidden dimension, per token, on the plain
    model: ``embeddings`` is what the model returns as ``hidden_states[0]`` (the input to
    its first block), ``word_embeddings`` its input embeddings fed as ``inputs_embeds``."""
    enc = tok(text, return_tensors="pt", truncation=True, max_length=64)
    if layer == "embeddings":
        out = model(**enc, output_hidden_states=True)
        x = out.hidden_states[0]
        x.retain_grad()
    else:
        x = model.get_input_embeddings()(enc["input_ids"]).detach().requires_grad_()
        rest = {k: v for k, v in enc.items() if k != "input_ids"}
        out = model(inputs_embeds=x, **rest)
    out.logits[0, target].backward()
    assert x.grad is not None
    return x.grad[0].abs().sum(-1).numpy()


@pytest.mark.parametrize("layer", ["embeddings", "word_embeddings"])
@pytest.mark.parametrize("family", ALL)
def test_vanilla_gradient_equals_an_independent_gradient(family, layer, family_checkpoints):
    model, tok = _load(family_checkpoints[family])
    segs = [segment(t, tok, 64) for t in TEXTS]
    targets = [i % 2 for i in range(len(segs))]
    ours = build_method({"kind": "vanilla_gradient", "layer": layer}).attribute(
        model, tok, segs, targets
    )
    for seg, t, text, got in zip(segs, targets, TEXTS, ours):
        ref = token_to_word_scores(_independent_gradient(model, tok, text, t, layer), seg)
        assert ref.max() > 0, "a gradient of zero would make the comparison vacuous"
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6 * float(ref.max()))


@pytest.mark.parametrize("family", ALL)
def test_ig_is_complete_against_the_plain_model(family, family_checkpoints) -> None:
    """Σ IG attributions = f(x) − f(baseline), both sides computed on the plain model: the
    input's logit as its tokenizer feeds it, and the baseline's — the unknown token's word
    embedding at every non-special token, the special tokens' own — fed as
    ``inputs_embeds``. (From the zero vector — and the pad token's embedding is zero in
    most families — a model whose embedding LayerNorm sees no position embedding, such as
    DeBERTa-v2, has a near-step on the path that quadrature needs ~1,000 steps to resolve.)"""
    model, tok = _load(family_checkpoints[family])
    ig = build_method(
        {"kind": "integrated_gradients", "layer": "word_embeddings", "baseline": "unk",
         "n_steps": 256}
    )  # fmt: skip
    for text, t in zip(TEXTS[:4], [1, 0, 1, 0]):
        seg = segment(text, tok, 64)
        with torch.enable_grad():
            total = float(ig.token_scores(Texts(model, tok, [seg], [t])).detach().sum())
        with torch.no_grad():
            out, enc = _alone(model, tok, text)
            ids = enc["input_ids"]
            special = torch.as_tensor(seg.special)[None, :]
            base_ids = torch.where(special, ids, torch.full_like(ids, tok.unk_token_id))
            base = model.get_input_embeddings()(base_ids)
            rest = {k: v for k, v in enc.items() if k != "input_ids"}
            gap = float(out.logits[0, t] - model(inputs_embeds=base, **rest).logits[0, t])
        assert abs(gap) > 1e-3, "the baseline's output equals the input's: vacuous"
        # Captum's completeness gap, measured with saleval's forward, is exactly the gap to
        # the plain model's outputs: both ends of the path are the plain model's
        delta = ig.diagnostics["convergence_delta"][-1]
        assert total - gap == pytest.approx(delta, abs=1e-5 * max(1.0, abs(gap)))
        assert total == pytest.approx(gap, rel=5e-2)  # and the quadrature is close


# --- decoders --------------------------------------------------------------------------


@pytest.mark.parametrize("family", DECODERS)
def test_decoder_attention_is_not_a_position_ramp(family, family_checkpoints) -> None:
    """Under a causal mask, averaging every query row ranks words by position (the issue
    measured a Spearman of −0.91 with position); the default reads the row the classifier
    reads (the last non-pad token), which is not a ramp. ``query: all`` still is one, so
    the check can fail; ``query: cls`` is refused."""
    model, tok = _load(family_checkpoints[family])
    assert classifier_reads(model, tok) == "last"
    segs = [segment(t, tok, 64) for t in TEXTS]
    targets = [0] * len(segs)

    def ramp(query: str) -> tuple[float, int]:
        scores = build_method({"kind": "all_attention", "query": query}).attribute(
            model, tok, segs, targets
        )
        rhos = [spearmanr(s, np.arange(len(s)))[0] for s in scores if len(s) > 2]
        first_top = sum(int(np.argmax(s) == 0) for s in scores if len(s) > 2)
        return float(np.mean(rhos)), first_top

    rho, first = ramp("auto")
    assert rho > -0.5 and first <= 3, (rho, first)
    rho_all, _ = ramp("all")
    assert rho_all < -0.7, rho_all
    with pytest.raises(AttributionError, match="query: cls reads row 0.*query: output"):
        build_method({"kind": "all_attention", "query": "cls"}).attribute(model, tok, segs, targets)


def test_the_decoder_query_warning_is_logged_once_per_run(
    family_checkpoints, caplog, monkeypatch
) -> None:
    """``query: all`` on a decoder is warned when the method is prepared, which happens
    for every method built and again for every call that attributes (the explain stage
    met it six times a run); the run's log says it once per model class."""
    from saleval import errors
    from saleval.attribution.attention import resolve_query

    monkeypatch.setattr(errors, "_WARNED", set())  # what this process warned before
    model, tok = _load(family_checkpoints["gpt2"])
    segs = [segment(t, tok, 64) for t in TEXTS[:3]]
    frame = pd.DataFrame({"sample_id": ["a", "b", "c"], "text": TEXTS[:3]})
    methods = {kind: {"kind": kind, "query": "all"} for kind in ("all_attention", "last_attention")}
    with caplog.at_level(logging.WARNING, logger="saleval.attribution.attention"):
        for kind in methods:
            for _ in range(2):
                build_method(methods[kind]).attribute(model, tok, segs, [0, 1, 0])
        explain_frame(model, tok, frame, methods)
        resolve_query("all", "last", type(model).__name__)
    said = [r for r in caplog.records if "query: all on GPT2ForSequenceClassification" in r.message]
    assert len(said) == 1, [r.message for r in said]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="saleval.attribution.attention"):
        resolve_query("all", "last", "LlamaForSequenceClassification")  # another model class
    assert len(caplog.records) == 1 and "LlamaForSequenceClassification" in caplog.messages[0]


def _tiny_bert(tok):
    """A random BERT classifier at the families' sizes: its pooler's ``nn.Tanh`` is the one
    non-linearity Captum's DeepLIFT has a rule for (docs/methods.md#deeplift)."""
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    conf = BertConfig(vocab_size=len(tok), hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, intermediate_size=FFN,
                      max_position_embeddings=POSITIONS, initializer_range=INIT,
                      pad_token_id=tok.pad_token_id, num_labels=2)  # fmt: skip
    return BertForSequenceClassification(conf).eval()


@pytest.mark.parametrize("family", [*DECODERS, "bert"])
def test_deeplift_is_input_x_gradient_where_captum_has_no_rule(family, family_checkpoints):
    """The table of docs/methods.md#deeplift: Captum's DeepLIFT rescales only at the
    ``torch.nn`` non-linearities it knows; GPT-2 (``NewGELUActivation``) and Llama (SiLU)
    have none, so from the zero baseline DeepLIFT is input × gradient to float rounding.
    BERT's pooler ``Tanh`` is rescaled, and there the two differ."""
    if family == "bert":  # BERT's tokenizer kind: WordPiece, as DistilBERT's
        tok = _load(family_checkpoints["distilbert"])[1]
        model = _tiny_bert(tok)
    else:
        model, tok = _load(family_checkpoints[family])
    segs = [segment(t, tok, 64) for t in TEXTS]
    targets = [i % 2 for i in range(len(segs))]
    dl = build_method({"kind": "deeplift"}).attribute(model, tok, segs, targets)
    ixg = build_method({"kind": "input_x_gradient"}).attribute(model, tok, segs, targets)
    scale = max(float(np.abs(x).max()) for x in ixg)
    gap = max(float(np.abs(a - b).max()) for a, b in zip(dl, ixg))
    assert scale > 1e-3, "scores of zero would make the comparison vacuous"
    if family == "bert":
        assert gap > 0.01 * scale, (gap, scale)
    else:
        assert gap <= 1e-5 * scale, (gap, scale)


@pytest.mark.parametrize("family", DECODERS)
def test_a_removal_the_model_cannot_take_is_refused(family, family_checkpoints) -> None:
    from saleval.metrics.config import MetricsConfig
    from saleval.metrics.faithfulness import evaluate
    from saleval.words import RemovalError

    model, tok = _load(family_checkpoints[family])
    assert tok.mask_token_id is None
    segs = [segment(t, tok, 64) for t in TEXTS[:2]]
    for kind in ("lime", "occlusion"):
        with pytest.raises(AttributionError, match="removal: mask needs a mask token.*delete"):
            build_method({"kind": kind, "removal": "mask"}).attribute(model, tok, segs, [0, 0])
    with pytest.raises(RemovalError, match="removal: mask needs a mask token"):
        evaluate(model, tok, [], MetricsConfig(ks=[1], removal="mask"))
    if tok.unk_token_id == tok.pad_token_id:  # GPT-2: one token is eos, unk and pad
        with pytest.raises(AttributionError, match="also GPT2ForSequenceClassification's pad"):
            build_method({"kind": "occlusion", "removal": "unk"}).attribute(
                model, tok, segs, [0, 0]
            )
        with pytest.raises(InterfaceError, match="removal: delete"):
            evaluate(model, tok, [], MetricsConfig(ks=[1], removal="unk"))
    else:  # Llama: <unk> is a token of its own, and removal by it works
        build_method({"kind": "occlusion", "removal": "unk"}).attribute(model, tok, segs, [0, 0])


def test_the_explain_stage_refuses_before_any_work(family_checkpoints, make_cfg) -> None:
    """A setting the model cannot honour stops ``saleval-explain`` in one line (a
    :class:`~saleval.errors.UserError`, printed as one line by the console script) before
    the first method runs: no table is written."""
    from saleval.errors import UserError
    from saleval.stages import explain

    cfg = make_cfg(
        "explain",
        [f"inputs.model={family_checkpoints['gpt2']}", "dataset=sst2", "dataset.max_test=40",
         "data.n_samples=4", "data.population=all", "progress=false",
         "method.lime.removal=mask"],
    )  # fmt: skip
    with pytest.raises(UserError, match=r"^lime: removal: mask needs a mask token") as err:
        explain.run(cfg)
    assert "\n" not in str(err.value)
    assert not list(Path(cfg.run_dir).glob("*.parquet"))


def test_a_decoder_without_a_pad_id_is_one_line_and_training_sets_it(
    family_checkpoints, tmp_path, make_cfg
) -> None:
    """GPT-2 as published: no pad token, no ``config.pad_token_id``. A model that pads
    with nothing would read padding, so it is refused naming the fix; loading it as
    saleval does (the explain and metrics stages) and training from it both set the pad
    token (its eos) and record that."""
    from saleval.stages import train

    src = family_checkpoints["gpt2"]
    bare = tmp_path / "gpt2-no-pad"
    model = AutoModelForSequenceClassification.from_pretrained(src)
    tok = AutoTokenizer.from_pretrained(src)
    model.config.pad_token_id = None
    tok.pad_token = None
    model.save_pretrained(bare)
    tok.save_pretrained(bare)
    raw = AutoModelForSequenceClassification.from_pretrained(bare).eval()
    raw_tok = AutoTokenizer.from_pretrained(bare)
    segs = [segment(x, raw_tok, 64) for x in TEXTS[:3]]
    with pytest.raises(
        InterfaceError, match="names no pad_token_id.*set model.config.pad_token_id"
    ):
        inference.forward_logits(raw, [s.input_ids for s in segs], tokenizer=raw_tok)
    m, t = load_trained(bare)  # what explain does: the eos token pads, as in training
    assert m.config.pad_token_id == t.pad_token_id == t.eos_token_id
    assert model_tags(m, t)["model.pad_adopted"].startswith("pad_token=<|endoftext|>")
    inference.forward_logits(m, [s.input_ids for s in segs], tokenizer=t)
    cfg = make_cfg(
        "train",
        [f"model.pretrained={bare}", "dataset=sst2", "trainer=smoke",
         "trainer.limit_train_batches=1", "dataset.max_train=32", "dataset.max_validation=16",
         "dataset.max_test=16", "tracking.log_model=false"],
    )  # fmt: skip
    run_dir = Path(train.run(cfg)["run_dir"])
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["pad_token"].startswith("<|endoftext|>")
    trained, trained_tok = load_trained(run_dir)
    assert trained.config.pad_token_id == trained_tok.pad_token_id == trained_tok.eos_token_id
    inference.forward_logits(trained, [s.input_ids for s in segs], tokenizer=trained_tok)


# --- labels, limits, layers ------------------------------------------------------------


@pytest.mark.parametrize("family", ALL)
def test_reversed_id2label_is_reordered(family, family_checkpoints, tmp_path) -> None:
    """A checkpoint whose ``id2label`` lists the classes the other way round is put in the
    dataset's order through its output layer, whatever that layer is called."""
    model, tok = _load(family_checkpoints[family])
    model.config.id2label = {0: LABELS[1], 1: LABELS[0]}
    model.config.label2id = {LABELS[1]: 0, LABELS[0]: 1}
    with torch.no_grad():
        before = _alone(model, tok, TEXTS[2])[0].logits[0]
    align_labels(model, LABELS, where="test")
    with torch.no_grad():
        after = _alone(model, tok, TEXTS[2])[0].logits[0]
    torch.testing.assert_close(after, before.flip(0))
    assert model.config.id2label == dict(enumerate(LABELS))


@pytest.mark.parametrize("family", ALL)
def test_limits_inputs_and_layers_come_from_the_model(family, family_checkpoints) -> None:
    """max_length is capped by the checkpoint's position limit; token types reach only
    models whose tokenizer makes them; ``embeddings`` is the input to the first block."""
    model, tok = _load(family_checkpoints[family])
    assert effective_max_length(None, model, tok) == POSITIONS
    assert effective_max_length(32, model, tok) == 32
    from saleval.modeling.interface import interface

    names = interface(model, tok).input_names
    assert ("token_type_ids" in names) == ("token_type_ids" in tok.model_input_names)
    enc = tok(TEXTS[0], return_tensors="pt")
    with torch.no_grad():
        h0 = model(**enc, output_hidden_states=True).hidden_states[0]
        got = embedding_point(model, tok).capture(model, dict(enc))
    torch.testing.assert_close(got, h0)


def test_every_family_is_in_the_docs_table() -> None:
    from saleval import paths

    page = (paths.project_root() / "docs" / "data-and-models.md").read_text()
    section = page.split('<a id="families"></a>')[1]
    for family in FAMILIES:
        assert f"`{family}`" in section, family
