"""Tiny random checkpoints of the model families a researcher brings (docs/data-and-models.md#families).

Each is what a user's fine-tuned classifier looks like on disk — a ``save_pretrained``
directory with weights, config and a fast tokenizer — at test size: random weights (2
layers, hidden size 32) and a tokenizer *trained here* on SST-2 sentences with the
algorithm its family uses (byte-level BPE for RoBERTa, GPT-2 and ModernBERT, Unigram with
``▁`` for DeBERTa-v2 and Llama, WordPiece for DistilBERT and ELECTRA). Nothing comes from
a hub, so the suite and the benchmarks exercise every family offline.

>>> sorted(FAMILIES)[:3]
['deberta_v2', 'distilbert', 'electra']
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

#: tokenizer vocabulary size: large enough that common SST-2 words are single tokens,
#: small enough that rare ones split into pieces (so word merging is exercised)
VOCAB = 600
#: the layer sizes of every tiny model
HIDDEN, LAYERS, HEADS, FFN, POSITIONS = 32, 2, 4, 64, 128
#: the weights' standard deviation: ten times the usual 0.02, so that a random model's
#: logits differ between texts by more than float noise (tests compare such differences)
INIT = 0.2


@dataclass(frozen=True)
class Family:
    """One model family: its config class, its classifier class and its tokenizer."""

    name: str
    decoder: bool
    tokenizer: str  # "bpe" (byte-level), "unigram" (▁), "wordpiece"
    build: Callable[[Any, int], Any]  # (tokenizer, n_labels) -> a random classifier


def _special(tok: Any) -> dict[str, Any]:
    ids = {
        k: getattr(tok, f"{k}_token_id", None)
        for k in ("pad", "bos", "eos", "cls", "sep", "mask", "unk")
    }
    # every id the config names (a family's defaults point into its own large vocabulary)
    return {f"{k}_token_id": v for k, v in ids.items()}


def _labels(n: int) -> dict[str, Any]:
    names = ["negative", "positive"] if n == 2 else [f"class_{i}" for i in range(n)]
    return {
        "num_labels": n,
        "id2label": dict(enumerate(names)),
        "label2id": {v: i for i, v in enumerate(names)},
    }


def _size(**extra: Any) -> dict[str, Any]:
    return {
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "intermediate_size": FFN,
        "max_position_embeddings": POSITIONS,
        "initializer_range": INIT,
        **extra,
    }


def _roberta(tok: Any, n: int) -> Any:
    from transformers import RobertaConfig, RobertaForSequenceClassification

    conf = RobertaConfig(
        **_special(tok),
        **_labels(n),
        vocab_size=len(tok),
        **_size(max_position_embeddings=POSITIONS + 2),
    )
    return RobertaForSequenceClassification(conf)


def _deberta_v2(tok: Any, n: int) -> Any:
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

    conf = DebertaV2Config(
        **_special(tok),
        **_labels(n),
        vocab_size=len(tok),
        relative_attention=True,
        pos_att_type=["p2c", "c2p"],
        position_biased_input=False,
        max_relative_positions=-1,
        type_vocab_size=0,
        **_size(),
        # the convolution after the first layer also reads the embeddings; the config takes
        # these through its **kwargs, which the stubs do not show
        **cast(dict[str, Any], {"conv_kernel_size": 3, "pooler_hidden_size": HIDDEN}),
    )
    return DebertaV2ForSequenceClassification(conf)


def _distilbert(tok: Any, n: int) -> Any:
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    conf = DistilBertConfig(
        **_special(tok),
        **_labels(n),
        vocab_size=len(tok),
        dim=HIDDEN,
        n_layers=LAYERS,
        n_heads=HEADS,
        hidden_dim=FFN,
        max_position_embeddings=POSITIONS,
        initializer_range=INIT,
    )
    return DistilBertForSequenceClassification(conf)


def _electra(tok: Any, n: int) -> Any:
    from transformers import ElectraConfig, ElectraForSequenceClassification

    # embedding_size below hidden_size: ELECTRA projects its embeddings up before block 1
    conf = ElectraConfig(
        **_special(tok), **_labels(n), vocab_size=len(tok), embedding_size=16, **_size()
    )
    return ElectraForSequenceClassification(conf)


def _modernbert(tok: Any, n: int) -> Any:
    from transformers import ModernBertConfig, ModernBertForSequenceClassification

    conf = ModernBertConfig(
        **_special(tok),
        **_labels(n),
        vocab_size=len(tok),
        layer_types=["full_attention", "sliding_attention"],
        local_attention=16,
        classifier_pooling="mean",  # reads every position: attention's `output` query = `all`
        **_size(),
    )
    return ModernBertForSequenceClassification(conf)


def _gpt2(tok: Any, n: int) -> Any:
    from transformers import GPT2Config, GPT2ForSequenceClassification

    conf = GPT2Config(
        **_special(tok),
        **_labels(n),
        vocab_size=len(tok),
        n_embd=HIDDEN,
        n_layer=LAYERS,
        n_head=HEADS,
        n_positions=POSITIONS,
    )
    return GPT2ForSequenceClassification(conf)


def _llama(tok: Any, n: int) -> Any:
    from transformers import LlamaConfig, LlamaForSequenceClassification

    conf = LlamaConfig(
        **_special(tok), **_labels(n), vocab_size=len(tok), num_key_value_heads=2, **_size()
    )
    return LlamaForSequenceClassification(conf)


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("roberta", False, "bpe", _roberta),
        Family("deberta_v2", False, "unigram", _deberta_v2),
        Family("distilbert", False, "wordpiece", _distilbert),
        Family("electra", False, "wordpiece", _electra),
        Family("modernbert", False, "bpe", _modernbert),
        Family("gpt2", True, "bpe", _gpt2),
        Family("llama", True, "unigram", _llama),
    )
}


#: each family's special tokens, as its own tokenizer names them (the first is trained first)
_SPECIALS: dict[str, dict[str, str]] = {
    # GPT-2: one token serves as bos, eos and unk; a fine-tuned classifier pads with it too
    "gpt2": dict.fromkeys(("bos_token", "eos_token", "unk_token", "pad_token"), "<|endoftext|>"),
    "llama": {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "</s>"},
    "bpe": {"bos_token": "<s>", "pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>",
            "mask_token": "<mask>", "cls_token": "<s>", "sep_token": "</s>"},
    "wordpiece": {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]",
                  "sep_token": "[SEP]", "mask_token": "[MASK]"},
}  # fmt: skip
#: the families whose tokenizer returns token type ids (their models take them)
_TOKEN_TYPES = ("deberta_v2", "electra")


def _specials(family: str) -> dict[str, str]:
    kind = FAMILIES[family].tokenizer
    if family in _SPECIALS:
        return _SPECIALS[family]
    return _SPECIALS["bpe" if kind == "bpe" else "wordpiece"]


def _model(kind: str, unk: str) -> tuple[Any, Any]:
    """An untrained tokenizer of ``kind`` and its trainer's class and options."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers
    from tokenizers import trainers as tt

    if kind == "bpe":
        tk = Tokenizer(models.BPE())
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tk.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        return tk, lambda sp: tt.BpeTrainer(
            vocab_size=VOCAB, special_tokens=sp, initial_alphabet=alphabet
        )
    if kind == "unigram":  # its pieces come from a BPE run (see _canonical)
        tk = Tokenizer(models.BPE(unk_token=unk))
        tk.normalizer = normalizers.Replace(" ", "▁")
        tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        tk.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
        return tk, lambda sp: tt.BpeTrainer(vocab_size=VOCAB, special_tokens=sp)
    tk = Tokenizer(models.WordPiece(unk_token=unk))
    tk.normalizer = normalizers.BertNormalizer(lowercase=True)
    tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tk.decoder = decoders.WordPiece()
    return tk, lambda sp: tt.WordPieceTrainer(vocab_size=VOCAB, special_tokens=sp)


