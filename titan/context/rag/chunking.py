"""Cutting text into overlapping windows of the embedding model's tokens.

Windows are counted in the model's own tokens (not characters or words) so that every chunk fits
the model's window: all-MiniLM-L6-v2 reads at most 256 wordpieces and silently drops the rest,
so a chunk cut by characters could lose its end. The overlap keeps a sentence that straddles a
boundary whole in at least one chunk. Each chunk keeps its character span, so a search result
quotes the original text (case and accents included), not the tokenizer's normalized form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from titan.errors import InvalidRequestError

DEFAULT_MAX_TOKENS = 200
DEFAULT_OVERLAP = 40
# The model's window is 256 wordpieces, two of them [CLS] and [SEP].
MODEL_MAX_TOKENS = 254


@dataclass(frozen=True)
class Chunk:
    index: int
    text: str
    start: int  # character offsets of the chunk in the source text, end exclusive
    end: int
    first_token: int
    num_tokens: int


def check_sizes(max_tokens: int, overlap: int) -> None:
    if not 1 <= max_tokens <= MODEL_MAX_TOKENS:
        raise ValueError(f"max_tokens must be between 1 and {MODEL_MAX_TOKENS}, not {max_tokens}")
    if not 0 <= overlap <= max_tokens // 2:
        raise ValueError(f"overlap must be between 0 and half of max_tokens, not {overlap}")


def chunk_text(
    text: str,
    offsets: list[tuple[int, int]],
    *,
    max_tokens: int = DEFAULT_MAX_TOKENS,
    overlap: int = DEFAULT_OVERLAP,
) -> list[Chunk]:
    """Windows of ``max_tokens`` tokens, each starting ``max_tokens - overlap`` tokens after the
    previous one; the last window ends at the last token (it may be shorter). ``offsets``: each
    token's character span in ``text``, in order (``Embedder.token_offsets``)."""
    check_sizes(max_tokens, overlap)
    chunks: list[Chunk] = []
    step = max_tokens - overlap
    first = 0
    while first < len(offsets):
        last = min(first + max_tokens, len(offsets))
        start, end = offsets[first][0], offsets[last - 1][1]
        chunks.append(Chunk(len(chunks), text[start:end], start, end, first, last - first))
        if last == len(offsets):
            break
        first += step
    return chunks


def parse_chunking_strategy(asked: Any) -> tuple[int, int]:
    """OpenAI's ``chunking_strategy``: "auto" (our default) or "static" with token sizes."""
    if asked is None or (isinstance(asked, dict) and asked.get("type") == "auto"):
        return DEFAULT_MAX_TOKENS, DEFAULT_OVERLAP
    static = asked.get("static") if isinstance(asked, dict) else None
    if not isinstance(static, dict) or asked.get("type") != "static":
        raise InvalidRequestError(
            "chunking_strategy must be {'type': 'auto'} or {'type': 'static', 'static': "
            "{'max_chunk_size_tokens': N, 'chunk_overlap_tokens': M}}.",
            param="chunking_strategy",
        )
    max_tokens = static.get("max_chunk_size_tokens", DEFAULT_MAX_TOKENS)
    overlap = static.get("chunk_overlap_tokens", DEFAULT_OVERLAP)
    try:
        if not isinstance(max_tokens, int) or not isinstance(overlap, int):
            raise ValueError("token sizes must be integers")
        check_sizes(max_tokens, overlap)
    except ValueError as exc:
        raise InvalidRequestError(
            f"Invalid chunking_strategy: {exc}.", param="chunking_strategy"
        ) from None
    return max_tokens, overlap
