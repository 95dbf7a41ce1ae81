import pytest

from titan.engine.detokenizer import IncrementalDetokenizer

TEXTS = [
    "The capital of France is Paris.",
    "Emoji 🎉🚀 and CJK 中文字符 and accents: café, naïve, Ångström.",
    "Code:\n```python\ndef f(x):\n    return x ** 2\n```\n",
    "  leading spaces, trailing spaces   ",
]


def stream(tokenizer, text, **kwargs):
    ids = tokenizer.encode(text)
    detok = IncrementalDetokenizer(tokenizer, tokenizer.encode("Prompt:"), **kwargs)
    deltas = []
    for token_id in ids:
        detok.add_token(token_id)
        deltas.append(detok.take_released(is_finished=False))
        if detok.stop_string:
            break
    detok.flush()
    deltas.append(detok.take_released(is_finished=True))
    return deltas, detok


@pytest.mark.parametrize("text", TEXTS)
def test_incremental_text_equals_full_decode_and_never_splits_a_character(tokenizer, text):
    deltas, _ = stream(tokenizer, text)
    assert "".join(deltas) == text
    assert all("\ufffd" not in delta for delta in deltas)


def test_multibyte_characters_span_several_tokens(tokenizer):
    # The premise of the test above: some tokens carry only part of a UTF-8 character.
    ids = tokenizer.encode("🎉🚀中文")
    assert any(tokenizer.decode([t]).endswith("\ufffd") for t in ids)


def test_stop_string_spanning_tokens_truncates_and_holds_back_prefixes(tokenizer):
    text = "The capital of France is Paris."
    stop = "ital of Fr"
    ids = tokenizer.encode(text)
    assert len([t for t in ids if tokenizer.decode([t]).strip()]) > 3  # spans several tokens
    deltas, detok = stream(tokenizer, text, stop=(stop,))
    assert detok.stop_string == stop
    assert "".join(deltas) == "The cap"
    # Nothing of the stop string leaked out before the match was certain.
    assert all("ital" not in d for d in deltas)


def test_stop_string_included_on_request(tokenizer):
    deltas, _ = stream(
        tokenizer, "one two three four", stop=("three",), include_stop_str_in_output=True
    )
    assert "".join(deltas) == "one two three"


def test_earliest_of_several_stop_strings_wins(tokenizer):
    deltas, detok = stream(tokenizer, "alpha beta gamma delta", stop=("delta", "beta"))
    assert detok.stop_string == "beta"
    assert "".join(deltas) == "alpha "


def test_partial_stop_prefix_is_released_once_it_cannot_match(tokenizer):
    deltas, detok = stream(tokenizer, "a stop-like word: stoplight is fine", stop=("stop!",))
    assert detok.stop_string is None
    assert "".join(deltas) == "a stop-like word: stoplight is fine"
