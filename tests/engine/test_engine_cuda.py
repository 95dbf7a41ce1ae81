"""The engine's CUDA path (torch SDPA attention over the paged cache). Runs only where a CUDA
device is present; CI machines here have none."""

from __future__ import annotations

import pytest
import torch

from tests.engine.conftest import run_engine
from titan.engine.config import EngineConfig
from titan.engine.engine import Engine
from titan.engine.sampling_params import SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
]


def test_cuda_greedy_matches_cpu_in_float32(tokenizer):
    prompts = {
        f"p{i}": tokenizer.encode(
            tokenizer.apply_chat_template([{"role": "user", "content": text}])
        )
        for i, text in enumerate(["Name three rivers.", "What is 2 + 2?", "Say hello " * 40])
    }
    greedy = SamplingParams(max_tokens=16, temperature=0)
    cpu = run_engine(Engine(EngineConfig(device="cpu", dtype="float32")), prompts, greedy)
    cuda_engine = Engine(
        EngineConfig(device="cuda", dtype="float32", max_num_batched_tokens=64, num_kv_blocks=64)
    )
    assert run_engine(cuda_engine, prompts, greedy) == cpu
    stats = cuda_engine.stats()
    assert stats.num_free_blocks == stats.num_total_blocks
