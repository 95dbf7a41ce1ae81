"""Constrained decoding (structured output) with llguidance.

Three pieces:
- ``GrammarCache``: compiles a ``StructuredOutput`` (JSON schema, JSON object, regex, choice,
  Lark/GBNF grammar) into an llguidance grammar, validated against the tokenizer; an LRU keyed by
  (kind, canonical spec), so a schema sent again costs a dictionary lookup.
- ``ConstraintState``: one request's matcher; it advances with each sampled token.
- ``MaskBatch``: this step's allowed-token bitmasks for the constrained rows, computed in one
  batched call on a worker thread while the forward pass runs (llguidance releases the GIL), and
  waited for by the sampler.

Why llguidance (bench/RESULTS.md, "Structured output"): no Python dependencies (one abi3 wheel),
JSON schema + regex + Lark grammars, ~1 ms to compile a schema and ~11 µs median per token mask on
SmolLM2's 49,152-token vocabulary; xgrammar masks faster but needs transformers, triton and
apache-tvm-ffi; outlines-core spends ~70 ms per schema compile and has no context-free grammars.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llguidance
import torch

from titan.engine.grammar_closing import MINIMUM_SEARCH_BYTES, ClosingBudget, GrammarCloser
from titan.engine.sampling_params import StructuredOutput
from titan.errors import InvalidRequestError

log = logging.getLogger(__name__)

# JSON is generated compactly but with the spaces models are used to ({"a": 1, "b": 2}); no
# free whitespace: small models given free whitespace can loop on newlines until max_tokens.
_JSON_OPTIONS: llguidance.JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
_ANY_JSON_OBJECT = '{"type":"object"}'
DEFAULT_CACHE_SIZE = 256


def canonical_key(structured: StructuredOutput) -> tuple[str, str]:
    """(kind, spec) with JSON specs re-serialized compactly (key order kept: it is the order the
    properties are generated in), so equal schemas share one cache entry."""
    if structured.kind == "json_object":
        return ("json_object", "")
    if structured.kind == "choice":
        return ("choice", json.dumps(list(structured.choices), ensure_ascii=False))
    if structured.kind == "json_schema":
        try:
            schema = json.loads(structured.spec)
        except ValueError as exc:
            raise _invalid(structured, f"the schema is not valid JSON ({exc})") from exc
        if not isinstance(schema, dict):
            raise _invalid(structured, "the schema must be a JSON object")
        return ("json_schema", json.dumps(schema, separators=(",", ":"), ensure_ascii=False))
    return (structured.kind, structured.spec)


def _to_grammar(kind: str, spec: str) -> str:
    """An llguidance grammar (JSON text) for a canonical (kind, spec)."""
    if kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema(_ANY_JSON_OBJECT, _JSON_OPTIONS)
    if kind == "json_schema":
        return llguidance.LLMatcher.grammar_from_json_schema(spec, _JSON_OPTIONS)
    if kind == "regex":
        # \d and \w mean ASCII digits and word characters (JSON Schema's and most clients'
        # reading); Rust's Unicode \d lets a small model write digits like "🯸".
        return llguidance.LLMatcher.grammar_from_lark(
            "start: /" + llguidance.regex_to_lark(spec, "dw") + "/"
        )
    if kind == "choice":
        # Lark string literals take JSON's escapes, so json.dumps quotes any choice safely.
        choices = json.loads(spec)
        return llguidance.LLMatcher.grammar_from_lark(
            "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
        )
    if "::=" in spec:  # GBNF (llama.cpp's grammar format, accepted by vLLM): convert to Lark
        from llguidance.gbnf_to_lark import gbnf_to_lark

        spec = gbnf_to_lark(spec)
    return llguidance.LLMatcher.grammar_from_lark(spec)


class GrammarCache:
    """Compiled grammars for one tokenizer. Thread-safe: requests are validated on the event
    loop's thread and started on the engine's."""

    def __init__(
        self,
        tokenizer_json: Path,
        vocab_size: int,
        eos_token_ids: tuple[int, ...],
        max_entries: int = DEFAULT_CACHE_SIZE,
    ):
        self._tokenizer_json = tokenizer_json
        self.vocab_size = vocab_size
        self._eos_token_ids = list(eos_token_ids)
        self._max_entries = max_entries
        self._grammars: OrderedDict[tuple[str, str], str] = OrderedDict()
        self._lock = threading.Lock()
        self._tokenizer: llguidance.LLTokenizer | None = None
        self.num_hits = 0
        self.num_misses = 0

    @property
    def tokenizer(self) -> llguidance.LLTokenizer:
        # Built on first use (~0.2 s): servers that never constrain output never pay for it.
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = llguidance.LLTokenizer(
                    self._tokenizer_json.read_text(),
                    n_vocab=self.vocab_size,
                    eos_token=self._eos_token_ids,
                )
            return self._tokenizer

    def compile(self, structured: StructuredOutput) -> str:
        """The validated grammar; InvalidRequestError (400, naming ``structured.param``) with
        llguidance's reason when the spec does not compile."""
        key = canonical_key(structured)
        with self._lock:
            grammar = self._grammars.get(key)
            if grammar is not None:
                self._grammars.move_to_end(key)
                self.num_hits += 1
                return grammar
        tokenizer = self.tokenizer
        try:
            grammar = _to_grammar(*key)
        except Exception as exc:  # llguidance raises ValueError/RuntimeError on bad specs
            raise _invalid(structured, str(exc)) from exc
        error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
        if error:
            raise _invalid(structured, error)
        with self._lock:
            self.num_misses += 1
            self._grammars[key] = grammar
            while len(self._grammars) > self._max_entries:
                self._grammars.popitem(last=False)
        return grammar

    def check_room(self, structured: StructuredOutput, max_tokens: int, closer: GrammarCloser):
        """A 400 naming max_tokens when the shortest output found that satisfies ``structured``
        is longer than ``max_tokens`` (and the spec's own 400 when it does not compile)."""
        needed = self.new_state(structured).minimum_tokens(closer)
        if needed is not None and needed > max_tokens:
            raise InvalidRequestError(
                f"max_tokens is {max_tokens}, but the shortest output that satisfies this "
                f"{structured.param} takes {needed} tokens: raise max_tokens to at least "
                f"{needed}.",
                param="max_tokens",
            )

    def new_state(
        self, structured: StructuredOutput, closer: GrammarCloser | None = None
    ) -> ConstraintState:
        """A fresh matcher; with ``closer``, one kept able to end within its budget."""
        matcher = llguidance.LLMatcher(self.tokenizer, self.compile(structured), log_level=0)
        if matcher.is_error():
            raise _invalid(structured, matcher.get_error())
        budget = None if closer is None else ClosingBudget(closer, self.tokenizer.eos_token)
        return ConstraintState(matcher, structured.kind, budget)


