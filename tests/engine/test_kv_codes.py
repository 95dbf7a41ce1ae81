"""The int8 attention unit's KV codes (kernels/kv_codes.h) on the real model: wherever the
engine writes or moves a key or a value (a prefill, decode steps, copy-on-write of a forked
prompt, context shift's rotated copy), its codes are the ones computed afresh from the float16
key or value."""

from __future__ import annotations

import pytest
import torch

from titan.engine.config import EngineConfig
from titan.engine.engine import Engine
from titan.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.slow


def _fresh_codes(engine: Engine) -> list[torch.Tensor]:
    model = engine.core.runner.model
    fresh = []
    for (keys, values), codes in zip(engine.core.runner.kv_caches, model.kv_codes, strict=True):
        expected = torch.empty_like(codes)
        model.kernels.kv_codes(keys.numpy(), values.numpy(), expected.numpy())
        fresh.append(expected)
    return fresh


def _run_to_end(engine: Engine) -> None:
    while engine.has_unfinished:
        engine.step()


def test_kv_codes_follow_every_key_the_engine_writes():
    engine = Engine(EngineConfig(num_kv_blocks=96))  # attention_precision auto
    model = engine.core.runner.model
    if not getattr(model, "uses_kv_codes", False):
        pytest.skip("this CPU's attention keeps no KV codes (no int8 unit here)")
    # unwritten memory consistent with its codes, so that every block can be compared
    for (keys, values), codes in zip(engine.core.runner.kv_caches, model.kv_codes, strict=True):
        keys.zero_()
        values.zero_()
        model.kernels.kv_codes(keys.numpy(), values.numpy(), codes.numpy())
    encode = engine.tokenizer.encode
    system = encode("You are a helpful assistant. Answer in one short sentence.")
    dropped = encode(" The first topic was the printing press in Europe, from Mainz onward.")
    kept = encode(" Now rivers: the Nile flows north, the Amazon carries the most water,") * 3
    params = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)

    engine.add_request("earlier", system + dropped + kept, params, shift_scope="talk")
    _run_to_end(engine)
    engine.add_request("shifted", system + kept + encode(" Answer:"), params, shift_scope="talk")
    _run_to_end(engine)
    assert engine.stats().num_shifted_tokens >= 32
    sampled = SamplingParams(max_tokens=5, temperature=1.0, seed=3)
    prompt = encode(" Name three rivers of Europe, please:")  # ends inside a block: copied
    engine.add_request("a", prompt, sampled)
    engine.add_request("b", prompt, SamplingParams(max_tokens=5, temperature=1.0, seed=4),
                       share_prompt_with="a")  # fmt: skip
    _run_to_end(engine)
    keys_written = values_written = 0
    key_scales = model.config.head_dim // 4  # kv_codes_shape's rows: the keys' scales, then
    for codes, fresh in zip(model.kv_codes, _fresh_codes(engine), strict=True):  # at -1 values'
        assert torch.equal(codes, fresh)
        keys_written += int((codes[:, :, key_scales] != 0).sum())  # with a scale: written ones
        values_written += int((codes[:, :, -1] != 0).sum())
    assert keys_written > 0 and values_written > 0
