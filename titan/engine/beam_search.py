"""Beam search in the engine's core: runs each group's rounds (beam_scoring) on the scheduler,
forks survivors, frees pruned beams, hands back the groups that finished.

The engine hands over every beam request's sampled token (its top candidates); a beam's own
"sampled" token is never appended by the scheduler, so a beam that has reported computes nothing
until its round closes (the scheduler skips requests with nothing to compute).
"""

from __future__ import annotations

import torch

from titan.engine.beam_scoring import BeamSearchGroup
from titan.engine.request import RequestStatus
from titan.engine.sampler import SampledToken, SamplingRow
from titan.engine.sampling_params import BeamSearchParams, SamplingParams
from titan.engine.scheduler import Scheduler


class BeamSearchDriver:
    def __init__(self, scheduler: Scheduler, eos_token_ids: tuple[int, ...], max_model_len: int):
        self.scheduler = scheduler
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.groups: dict[str, BeamSearchGroup] = {}
        self._group_of: dict[str, str] = {}  # beam request id -> group (client) request id
        # Beams are greedy: the sampler never draws from this generator.
        self._generator = torch.Generator()

    def owns(self, beam_request_id: str) -> bool:
        return beam_request_id in self._group_of

    def add(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        params: SamplingParams,
        beam: BeamSearchParams,
        *,
        priority: int,
        arrival_seq: int,
    ) -> None:
        group = BeamSearchGroup.create(
            request_id,
            prompt_token_ids,
            params,
            beam,
            eos_token_ids=self.eos_token_ids,
            max_model_len=self.max_model_len,
            priority=priority,
            arrival_seq=arrival_seq,
        )
        self.groups[request_id] = group
        for beam_id, live in group.live.items():
            self._group_of[beam_id] = request_id
            self.scheduler.add_request(live.request)

    def row(self, beam_request_id: str) -> SamplingRow:
        group = self.groups[self._group_of[beam_request_id]]
        request = group.live[beam_request_id].request
        return SamplingRow(
            group.params, self._generator, group.prompt_token_ids, request.output_token_ids
        )

    def on_sampled(self, sampled: dict[str, SampledToken]) -> list[BeamSearchGroup]:
        """Record the beams' candidates; close the rounds now complete. Returns the groups that
        finished."""
        closed = []
        for beam_id, token in sampled.items():
            group_id = self._group_of.get(beam_id)
            if group_id is None:
                continue
            group = self.groups[group_id]
            if group.report(beam_id, token.top) and group not in closed:
                closed.append(group)
        finished = []
        for group in closed:
            forks, old_ids = group.advance()
            # Fork first (the survivors take references on their parents' blocks), then free
            # the parents: the shared blocks stay, the pruned beams' blocks return to the pool.
            for parent, child in forks:
                self._group_of[child.request_id] = group.request_id
                self.scheduler.fork(parent, child)
            for old_id in old_ids:
                self._group_of.pop(old_id, None)
                self.scheduler.finish_request(old_id, RequestStatus.FINISHED_STOPPED)
            if group.is_done:
                finished.append(self.groups.pop(group.request_id))
        return finished

    def abort(self, request_id: str) -> BeamSearchGroup | None:
        group = self.groups.pop(request_id, None)
        if group is None:
            return None
        for beam_id in list(group.live):
            self._group_of.pop(beam_id, None)
            self.scheduler.finish_request(beam_id, RequestStatus.FINISHED_ABORTED)
        group.live = {}
        return group