class ConstraintState:
    """One request's position in its grammar."""

    def __init__(
        self, matcher: llguidance.LLMatcher, kind: str = "", budget: ClosingBudget | None = None
    ):
        self.matcher = matcher
        self.kind = kind
        self._budget = budget  # None: no steering toward an end (not a sampled request)
        self.is_broken = False  # the matcher rejected a token: the request goes on unconstrained

    def forced_token(self, remaining: int) -> int | None:
        """Near the end of the budget: the one token allowed this step (the next of a text
        that ends the grammar), once the tokens left barely cover it; None: sample as usual."""
        if self.is_broken or self._budget is None:
            return None
        return self._budget.forced_token(self.matcher, remaining)

    def vet(self, token_id: int, remaining: int) -> int:
        """The sampled token, or the closing text's next one when the grammar could not end
        within the tokens left after the sampled one."""
        if self.is_broken or self._budget is None:
            return token_id
        return self._budget.vet(self.matcher, token_id, remaining)

    def minimum_tokens(
        self, closer: GrammarCloser, limit: int = MINIMUM_SEARCH_BYTES
    ) -> int | None:
        """Tokens of the shortest output found from here (an upper bound of the true minimum);
        None when none is found within ``limit`` bytes."""
        token_ids = closer.completion(self.matcher, limit=limit)
        return None if token_ids is None else len(token_ids)

    @property
    def is_satisfied(self) -> bool:
        """The output so far is whole: the grammar may end here."""
        return not self.is_broken and self.matcher.is_accepting()

    def advance(self, token_id: int) -> None:
        if self.is_broken:
            return
        if not self.matcher.consume_token(token_id):
            # Cannot happen for a token the mask allowed; never fail the request over it.
            log.warning("grammar rejected token %d: %s", token_id, self.matcher.get_error())
            self.is_broken = True
        elif self._budget is not None:
            self._budget.advanced(token_id)

    @property
    def is_complete(self) -> bool:
        """The grammar admits nothing more but the end: the request stops here."""
        return not self.is_broken and self.matcher.is_stopped()


