"""Admission policy: API keys and tenants, usage accounting, rate limits, the admission queue,
and degradation. Uses the ``titan.storage.base`` protocols only, never a concrete store."""
