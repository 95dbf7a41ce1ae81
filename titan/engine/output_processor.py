"""Output processing: the core's token ids become what callers get.

Incremental text (detokenized as tokens arrive, stop strings searched across token boundaries,
text that could still begin one held back), the logprobs' token texts, and the texts of a beam
search's sequences. A stop string ends a request here, where the text is: the engine then
finishes it in the core, which never sees text.
"""

from __future__ import annotations

from dataclasses import dataclass

from titan.engine.core import CoreOutput
from titan.engine.detokenizer import IncrementalDetokenizer
from titan.engine.outputs import (
    BeamOutput,
    FinishReason,
    RequestOutput,
    TokenLogprob,
    TopLogprob,
)
from titan.engine.request import RequestStatus
from titan.engine.sampler import SampledToken
from titan.engine.sampling_params import SamplingParams
from titan.engine.tokenizer import Tokenizer

_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
}


@dataclass
class _Stream:
    params: SamplingParams
    # None for a beam search: its sequences are decoded whole when it finishes.
    detokenizer: IncrementalDetokenizer | None


class OutputProcessor:
    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._streams: dict[str, _Stream] = {}

    def add_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> None:
        detokenizer = IncrementalDetokenizer(
            self.tokenizer,
            prompt_token_ids,
            skip_special_tokens=params.skip_special_tokens,
            stop=params.stop,
            include_stop_str_in_output=params.include_stop_str_in_output,
        )
        self._streams[request_id] = _Stream(params, detokenizer)

    def add_beam_search(self, request_id: str, params: SamplingParams) -> None:
        self._streams[request_id] = _Stream(params, None)

    def process(self, output: CoreOutput) -> RequestOutput:
        """The increment of one request. Finished with a stop string while the core's request
        is not: the caller must finish it in the core."""
        stream = self._streams[output.request_id]
        if stream.detokenizer is None:
            del self._streams[output.request_id]
            return self._beam_search_output(output, stream.params)
        detokenizer = stream.detokenizer
        token = output.token
        if token is not None and not output.is_stop_token:
            detokenizer.add_token(token.token_id)
        finish_reason = _FINISH_REASONS.get(output.status)
        stop_reason: str | int | None = output.stop_reason
        if detokenizer.stop_string is not None and not output.status.is_finished:
            finish_reason, stop_reason = FinishReason.STOP, detokenizer.stop_string
        is_finished = finish_reason is not None
        if is_finished:
            del self._streams[output.request_id]
            detokenizer.flush()
        logprobs: tuple[TokenLogprob, ...] | None = None
        if stream.params.logprobs is not None:
            logprobs = ()
            if token is not None and token.logprob is not None:
                logprobs = (self._token_logprob(token),)
        return RequestOutput(
            request_id=output.request_id,
            text=detokenizer.take_released(is_finished=is_finished),
            token_ids=() if token is None else (token.token_id,),
            logprobs=logprobs,
            is_finished=is_finished,
            finish_reason=finish_reason,
            stop_reason=stop_reason,
            num_prompt_tokens=output.num_prompt_tokens,
            num_output_tokens=output.num_output_tokens,
            num_cached_tokens=output.num_cached_tokens,
        )

    def _token_logprob(self, token: SampledToken) -> TokenLogprob:
        tokenizer = self.tokenizer
        top = tuple(
            TopLogprob(tid, tokenizer.token_text(tid), tokenizer.token_bytes(tid), lp)
            for tid, lp in token.top
        )
        return TokenLogprob(
            token.token_id,
            tokenizer.token_text(token.token_id),
            tokenizer.token_bytes(token.token_id),
            token.logprob if token.logprob is not None else 0.0,
            top,
        )

    def _beam_search_output(self, output: CoreOutput, params: SamplingParams) -> RequestOutput:
        beams = tuple(
            BeamOutput(
                text=self.tokenizer.decode(
                    list(beam.token_ids), skip_special_tokens=params.skip_special_tokens
                ),
                token_ids=beam.token_ids,
                cumulative_logprob=beam.cumulative_logprob,
                score=beam.score,
                finish_reason=beam.finish_reason,
            )
            for beam in output.beams or ()
        )
        best = beams[0] if beams else None
        return RequestOutput(
            request_id=output.request_id,
            text=best.text if best else "",
            token_ids=best.token_ids if best else (),
            logprobs=None,
            is_finished=True,
            # No sequence: aborted (or none could end within its limits).
            finish_reason=best.finish_reason if best else FinishReason.ABORT,
            stop_reason=None,
            num_prompt_tokens=output.num_prompt_tokens,
            num_output_tokens=output.num_output_tokens,
            num_cached_tokens=output.num_cached_tokens,
            beams=beams,
        )
