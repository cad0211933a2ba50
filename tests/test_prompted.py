"""A causal LM prompted to classify (docs/data-and-models.md#prompted-llms).

Tiny random ``LlamaForCausalLM``, ``Qwen2ForCausalLM`` (with a chat template) and
``GPT2LMHeadModel`` (no pad token, as GPT-2 ships), with tokenizers trained here. Every
check compares saleval with the plain LM fed the recorded prompt: no saleval code on the
reference side.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from saleval.attribution import Texts, build_method
from saleval.attribution.gradient import EmbeddingForward
from saleval.config.model import ModelConfig, PromptConfig
from saleval.modeling import inference, prompted, prompts
from saleval.modeling.interface import classifier_reads
from saleval.modeling.models import load_trained
from saleval.pipeline import tables
from saleval.testing.prompted import CAUSAL_FAMILIES, build_causal_checkpoint
from saleval.words import segment, token_to_word_scores, word_spans

from .conftest import DATA_ROOT

TEXTS = [
    "a gorgeously strange and moving film .",
    "bad",
    "the plot is thin , but the acting is wonderful and the music soars",
    "it 's a charming , often hilarious ride",
    "dull , lifeless and far too long",
]
LABELS = ["negative", "positive"]
#: a template whose own words matter: removing any of them changes the logits
TEMPLATE = "Review: {text}\nIs this review positive or negative? Answer:"


@pytest.fixture(scope="session")
def causal_checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    corpus = pd.read_csv(DATA_ROOT / "sst2" / "train.tsv", sep="\t")["text"].head(2000).tolist()
    corpus += [TEMPLATE.replace("{text}", t) for t in corpus[:50]]
    root = tmp_path_factory.mktemp("causal")
    return {f: build_causal_checkpoint(f, root / f"tiny-{f}", corpus) for f in CAUSAL_FAMILIES}


def _train() -> pd.DataFrame:
    df = pd.read_csv(DATA_ROOT / "sst2" / "train.tsv", sep="\t").head(200)
    df["sample_id"] = [f"train-{i}" for i in range(len(df))]
    return df


def _node(ckpt: Path, **prompt: object) -> ModelConfig:
    settings = {"template": TEMPLATE, "instruction": "Classify the sentiment.", **prompt}
    return ModelConfig(
        _target_="saleval.modeling.models.PromptedSource",
        name="prompted",
        pretrained=str(ckpt),
        prompt=PromptConfig(**settings),  # type: ignore[arg-type]
    )


def _build(ckpt: Path, **prompt: object):
    return prompted.build(_node(ckpt, **prompt), str(ckpt), LABELS, _train())


def _plain_label_logprobs(lm, tok, prompt: str, add_special: bool, words) -> torch.Tensor:
    """Each class's score on the plain LM: tokenize the prompt, and for every label word
    sum the log-probabilities of its tokens after the prompt; logsumexp over a class's words."""
    ids = tok(prompt, add_special_tokens=add_special)["input_ids"]
    scores = []
    for cls_words in words:
        per = []
        for w in cls_words:
            full = torch.tensor([ids + w])
            with torch.no_grad():
                logp = torch.log_softmax(lm(input_ids=full).logits[0].float(), -1)
            per.append(sum(logp[len(ids) - 1 + j, t] for j, t in enumerate(w)))
        scores.append(torch.logsumexp(torch.stack(per), 0))
    return torch.stack(scores)


def word_spans_of(text: str) -> list[str]:
    return [text[s:e] for s, e in word_spans(text)]


# --- the logits are the label words' log-probabilities ---------------------------------


