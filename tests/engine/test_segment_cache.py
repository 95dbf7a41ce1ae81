"""Encoding cached by stretch between added tokens: the ids of one encode of the whole text,
or no cache where a tokenizer does not encode its stretches on their own."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

from titan.engine import segment_cache
from titan.engine.segment_cache import SegmentCache

PIECES = ["Hello", " world", "\n", "\n\n", "  ", "12345", "3.14", "café", "naïve", "中文字符",
          "🎉", "def f(x):\n    return x", "   trailing   ", "user", "assistant\n", "<", "|>",
          "<|im", "_end|>", "im_start", "Ångström", "\t", "!?", "  spaced  out "]  # fmt: skip


@pytest.fixture(scope="module")
def smollm(hf_dir: Path) -> HFTokenizer:
    return HFTokenizer.from_file(str(hf_dir / "tokenizer.json"))


def _random_texts(specials: list[str], count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    pool = PIECES + specials
    return ["".join(rng.choice(pool) for _ in range(rng.randrange(1, 30))) for _ in range(count)]


def test_cached_ids_are_the_whole_texts_ids_cold_and_warm(smollm, tokenizer):
    cache = SegmentCache.for_tokenizer(smollm)
    assert cache is not None
    conversation = [{"role": "system", "content": "Answer in one sentence."}]
    for turn in range(6):
        conversation += [
            {"role": "user", "content": f"Turn {turn}: notes on café prices, 12 items.\n\n  ok"},
            {"role": "assistant", "content": "Sure <|im_end|> here"},  # a special token inside
        ]
    texts = [tokenizer.apply_chat_template(conversation[:n]) for n in range(1, 14)]
    texts += _random_texts(["<|im_start|>", "<|im_end|>", "<|endoftext|>"], 300, seed=0)
    for text in texts + texts:  # the second time from the cache
        assert cache.encode(text) == smollm.encode(text, add_special_tokens=False).ids, text


def test_the_engine_tokenizer_encodes_through_the_cache(tokenizer, smollm):
    text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi there"}])
    first = tokenizer.encode(text)
    assert first == smollm.encode(text, add_special_tokens=False).ids
    assert tokenizer.encode(text) == first
    assert tokenizer.encode(text, add_special_tokens=True)[-len(first) :] == first


def _metaspace_tokenizer(scheme: str) -> HFTokenizer:
    """A small BPE over Metaspace pieces (SentencePiece's word boundary marker)."""
    tokenizer = HFTokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme=scheme)
    tokenizer.decoder = decoders.Metaspace(prepend_scheme=scheme)
    corpus = [" ".join(PIECES) * 3, "Hello there, how are you? Tell me 12 facts user assistant"]
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]", "<s>", "</s>"])
    tokenizer.train_from_iterator(corpus, trainer)
    return tokenizer


def test_no_cache_where_the_first_stretch_is_encoded_apart():
    """Metaspace's `first` scheme marks only the text's first word: a later stretch encoded
    alone would gain the mark, so such a tokenizer gets no cache; `always` marks every stretch."""
    first = _metaspace_tokenizer("first")
    assert SegmentCache.for_tokenizer(first) is None
    always = _metaspace_tokenizer("always")
    cache = SegmentCache.for_tokenizer(always)
    assert cache is not None
    for text in _random_texts(["<s>", "</s>"], 200, seed=1):
        assert cache.encode(text) == always.encode(text, add_special_tokens=False).ids, text


@pytest.mark.parametrize("flag", ["lstrip", "rstrip", "single_word", "normalized"])
def test_no_cache_where_an_added_token_reaches_beyond_its_text(flag):
    tokenizer = _metaspace_tokenizer("always")
    tokenizer.add_tokens([AddedToken("<tool>", **{flag: True})])
    assert SegmentCache.for_tokenizer(tokenizer) is None


def test_the_cache_keeps_within_its_bound(smollm, monkeypatch):
    monkeypatch.setattr(segment_cache, "MAX_CACHED_CHARS", 400)
    cache = SegmentCache.for_tokenizer(smollm)
    assert cache is not None
    texts = [f"message number {i} with some words" for i in range(100)]
    for text in texts:
        cache.encode(f"<|im_start|>{text}<|im_end|>")
        assert cache.cached_chars <= 400
    huge = "word " * 200  # over a quarter of the bound: encoded, never kept
    assert cache.encode(huge) == smollm.encode(huge, add_special_tokens=False).ids
    assert cache.cached_chars <= 400
