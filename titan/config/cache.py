"""Response cache settings: global defaults, overridable per model."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from titan.config.settings import Settings

CacheDirective = Literal["no-store", "no-cache", "only-if-cached"]


class SemanticCacheConfig(Settings):
    """Semantic hits under an error budget (docs/caching.md). ``max_error_rate``: at most this
    share of the semantic hits served may be wrong, at 95% confidence, judged by verifications
    (a would-be hit that runs the model anyway, its answer compared with the cached one); None
    serves every hit over the threshold at once, with no guarantee."""

    enabled: bool = False
    max_error_rate: float | None = Field(0.01, gt=0, lt=1)
    # With an error budget: the similarity from which would-be hits are verified and the
    # threshold they are served at is learned (never below it). Without: ``threshold`` serves.
    # 0.65: chosen with the pair verifier's threshold on left-out training pairs (docs/caching.md).
    min_similarity: float = Field(0.65, gt=0, le=1)
    # Served hits that run the model anyway, so that the estimate follows the traffic.
    verify_fraction: float = Field(0.05, ge=0, le=1)
    # An entry is not served semantically before this many verifications agreed with it.
    min_verifications: int = Field(1, ge=0)
    # Answers of sampled requests agree when their embeddings are this close (temperature 0
    # or a fixed seed: only the same text agrees).
    answer_similarity: float = Field(0.9, gt=0, le=1)
    # The pair verifier (titan/cache/pair_verifier.py): a candidate that passes the guards is
    # served only when a cross-encoder, reading the two questions together, says they ask the
    # same (~5 ms more for a would-be hit). Its weights are trained at first use (minutes,
    # once per machine); until they are ready no semantic hit is served. Off: the guards and
    # the error budget alone (several times the false hits on held-out pairs, docs/caching.md).
    pair_verifier: bool = True
    # A weights file for it (pair_training.py's format, e.g. made on another machine by
    # `titan cache prepare-verifier`); None: trained here at first use, kept in the cache
    # folder (~/.cache/titan/pair-verifier).
    pair_verifier_weights: str | None = None


class CacheConfig(Settings):
    """``exact``: the same request (tenant, model, messages, every output-changing parameter)
    gets the stored answer. ``semantic``: a question close enough in meaning (cosine similarity of
    all-MiniLM-L6-v2 embeddings ≥ ``threshold``, and passing the guards) in the same scope (tenant,
    model, system prompt and earlier turns) gets it too, within the semantic error budget (which
    may raise the threshold it serves at, never lower it)."""

    exact: bool = True
    semantic: SemanticCacheConfig = Field(default_factory=SemanticCacheConfig)
    ttl_s: float = Field(3600.0, gt=0)
    # Entries per kind (exact, semantic) in the store; the least recently used go first.
    max_entries: int = Field(10_000, ge=1)
    # The fixed similarity threshold (semantic.max_error_rate null). 0.90: at most 1% wrong
    # hits on the labeled calibration sets (docs/caching.md).
    threshold: float = Field(0.9, gt=0, le=1)
    # Only deterministic requests (temperature 0, or a fixed seed) are cached unless this is on.
    cache_sampled: bool = False
    # Semantic lookups need at least this many words to judge a question's meaning.
    min_query_words: int = Field(3, ge=1)
    # Answers bigger than this are not stored.
    max_answer_bytes: int = Field(256 * 1024, ge=1)

    @field_validator("semantic", mode="before")
    @classmethod
    def _switch(cls, value: Any) -> Any:
        """``semantic: true`` is the short form of ``semantic: {enabled: true}``."""
        return {"enabled": value} if isinstance(value, bool) else value
