"""A request's state inside the engine.

The one token-accounting rule: a request has ``num_tokens`` (prompt + output so far) and
``num_computed_tokens`` (tokens whose KV is in the cache) catching up with it. Prefill, chunked
prefill, prefix-cache hits, decode and recompute after preemption are all the same thing at
different sizes.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterator

from titan.engine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"  # blocks freed, back in the waiting queue, recomputes from scratch
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"

    @property
    def is_finished(self) -> bool:
        return self in (
            RequestStatus.FINISHED_STOPPED,
            RequestStatus.FINISHED_LENGTH,
            RequestStatus.FINISHED_ABORTED,
        )


class Request:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        *,
        priority: int = 0,
        arrival_seq: int = 0,
        eos_token_ids: tuple[int, ...] = (),
        shift_scope: str | None = None,
    ):
        self.request_id = request_id
        self.params = params
        self.priority = priority  # lower is served first
        self.arrival_seq = arrival_seq  # FCFS order within a priority class
        self.num_prompt_tokens = len(prompt_token_ids)
        # prompt + output in one list: the runner slices inputs from it without copying twice.
        self.all_token_ids: list[int] = list(prompt_token_ids)
        self.eos_token_ids = eos_token_ids
        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.block_ids: list[int] = []
        # Chained hashes of this request's full blocks (prefix caching), grown lazily.
        self.block_hashes: list[bytes] = []
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache at first admission
        self.num_preemptions = 0
        self.stop_reason: int | None = None  # the stop token id that ended the request
        # Parallel sampling (n > 1): the id of a sibling with the same prompt. This request waits
        # until that sibling has computed the prompt, then shares its KV blocks (copy-on-write of
        # the last one) instead of computing the prompt again. Cleared at first admission.
        self.share_prompt_with: str | None = None
        # Context shift (kv_cache/context_shift.py): the scope (a conversation) whose last
        # sequence this request may reuse KV from with a stretch dropped, and the first of its
        # blocks whose KV is approximate (published under scoped keys; None: all exact).
        self.shift_scope = shift_scope
        self.first_approximate_block: int | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.all_token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens :]

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.all_token_ids[: self.num_prompt_tokens]

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def sort_key(self) -> tuple[int, int]:
        return (self.priority, self.arrival_seq)

    def append_output_token(self, token_id: int) -> None:
        self.all_token_ids.append(token_id)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.value}, "
            f"computed={self.num_computed_tokens}/{self.num_tokens}, blocks={len(self.block_ids)})"
        )


def arrival_counter() -> Iterator[int]:
    """Monotonic arrival sequence numbers, one counter per engine (no global state)."""
    return itertools.count()
