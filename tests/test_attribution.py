"""Attribution engine (docs/methods.md): invariants of every method on a tiny random BERT.

IG completeness, input×gradient = one-step IG, padding never moves a score, seeded
methods reproduce, attention is averaged over the right axes (read by hand), LIME and
occlusion find a planted word, and the explain stage writes its tables and views.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch
from mlflow.tracking import MlflowClient
from torch import nn

from saleval.analysis.reports import display_name
from saleval.analysis.scoring import order_methods
from saleval.analysis.views import highlight_html, overlap_matrix
from saleval.attribution import (
    REGISTRY,
    AttributionError,
    Lime,
    Texts,
    attribute_words,
    build_method,
    explain_frame,
    paper_methods,
    published_names,
)
from saleval.attribution.base import Batch, register
from saleval.attribution.gradient import EmbeddingForward, IntegratedGradientsMethod
from saleval.attribution.perturbation import lime_neighbourhood
from saleval.modeling.models import build_model, load_tokenizer
from saleval.pipeline import tables
from saleval.pipeline.tracker.tracking_reads import method_rows
from saleval.vocab import PROBS
from saleval.words import rank_words, segment, token_to_word_scores
from tests.conftest import compose_config, tiny_model_cfg

# wider init than BERT's 0.02 so outputs depend visibly on the input
MODEL_CFG = tiny_model_cfg(initializer_range=0.3)
LABELS = ["World", "Sports", "Business", "Sci/Tech"]
TEXTS = [
    "The movie was unbelievably good, really!",
    "Oil rose $10.5 to 3.5% (AP) -- analysts said on Monday.",
    "short",
    "don't stop, it's 1990s state-of-the-art café-owner's URL http://x.io works.",
    "!!! ... --",  # no words at all
    "Stocks fell sharply as investors worried about rising interest rates and weak earnings.",
    "The team won the championship game in overtime.",
    "NASA launches a new probe to study the outer planets.",
]

# Small settings so the whole file stays fast on a loaded CPU.
SMALL = {
    "random": {},
    "all_attention": {},
    "last_attention": {},
    "vanilla_gradient": {},
    "input_x_gradient": {},
    "integrated_gradients": {"n_steps": 8},
    "deeplift": {},
    "lime": {"num_samples": 60},
    "occlusion": {},
    "captum_lime": {"n_samples": 10, "perturbations_per_eval": 10},
}
#: methods that need a prompted LLM, tested in tests/test_prompted.py
PROMPTED_ONLY = {"self_explain"}


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(MODEL_CFG)


@pytest.fixture(scope="module")
def model():
    return build_model(MODEL_CFG, LABELS, attn_implementation="eager", seed=3).eval()


@pytest.fixture(scope="module")
def segs(tok):
    return [segment(t, tok, 64) for t in TEXTS]


def _targets(n: int) -> list[int]:
    return [i % len(LABELS) for i in range(n)]


def test_registry_covers_every_method_and_config() -> None:
    from saleval import paths

    options = {p.stem for p in (paths.conf_dir() / "method").glob("*.yaml")}
    assert set(SMALL) | PROMPTED_ONLY == set(REGISTRY) == options


def test_self_explain_on_a_fine_tuned_classifier_is_one_line(model, tok, segs) -> None:
    with pytest.raises(AttributionError, match=r"^self_explain asks .* needs a prompted LLM"):
        attribute_words(model, tok, segs, _targets(len(segs)), {"kind": "self_explain"})


def test_what_a_method_is_is_declared_where_it_registers() -> None:
    # kept on the class, as Captum keeps a method's name on its class
    assert IntegratedGradientsMethod.display_name == "Integrated Gradients"
    assert IntegratedGradientsMethod.published_name == "Integrated_Gradient"
    assert (
        IntegratedGradientsMethod.paper_order == paper_methods().index("integrated_gradients") + 1
    )
    # read back in the paper's order: the published study had every method but occlusion
    published = [m for m in paper_methods() if m != "occlusion"]
    assert list(published_names().values()) == published
    # and read by the tables: row order, the names shown
    assert order_methods(["random", "captum_lime", "deeplift", "all_attention"]) == [
        "all_attention",
        "deeplift",
        "captum_lime",
        "random",
    ]
    assert display_name("deeplift") == "DeepLIFT" and display_name("captum_lime") == "captum_lime"
    # a clash is refused where it is made, and registers nothing
    with pytest.raises(ValueError, match="published name 'LIME' is lime's"):
        register("my_lime", published="LIME")(type("MyLime", (Lime,), {}))
    with pytest.raises(ValueError, match="paper_order 1 is all_attention's"):
        register("my_lime", paper_order=1)(type("MyLime", (Lime,), {}))
    assert "my_lime" not in REGISTRY
    # a method of one's own says what it is the same way
    try:
        register("my_lime", display="My LIME", paper_order=10)(type("MyLime", (Lime,), {}))
        assert display_name("my_lime") == "My LIME" and Lime.display_name == "LIME"
        assert order_methods(["my_lime", "zeta", "lime", "random"]) == [
            "lime",
            "my_lime",
            "zeta",
            "random",
        ]
    finally:
        REGISTRY.pop("my_lime")


def test_what_the_source_declares_is_what_the_classes_say(tmp_path: Path) -> None:
    """The catalog reads each built-in method's ``@register`` from the source (a stage
    that names methods loads none of them); it says what the loaded classes say, and a
    declaration it cannot read without running the module is refused, naming the line."""
    from saleval.attribution import catalog

    loaded = {name: catalog.info_of(cls) for name, cls in REGISTRY.items()}
    assert catalog.builtin_methods() == {n: loaded[n] for n in catalog.builtin_methods()}
    assert set(catalog.builtin_methods()) == set(SMALL) | PROMPTED_ONLY
    module = tmp_path / "mine.py"
    module.write_text('ROW = 3\n\n@register("mine", paper_order=ROW)\nclass Mine: ...\n')
    with pytest.raises(ValueError, match=rf"{module}:3: @register's arguments must be literals"):
        catalog.registrations(module, "mine")


# --- every method --------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_every_method_one_finite_score_per_kept_word(kind, model, tok, segs) -> None:
    scores = attribute_words(model, tok, segs, _targets(len(segs)), {"kind": kind, **SMALL[kind]})
    assert [len(s) for s in scores] == [s.n_words for s in segs]
    assert segs[4].n_words == 0
    for s in scores:
        assert s.dtype == np.float64 and np.isfinite(s).all()
    # not constant: the method looks at the input
    assert np.ptp(np.concatenate(scores)) > 0


@pytest.mark.parametrize("kind", sorted(SMALL))
def test_batch_of_one_equals_batch_of_sixteen(kind, model, tok) -> None:
    """Padding (a batch of mixed lengths) must not change any sample's scores."""
    texts = (TEXTS * 2)[:16]
    segs = [segment(t, tok, 64) for t in texts]
    targets = _targets(16)
    batched = build_method({"kind": kind, **SMALL[kind], "batch_size": 16})
    single = build_method({"kind": kind, **SMALL[kind], "batch_size": 1})
    a = batched.attribute(model, tok, segs, targets)
    b = single.attribute(model, tok, segs, targets)
    scale = max(float(np.abs(np.concatenate(a)).max()), 1e-12)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=1e-3, atol=1e-4 * scale)


