"""Tiny random causal LMs with tokenizers trained on the spot, for prompted-LLM tests.

Three families (``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``GPT2LMHeadModel``) with the
kind of tokenizer each ships: Llama a SentencePiece-style ``▁`` vocabulary with a bos
token, GPT-2 byte-level BPE, Qwen2 byte-level BPE with ChatML special tokens and a chat
template — so a test covers a prompt with and without the tokenizer's chat template.

>>> sorted(CAUSAL_FAMILIES)
['gpt2', 'llama', 'qwen2']
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from saleval.testing.families import FFN, HEADS, HIDDEN, INIT, LAYERS, train_tokenizer

CAUSAL_FAMILIES = ("gpt2", "llama", "qwen2")
#: positions of the tiny LMs: room for a few-shot prompt
CAUSAL_POSITIONS = 1024

#: ChatML, as Qwen2's tokenizer writes it (its own template, shortened: no tools)
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _qwen2_tokenizer(corpus: Sequence[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers import trainers as tt
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = tt.BpeTrainer(
        vocab_size=600,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tk.train_from_iterator(list(corpus), trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        model_max_length=CAUSAL_POSITIONS,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=specials[1:],
        model_input_names=["input_ids", "attention_mask"],
    )
    tok.chat_template = CHATML
    return tok


def causal_tokenizer(family: str, corpus: Sequence[str]) -> Any:
    """``family``'s kind of fast tokenizer trained on ``corpus``."""
    if family == "qwen2":
        return _qwen2_tokenizer(corpus)
    tok = train_tokenizer(family, corpus)
    tok.model_max_length = CAUSAL_POSITIONS
    if family == "gpt2":  # as GPT-2 ships: no pad token (saleval adopts the eos token)
        tok.pad_token = None
    return tok


def causal_lm(family: str, tok: Any) -> Any:
    """A random tiny causal LM of ``family`` over ``tok``'s vocabulary."""
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    ids: dict[str, Any] = {
        f"{k}_token_id": getattr(tok, f"{k}_token_id", None) for k in ("pad", "bos", "eos")
    }
    if family == "gpt2":
        conf = GPT2Config(
            vocab_size=len(tok), n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
            n_positions=CAUSAL_POSITIONS, initializer_range=INIT, **ids,
        )  # fmt: skip
        conf.pad_token_id = None  # GPT-2's config names no pad id either
        return GPT2LMHeadModel(conf)
    size: dict[str, Any] = {
        "vocab_size": len(tok), "hidden_size": HIDDEN, "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS, "num_key_value_heads": 2, "intermediate_size": FFN,
        "max_position_embeddings": CAUSAL_POSITIONS, "initializer_range": INIT,
        "tie_word_embeddings": False,
    }  # fmt: skip
    if family == "llama":
        return LlamaForCausalLM(LlamaConfig(**size, **ids))
    if family == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**size, **ids))
    raise ValueError(f"no causal family {family!r}; one of {CAUSAL_FAMILIES}")


def build_causal_checkpoint(family: str, out: Path, corpus: Sequence[str], seed: int = 0) -> Path:
    """A random ``family`` causal LM and its trained tokenizer, saved to ``out``: a directory
    ``model=prompted model.pretrained=<out>`` reads."""
    import torch

    tok = causal_tokenizer(family, corpus)
    torch.manual_seed(seed)
    lm = causal_lm(family, tok)
    lm.save_pretrained(out)
    tok.save_pretrained(out)
    return out