def _post_processor(family: str, tk: Any, names: dict[str, str]) -> Any:
    """What the family's tokenizer adds around one text: ``[CLS] x [SEP]``, ``<s> x </s>``,
    Llama's ``<s> x``, nothing for GPT-2."""
    from tokenizers import processors

    def tid(token: str) -> int:
        found = tk.token_to_id(token)
        if found is None:
            raise ValueError(f"{family}: the trained tokenizer lacks {token!r}")
        return int(found)

    if family == "gpt2":
        return None
    if family == "llama":
        bos = names["bos_token"]
        return processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, tid(bos))])
    if FAMILIES[family].tokenizer == "bpe":
        sep, cls = names["sep_token"], names["cls_token"]
        return processors.RobertaProcessing(
            (sep, tid(sep)), (cls, tid(cls)), trim_offsets=True, add_prefix_space=False
        )
    cls, sep = names["cls_token"], names["sep_token"]
    return processors.TemplateProcessing(
        single=f"{cls} $A {sep}", special_tokens=[(cls, tid(cls)), (sep, tid(sep))]
    )


def _canonical(tk: Any, specials: list[str], kind: str) -> Any:
    """``tk`` with the same vocabulary and ids in every run.

    The WordPiece and Unigram trainers number tokens of equal frequency in whatever order
    their threads met them (and Unigram's EM moves its scores run to run); fixed ids make
    every session's checkpoints the same. WordPiece: the special tokens first, then the
    rest by spelling. Unigram: the pieces of a BPE run over ``▁``-marked words (whose
    merges are deterministic), scored by merge rank as a Zipf law (log 1/(rank + 2)), so
    the tokenizer is a Unigram model with ``▁`` (a SentencePiece-style vocabulary) whose
    pieces do not depend on threads.
    """
    import json
    import math

    from tokenizers import Tokenizer

    spec = json.loads(tk.to_str())
    model = spec["model"]
    if kind == "wordpiece":
        order = [*specials, *sorted(t for t in model["vocab"] if t not in specials)]
        model["vocab"] = {t: i for i, t in enumerate(order)}
    elif kind == "unigram":
        by_id = sorted(model["vocab"], key=lambda t: model["vocab"][t])
        order = [*specials, *(t for t in by_id if t not in specials)]
        vocab = [[t, 0.0 if t in specials else math.log(1 / (r + 2))] for r, t in enumerate(order)]
        spec["model"] = {"type": "Unigram", "unk_id": order.index(model["unk_token"]),
                         "vocab": vocab, "byte_fallback": False}  # fmt: skip
    else:  # byte-level BPE: deterministic already
        return tk
    ids = {t: i for i, t in enumerate(order)}
    for added in spec.get("added_tokens", []):
        added["id"] = ids[added["content"]]
    return Tokenizer.from_str(json.dumps(spec))