# --- gradients ----------------------------------------------------------------------


def _independent_baseline(model, tok, batch: Batch, kind: str) -> torch.Tensor:
    """The baseline built by hand: non-special tokens → zero vector or the id's embedding."""
    emb = model.bert.embeddings
    with torch.no_grad():
        x = emb(input_ids=batch.input_ids, token_type_ids=torch.zeros_like(batch.input_ids))
        if kind == "zero":
            base = torch.zeros_like(x)
        else:
            token = {"pad": tok.pad_token_id, "mask": tok.mask_token_id, "unk": tok.unk_token_id}
            ids = batch.input_ids.clone()
            ids[~batch.keep_own] = token[kind]
            base = emb(input_ids=ids, token_type_ids=torch.zeros_like(ids))
    keep = batch.keep_own.unsqueeze(-1)
    return torch.where(keep, x, base)


@pytest.mark.parametrize(
    ("baseline", "output"),
    [
        ("zero", "logits"),
        ("pad", "logits"),
        ("mask", "logits"),
        ("unk", "logits"),
        ("zero", "probs"),
    ],
)
def test_ig_completeness(baseline, output, model, tok, segs) -> None:
    """Σ attributions = f(x) − f(baseline) within the reported convergence delta."""
    texts = Texts(model, tok, segs[:4], [0, 1, 2, 3])
    batch, targets = texts.padded, texts.target_ids
    ig = IntegratedGradientsMethod(baseline=baseline, n_steps=32, output=output)
    with torch.enable_grad():
        attr = ig.token_scores(texts).detach()
    fwd = EmbeddingForward(model, tok, "embeddings", output)
    args = (batch.input_ids, batch.attention_mask)
    with torch.no_grad():
        x = model.bert.embeddings(input_ids=batch.input_ids)
        fx = fwd(x, *args)[torch.arange(4), targets]
        fb = fwd(_independent_baseline(model, tok, batch, baseline), *args)[
            torch.arange(4), targets
        ]
    total = (attr * batch.attention_mask).sum(1)
    gap = (fx - fb).abs()
    assert gap.min() > 1e-4, "baseline output equals the input's: the test would be vacuous"
    np.testing.assert_allclose(
        total.numpy(), (fx - fb).numpy(), rtol=2e-2, atol=1e-4 * float(gap.max())
    )
    delta = np.asarray(ig.diagnostics["convergence_delta"])
    assert delta.shape == (4,)
    np.testing.assert_allclose(
        delta, (total - (fx - fb)).numpy(), atol=1e-5 + 1e-3 * float(gap.max())
    )
    # special tokens keep their own embedding in the baseline → exactly zero attribution
    assert torch.all(attr[batch.keep_own & batch.attention_mask.bool()] == 0)