@dataclass
class RowMask:
    """A constrained row's slot in this step's MaskBatch."""

    batch: MaskBatch
    slot: int


class MaskBatch:
    """Bitmasks (int32 words, bit t = token t allowed) for this step's constrained rows."""

    def __init__(
        self,
        states: list[ConstraintState],
        vocab_size: int,
        pool: ThreadPoolExecutor,
        executor: llguidance.LLExecutor,
    ):
        num_words = (vocab_size + 31) // 32
        self.bitmask = torch.full((len(states), num_words), -1, dtype=torch.int32)
        work = [(s.matcher, slot) for slot, s in enumerate(states) if not s.is_broken]
        self._ready: Future[None] = pool.submit(
            executor.unsafe_compute_mask_ptr,
            work,
            self.bitmask.data_ptr(),
            num_words * 4,
            len(states),
        )

    def wait(self) -> torch.Tensor:
        self._ready.result()
        return self.bitmask


class MaskWorker:
    """Owns the thread that computes masks during the forward pass."""

    def __init__(self, grammars: GrammarCache):
        self._grammars = grammars
        self._pool: ThreadPoolExecutor | None = None
        self._executor: llguidance.LLExecutor | None = None

    def start(self, rows: list[Any]) -> None:
        """Start computing this step's masks for the rows (SamplingRow) that have a constraint;
        each such row's ``mask`` is set, every other row's cleared."""
        constrained = [row for row in rows if row.constraint is not None]
        for row in rows:
            row.mask = None
        if not constrained:
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="titan-grammar")
            self._executor = llguidance.LLExecutor()
        states = [row.constraint for row in constrained]
        batch = MaskBatch(states, self._grammars.vocab_size, self._pool, self._executor)
        for slot, row in enumerate(constrained):
            row.mask = RowMask(batch, slot)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def apply_masks(logits: torch.Tensor, row_indices: list[int], masks: list[RowMask]) -> None:
    """Set the logits of disallowed tokens to -inf on the given rows, in one masked fill.

    Tokens past the tokenizer's vocabulary (padded model vocabularies) are never allowed. A row
    whose mask allows nothing (a grammar error) is left unmasked rather than made all -inf.
    """
    words = torch.stack([m.batch.wait()[m.slot] for m in masks])
    bits = torch.arange(32, dtype=torch.int32)
    allowed = ((words.unsqueeze(-1) >> bits) & 1).bool().flatten(1)
    vocab = logits.shape[-1]
    if allowed.shape[1] < vocab:
        allowed = torch.nn.functional.pad(allowed, (0, vocab - allowed.shape[1]), value=False)
    allowed = allowed[:, :vocab]
    allowed |= ~allowed.any(dim=1, keepdim=True)
    index = torch.tensor(row_indices, dtype=torch.long)
    logits[index] = logits[index].masked_fill(~allowed, float("-inf"))


def _invalid(structured: StructuredOutput, reason: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"Invalid {structured.kind} for '{structured.param}': {reason.strip()}",
        param=structured.param,
    )
