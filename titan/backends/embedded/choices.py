"""n, best_of and beam search on the embedded model: how many sequences run, which come back.

- n > 1: n engine requests whose children fork the first one's prompt KV (computed once).
- best_of > n (completions, not streamed): best_of requests, the n with the highest cumulative
  logprob come back (vLLM's semantics).
- use_beam_search (vLLM's extra): one beam-search request per prompt, width best_of (else n),
  its n best sequences come back as the choices. Deterministic, so temperature must be 0.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from titan.backends.embedded.convert import finish_reason
from titan.engine.outputs import RequestOutput
from titan.engine.sampling_params import BeamSearchParams, SamplingParams
from titan.errors import InvalidRequestError
from titan.protocol import ChatCompletionRequest, CompletionRequest

Request = ChatCompletionRequest | CompletionRequest


def _best_of(request: Request) -> int | None:
    return getattr(request, "best_of", None)


def _invalid(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"Invalid value for '{param}': {message}", param=param)


def beam_search_options(request: Request) -> BeamSearchParams | None:
    """The beam search a request asks for (None: sampling); invalid combinations are 400s."""
    if not request.use_beam_search:
        return None
    if request.stream:
        raise _invalid("stream", "beam search cannot stream; set stream to false.")
    if request.temperature not in (None, 0.0):
        raise _invalid("temperature", "beam search is deterministic: temperature must be 0.")
    if request.top_p not in (None, 1.0) or request.top_k not in (None, 0, -1):
        param = "top_p" if request.top_p not in (None, 1.0) else "top_k"
        raise _invalid(param, "beam search ranks by the model's own log-probabilities.")
    if getattr(request, "logprobs", None) not in (None, False):
        raise _invalid("logprobs", "logprobs are not supported with beam search.")
    if request.stop:
        raise _invalid("stop", "stop strings are not supported with beam search.")
    best_of = _best_of(request)
    return BeamSearchParams(
        width=best_of or request.n,
        num_results=request.n,
        length_penalty=request.length_penalty,
    )


def check_beam_params(params: list[SamplingParams]) -> None:
    """Beams rank by the raw model distribution: an output constraint cannot apply."""
    if any(p.structured is not None for p in params):
        raise _invalid(
            "use_beam_search",
            "beam search cannot be combined with structured output or forced tool calls.",
        )


def num_sampled_choices(request: Request) -> int:
    """How many sequences to sample per prompt: best_of when it exceeds n."""
    best_of = _best_of(request)
    if best_of is None or request.use_beam_search:
        return request.n
    if best_of < request.n:
        raise _invalid("best_of", f"must be >= n ({request.n}), got {best_of}.")
    if best_of > request.n and request.stream:
        raise _invalid("best_of", "best_of greater than n cannot be streamed.")
    return best_of


def scoring_params(params: SamplingParams, request: Request) -> SamplingParams:
    """best_of ranks by cumulative logprob: the engine must report the sampled tokens'."""
    if num_sampled_choices(request) > request.n and params.logprobs is None:
        return replace(params, logprobs=0)
    return params


def best_choices(runs: list[Any], results: list[Any], n: int) -> tuple[list[Any], list[Any]]:
    """Per prompt, the n results with the highest cumulative logprob, reindexed 0..n-1."""
    by_prompt: dict[int, list[tuple[Any, Any]]] = {}
    for run, result in zip(runs, results, strict=True):
        by_prompt.setdefault(run.prompt_index, []).append((run, result))
    kept_runs, kept_results = [], []
    for prompt_index, pairs in by_prompt.items():
        ranked = sorted(
            pairs, key=lambda pair: sum(lp.logprob for lp in pair[1].logprobs), reverse=True
        )
        for rank, (run, result) in enumerate(ranked[:n]):
            kept_runs.append(replace(run, choice_index=prompt_index * n + rank))
            kept_results.append(result)
    return kept_runs, kept_results


def fill_from_beams(output: RequestOutput, results: list[Any]) -> None:
    """Copy a beam search's sequences, best first, into the prompt's n choice results."""
    for result, beam in zip(results, output.beams, strict=False):
        result.text = beam.text
        result.finish_reason = finish_reason(beam.finish_reason)
        result.num_output_tokens = len(beam.token_ids)
        result.num_cached_tokens = output.num_cached_tokens
    for result in results[len(output.beams) :]:
        result.finish_reason = finish_reason(output.finish_reason)