@pytest.mark.parametrize("kind", ["integrated_gradients", "deeplift"])
def test_zero_all_baseline_is_captums_default_on_one_unpadded_text(kind, model, tok, segs) -> None:
    """``zero_all`` = Captum called on the embeddings with no baseline, one text at a time.

    That is what the original crowd study's code did (Lu et al. 2024): zero at every
    position, [CLS] and [SEP] included. Our batched run (padding) must give the same
    token scores, and unlike ``zero`` the special tokens get attribution.
    """
    from captum.attr import DeepLift, IntegratedGradients

    from saleval.attribution.gradient import DeepLiftMethod

    settings = {"n_steps": 16} if kind == "integrated_gradients" else {}
    cls = IntegratedGradientsMethod if kind == "integrated_gradients" else DeepLiftMethod
    texts = Texts(model, tok, segs[:4], [0, 1, 2, 3])
    batch, targets = texts.padded, texts.target_ids
    ours = cls(baseline="zero_all", **settings)
    with torch.enable_grad():
        attr = ours.token_scores(texts).detach()
    fwd = EmbeddingForward(model, tok, "embeddings", "logits")
    for i in range(4):
        n = int(batch.attention_mask[i].sum())
        args = tuple(t[i : i + 1, :n] for t in (batch.input_ids, batch.attention_mask))
        with torch.no_grad():
            x = model.bert.embeddings(input_ids=args[0])
        x.requires_grad_()
        if kind == "integrated_gradients":
            ref = IntegratedGradients(fwd).attribute(
                x,
                additional_forward_args=args,
                target=int(targets[i]),
                n_steps=16,
                method="gausslegendre",
            )
        else:
            ref = DeepLift(fwd).attribute(x, additional_forward_args=args, target=int(targets[i]))
        ref_tok = ref.detach().sum(-1)[0]
        np.testing.assert_allclose(attr[i, :n].numpy(), ref_tok.numpy(), rtol=1e-4, atol=1e-6)
        assert float(attr[i, 0].abs()) > 0, "[CLS] is zeroed in the baseline: it gets a score"
    assert torch.all(attr[batch.attention_mask == 0] == 0)


@pytest.mark.parametrize("layer", ["embeddings", "word_embeddings"])
def test_input_x_gradient_is_one_step_ig_from_zero(layer, model, tok, segs) -> None:
    targets = _targets(len(segs))
    ixg = attribute_words(model, tok, segs, targets, {"kind": "input_x_gradient", "layer": layer})
    one_step = {"n_steps": 1, "method": "riemann_right", "baseline": "zero", "layer": layer}
    ig1 = attribute_words(model, tok, segs, targets, {"kind": "integrated_gradients", **one_step})
    scale = float(np.abs(np.concatenate(ixg)).max())
    for a, b in zip(ixg, ig1):  # float32 round-off differs with batch padding
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * scale)
    # and not a trivial identity: more steps give something else
    ig8 = attribute_words(
        model, tok, segs, targets, {"kind": "integrated_gradients", "n_steps": 8, "layer": layer}
    )
    assert not np.allclose(np.concatenate(ixg), np.concatenate(ig8), rtol=1e-3)


def test_vanilla_gradient_reductions(model, tok, segs) -> None:
    targets = _targets(len(segs))
    run = {
        r: np.concatenate(
            attribute_words(
                model,
                tok,
                segs,
                targets,
                {"kind": "vanilla_gradient", "reduction": r, "word_reduce": "first"},
            )
        )
        for r in ("l1", "l2", "mean", "sum")
    }
    assert (run["l1"] >= run["l2"] - 1e-9).all() and (run["l2"] >= 0).all()
    np.testing.assert_allclose(
        run["mean"] * MODEL_CFG["config"]["hidden_size"], run["sum"], rtol=1e-5
    )
    assert np.abs(run["sum"]).max() <= run["l1"].max() + 1e-9


# --- attention ----------------------------------------------------------------------


@pytest.mark.parametrize("query", ["all", "cls"])
def test_attention_axes_by_hand(query, model, tok, segs) -> None:
    seg = segs[0]
    ids = torch.tensor([seg.input_ids])
    with torch.no_grad():
        atts = model(input_ids=ids, output_attentions=True).attentions  # L × (1, H, Q, K)
    a = np.stack([x[0].numpy() for x in atts])  # (L, H, Q, K)
    L_, H, Q, K = a.shape
    expected_all = np.zeros(K)
    expected_last = np.zeros(K)
    for k in range(K):
        rows = range(Q) if query == "all" else [0]
        expected_all[k] = np.mean(
            [a[layer, h, q, k] for layer in range(L_) for h in range(H) for q in rows]
        )
        expected_last[k] = np.mean([a[L_ - 1, h, q, k] for h in range(H) for q in rows])
    for kind, expected in (("all_attention", expected_all), ("last_attention", expected_last)):
        got = attribute_words(model, tok, [seg], [0], {"kind": kind, "query": query})[0]
        np.testing.assert_allclose(got, token_to_word_scores(expected, seg), rtol=1e-5)
        summed = attribute_words(
            model, tok, [seg], [0], {"kind": kind, "query": query, "aggregate": "sum"}
        )[0]
        n = (L_ if kind == "all_attention" else 1) * H * (Q if query == "all" else 1)
        np.testing.assert_allclose(summed, got * n, rtol=1e-5)
    if query == "all":  # every query row sums to 1 → mean over keys of the token scores
        np.testing.assert_allclose(expected_all.sum(), 1.0, rtol=1e-5)


