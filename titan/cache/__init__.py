"""Response caching (exact and semantic) and the sentence embedder it shares with routing."""
