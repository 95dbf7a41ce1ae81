"""Retrieval over a tenant's own documents: OpenAI's Files and Vector Stores APIs.

Files keep their text as documents; a vector store cuts its files into token chunks, embeds them
with the shared sentence embedder and searches them by cosine similarity. Every object belongs to
one tenant: another tenant's ids answer 404, exactly like ids that never existed.
"""

from titan.context.rag.chunking import Chunk, chunk_text
from titan.context.rag.files import MAX_FILE_BYTES, Files, FileTooLargeError
from titan.context.rag.ingestion import TextEmbedder
from titan.context.rag.vector_stores import VectorStores

__all__ = [
    "MAX_FILE_BYTES",
    "Chunk",
    "FileTooLargeError",
    "Files",
    "TextEmbedder",
    "VectorStores",
    "chunk_text",
]
