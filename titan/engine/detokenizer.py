"""Incremental detokenization with stop strings.

Text is released only when it is final: never half of a UTF-8 character (a token may carry part
of one), and never characters that could still turn out to begin a stop string. A stop string may
span any number of tokens.
"""

from __future__ import annotations

from titan.engine.tokenizer import Tokenizer

# How many tokens before the first new one are decoded with it, so that the decoder sees the
# context it needs (leading spaces in SentencePiece vocabularies, split characters).
_CONTEXT_TOKENS = 5


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_token_ids: list[int],
        *,
        skip_special_tokens: bool = True,
        stop: tuple[str, ...] = (),
        include_stop_str_in_output: bool = False,
    ):
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._stop = stop
        self._include_stop = include_stop_str_in_output
        self._token_ids = list(prompt_token_ids[-_CONTEXT_TOKENS:])
        self._read_offset = len(self._token_ids)
        self._prefix_offset = 0
        self.text = ""  # all output text decoded so far (truncated at a stop string)
        self._num_released = 0
        self.stop_string: str | None = None

    def add_token(self, token_id: int) -> None:
        """Decode one more output token; sets ``stop_string`` when one completes."""
        if self.stop_string is not None:
            return
        self._token_ids.append(token_id)
        ids = self._token_ids
        prefix_text = self._tokenizer.decode(
            ids[self._prefix_offset : self._read_offset], self._skip_special
        )
        new_text = self._tokenizer.decode(ids[self._prefix_offset :], self._skip_special)
        # A trailing U+FFFD means the last token ends inside a UTF-8 character: wait for the rest.
        if len(new_text) <= len(prefix_text) or new_text.endswith("\ufffd"):
            return
        self._append(new_text[len(prefix_text) :])
        self._prefix_offset = self._read_offset
        self._read_offset = len(ids)

    def flush(self) -> None:
        """At the end of a request: whatever is pending is final, replacement characters too."""
        if self.stop_string is not None or self._read_offset == len(self._token_ids):
            return
        ids = self._token_ids
        prefix_text = self._tokenizer.decode(
            ids[self._prefix_offset : self._read_offset], self._skip_special
        )
        new_text = self._tokenizer.decode(ids[self._prefix_offset :], self._skip_special)
        self._read_offset = len(ids)
        if len(new_text) > len(prefix_text):
            self._append(new_text[len(prefix_text) :])

    def _append(self, delta: str) -> None:
        search_from = max(0, len(self.text) - max((len(s) for s in self._stop), default=0) + 1)
        self.text += delta
        if not self._stop:
            return
        best: tuple[int, str] | None = None
        for stop in self._stop:
            index = self.text.find(stop, search_from)
            if index != -1 and (best is None or index < best[0]):
                best = (index, stop)
        if best is not None:
            index, stop = best
            self.text = self.text[: index + len(stop)] if self._include_stop else self.text[:index]
            self.stop_string = stop

    def take_released(self, is_finished: bool) -> str:
        """Text not returned before that is now final."""
        end = (
            len(self.text)
            if is_finished or self.stop_string
            else len(self.text) - self._held_back()
        )
        end = max(end, self._num_released)
        released = self.text[self._num_released : end]
        self._num_released = end
        return released

    def _held_back(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string."""
        held = 0
        for stop in self._stop:
            for length in range(min(len(stop) - 1, len(self.text)), held, -1):
                if self.text.endswith(stop[:length]):
                    held = length
                    break
        return held