@pytest.mark.parametrize("family", CAUSAL_FAMILIES)
def test_explained_logits_equal_the_plain_label_word_log_probs(family, causal_checkpoints):
    """For every text of a padded batch, with and without the prefix cache, through every
    forward saleval runs (the gradient methods' over either layer, the batched forward of
    LIME, occlusion and the metrics, the attention methods' eager pass): the plain LM's
    label-word log-probabilities on the recorded prompt. One class has a multi-token word
    and two words."""
    model, tok, spec = _build(causal_checkpoints[family], shots=2,
                              label_words={"positive": [" positive", " wonderful film"]})  # fmt: skip
    assert any(len(w) > 1 for c in model.label_ids for w in c), "no multi-token label word"
    segs = [segment(t, tok, 64) for t in TEXTS]
    own = torch.stack([
        _plain_label_logprobs(model.lm, tok.base, tok.encode_text(t, 64).prompt,
                              spec.add_special_tokens, model.label_ids) for t in TEXTS
    ])  # fmt: skip
    texts = Texts(model, tok, segs, [0] * len(segs))
    batch = texts.padded
    assert batch.attention_mask.sum(1).tolist() != [batch.input_ids.shape[1]] * len(segs)
    for cache in (True, False):
        model.use_prefix_cache = cache
        hits = model.cache_hits
        with torch.no_grad():
            for layer in ("embeddings", "word_embeddings"):
                fwd = EmbeddingForward(model, tok, layer)
                x = fwd.embed(batch.input_ids, batch.attention_mask)
                got = fwd(x, batch.input_ids, batch.attention_mask)
                torch.testing.assert_close(got, own, atol=1e-5, rtol=1e-4)
            eager = model(**batch.inputs(), output_attentions=True)
        torch.testing.assert_close(eager.logits, own, atol=1e-5, rtol=1e-4)
        assert eager.attentions is not None
        batched = inference.forward_logits(model, [s.input_ids for s in segs], tokenizer=tok)
        np.testing.assert_allclose(batched, own.numpy(), atol=1e-5, rtol=1e-4)
        assert (model.cache_hits > hits) == cache
    assert classifier_reads(model, tok) == "last"


@pytest.mark.parametrize("family", CAUSAL_FAMILIES)
def test_the_recorded_prompt_tokenizes_to_the_ids_the_model_read(family, causal_checkpoints):
    _, tok, spec = _build(causal_checkpoints[family], shots=4)
    assert spec.chat == (family == "qwen2")
    assert len(spec.shots) == 4 and [s.label for s in spec.shots] == [0, 1, 0, 1]
    for text in TEXTS:
        enc = tok.encode_text(text, 64)
        ids = tok.base(enc.prompt, add_special_tokens=spec.add_special_tokens)["input_ids"]
        assert ids == enc.input_ids
        assert all(s.text in enc.prompt for s in spec.shots)


# --- gradients -------------------------------------------------------------------------


def _independent_gradient(model, tok, text: str, target: int) -> np.ndarray:
    """|∂ score / ∂ token embedding| per prompt token, on the plain LM fed
    ``inputs_embeds`` of the recorded prompt followed by the target's label word: the sum
    of the word's tokens' log-probabilities."""
    enc = tok.encode_text(text, 64)
    word = model.label_ids[target][0]
    table = model.lm.get_input_embeddings()
    x = table(torch.tensor([enc.input_ids])).detach().requires_grad_()
    rest = table(torch.tensor([word[:-1]], dtype=torch.long)).detach()
    logp = torch.log_softmax(model.lm(inputs_embeds=torch.cat([x, rest], 1)).logits[0].float(), -1)
    n = len(enc.input_ids)
    sum(logp[n - 1 + j, t] for j, t in enumerate(word)).backward()
    assert x.grad is not None
    return x.grad[0].abs().sum(-1).numpy()


@pytest.mark.parametrize("family", CAUSAL_FAMILIES)
def test_vanilla_gradient_equals_an_independent_gradient(family, causal_checkpoints):
    model, tok, _ = _build(causal_checkpoints[family], shots=2)
    segs = [segment(t, tok, 64) for t in TEXTS]
    targets = [i % 2 for i in range(len(segs))]
    ours = build_method({"kind": "vanilla_gradient"}).attribute(model, tok, segs, targets)
    for seg, t, text, got in zip(segs, targets, TEXTS, ours):
        ref = token_to_word_scores(_independent_gradient(model, tok, text, t), seg)
        assert ref.max() > 0
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6 * float(ref.max()))


