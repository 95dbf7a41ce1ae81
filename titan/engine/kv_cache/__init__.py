"""Paged KV cache: the block pool and per-request block bookkeeping (pure Python)."""
