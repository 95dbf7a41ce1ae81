"""Embedded requests as engine runs: one run per choice of each prompt (n x prompts), and the
usage they add up to."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from titan.backends.embedded.choices import (
    beam_search_options,
    num_sampled_choices,
    scoring_params,
)
from titan.backends.embedded.convert import (
    check_chat_supported,
    check_completion_supported,
    choice_seed,
    resolve_max_tokens,
    sampling_params,
)
from titan.backends.embedded.engine_handle import EngineHandle
from titan.backends.embedded.tools import ToolPlan, forced_call_constraint, render_chat_prompt
from titan.engine.outputs import TokenLogprob
from titan.engine.sampling_params import SamplingParams
from titan.errors import InvalidRequestError
from titan.protocol import ChatCompletionRequest, CompletionRequest, Usage


@dataclass(frozen=True)
class ChoiceRun:
    """One engine request: one choice of one prompt."""

    choice_index: int  # prompt_index * n + i
    prompt_index: int
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    priority: int = 0
    # n > 1: the run of the same prompt whose prompt KV this one forks (computed once).
    share_prompt_with: str | None = None
    # A forced "required" reply with parallel calls: cut at the first repeated call.
    cuts_repeated_calls: bool = False
    # The conversation the request continues (context shift: Engine.add_request).
    shift_scope: str | None = None


@dataclass
class ChoiceResult:
    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    num_output_tokens: int = 0
    num_cached_tokens: int = 0


def usage_of(runs: list[ChoiceRun], results: list[ChoiceResult]) -> Usage:
    """Prompt tokens once per prompt (not once per choice), completion tokens summed.

    The n choices of a prompt share it, and only one of them had to compute it: the prompt's
    cached count is the smallest any of its choices saw.
    """
    num_prompt_tokens: dict[int, int] = {}
    num_cached_tokens: dict[int, int] = {}
    for run, result in zip(runs, results, strict=True):
        num_prompt_tokens[run.prompt_index] = len(run.prompt_token_ids)
        previous = num_cached_tokens.get(run.prompt_index, result.num_cached_tokens)
        num_cached_tokens[run.prompt_index] = min(previous, result.num_cached_tokens)
    return Usage.of(
        sum(num_prompt_tokens.values()),
        sum(result.num_output_tokens for result in results),
        sum(num_cached_tokens.values()),
    )


def _with_forced_calls(params: SamplingParams, plan: ToolPlan) -> SamplingParams:
    """tool_choice "required" or named: the output constrained to the call's JSON."""
    constraint = forced_call_constraint(plan)
    if constraint is None:
        return params
    if params.structured is not None:
        raise InvalidRequestError(
            "Invalid value for 'tool_choice': a forced tool call cannot be combined with "
            "structured output ('response_format' or 'guided_*'): both constrain the output.",
            param="tool_choice",
        )
    return replace(params, structured=constraint)


def chat_runs(
    engine: EngineHandle,
    request: ChatCompletionRequest,
    request_id: str,
    plan: ToolPlan,
    shift_scope: str | None = None,
) -> list[ChoiceRun]:
    check_chat_supported(request)
    tokenizer = engine.tokenizer
    text = render_chat_prompt(tokenizer, request, plan)
    prompt_ids = tokenizer.encode(text, add_special_tokens=False)
    max_tokens = resolve_max_tokens(
        request.max_output_tokens, len(prompt_ids), engine.max_model_len, "messages"
    )
    beam_search_options(request)  # a bad combination is a 400 before anything runs
    return [
        ChoiceRun(
            choice_index=i,
            prompt_index=0,
            request_id=f"{request_id}-{i}",
            prompt_token_ids=prompt_ids,
            params=_with_forced_calls(
                sampling_params(
                    request,
                    max_tokens=max_tokens,
                    num_logprobs=request.num_logprobs,
                    seed=choice_seed(request.seed, i),
                ),
                plan,
            ),
            priority=request.priority,
            share_prompt_with=f"{request_id}-0" if i else None,
            cuts_repeated_calls=plan.mode == "required" and plan.is_parallel,
            # n > 1 forks the first choice's prompt KV instead.
            shift_scope=shift_scope if request.n == 1 else None,
        )
        for i in range(request.n)
    ]


def _completion_prompt(engine: EngineHandle, prompt: str | list[int]) -> list[int]:
    tokenizer = engine.tokenizer
    if isinstance(prompt, str):
        # As vLLM: a raw prompt gets the tokenizer's special tokens (BOS, if it has one).
        token_ids = tokenizer.encode(prompt, add_special_tokens=True)
    else:
        out_of_range = [token for token in prompt if token >= tokenizer.vocab_size]
        if out_of_range:
            raise InvalidRequestError(
                f"Invalid value for 'prompt': token id {out_of_range[0]} is out of range "
                f"(the vocabulary has {tokenizer.vocab_size} tokens).",
                param="prompt",
            )
        token_ids = prompt
    if not token_ids:
        raise InvalidRequestError("Invalid value for 'prompt': it is empty.", param="prompt")
    return token_ids


def completion_runs(
    engine: EngineHandle, request: CompletionRequest, request_id: str
) -> tuple[list[ChoiceRun], list[str]]:
    """The runs, and each prompt's text (for echo)."""
    check_completion_supported(request)
    beam_search_options(request)  # a bad combination is a 400 before anything runs
    num_choices = num_sampled_choices(request)
    runs: list[ChoiceRun] = []
    prompt_texts: list[str] = []
    for prompt_index, prompt in enumerate(request.prompts):
        prompt_ids = _completion_prompt(engine, prompt)
        if isinstance(prompt, str):
            prompt_texts.append(prompt)
        else:
            prompt_texts.append(engine.tokenizer.decode(prompt) if request.echo else "")
        max_tokens = resolve_max_tokens(
            request.max_tokens, len(prompt_ids), engine.max_model_len, "prompt"
        )
        first_run_id = f"{request_id}-{prompt_index * num_choices}"
        for i in range(num_choices):
            params = sampling_params(
                request,
                max_tokens=max_tokens,
                num_logprobs=request.logprobs,
                seed=choice_seed(request.seed, i),
            )
            choice_index = prompt_index * num_choices + i
            run_id = f"{request_id}-{choice_index}"
            runs.append(
                ChoiceRun(
                    choice_index,
                    prompt_index,
                    run_id,
                    prompt_ids,
                    scoring_params(params, request),
                    request.priority,
                    share_prompt_with=first_run_id if i else None,
                )
            )
    return runs, prompt_texts