@pytest.mark.parametrize("family", CAUSAL_FAMILIES)
def test_ig_is_complete_against_the_plain_model(family, causal_checkpoints) -> None:
    """Σ IG = f(prompt) − f(baseline prompt), on the plain LM: the baseline replaces the
    text's tokens only (the unknown/eos token's embedding), never the template's."""
    model, tok, _ = _build(causal_checkpoints[family], shots=2)
    ig = build_method({"kind": "integrated_gradients", "baseline": "pad", "n_steps": 128})
    for text, t in zip(TEXTS[:3], [1, 0, 1]):
        seg = segment(text, tok, 64)
        with torch.enable_grad():
            total = float(ig.token_scores(Texts(model, tok, [seg], [t])).detach().sum())
        ids = torch.tensor([seg.input_ids])
        special = torch.as_tensor(seg.special)[None, :]
        base_ids = torch.where(special, ids, torch.full_like(ids, tok.pad_token_id))
        table = model.lm.get_input_embeddings()
        word = model.label_ids[t][0]

        def score(prompt_ids, table=table, word=word):
            full = torch.cat(
                [table(prompt_ids), table(torch.tensor([word[:-1]], dtype=torch.long))], 1
            )
            logp = torch.log_softmax(model.lm(inputs_embeds=full).logits[0].float(), -1)
            n = prompt_ids.shape[1]
            return sum(logp[n - 1 + j, w] for j, w in enumerate(word))

        with torch.no_grad():
            f_x, f_b = score(ids), score(base_ids)
        gap = float(f_x - f_b)
        assert abs(gap) > 1e-3, "the baseline's output equals the input's: vacuous"
        assert total == pytest.approx(gap, rel=5e-2, abs=1e-3)


# --- only the text is explained --------------------------------------------------------


