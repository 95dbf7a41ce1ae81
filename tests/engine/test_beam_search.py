"""Beam search in the engine: width 1 is greedy, n distinct sequences by score, no leaks."""

from __future__ import annotations

import pytest

from titan.engine.config import EngineConfig
from titan.engine.engine import Engine
from titan.engine.sampling_params import BeamSearchParams, SamplingParams
from titan.errors import InvalidRequestError


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(EngineConfig(dtype="float32", num_kv_blocks=256))


@pytest.fixture(scope="module")
def prompt(engine: Engine) -> list[int]:
    return engine.tokenizer.encode("The three best things about autumn are")


def beam_search(engine: Engine, request_id, prompt, params, beam):
    engine.add_beam_search(request_id, prompt, params, beam)
    result = None
    for _ in range(2000):  # a bound, so that a livelock fails instead of hanging
        if not engine.has_unfinished:
            break
        for output in engine.step():
            if output.request_id == request_id:
                result = output
    assert engine.kv.num_free_blocks == engine.kv.num_total_blocks
    engine.kv.pool.check_invariants()
    return result


def test_width_one_equals_greedy(engine, prompt):
    params = SamplingParams(max_tokens=10, temperature=0.0)
    engine.add_request("greedy", prompt, params)
    greedy = []
    while engine.has_unfinished:
        for output in engine.step():
            greedy.extend(output.token_ids)
    result = beam_search(engine, "b1", prompt, params, BeamSearchParams(width=1, num_results=1))
    assert list(result.token_ids) == greedy
    assert len(result.beams) == 1


def test_returns_n_distinct_sequences_sorted_by_score(engine, prompt):
    params = SamplingParams(max_tokens=8, temperature=0.0)
    result = beam_search(engine, "b4", prompt, params, BeamSearchParams(width=4, num_results=3))
    assert result.is_finished and len(result.beams) == 3
    sequences = [beam.token_ids for beam in result.beams]
    assert len(set(sequences)) == 3
    scores = [beam.score for beam in result.beams]
    assert scores == sorted(scores, reverse=True)
    assert result.text == result.beams[0].text
    # The best beam is at least as likely as greedy (length normalized, same length here).
    engine.add_request("g", prompt, params, 0)
    greedy_logprob = 0.0
    engine.add_request("g-lp", prompt, SamplingParams(max_tokens=8, temperature=0.0, logprobs=0))
    while engine.has_unfinished:
        for output in engine.step():
            if output.request_id == "g-lp":
                greedy_logprob += sum(lp.logprob for lp in output.logprobs or ())
    best = result.beams[0]
    if len(best.token_ids) == 8 and best.finish_reason == "length":
        assert best.cumulative_logprob >= greedy_logprob - 1e-4


def test_abort_frees_every_block(engine, prompt):
    params = SamplingParams(max_tokens=30, temperature=0.0)
    engine.add_beam_search("ab", prompt, params, BeamSearchParams(width=3, num_results=2))
    for _ in range(4):
        engine.step()
    output = engine.abort_request("ab")
    assert output is not None and output.finish_reason == "abort"
    while engine.has_unfinished:
        engine.step()
    assert engine.kv.num_free_blocks == engine.kv.num_total_blocks
    assert engine.request_ids() == []


def test_preemption_keeps_the_beams(engine, prompt):
    params = SamplingParams(max_tokens=12, temperature=0.0)
    beam = BeamSearchParams(width=3, num_results=3)
    expected = beam_search(engine, "pre", prompt, params, beam)
    tight = Engine(EngineConfig(dtype="float32", num_kv_blocks=4, max_model_len=64))
    tight.kv.pool.enable_caching = False
    result = beam_search(tight, "pre", prompt, params, beam)
    assert tight.scheduler.num_preemptions > 0
    assert [b.token_ids for b in result.beams] == [b.token_ids for b in expected.beams]


@pytest.mark.parametrize(
    ("width", "num_results", "penalty", "param"),
    [
        (0, 1, 1.0, "n"),
        (11, 1, 1.0, "n"),
        (2, 3, 1.0, "best_of"),
        (2, 1, float("nan"), "length_penalty"),
    ],
)
def test_bad_beam_params_name_the_parameter(width, num_results, penalty, param):
    with pytest.raises(InvalidRequestError) as error:
        BeamSearchParams(width, num_results, penalty)
    assert error.value.param == param
