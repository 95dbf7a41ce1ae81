"""Context that outlives one request, tenant-scoped: stored conversations and their trimming,
retrieval over a tenant's files (``rag``), and agent state (versioned JSON documents per agent).

Uses the ``titan.storage.base`` protocols only, never a concrete store.
"""