@pytest.mark.parametrize("family", CAUSAL_FAMILIES)
def test_the_template_is_never_perturbed_nor_scored(family, causal_checkpoints) -> None:
    """Removing a template word changes the logits (so the template matters), yet every
    input LIME, occlusion and the deletion metrics feed the model keeps the template
    tokens, in place, and every scored word is a word of the text."""
    from saleval.metrics.config import MetricsConfig
    from saleval.metrics.faithfulness import Explanation, evaluate

    model, tok, _ = _build(causal_checkpoints[family], shots=2)
    seg = segment(TEXTS[2], tok, 64)
    template = [i for i, sp in enumerate(seg.special) if sp]
    without = [t for i, t in enumerate(seg.input_ids) if i != template[len(template) // 2]]
    two = inference.forward_logits(model, [seg.input_ids, without], tokenizer=tok)
    assert np.abs(two[0] - two[1]).max() > 1e-4, "the template's words do not matter: vacuous"

    prefix = [seg.input_ids[i] for i in range(template.index(template[0]), len(seg.input_ids))
              if i in template and all(seg.special[: i + 1])]  # fmt: skip
    suffix_len = len(seg.input_ids) - 1 - max(i for i, s in enumerate(seg.special) if not s)
    suffix = seg.input_ids[len(seg.input_ids) - suffix_len :]
    seen: list[list[int]] = []

    def record(module, args, kwargs):
        ids, mask = kwargs.get("input_ids", args[0] if args else None), kwargs.get("attention_mask")
        for row, m in zip(ids.tolist(), mask.tolist()):
            seen.append(row[: sum(m)])

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        words_of_text = {seg.text[s:e] for s, e in word_spans(seg.text)}
        for kind in ("lime", "occlusion"):
            m = build_method(
                {"kind": kind, "num_samples": 64} if kind == "lime" else {"kind": kind}
            )
            scores = m.attribute(model, tok, [seg], [1])[0]
            assert len(scores) == seg.n_words and set(seg.words) <= words_of_text
        ex = Explanation("s", "m", seg, np.arange(seg.n_words, dtype=float))
        evaluate(model, tok, [ex], MetricsConfig.from_config({"ks": [1, 2]}), progress=False)
    finally:
        handle.remove()
    assert len(seen) > 50
    for row in seen:
        if len(row) < 8:  # the padding check's and the read probe's own short inputs
            continue
        assert row[: len(prefix)] == prefix and row[-len(suffix) :] == suffix


# --- the stages ------------------------------------------------------------------------


def test_train_explain_tasks_and_metrics_on_a_prompted_model(causal_checkpoints, make_cfg):
    """``saleval-train model=prompted`` records the prompt and the test accuracy, and the
    later stages load the classifier from that run; the predictions table holds each text's
    exact prompt, the explained words are the text's, and so are the crowd tasks' words."""
    from saleval.stages import explain, metrics, tasks, train

    ckpt = causal_checkpoints["qwen2"]
    common = ["dataset=sst2", "dataset.max_train=64", "dataset.max_validation=16",
              "dataset.max_test=24"]  # fmt: skip
    t = make_cfg("train", ["model=prompted", f"model.pretrained={ckpt}", "model.prompt.shots=2",
                           "tracking.log_model=false", *common], name="p-train")  # fmt: skip
    out = train.run(t)
    train_dir = Path(out["run_dir"])
    saved = json.loads((train_dir / "model" / prompts.PROMPT_FILE).read_text())
    assert len(saved["shots"]) == 2 and saved["chat"] is True
    assert 0.0 <= json.loads((train_dir / "metrics.json").read_text())["test_accuracy"] <= 1.0
    e = make_cfg("explain", [f"inputs.model={train_dir}", "data.n_samples=8", "progress=false",
                             "view.samples=2", "view.overlap_k=3"], name="p-explain")  # fmt: skip
    run_dir = Path(explain.run(e)["run_dir"])
    preds = tables.PREDICTIONS.read(run_dir)
    attrs = tables.ATTRIBUTIONS.read(run_dir)
    model, tok = load_trained(train_dir)
    for row in preds.itertuples():
        assert row.prompt == tok.encode_text(row.text, 256).prompt and row.special_tokens is False
        got = _plain_label_logprobs(model.lm, tok.base, row.prompt, False, model.label_ids)
        probs = torch.softmax(got, 0).numpy()
        np.testing.assert_allclose([row.prob_negative, row.prob_positive], probs, atol=1e-5)
        mine = attrs[attrs["sample_id"] == row.sample_id]
        words = {row.text[s:e] for s, e in word_spans(row.text)}
        assert set(mine["word"]) <= words and len(mine) > 0
    assert set(attrs["method"]) == set(e.method)
    k = make_cfg("tasks", [f"inputs.explain={run_dir}", "study=smoke", "kgrid=smoke"],
                 name="p-tasks")  # fmt: skip
    task_rows = tables.TASKS.read(Path(tasks.run(k)["run_dir"]))
    assert len(task_rows)
    template_words = {w for w in word_spans_of(tok.render("")) if w}
    for row in task_rows.itertuples():  # a worker sees the text's words, nothing else
        text = str(preds.set_index("sample_id").loc[row.sample_id, "text"])
        words = word_spans_of(text)
        shown = [w.lstrip(".") for w in str(row.display_text).split(" ") if w.strip(".")]
        assert row.n_words == len(words) and set(shown) <= set(words), (shown, words)
        assert len(shown) == row.n_words_shown
    assert template_words - {w for t in preds["text"] for w in word_spans_of(str(t))}
    m = make_cfg("metrics", [f"inputs.model={train_dir}", f"inputs.explain={run_dir}",
                             "kgrid=smoke", "progress=false"], name="p-metrics")  # fmt: skip
    got = tables.METRICS.read(Path(metrics.run(m)["run_dir"]))
    assert set(got["method"]) == set(e.method)


def test_explain_straight_from_the_lm_directory(causal_checkpoints, make_cfg) -> None:
    """The documented command: ``saleval-explain model=prompted model.pretrained=<dir>``."""
    from saleval.stages import explain, metrics

    ckpt = causal_checkpoints["llama"]
    e = make_cfg("explain", ["model=prompted", f"model.pretrained={ckpt}", "dataset=sst2",
                             "dataset.max_test=16", "data.n_samples=3", "progress=false",
                             "method=[integrated_gradients,occlusion]", "view.samples=1"],
                 name="p-direct")  # fmt: skip
    run_dir = Path(explain.run(e)["run_dir"])
    assert (run_dir / "model" / prompts.PROMPT_FILE).is_file()
    info = json.loads((run_dir / "run.json").read_text())
    assert info["provenance"]["model"] == "tiny-llama-prompted"
    preds = tables.PREDICTIONS.read(run_dir)
    assert preds["prompt"].str.contains("Answer:").all() and preds["special_tokens"].all()
    # the metrics, given the same directory, read the prompt the explain run kept
    m = make_cfg("metrics", [f"inputs.model={ckpt}", f"inputs.explain={run_dir}",
                             "kgrid=smoke", "progress=false"], name="p-direct-metrics")  # fmt: skip
    got = tables.METRICS.read(Path(metrics.run(m)["run_dir"]))
    assert set(got["method"]) == {"integrated_gradients", "occlusion"}


# --- self-explanation ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "named", "unknown"),
    [
        ("wonderful, boring", ["wonderful", "boring"], []),
        ("1. Wonderful\n2. plot\n3. music", ["wonderful", "plot"], ["music"]),
        ('"boring" and "thin"', ["boring", "thin"], []),
        ("- acting\n- Wonderful!", ["acting", "wonderful"], []),
        ("The words: plot, plot, thin.", ["the", "plot", "thin"], ["words"]),
        ("I cannot say.", [], ["i", "cannot", "say"]),
        ("", [], []),
    ],
)
def test_self_explanation_replies_are_parsed_into_word_ranks(reply, named, unknown) -> None:
    from saleval.attribution.self_explain import parse_answer

    words = ["the", "plot", "is", "thin", "but", "the", "acting", "is", "wonderful", "boring"]
    got = parse_answer(reply, words)
    assert got.named == named and got.unknown == unknown
    assert got.no_word == (not named)
    for rank, w in enumerate(named):  # every occurrence, the first named highest
        for i in [i for i, x in enumerate(words) if x == w]:
            assert got.scores[i] == len(named) - rank
    assert (got.scores[[i for i, x in enumerate(words) if x not in named]] == 0).all()


def test_self_explain_generates_on_a_tiny_model_and_records_every_reply(
    causal_checkpoints, make_cfg
) -> None:
    """End to end: a random LM replies with noise; each text's reply is recorded, words
    that are not the text's are reported and never scored, a reply naming no word of the
    text is recorded as such — never a crash."""
    from saleval.stages import explain

    ckpt = causal_checkpoints["gpt2"]
    e = make_cfg("explain", ["model=prompted", f"model.pretrained={ckpt}", "dataset=sst2",
                             "dataset.max_test=16", "data.n_samples=4", "progress=false",
                             "method=[self_explain,random]", "method.self_explain.max_new_tokens=12",
                             "view.samples=1"], name="p-self")  # fmt: skip
    run_dir = Path(explain.run(e)["run_dir"])
    answers = pd.read_csv(run_dir / "self_explanations.csv", keep_default_na=False)
    preds = tables.PREDICTIONS.read(run_dir).set_index("sample_id")
    assert len(answers) == 4
    for row in answers.itertuples():
        text_words = {w.casefold() for w in
                      (preds.loc[row.sample_id, "text"][s:e] for s, e in word_spans(preds.loc[row.sample_id, "text"]))}  # fmt: skip
        assert set(str(row.named).split()) <= text_words
        assert not set(str(row.not_in_text).split()) & text_words
        assert bool(row.no_word) == (str(row.named) == "")
    attrs = tables.ATTRIBUTIONS.read(run_dir)
    assert set(attrs["method"]) == {"self_explain", "random"}


def test_saleval_run_smoke_profile_on_a_prompted_model(causal_checkpoints, tmp_path) -> None:
    """``saleval-run profile=prompted_smoke profile.params.lm=<dir>``: every stage, on a
    prompted LLM, with its self-explanations among the scored methods."""
    import contextlib
    import io

    from saleval.stages import run as pipeline

    from .conftest import compose_config

    lm = causal_checkpoints["llama"]
    with contextlib.redirect_stdout(io.StringIO()):
        summary = pipeline.run(compose_config(
            "run", ["profile=prompted_smoke", f"profile.params.lm={lm}"], tmp_path / "run"
        ))  # fmt: skip
    dirs = {k: Path(v["run_dir"]) for k, v in summary["stages"].items()}
    assert (dirs["train"] / "model" / prompts.PROMPT_FILE).is_file()
    scored = tables.METRICS.read(dirs["metrics"])
    assert "self_explain" in set(scored["method"])
    preds = tables.PREDICTIONS.read(dirs["explain"])
    assert preds["prompt"].str.contains("Answer:").all()


def test_the_api_explains_and_evaluates_a_prompted_model(causal_checkpoints) -> None:
    from saleval import api

    clf = api.load_prompted(causal_checkpoints["gpt2"], LABELS, template=TEMPLATE, device="cpu")
    got = api.explain(TEXTS[:2], clf, ["occlusion", "vanilla_gradient"])
    assert set(got["method"]) == {"occlusion", "vanilla_gradient"}
    for text, rows in got.groupby("text"):
        words = [str(text)[s:e] for s, e in word_spans(str(text))]
        for _, one in rows.groupby("method"):
            assert one.sort_values("word_index")["word"].tolist() == words
    scored = api.evaluate(got, clf, metrics="quick")
    assert set(scored.index) == {"occlusion", "vanilla_gradient"} and scored.notna().any(axis=None)


def test_the_shortcut_protocol_refuses_a_prompted_model_in_one_line(make_cfg) -> None:
    from saleval.errors import UserError
    from saleval.stages import shortcut

    cfg = make_cfg("shortcut", ["model=prompted", "model.pretrained=/nowhere"], name="p-st")
    with pytest.raises(UserError, match=r"^model=prompted: the synthetic-shortcut") as err:
        shortcut.run(cfg)
    assert "\n" not in str(err.value) and not Path(cfg.run_dir).exists()


def test_the_prefix_cache_benchmark_runs_at_smoke_size(capsys) -> None:
    """The benchmark of docs/benchmarks.md#prefix-cache end to end; its exit code says the
    cached and whole-prompt logits agree within 1e-4 (speed is not asserted)."""
    from benchmarks import prefix_cache

    assert prefix_cache.main(["--smoke"]) == 0
    out = capsys.readouterr().out
    assert "| occlusion |" in out and "| lime |" in out and "Largest logit difference" in out


def test_a_label_word_merging_with_the_prompt_is_warned_once(caplog, monkeypatch) -> None:
    """Every stage that loads a prompted model finds its label words' tokens again; the
    word that merges with the prompt's last token is warned once per process."""
    from types import SimpleNamespace

    from saleval import errors
    from saleval.modeling import prompts

    monkeypatch.setattr(errors, "_WARNED", set())

    def base(text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
        """One id per character, except that a word after the prompt merges with its
        last character ("d" of "Hello world" becomes id 0)."""
        ids = [ord(c) for c in text]
        if text.startswith("Hello world") and len(text) > len("Hello world"):
            ids[len("Hello world") - 1] = 0
        return {"input_ids": ids}

    def render(text: str) -> str:
        return text

    tok = SimpleNamespace(base=base, render=render, spec=SimpleNamespace(add_special_tokens=False))
    with caplog.at_level("WARNING", logger=prompts.__name__):
        for _ in range(3):
            ids = prompts.label_token_ids(tok, [["ab"], ["cd"]])  # type: ignore[arg-type]
    assert ids == [[[97, 98]], [[99, 100]]]
    said = [m for m in caplog.messages if "merges with the prompt's last token" in m]
    assert len(said) == 2 and "'ab'" in said[0] and "'cd'" in said[1], said
