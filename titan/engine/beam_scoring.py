"""Beam search's rounds and scores: which candidates survive a round, which beams are finished.

Each live beam is one engine request. Each round every live beam computes one token and reports its
top ``2 * width`` next tokens (log-softmax of the raw logits). When all live beams have reported,
the candidates (beam + token) are ranked by their length-penalized score and the best ``width``
survive: a survivor that ends (EOS, a stop token id, max_tokens, the context window) is finished,
the others become the next round's beams. A new beam is a new request forked from its parent (the
parent's KV blocks shared, the last one copied on write); the parents are then freed. vLLM's
algorithm, deterministic.

Pure Python: the engine runs the requests; this module only decides what the beams are.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from titan.engine.outputs import FinishReason
from titan.engine.request import Request
from titan.engine.sampling_params import BeamSearchParams, SamplingParams


@dataclass(frozen=True)
class FinishedBeam:
    token_ids: tuple[int, ...]  # output tokens, the ending EOS / stop token included
    cumulative_logprob: float
    score: float
    finish_reason: FinishReason


@dataclass
class _Beam:
    request: Request
    cumulative_logprob: float


@dataclass
class BeamSearchGroup:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams  # the caller's, made greedy with 2 * width logprobs
    beam: BeamSearchParams
    eos_token_ids: tuple[int, ...]
    max_model_len: int
    priority: int
    arrival_seq: int
    live: dict[str, _Beam] = field(default_factory=dict)
    finished: list[FinishedBeam] = field(default_factory=list)
    # The current round's reports: beam request id -> its (token id, logprob) candidates.
    reports: dict[str, tuple[tuple[int, float], ...]] = field(default_factory=dict)
    num_beams_made: int = 0

    @classmethod
    def create(
        cls,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        beam: BeamSearchParams,
        *,
        eos_token_ids: tuple[int, ...],
        max_model_len: int,
        priority: int,
        arrival_seq: int,
    ) -> BeamSearchGroup:
        beam_params = replace(params, temperature=0.0, logprobs=2 * beam.width, seed=None)
        group = cls(
            request_id,
            list(prompt_token_ids),
            beam_params,
            beam,
            eos_token_ids,
            max_model_len,
            priority,
            arrival_seq,
        )
        first = group._new_request([])
        group.live[first.request_id] = _Beam(first, 0.0)
        return group

    def _new_request(self, output_token_ids: list[int]) -> Request:
        request = Request(
            f"{self.request_id}#beam{self.num_beams_made}",
            self.prompt_token_ids,
            self.params,
            priority=self.priority,
            arrival_seq=self.arrival_seq,
            eos_token_ids=self.eos_token_ids,
        )
        request.all_token_ids.extend(output_token_ids)
        self.num_beams_made += 1
        return request

    @property
    def is_done(self) -> bool:
        return not self.live

    def report(self, beam_id: str, top: tuple[tuple[int, float], ...]) -> bool:
        """Record a beam's candidates; True when every live beam has reported this round."""
        self.reports[beam_id] = top
        return len(self.reports) == len(self.live)

    def score(self, output_token_ids: list[int] | tuple[int, ...], cum_logprob: float) -> float:
        length = len(output_token_ids)
        if output_token_ids and self._ends(output_token_ids[-1]):
            length -= 1  # the ending token is not text (vLLM, HF)
        return cum_logprob / max(length, 1) ** self.beam.length_penalty

    def _ends(self, token_id: int) -> bool:
        if token_id in self.params.stop_token_ids:
            return True
        return not self.params.ignore_eos and token_id in self.eos_token_ids

    def advance(self) -> tuple[list[tuple[Request, Request]], list[str]]:
        """Close the round: returns the (parent, child) forks to make and the old beam ids to
        free. Finished survivors go to ``finished``."""
        candidates = []
        for beam_id, beam in self.live.items():
            request = beam.request
            may_end = request.num_output_tokens >= self.params.min_tokens
            for token_id, logprob in self.reports[beam_id]:
                if self._ends(token_id) and not may_end:
                    continue
                output_ids = [*request.output_token_ids, token_id]
                cum_logprob = beam.cumulative_logprob + logprob
                candidates.append(
                    (self.score(output_ids, cum_logprob), beam, token_id, cum_logprob)
                )
        candidates.sort(key=lambda candidate: candidate[0], reverse=True)  # stable: deterministic
        forks = []
        next_live: dict[str, _Beam] = {}
        for score, beam, token_id, cum_logprob in candidates[: self.beam.width]:
            output_ids = [*beam.request.output_token_ids, token_id]
            reason = None
            if self._ends(token_id):
                reason = FinishReason.STOP
            elif (
                len(output_ids) >= self.params.max_tokens
                or len(self.prompt_token_ids) + len(output_ids) >= self.max_model_len
            ):
                reason = FinishReason.LENGTH
            if reason is not None:
                self.finished.append(FinishedBeam(tuple(output_ids), cum_logprob, score, reason))
                continue
            child = self._new_request(output_ids)
            next_live[child.request_id] = _Beam(child, cum_logprob)
            forks.append((beam.request, child))
        old_ids = list(self.live)
        self.live = next_live
        self.reports = {}
        return forks, old_ids

    def results(self) -> list[FinishedBeam]:
        """The ``num_results`` best finished beams, best first (once ``is_done``)."""
        ranked = sorted(self.finished, key=lambda beam: beam.score, reverse=True)
        return ranked[: self.beam.num_results]
