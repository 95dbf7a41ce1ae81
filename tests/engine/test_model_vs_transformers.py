"""The model against HF transformers on the same weights: greedy token ids must be equal."""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.engine.conftest import run_engine
from titan.engine.model.loader import default_gguf_path
from titan.engine.sampling_params import SamplingParams
from titan.engine.tokenizer import Tokenizer

pytestmark = pytest.mark.slow

NUM_NEW_TOKENS = 24


def prompts(tokenizer: Tokenizer) -> list[list[int]]:
    chats = [
        "What is the capital of France?",
        "Write a haiku about autumn leaves.",
        "Explain what a hash table is in two sentences.",
        "List three uses of copper.",
    ]
    rendered = [
        tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": c}]))
        for c in chats
    ]
    story = " ".join(
        f"Chapter {i}: the traveller crossed the {w} and wrote about it in her diary."
        for i, w in enumerate(["river", "desert", "mountain", "forest", "sea", "city"] * 6)
    )
    long = tokenizer.encode(
        tokenizer.apply_chat_template([{"role": "user", "content": story + " Summarize."}])
    )
    assert len(long) > 300
    return [*rendered, long, tokenizer.encode("Once upon a time")]


def hf_greedy(hf_dir, token_lists):
    transformers = pytest.importorskip("transformers")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation chatter from transformers' loaders
        model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32)
        model.eval()
        outputs = []
        for tokens in token_lists:
            ids = torch.tensor([tokens])
            generated = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=NUM_NEW_TOKENS,
                do_sample=False,
                eos_token_id=2,
                pad_token_id=2,
            )
            outputs.append(generated[0, len(tokens) :].tolist())
    return outputs


def test_greedy_tokens_equal_transformers_generate(hf_dir, tokenizer, float32_engine):
    token_lists = prompts(tokenizer)
    expected = hf_greedy(hf_dir, token_lists)
    got = run_engine(
        float32_engine,
        {str(i): tokens for i, tokens in enumerate(token_lists)},
        SamplingParams(max_tokens=NUM_NEW_TOKENS, temperature=0.0),
    )
    assert [got[str(i)] for i in range(len(token_lists))] == expected


def test_gguf_conversion_matches_transformers_gguf_loader(hf_dir, tokenizer):
    """Dequantization, the Q/K un-permutation and the tokenizer, against transformers' own
    GGUF path (slow: it re-parses the file)."""
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file

    gguf = default_gguf_path()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = transformers.AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        ).state_dict()
        reference_tokenizer = transformers.AutoTokenizer.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name
        )
    ours = load_file(str(hf_dir / "model.safetensors"))
    for name, tensor in ours.items():
        assert torch.equal(tensor, reference[name]), name
    texts = [
        "Hello world!",
        "  multiple   spaces\n\nand\ttabs",
        "digits 1234567 and 3.14159",
        "émojis 🎉🚀, CJK 中文字符, accents café",
        "<|im_start|>user\nhi<|im_end|>\n",
        "don't won't it's y'all",
        "def f(x):\n    return x ** 2  # comment",
    ]
    for text in texts:
        assert tokenizer.encode(text) == reference_tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.chat_template.source == reference_tokenizer.chat_template
