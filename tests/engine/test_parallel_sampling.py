"""n > 1 as one prompt computed once and forked: KV sharing, seeded equality, abort, preemption."""

from __future__ import annotations

import pytest

from titan.engine.config import EngineConfig
from titan.engine.engine import Engine
from titan.engine.sampling_params import SamplingParams

PROMPT_TEXT = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle. The story "
    "should mention the sea, the wind, an old map, a seagull named Pip and a storm that lasts "
    "three days. Keep it gentle and end on a hopeful note for the keeper and the village."
)


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(EngineConfig(dtype="float32", num_kv_blocks=256))


@pytest.fixture(scope="module")
def prompt(engine: Engine) -> list[int]:
    token_ids = engine.tokenizer.encode(PROMPT_TEXT)
    assert len(token_ids) > 3 * engine.config.block_size + 1  # several blocks + a partial one
    assert len(token_ids) % engine.config.block_size != 1  # the fork copies a partial block
    return token_ids


def run(engine: Engine, requests: dict[str, tuple[SamplingParams, str | None]], prompt):
    """Add the requests, step to the end; (tokens per id, finish reasons, peak used blocks)."""
    for request_id, (params, sibling) in requests.items():
        engine.add_request(request_id, prompt, params, share_prompt_with=sibling)
    tokens: dict[str, list[int]] = {rid: [] for rid in requests}
    reasons = {}
    peak = 0
    while engine.has_unfinished:
        outputs = engine.step()
        peak = max(peak, engine.kv.num_total_blocks - engine.kv.num_free_blocks)
        for output in outputs:
            tokens[output.request_id].extend(output.token_ids)
            if output.is_finished:
                reasons[output.request_id] = output.finish_reason
    assert engine.kv.num_free_blocks == engine.kv.num_total_blocks
    engine.kv.pool.check_invariants()
    return tokens, reasons, peak


def seeded(i: int, max_tokens: int = 6) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=100 + i, ignore_eos=True)


def test_n4_shares_the_prompt_blocks_and_equals_four_seeded_requests(engine, prompt):
    engine.kv.pool.enable_caching = False  # separate requests may not share through the cache
    try:
        alone, _, peak_alone = run(engine, {f"a{i}": (seeded(i), None) for i in range(4)}, prompt)
        group = {f"g{i}": (seeded(i), "g0" if i else None) for i in range(4)}
        forked, _, peak_forked = run(engine, group, prompt)
    finally:
        engine.kv.pool.enable_caching = True
    assert [forked[f"g{i}"] for i in range(4)] == [alone[f"a{i}"] for i in range(4)]
    assert len({tuple(t) for t in forked.values()}) > 1  # really sampled, not one answer x4
    num_prompt_blocks = -(-len(prompt) // engine.config.block_size)
    # Separate: 4 full copies of the prompt; forked: one copy + a private tail per child.
    assert peak_alone >= 4 * num_prompt_blocks
    assert peak_forked <= num_prompt_blocks + 3 * 2
    assert peak_forked < peak_alone


def test_children_finish_independently(engine, prompt):
    lengths = [1, 3, 5]
    group = {f"f{i}": (seeded(i, max_tokens=n), "f0" if i else None) for i, n in enumerate(lengths)}
    tokens, reasons, _ = run(engine, group, prompt)
    assert [len(tokens[f"f{i}"]) for i in range(3)] == lengths
    assert all(reason == "length" for reason in reasons.values())


def test_aborting_the_leader_and_a_child_frees_every_block(engine, prompt):
    for i in range(3):
        engine.add_request(f"x{i}", prompt, seeded(i, 20), share_prompt_with="x0" if i else None)
    engine.step()  # the leader computes the prompt; the children wait for it
    engine.abort_request("x0")  # the children fall back to a normal admission
    engine.step()
    engine.abort_request("x1")
    while engine.has_unfinished:
        engine.step()
    assert engine.kv.num_free_blocks == engine.kv.num_total_blocks
    engine.kv.pool.check_invariants()


def test_preemption_inside_a_group_keeps_the_output(engine, prompt):
    group = {f"p{i}": (seeded(i, 12), "p0" if i else None) for i in range(4)}
    expected, _, _ = run(engine, group, prompt)
    num_prompt_blocks = -(-len(prompt) // engine.config.block_size)
    tight = Engine(
        EngineConfig(dtype="float32", num_kv_blocks=num_prompt_blocks + 4, max_model_len=128)
    )
    tight.kv.pool.enable_caching = False  # recompute for real after each preemption
    tokens, _, _ = run(tight, group, prompt)
    assert tight.scheduler.num_preemptions > 0
    assert [tokens[f"p{i}"] for i in range(4)] == [expected[f"p{i}"] for i in range(4)]