def test_attention_switches_an_sdpa_model_to_eager_and_back(tok, segs) -> None:
    sdpa = build_model(MODEL_CFG, LABELS, attn_implementation="sdpa", seed=3).eval()
    eager = build_model(MODEL_CFG, LABELS, attn_implementation="eager", seed=3).eval()
    a = attribute_words(sdpa, tok, segs[:2], [0, 1], "all_attention")
    b = attribute_words(eager, tok, segs[:2], [0, 1], "all_attention")
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=1e-5)
    assert sdpa.config._attn_implementation == "sdpa"


# --- seeded methods -----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["random", "lime", "captum_lime"])
def test_seeded_methods_reproduce_in_any_batch(kind, model, tok, segs) -> None:
    cfg = {"kind": kind, **SMALL[kind], "seed": 7}
    targets = _targets(len(segs))
    first = attribute_words(model, tok, segs, targets, cfg)
    # same sample alone, in reversed order and in another batch: same draws
    alone = attribute_words(model, tok, [segs[3]], [targets[3]], cfg)[0]
    rev = attribute_words(model, tok, segs[::-1], targets[::-1], cfg)[::-1]
    # other batches hold other sequences beside each one: float noise (~1e-8 here), where
    # other draws would move scores by ~1e-2
    np.testing.assert_allclose(first[3], alone, rtol=1e-6, atol=1e-7)
    for x, y in zip(first, rev):
        np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-7)
    other = attribute_words(model, tok, segs, targets, {**cfg, "seed": 8})
    assert not np.allclose(np.concatenate(first), np.concatenate(other))


def test_lime_neighbourhood_shape() -> None:
    data = lime_neighbourhood(6, 50, np.random.default_rng(0))
    assert data.shape == (50, 6) and data[0].all()
    assert (data[1:].sum(1) <= 5).all()  # every other row removes at least one word
    assert set(np.unique(data)) == {0.0, 1.0}


class _Planted(nn.Module):
    """Class 1 iff a given token is present: the ground truth LIME and occlusion must find."""

    def __init__(self, token_id: int) -> None:
        super().__init__()
        self.token_id = token_id
        self.dummy = nn.Parameter(torch.zeros(1))
        self.config = SimpleNamespace(num_labels=2)

    def forward(self, input_ids, attention_mask=None, **_):
        present = ((input_ids == self.token_id) & attention_mask.bool()).any(1).float()
        logits = torch.stack([torch.zeros_like(present), 6 * present - 3], 1)
        return SimpleNamespace(logits=logits)


@pytest.mark.parametrize("removal", ["delete", "unk", "mask"])
def test_lime_and_occlusion_find_a_planted_word(removal, tok) -> None:
    text = "the quick brown fox jumps over the lazy dog near the river bank"
    seg = segment(text, tok, 64)
    fox = tok.convert_tokens_to_ids("fox")
    model = _Planted(fox)
    for cfg in ({"kind": "lime", "num_samples": 300}, {"kind": "occlusion"}):
        scores = attribute_words(model, tok, [seg], [1], {**cfg, "removal": removal})[0]
        assert seg.words[int(rank_words(scores)[0])] == "fox", (cfg, scores)
    occ = attribute_words(model, tok, [seg], [1], {"kind": "occlusion", "removal": removal})[0]
    p = 1 / (1 + np.exp(-3))
    np.testing.assert_allclose(occ[seg.words.index("fox")], p - (1 - p), rtol=1e-5)
    assert np.abs(np.delete(occ, seg.words.index("fox"))).max() < 1e-6


# --- configs, errors ------------------------------------------------------------------


def test_method_configs_build_and_presets_compose() -> None:
    cfg = compose_config("explain")
    # the explain stage's default methods are the paper's, the baseline first
    assert list(cfg.method) == ["random", *(m for m in paper_methods() if m != "random")]
    for key, m in cfg.method.items():
        assert build_method(m, key).name == key
    lu = compose_config("explain", ["method=preset/lu2024"]).method
    assert lu.integrated_gradients.n_steps == 100 and lu.captum_lime.n_samples == 40
    # the study's code gave Captum no baseline: zero at [CLS]/[SEP] too
    assert lu.integrated_gradients.baseline == lu.deeplift.baseline == "zero_all"
    assert lu.all_attention.aggregate == "sum" and "occlusion" not in lu
    grid = compose_config("explain", ["method=preset/bastings2022"]).method
    assert len(grid) == 30 and {build_method(m, k).name for k, m in grid.items()} == set(grid)
    one = compose_config("explain", ["method=lime", "method.lime.removal=unk"]).method
    assert list(one) == ["lime"] and build_method(one.lime, "lime").removal == "unk"


def test_bad_settings_are_clear_errors(model, tok, segs) -> None:
    with pytest.raises(AttributionError, match="unknown method 'salience'"):
        build_method({"kind": "salience"})
    with pytest.raises(AttributionError, match="baseline must be one of"):
        build_method({"kind": "integrated_gradients", "baseline": "blur"})
    with pytest.raises(AttributionError, match="bad settings"):
        build_method({"kind": "lime", "n_steps": 3})
    with pytest.raises(AttributionError, match="target 9 outside"):
        attribute_words(model, tok, segs[:1], [9], "random")
    df = pd.DataFrame({"sample_id": ["a"], "text": ["hi there"], "label": [0]})
    with pytest.raises(AttributionError, match="share the name 'x'"):
        explain_frame(model, tok, df, {"a": {"kind": "random", "name": "x"}, "x": "random"})
    # one word per concept (saleval.vocab): Target and Removal, not the old spellings
    with pytest.raises(AttributionError, match=r"target must be one of \['gold', 'prediction'\]"):
        explain_frame(model, tok, df, {"r": "random"}, target="predicted")
    with pytest.raises(
        AttributionError, match=r"removal must be one of \['delete', 'mask', 'unk'\]"
    ):
        build_method({"kind": "occlusion", "removal": "erase"})


