"""Shared state: documents, counters, atomic limit buckets and cached answers behind one
``storage:`` URL.

Only the protocols and ``open_storage`` are exported; the Redis client is imported when a
``redis://`` URL is opened, so importing this package stays cheap.
"""

from titan.storage.base import (
    Acquisition,
    Bucket,
    CacheEntry,
    CacheStore,
    ConcurrencySlot,
    CounterStore,
    DocumentStore,
    Increment,
    LimitStore,
    Settlement,
    Storage,
)
from titan.storage.factory import open_storage

__all__ = [
    "Acquisition",
    "Bucket",
    "CacheEntry",
    "CacheStore",
    "ConcurrencySlot",
    "CounterStore",
    "DocumentStore",
    "Increment",
    "LimitStore",
    "Settlement",
    "Storage",
    "open_storage",
]
