"""Finishing a key rotation: rewrite every document not sealed with the current key.

After a new key is put first in ``data_at_rest.encryption_keys``, new writes use it at once, but
documents written before stay under the old key (and plaintext from before encryption stays
plaintext) until they are written again. ``reseal`` walks every namespace of the raw store and
rewrites those documents sealed with the current key; once it reports nothing left, the old key
can leave the config.

Versioned documents (``_version``: vector stores, their files, agent state, batches) are
rewritten by compare-and-set, so a concurrent change wins and the document is sealed by that
write instead. Unversioned ones (responses, files, chunks) are written once and never changed,
so rewriting them races with nothing but their delete: a document deleted meanwhile is not
brought back (it is checked just before), though a delete landing between that check and the
write can be undone; run it at a quiet time if that matters. ``_written_at`` is kept: resealing
does not restart a document's retention.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from titan.errors import ConfigError
from titan.storage.sealed import SealedDocuments


@dataclass
class ResealReport:
    num_resealed: int = 0
    num_current: int = 0  # already under the current key (or kept in clear by design)
    by_namespace: dict[str, int] = field(default_factory=dict)


async def namespaces_of(raw: Any) -> list[str]:
    """Every namespace of a raw document store (memory, SQLite or Redis)."""
    listing = getattr(raw, "namespaces", None)
    if listing is not None:
        return await listing()  # type: ignore[no-any-return]
    db = getattr(raw, "_db", None)  # SQLite: one query (its module offers no listing yet)
    if db is not None:

        def distinct(connection: Any) -> list[str]:
            rows = connection.execute("SELECT DISTINCT namespace FROM documents ORDER BY 1")
            return [row[0] for row in rows]

        return await db.run(distinct)  # type: ignore[no-any-return]
    raise ConfigError(f"cannot list the namespaces of {type(raw).__name__}")


async def reseal(documents: SealedDocuments) -> ResealReport:
    if not documents.keyring.is_sealing:
        raise ConfigError(
            "storage reseal: no data key configured; set data_at_rest.encryption_keys "
            "(the new key first)."
        )
    raw = documents.inner
    report = ResealReport()
    for namespace in await namespaces_of(raw):
        for doc_id, stored in await raw.list(namespace):
            if not documents.needs_reseal(namespace, stored):
                report.num_current += 1
                continue
            if await _rewrite(documents, namespace, doc_id, stored):
                report.num_resealed += 1
                report.by_namespace[namespace] = report.by_namespace.get(namespace, 0) + 1
    return report


async def _rewrite(
    documents: SealedDocuments, namespace: str, doc_id: str, stored: dict[str, Any]
) -> bool:
    raw = documents.inner
    opened = documents.open(namespace, doc_id, stored)
    sealed = documents.seal(namespace, doc_id, opened)  # clear fields (_version...) kept
    version = stored.get("_version")
    if isinstance(version, str):
        return await raw.put_if(namespace, doc_id, sealed, expected=version)
    if await raw.get(namespace, doc_id) is None:  # deleted meanwhile: not brought back
        return False
    await raw.put(namespace, doc_id, sealed)
    return True