# --- table level, views, stage ------------------------------------------------------------


def test_explain_frame_tables(model, tok) -> None:
    df = pd.DataFrame(
        {
            "sample_id": [f"s{i}" for i in range(len(TEXTS))],
            "text": TEXTS,
            "label": _targets(len(TEXTS)),
        }
    )
    timings: dict = {}
    diag: dict = {}
    attr, pred = explain_frame(
        model,
        tok,
        df,
        {"random": "random", "ig": {"kind": "integrated_gradients", "n_steps": 4}},
        target="gold",
        max_length=64,
        timings=timings,
        diagnostics=diag,
    )
    tables.ATTRIBUTIONS.validate(attr)
    tables.PREDICTIONS.validate(pred)
    assert PROBS.of(pred.columns) == PROBS.columns(LABELS)  # in class-index order
    np.testing.assert_allclose(pred[PROBS.columns(LABELS)].sum(1), 1.0, rtol=1e-5)
    assert set(timings) == {"random", "ig"} and timings["ig"]["examples_per_s"] > 0
    assert len(diag["ig"]["convergence_delta"]) == len(TEXTS)
    row = attr[(attr.sample_id == "s3") & (attr.method == "ig")].sort_values("word_index")
    assert row["word"].tolist() == segment(TEXTS[3], tok, 64).words
    for w, s, e in row[["word", "char_start", "char_end"]].itertuples(index=False):
        assert TEXTS[3][s:e] == w
    first = attr.groupby("sample_id")["target"].first()
    assert (first == df.set_index("sample_id")["label"].loc[first.index]).all()


