"""Response cache settings: global defaults, overridable per model."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from titan.config.settings import Settings

CacheDirective = Literal["no-store", "no-cache", "only-if-cached"]


class CacheConfig(Settings):
    """``exact``: the same request (tenant, model, messages, every output-changing parameter)
    gets the stored answer. ``semantic``: a question close enough in meaning (cosine similarity of
    all-MiniLM-L6-v2 embeddings ≥ ``threshold``, and passing the guards) in the same scope (tenant,
    model, system prompt and earlier turns) gets it too."""

    exact: bool = True
    semantic: bool = False
    ttl_s: float = Field(3600.0, gt=0)
    # Entries per kind (exact, semantic) in the store; the least recently used go first.
    max_entries: int = Field(10_000, ge=1)
    threshold: float = Field(0.86, gt=0, le=1)
    # Only deterministic requests (temperature 0, or a fixed seed) are cached unless this is on.
    cache_sampled: bool = False
    # Semantic lookups need at least this many words to judge a question's meaning.
    min_query_words: int = Field(3, ge=1)
    # Answers bigger than this are not stored.
    max_answer_bytes: int = Field(256 * 1024, ge=1)
