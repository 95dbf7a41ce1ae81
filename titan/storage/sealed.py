"""Encryption at rest: AES-256-GCM envelopes, and documents sealed in them.

A ``Keyring`` holds the configured keys: the first seals, every one opens (key rotation: put the
new key first, keep the old ones until ``titan storage reseal`` has rewritten everything). Each
envelope carries a 4-byte key id (a hash of the key, never the key), a random 96-bit nonce per
write, and the AES-GCM ciphertext + tag; the place the data belongs to (namespace and id) is the
associated data, so a ciphertext copied to another id or tenant fails to open instead of being
served there.

``SealedDocuments`` wraps any ``DocumentStore``: a document is stored as
``{"_sealed": "ts1.<base64url envelope>", "_version": ..., "_written_at": ...}``. The two fields
stores and retention compare stay in clear (``put_if`` checks ``_version`` inside the store).
A document without ``_sealed`` (written before encryption was turned on) reads as it is and is
sealed on its next write. A sealed document read without its key is a 503 naming the config key,
never garbage and never a 500.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from titan.errors import ServiceUnavailableError
from titan.storage.base import DocumentStore

CONFIG_KEY = "data_at_rest.encryption_keys"
KEY_ID_BYTES = 4
NONCE_BYTES = 12  # 96 bits: GCM's native nonce size
TEXT_PREFIX = "ts1."  # a sealed document's "_sealed" value
BYTES_MAGIC = b"\x00ts1"  # a sealed cache value (plain values are JSON: never a NUL first)
SEALED_FIELD = "_sealed"
# Kept beside the envelope, in clear: put_if compares "_version" in the store, and the retention
# sweep reads "_written_at" without the key.
CLEAR_FIELDS = ("_version", "_written_at")
# API keys are stored hashed already, and auth must not depend on the data key.
CLEAR_NAMESPACES = frozenset({"api_keys"})


class DataKeyError(ServiceUnavailableError):
    """Stored data cannot be opened with the configured keys (503: an operator must fix the
    config; retrying the same request elsewhere will not help until then)."""

    default_code = "data_key_unavailable"


def key_id(key: bytes) -> bytes:
    return hashlib.sha256(b"titan data key id\x00" + key).digest()[:KEY_ID_BYTES]


class Keyring:
    """The data keys; the first one seals. Empty: nothing is sealed, and sealed data fails to
    open with a clear error."""

    def __init__(self, keys: Sequence[bytes] = ()):
        self._ciphers = {key_id(key): AESGCM(key) for key in keys}
        self._sealing = key_id(keys[0]) if keys else None

    @property
    def is_sealing(self) -> bool:
        return self._sealing is not None

    @property
    def key_ids(self) -> list[str]:
        return [kid.hex() for kid in self._ciphers]

    def current_key_id(self) -> str | None:
        return None if self._sealing is None else self._sealing.hex()

    def seal(self, plaintext: bytes, place: bytes) -> bytes:
        """key id + nonce + ciphertext (with its tag), bound to ``place``."""
        if self._sealing is None:
            raise DataKeyError(f"No data key to seal with: set {CONFIG_KEY}.")
        nonce = os.urandom(NONCE_BYTES)
        return self._sealing + nonce + self._ciphers[self._sealing].encrypt(nonce, plaintext, place)

    def sealed_with(self, envelope: bytes) -> str:
        return envelope[:KEY_ID_BYTES].hex()

    def open(self, envelope: bytes, place: bytes) -> bytes:
        kid = envelope[:KEY_ID_BYTES]
        nonce = envelope[KEY_ID_BYTES : KEY_ID_BYTES + NONCE_BYTES]
        if not self._ciphers:
            raise DataKeyError(
                f"Stored data is encrypted but no data key is configured: set {CONFIG_KEY} "
                "(e.g. ['${TITAN_DATA_KEY}'])."
            )
        cipher = self._ciphers.get(kid)
        if cipher is None:
            raise DataKeyError(
                f"Stored data is encrypted with key id {kid.hex()}, which is not in {CONFIG_KEY} "
                f"(configured: {', '.join(self.key_ids)}): add that key after the current one."
            )
        try:
            return cipher.decrypt(nonce, envelope[KEY_ID_BYTES + NONCE_BYTES :], place)
        except InvalidTag:
            raise DataKeyError(
                f"Stored data failed to authenticate with key id {kid.hex()} from {CONFIG_KEY}: "
                "it was altered, or copied from another record."
            ) from None

    def is_current(self, envelope: bytes) -> bool:
        return envelope[:KEY_ID_BYTES] == self._sealing


def document_place(namespace: str, doc_id: str) -> bytes:
    # Length-prefixed: no (namespace, id) pair encodes like another.
    return f"doc:{len(namespace)}:{namespace}:{doc_id}".encode()


def is_sealed(doc: Mapping[str, Any]) -> bool:
    return isinstance(doc.get(SEALED_FIELD), str)


class SealedDocuments:
    """A ``DocumentStore`` whose documents are sealed with ``keyring`` (see the module doc)."""

    def __init__(
        self,
        inner: DocumentStore,
        keyring: Keyring,
        *,
        clear_namespaces: frozenset[str] = CLEAR_NAMESPACES,
    ):
        self.inner = inner
        self.keyring = keyring
        self._clear_namespaces = clear_namespaces

    def _is_sealing(self, namespace: str) -> bool:
        return self.keyring.is_sealing and namespace not in self._clear_namespaces

    def seal(self, namespace: str, doc_id: str, doc: Mapping[str, Any]) -> dict[str, Any]:
        if not self._is_sealing(namespace):
            return dict(doc)
        secret = {k: v for k, v in doc.items() if k not in CLEAR_FIELDS}
        envelope = self.keyring.seal(orjson.dumps(secret), document_place(namespace, doc_id))
        sealed = {k: doc[k] for k in CLEAR_FIELDS if k in doc}
        sealed[SEALED_FIELD] = TEXT_PREFIX + base64.urlsafe_b64encode(envelope).decode()
        return sealed

    def open(self, namespace: str, doc_id: str, doc: dict[str, Any]) -> dict[str, Any]:
        if not is_sealed(doc):
            return doc  # written before encryption was on: sealed on its next write
        text = doc[SEALED_FIELD]
        if not text.startswith(TEXT_PREFIX):
            raise DataKeyError(f"Stored data has an unknown envelope format; check {CONFIG_KEY}.")
        envelope = base64.urlsafe_b64decode(text[len(TEXT_PREFIX) :])
        opened = orjson.loads(self.keyring.open(envelope, document_place(namespace, doc_id)))
        opened.update((k, doc[k]) for k in CLEAR_FIELDS if k in doc)
        return opened  # type: ignore[no-any-return]

    def needs_reseal(self, namespace: str, doc: Mapping[str, Any]) -> bool:
        """Whether ``doc`` (as stored) is not sealed with the current key (rotation)."""
        if not self._is_sealing(namespace):
            return False
        if not is_sealed(doc):
            return True
        envelope = base64.urlsafe_b64decode(doc[SEALED_FIELD][len(TEXT_PREFIX) :])
        return not self.keyring.is_current(envelope)

    async def put(self, namespace: str, doc_id: str, doc: Mapping[str, Any]) -> None:
        await self.inner.put(namespace, doc_id, self.seal(namespace, doc_id, doc))

    async def put_if(
        self, namespace: str, doc_id: str, doc: Mapping[str, Any], *, expected: str | None
    ) -> bool:
        sealed = self.seal(namespace, doc_id, doc)
        return await self.inner.put_if(namespace, doc_id, sealed, expected=expected)

    async def get(self, namespace: str, doc_id: str) -> dict[str, Any] | None:
        stored = await self.inner.get(namespace, doc_id)
        return None if stored is None else self.open(namespace, doc_id, stored)

    async def delete(self, namespace: str, doc_id: str) -> bool:
        return await self.inner.delete(namespace, doc_id)

    async def list(self, namespace: str) -> list[tuple[str, dict[str, Any]]]:
        stored = await self.inner.list(namespace)
        return [(doc_id, self.open(namespace, doc_id, doc)) for doc_id, doc in stored]