def test_a_one_process_trainer_runs_the_job_here_and_several_go_to_lightning(
    model, tok, monkeypatch
) -> None:
    """A ``conf/trainer`` for one process gives the tables of ``trainer=None`` without a
    Trainer (saleval.modeling.devices.one_process); several devices, several nodes or a
    launcher's ranks go through Lightning's predict loop (saleval.attribution.distributed)."""
    from saleval.attribution import distributed
    from saleval.modeling.devices import one_process

    df = pd.DataFrame({"sample_id": ["a", "b", "c"], "text": TEXTS[:3]})
    methods = {"random": "random", "vg": "vanilla_gradient"}
    sent: list[object] = []

    def predict(trainer: object, model: object, job: object) -> dict:
        sent.append(trainer)
        raise RuntimeError("sent to Lightning")

    monkeypatch.setattr(distributed, "predict", predict)
    for var in ("WORLD_SIZE", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    alone = explain_frame(model, tok, df, methods, trainer=None, max_length=64)
    for one in ({"accelerator": "cpu"}, {"accelerator": "cpu", "devices": 1, "strategy": "ddp"}):
        assert one_process(one)
        here = explain_frame(model, tok, df, methods, trainer=one, max_length=64)
        for got, want in zip(here, alone):
            pd.testing.assert_frame_equal(got, want)
    assert sent == []
    several = [{"accelerator": "cpu", "devices": 2}, {"accelerator": "cpu", "num_nodes": 2}]
    for cfg in several:
        with pytest.raises(RuntimeError, match="sent to Lightning"):
            explain_frame(model, tok, df, methods, trainer=cfg, max_length=64)
    for var in ("WORLD_SIZE", "SLURM_NTASKS"):  # ranks started by torchrun / srun
        with monkeypatch.context() as m:
            m.setenv(var, "2")
            assert not one_process({"accelerator": "cpu"})
            with pytest.raises(RuntimeError, match="sent to Lightning"):
                explain_frame(model, tok, df, methods, trainer={"accelerator": "cpu"})
    assert sent == [*several, {"accelerator": "cpu"}, {"accelerator": "cpu"}]


def test_overlap_matrix_by_hand() -> None:
    rows = []
    # sample a: m1 ranks w0 > w1 > w2, m2 ranks w2 > w1 > w0; sample b: both rank w0 > w1
    for m, sc in (("m1", [3, 2, 1]), ("m2", [1, 2, 3])):
        rows += [("a", m, i, s) for i, s in enumerate(sc)]
    for m in ("m1", "m2"):
        rows += [("b", m, 0, 5.0), ("b", m, 1, 4.0), ("b", m, 2, 0.0)]
    df = pd.DataFrame(rows, columns=["sample_id", "method", "word_index", "score"])
    mat = overlap_matrix(df, k=2)
    # a: {0,1} ∩ {2,1} = 1 of 2 → 50 %; b: 100 %; mean 75 %
    assert mat.loc["m1", "m2"] == pytest.approx(75.0)
    assert mat.loc["m1", "m1"] == pytest.approx(100.0)
    # K larger than the texts: the denominator stays K (docs/scores.md#overlap)
    assert overlap_matrix(df, k=4).loc["m1", "m1"] == pytest.approx(75.0)


def test_highlight_html_escapes_text() -> None:
    text = "<script>alert(1)</script> & good news"
    good, news = text.index("good"), text.index("news")
    pred = pd.DataFrame({"sample_id": ["x<1>"], "text": [text], "label": [0], "pred": [1]})
    attr = pd.DataFrame(
        {
            "sample_id": ["x<1>"] * 3,
            "method": ["m&m"] * 3,
            "word_index": [0, 1, 2],
            "char_start": [0, good, news],
            "char_end": [25, good + 4, news + 4],
            "score": [1.0, 3.0, 2.0],
        }
    )
    page = highlight_html(pred, attr, ["x<1>"], k=2, label_names=["neg", "pos"])
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "m&amp;m" in page and "x&lt;1&gt;" in page
    assert 'title="rank 1">good</mark>' in page and 'title="rank 2">news</mark>' in page


@pytest.mark.slow
def test_explain_stage_end_to_end(tiny_train_run: Path, make_cfg) -> None:
    from saleval.stages import explain

    cfg = make_cfg(
        "explain",
        [
            # no dataset=: the train run's (with its 64-text test split) is adopted
            f"inputs.model={tiny_train_run}",
            "data.n_samples=8",
            "method=[random,all_attention,integrated_gradients,lime,occlusion]",
            "method.integrated_gradients.n_steps=4",
            "method.lime.num_samples=20",
            "method.lime.name=lime_20",
            "trainer=cpu",
            "progress=false",
            "view.overlap_k=5",
        ],
    )
    out = explain.run(cfg)
    run_dir = Path(out["run_dir"])
    pred = tables.PREDICTIONS.read(run_dir)
    attr = tables.ATTRIBUTIONS.read(run_dir)
    assert len(pred) == 8 and pred["label"].value_counts().tolist() == [2, 2, 2, 2]
    assert set(attr["method"]) == {
        "random",
        "all_attention",
        "integrated_gradients",
        "lime_20",
        "occlusion",
    }
    per = attr.groupby(["sample_id", "method"]).size().unstack()
    assert (per.sub(pred.set_index("sample_id")["n_words"], axis=0) == 0).all().all()
    for f in ("highlights.html", "overlap.csv", "overlap.png"):
        assert (run_dir / "views" / f).is_file()
    overlap = pd.read_csv(run_dir / "views" / "overlap.csv", index_col=0)
    assert overlap.shape == (5, 5)
    run = MlflowClient().get_run(json.loads((run_dir / "run.json").read_text())["run_id"])
    assert run.data.tags["stage"] == "explain" and run.data.tags["model"] == "tiny"
    prov = json.loads((run_dir / "run.json").read_text())["provenance"]
    assert (prov["dataset"], prov["model"], prov["max_length"]) == ("ag_news", "tiny", 64)
    assert run.data.params["dataset.max_test"] == "64"  # adopted with the train run's node
    assert (
        run.data.params["methods"] == "random,all_attention,integrated_gradients,lime_20,occlusion"
    )
    assert run.info.run_name == "explain · ag_news · tiny · 5 methods"
    rows = method_rows(run.info.run_id).set_index("method")  # one child run per method
    assert sorted(rows.index) == sorted(set(attr["method"]))
    assert rows["examples_per_second"].gt(0).all() and rows["seconds"].gt(0).all()
    assert rows["convergence_delta_abs_mean"].notna().sum() == 1  # integrated_gradients
    assert "trainer.optimizer.lr" not in run.data.params  # a predict loop: not trained here
    assert run.data.params["trainer.accelerator"]
    (explained,) = run.inputs.dataset_inputs
    assert explained.dataset.name == "ag_news/test" and explained.dataset.profile
    assert not [k for k in run.data.params if k.startswith("method.")]  # on the children:
    lime = MlflowClient().get_run(rows.loc["lime_20", "run_id"]).data.params
    assert lime["method.num_samples"] == "20" and lime["method"] == "lime_20"
    arts = {a.path for a in MlflowClient().list_artifacts(run.info.run_id)}
    assert {"attributions.parquet", "predictions.parquet", "views"} <= arts


# ---------------------------------------------------------------------------------
# bf16: true | false | auto (auto = bf16 only where the hardware computes it natively)
# ---------------------------------------------------------------------------------


def test_bf16_option_parses_and_names_bad_values() -> None:
    from saleval.metrics.config import MetricsConfig
    from saleval.modeling.inference import parse_bf16

    assert [parse_bf16(v) for v in (True, False, None, "auto", "AUTO", "true", "false")] == [
        True, False, False, "auto", "auto", True, False,
    ]  # fmt: skip
    with pytest.raises(ValueError, match="metrics.inference.bf16 must be true, false or auto"):
        MetricsConfig.from_config({"ks": [1], "inference": {"bf16": "fast"}})
    assert (
        MetricsConfig.from_config({"ks": [1], "inference": {"bf16": "auto"}}).inference.bf16
        == "auto"
    )
    with pytest.raises(ValueError, match="bf16 must be true, false or auto, got 1"):
        build_method({"bf16": 1}, "lime")


def test_bf16_auto_follows_the_hardware(model, tok, segs, monkeypatch) -> None:
    """`auto` gives exactly the fp32 scores where bf16 is not native and the bf16 scores
    where it is; a forced `true` on emulated hardware warns once."""
    from saleval.modeling import inference

    monkeypatch.setattr(inference, "_warned_emulated", False)
    cpu = torch.device("cpu")
    native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert inference.bf16_native(cpu) is native
    targets = _targets(len(segs))
    scores = {
        mode: build_method({**SMALL["occlusion"], "bf16": mode}, "occlusion")
        for mode in (False, True, "auto")
    }
    with pytest.warns(UserWarning) if not native else contextlib.nullcontext():
        out = {mode: m.attribute(model, tok, segs, targets) for mode, m in scores.items()}
    same = out[True] if native else out[False]
    for a, b in zip(out["auto"], same):
        np.testing.assert_array_equal(a, b)
    assert scores["auto"].diagnostics["bf16"][0] == float(native)
    # where bf16 is native, `auto` autocasts: pretend so on this CPU
    monkeypatch.setattr(inference, "bf16_native", lambda device: True)
    assert inference.use_bf16(cpu, "auto") is True
    monkeypatch.setattr(inference, "bf16_native", lambda device: False)
    assert inference.use_bf16(cpu, "auto") is False
    assert inference.use_bf16(cpu, False) is False


# --- work not done: the last block at the first token only; texts batched by padding ------


def test_the_last_block_at_the_first_token_changes_no_logit_or_gradient(model, tok, segs) -> None:
    """The classifier reads the last block at [CLS] alone, so computing only that row
    gives the same logits and the same input gradients (every gradient method, IG and
    the perturbation methods) as the whole model, to float noise."""
    from saleval.modeling import first_token, inference

    with first_token.last_block_at_first_token(model) as on:
        assert on  # else nothing is tested
    layers = model.bert.encoder.layer
    last = layers[-1]
    seqs = [s.input_ids for s in segs]
    targets = _targets(len(segs))
    kinds = ("vanilla_gradient", "input_x_gradient", "integrated_gradients", "occlusion")
    fast = (inference.forward_logits(model, seqs),
            [attribute_words(model, tok, segs, targets, {"kind": k, **SMALL[k]}) for k in kinds])  # fmt: skip
    assert layers[-1] is last  # restored after every pass
    with first_token.whole_model():
        full = (inference.forward_logits(model, seqs),
                [attribute_words(model, tok, segs, targets, {"kind": k, **SMALL[k]}) for k in kinds])  # fmt: skip
    np.testing.assert_allclose(fast[0], full[0], rtol=1e-5, atol=1e-6)
    for kind, a, b in zip(kinds, fast[1], full[1]):
        for x, y in zip(a, b):
            scale = max(float(np.abs(y).max(initial=0)), 1e-12)
            assert np.abs(x - y).max(initial=0) <= 1e-4 * scale, kind


def test_the_first_token_block_is_a_no_op_where_it_would_not_be_exact(model) -> None:
    """Training mode (dropout), the switch off, an active wrapper (nested: wrapped once),
    and a block laid out as BERT's that computes something else (caught by the probe on
    the model itself, not by its class) all run the whole block."""
    from saleval.modeling import first_token

    model.train()
    try:
        with first_token.last_block_at_first_token(model) as on:
            assert not on  # dropout: training mode
    finally:
        model.eval()
    with first_token.whole_model(), first_token.last_block_at_first_token(model) as on:
        assert not on
    with first_token.last_block_at_first_token(model) as on:
        inner = model.bert.encoder.layer[-1]
        assert on and isinstance(inner, first_token.FirstRowBlock)
        with first_token.last_block_at_first_token(model) as again:
            assert not again and model.bert.encoder.layer[-1] is inner
    assert type(model.bert.encoder.layer[-1]).__name__ == "BertLayer"
    # a block with BERT's attribute names whose forward does more (here: scales its input),
    # which the one-row path, computing from the block's parts, would skip
    other = build_model(MODEL_CFG, LABELS).eval()
    last = other.bert.encoder.layer[-1]
    plain = type(last).forward  # the class is shared: this instance only is patched
    last.forward = lambda h, *a, **k: plain(last, 2 * h, *a, **k)  # type: ignore[method-assign]
    assert first_token.bert_layout(last)
    with first_token.last_block_at_first_token(other) as on:
        assert not on


@pytest.mark.parametrize("kind", ["vanilla_gradient", "integrated_gradients", "deeplift"])
def test_scores_do_not_depend_on_how_texts_are_batched(kind, model, tok, segs) -> None:
    """max_padding only regroups texts: one text at a time, padding-bounded groups and
    count-only batches give the same scores to float noise."""
    targets = _targets(len(segs))
    runs = [
        attribute_words(model, tok, segs, targets, {"kind": kind, **SMALL[kind], "max_padding": p})
        for p in (0.0, 0.25, 1.0)
    ]
    for other in runs[1:]:
        for x, y in zip(runs[0], other):
            scale = max(float(np.abs(x).max(initial=0)), 1e-12)
            assert np.abs(x - y).max(initial=0) <= 1e-4 * scale


# --- opt-in cheaper settings: IG steps by completeness, LIME samples by stability ------


def _close(a: list[np.ndarray], b: list[np.ndarray], rel: float = 1e-4) -> bool:
    scale = max(max(float(np.abs(x).max(initial=0)) for x in a), 1e-12)
    return all(np.abs(x - y).max(initial=0) <= rel * scale for x, y in zip(a, b))


def test_ig_steps_chosen_by_completeness(model, tok, segs) -> None:
    targets = _targets(len(segs))
    n = sum(s.n_words > 0 for s in segs)  # texts without words still run IG on their tokens
    base = {"kind": "integrated_gradients", "n_steps": 32, "min_steps": 4}

    def run(**kw: object) -> tuple[list[np.ndarray], dict[str, list[float]]]:
        m = build_method({**base, **kw})
        return m.attribute(model, tok, segs, targets), m.diagnostics

    fixed4, _ = run(n_steps=4)
    fixed32, _ = run()
    loose, d = run(convergence_tolerance=1e9)  # every text meets it at once: 4 steps
    assert set(d["n_steps"]) == {4.0} and _close(loose, fixed4)
    strict, d = run(convergence_tolerance=1e-12)  # none ever does: 4, 8, 16, 32 = n_steps
    assert set(d["n_steps"]) == {32.0} and set(d["ig_steps_run"]) == {4.0 + 8 + 16 + 32}
    assert _close(strict, fixed32)
    _, d = run(convergence_tolerance=0.05)
    assert len(d["n_steps"]) == len(segs) >= n
    for steps, tried in zip(d["n_steps"], d["ig_steps_run"]):
        assert steps in (4.0, 8.0, 16.0, 32.0)
        assert tried == sum(s for s in (4.0, 8.0, 16.0, 32.0) if s <= steps)  # doubling


def test_lime_samples_until_its_top_k_is_stable(model, tok, segs) -> None:
    targets = _targets(len(segs))
    fixed = build_method({"kind": "lime", "num_samples": 60, "seed": 3})
    want = fixed.attribute(model, tok, segs, targets)
    never = build_method({"kind": "lime", "num_samples": 60, "seed": 3, "stable_top_k": 3,
                          "sample_step": 20, "stable_rounds": 99})  # fmt: skip
    got = never.attribute(model, tok, segs, targets)
    assert set(never.diagnostics["num_samples"]) == {60.0}
    for x, y in zip(want, got):  # never settles: the fixed setting's explanation
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)
    eager = build_method({"kind": "lime", "num_samples": 400, "seed": 3, "stable_top_k": 1,
                          "sample_step": 20, "stable_rounds": 1})  # fmt: skip
    eager.attribute(model, tok, segs, targets)
    used = eager.diagnostics["num_samples"]
    assert min(used) >= 40 and max(used) <= 400 and min(used) < 400
    assert all(u % 20 == 0 for u in used)


