"""Context shift on the real model: the kept tokens' KV is copied from the scope's last sequence
with keys rotated to their new positions. Layer 0's keys and values depend on nothing but the
token and its position, so there they must equal a fresh exact computation; deeper layers keep
what they saw of the dropped stretch (the approximation), so there they differ."""

from __future__ import annotations

import pytest
import torch

from titan.engine.config import EngineConfig
from titan.engine.engine import Engine
from titan.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.slow


def tokens(engine: Engine, text: str) -> list[int]:
    return engine.tokenizer.encode(text, add_special_tokens=False)


def layer_kv(engine: Engine, request_id: str, layer: int, positions: range) -> torch.Tensor:
    """Keys and values of a running request at ``positions`` in one layer, [n, 2, heads, dim]."""
    runner, size = engine.core.runner, engine.config.block_size
    blocks = engine.core.scheduler.requests[request_id].block_ids
    key_cache, value_cache = runner.kv_caches[layer]
    slots = [(blocks[p // size], p % size) for p in positions]
    keys = torch.stack([key_cache[b, :, :, o] for b, o in slots]).float()
    values = torch.stack([value_cache[b, o] for b, o in slots]).float()
    return torch.stack([keys, values], dim=1)


def run_to_end(engine: Engine) -> dict[str, list[int]]:
    outputs: dict[str, list[int]] = {}
    while engine.has_unfinished:
        for output in engine.step():
            outputs.setdefault(output.request_id, []).extend(output.token_ids)
    return outputs


@pytest.mark.parametrize("dtype", ["float32", "auto"])  # the torch path; the default kernels
def test_kept_tokens_keep_their_kv_moved_to_their_new_positions(dtype: str):
    engine = Engine(EngineConfig(dtype=dtype))
    system = tokens(engine, "You are a helpful assistant. Answer in one short sentence.")
    dropped = tokens(engine, " The first topic was the history of the printing press in Europe,")
    dropped += tokens(engine, " from Gutenberg's workshop in Mainz to the spread of presses.")
    kept = tokens(engine, " Now the question is about rivers: the Nile flows north through")
    kept += tokens(engine, " Egypt, the Amazon carries the most water, and the Danube runs")
    kept += tokens(engine, " through ten countries. The Thames is short but famous, the Volga")
    kept += tokens(engine, " is the longest in Europe. Which river carries the most water?")
    params = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)

    engine.add_request("earlier", system + dropped + kept, params, shift_scope="conversation")
    run_to_end(engine)
    trimmed = system + kept + tokens(engine, " Answer:")
    engine.add_request("shifted", trimmed, params, shift_scope="conversation")
    first = engine.step()
    # The earlier sequence's blocks that were full when it ended hold most of the kept stretch.
    reused_end = first[0].num_cached_tokens
    assert reused_end >= len(system) + 32 and engine.stats().num_shifted_tokens >= 32
    moved = range(len(system), reused_end)
    shifted = {layer: layer_kv(engine, "shifted", layer, moved) for layer in (0, 29)}
    outputs = run_to_end(engine)
    assert len([*first[0].token_ids, *outputs["shifted"]]) == params.max_tokens

    engine.add_request("exact", trimmed, params)  # no scope: computed, never shifted
    engine.step()
    exact = {layer: layer_kv(engine, "exact", layer, moved) for layer in (0, 29)}
    run_to_end(engine)
    tolerance = 1e-4 if dtype == "float32" else 2e-2
    torch.testing.assert_close(shifted[0], exact[0], atol=tolerance, rtol=tolerance)
    # The last layer's KV is the earlier sequence's: it saw the dropped stretch.
    assert (shifted[29] - exact[29]).abs().max() > 10 * tolerance
    engine.core.kv.pool.check_invariants()
    assert engine.core.kv.num_free_blocks == engine.core.kv.num_total_blocks