def train_tokenizer(family: str, corpus: Iterable[str]) -> Any:
    """A fast tokenizer of ``family``'s kind, trained on ``corpus``, with its special tokens,
    its post-processor and the inputs it returns (token type ids only where the family's
    own tokenizer makes them)."""
    from transformers import PreTrainedTokenizerFast

    names = _specials(family)
    tk, trainer = _model(FAMILIES[family].tokenizer, names["unk_token"])
    specials = list(dict.fromkeys(names.values()))
    tk.train_from_iterator(list(corpus), trainer(specials))
    tk = _canonical(tk, specials, FAMILIES[family].tokenizer)
    post = _post_processor(family, tk, names)
    if post is not None:
        tk.post_processor = post
    inputs = ["input_ids", "attention_mask"]
    if family in _TOKEN_TYPES:
        inputs.insert(1, "token_type_ids")
    return PreTrainedTokenizerFast(
        tokenizer_object=tk, model_max_length=POSITIONS, model_input_names=inputs, **names
    )


def build_checkpoint(
    family: str, out: Path, corpus: Sequence[str], n_labels: int = 2, seed: int = 0
) -> Path:
    """A random ``family`` classifier and its trained tokenizer, saved to ``out``."""
    import torch

    tok = train_tokenizer(family, corpus)
    torch.manual_seed(seed)
    model = FAMILIES[family].build(tok, n_labels)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