def test_one_device_rule_for_every_accelerator_setting(monkeypatch) -> None:
    """One rule from an accelerator setting to a device (saleval.modeling.devices): `auto`
    (or nothing) the GPU when there is one, `gpu`/`cuda` the GPU or one line naming the
    setting and its fix, never the CPU unasked; an unknown name is refused the same way."""
    from saleval.modeling.devices import DeviceError, device_for

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert [device_for(a).type for a in ("cpu", "auto", "AUTO", None, "")] == ["cpu"] * 5
    for accel in ("gpu", "cuda", "GPU"):
        with pytest.raises(DeviceError) as err:
            device_for(accel)
        message = str(err.value)
        assert message.startswith(f"trainer.accelerator={accel}, but torch sees no GPU")
        assert "set trainer.accelerator=cpu or trainer.accelerator=auto" in message
        assert "\n" not in message
    with pytest.raises(
        DeviceError, match=r"^metrics.inference.accelerator=gpu, but .* set metrics"
    ):
        device_for("gpu", "metrics.inference.accelerator")
    with pytest.raises(DeviceError, match=r"trainer.accelerator=tpu: saleval places models on"):
        device_for("tpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert [device_for(a).type for a in ("gpu", "cuda", "auto", None, "cpu")] == [
        "cuda", "cuda", "cuda", "cuda", "cpu",
    ]  # fmt: skip


def test_training_and_attribution_refuse_a_missing_gpu_by_the_same_rule(monkeypatch) -> None:
    """Training (before Lightning builds its Trainer) and the attribution Trainer ask
    device_for, so `gpu` without one is the same one line there as in the metrics stage
    (test_faithfulness), not Lightning's traceback and not a CUDA device that is not there."""
    from saleval.attribution.distributed import make_trainer
    from saleval.modeling import training
    from saleval.modeling.devices import DeviceError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    expected = r"^trainer.accelerator=gpu, but torch sees no GPU"
    with pytest.raises(DeviceError, match=expected):
        make_trainer({"accelerator": "gpu", "devices": 1})
    with pytest.raises(DeviceError, match=expected):  # fails before it reads model or data
        training.fit(None, None, {"accelerator": "gpu"}, Path("unused"))  # type: ignore[arg-type]
    cpu = torch.device("cpu")
    assert training.resolve_precision("auto", cpu) in ("bf16-mixed", "32-true")
