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
from typing import Any

#: tokenizer vocabulary size: large enough that common SST-2 words are single tokens,
#: small enough that rare ones split into pieces (so word merging is exercised)
VOCAB = 600
#: the layer sizes of every tiny model
HIDDEN, LAYERS, HEADS, FFN, POSITIONS = 32, 2, 4, 64, 128


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
        conv_kernel_size=3,  # the convolution after the first layer also reads the embeddings
        pooler_hidden_size=HIDDEN,
        **_size(),
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
        global_attn_every_n_layers=2,
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


def train_tokenizer(family: str, corpus: Iterable[str]) -> Any:
    """A fast tokenizer of ``family``'s kind, trained on ``corpus``, with its special tokens
    and post-processor (what the family's own tokenizer adds around a text)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers import trainers as tt
    from transformers import PreTrainedTokenizerFast

    kind = FAMILIES[family].tokenizer
    texts = list(corpus)
    if family in ("gpt2",):
        specials = ["<|endoftext|>"]
    elif family == "llama":
        specials = ["<unk>", "<s>", "</s>"]
    elif kind == "bpe":
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    else:
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    if kind == "bpe":
        tk = Tokenizer(models.BPE())
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tk.decoder = decoders.ByteLevel()
        trainer: Any = tt.BpeTrainer(
            vocab_size=VOCAB,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
    elif kind == "unigram":
        tk = Tokenizer(models.Unigram())
        tk.normalizer = normalizers.Replace(" ", "▁")
        tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
        tk.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
        trainer = tt.UnigramTrainer(
            vocab_size=VOCAB,
            special_tokens=specials,
            unk_token=specials[0] if family == "llama" else "[UNK]",
        )
    else:
        tk = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tk.normalizer = normalizers.BertNormalizer(lowercase=True)
        tk.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tk.decoder = decoders.WordPiece()
        trainer = tt.WordPieceTrainer(vocab_size=VOCAB, special_tokens=specials)
    tk.train_from_iterator(texts, trainer)
    names: dict[str, str] = {}
    if family == "gpt2":
        names = {
            "bos_token": specials[0],
            "eos_token": specials[0],
            "unk_token": specials[0],
            "pad_token": specials[0],
        }
    elif family == "llama":
        names = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>", "pad_token": "</s>"}
        tk.post_processor = processors.TemplateProcessing(
            single="<s> $A", special_tokens=[("<s>", tk.token_to_id("<s>"))]
        )
    elif kind == "bpe":
        names = {
            "bos_token": "<s>",
            "eos_token": "</s>",
            "cls_token": "<s>",
            "sep_token": "</s>",
            "pad_token": "<pad>",
            "unk_token": "<unk>",
            "mask_token": "<mask>",
        }
        tk.post_processor = processors.RobertaProcessing(
            ("</s>", tk.token_to_id("</s>")),
            ("<s>", tk.token_to_id("<s>")),
            trim_offsets=True,
            add_prefix_space=False,
        )
    else:
        names = {
            "pad_token": "[PAD]",
            "unk_token": "[UNK]",
            "cls_token": "[CLS]",
            "sep_token": "[SEP]",
            "mask_token": "[MASK]",
        }
        tk.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            special_tokens=[("[CLS]", tk.token_to_id("[CLS]")), ("[SEP]", tk.token_to_id("[SEP]"))],
        )
    # what each family's own tokenizer returns: token types only where the model has them
    types = family in ("deberta_v2", "electra")
    inputs = (
        ["input_ids", "token_type_ids", "attention_mask"]
        if types
        else ["input_ids", "attention_mask"]
    )
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
