"""Roofline sanity (prefill compute-bound, decode bandwidth-bound, MoE and tensor parallel), and
the plan: replicas searched by simulation, models that do not fit, SLOs no count can meet."""

from __future__ import annotations

import pytest

from titan.planning.gpus import cpu_spec, gpu_by_name
from titan.planning.memory import weight_format
from titan.planning.model_catalog import built_in_model
from titan.planning.plan import PlanRequest, plan_capacity
from titan.planning.plan_report import plan_tables, plan_to_dict, verdict
from titan.planning.roofline import BANDWIDTH_EFFICIENCY, COMPUTE_EFFICIENCY, RooflineStepCost
from titan.planning.step_cost import LinearStepCost
from titan.planning.traffic import Arrivals, LengthDistribution, Slo, Traffic


def spec(name: str):  # type: ignore[no-untyped-def]
    found = built_in_model(name)
    assert found is not None
    return found


def gpu(name: str):  # type: ignore[no-untyped-def]
    found = gpu_by_name(name)
    assert found is not None
    return found


def roofline(model: str, device: str, dtype: str = "bf16", tp: int = 1) -> RooflineStepCost:
    m = spec(model)
    return RooflineStepCost(m, gpu(device), weight_format(dtype, m), 2, tp, step_overhead_s=0.0)


def test_decode_at_batch_one_reads_every_weight_once():
    cost = roofline("Llama-3.1-8B", "H100")
    step = 1 / cost.decode_tokens_per_s(1, 1)
    assert step == pytest.approx(16_060_522_496 / (3.35e12 * BANDWIDTH_EFFICIENCY), rel=0.01)
    assert not cost.is_compute_bound(1, 1, 1)


def test_prefill_is_compute_bound():
    cost = roofline("Llama-3.1-8B", "H100")
    body = 8_030_261_248 - 2 * 128256 * 4096 - 65 * 4096
    matmul_bound = 989e12 * COMPUTE_EFFICIENCY / (2 * body)
    assert cost.is_compute_bound(4096, 1, 2048)
    # Attention adds a little at 512 tokens and more at 8,192.
    assert cost.prefill_tokens_per_s(512) == pytest.approx(matmul_bound, rel=0.05)
    assert cost.prefill_tokens_per_s(8192) < 0.9 * cost.prefill_tokens_per_s(512)
    fp8 = roofline("Llama-3.1-8B", "H100", "fp8")
    assert fp8.prefill_tokens_per_s(512) == pytest.approx(
        2 * cost.prefill_tokens_per_s(512), rel=0.05
    )


def test_decode_throughput_grows_with_batch_then_flattens():
    cost = roofline("Llama-3.1-8B", "H100")
    rates = [cost.decode_tokens_per_s(b, 1024) for b in (1, 8, 64, 512)]
    assert rates == sorted(rates)
    assert rates[1] > 6 * rates[0]  # weights read once for the whole batch
    assert rates[3] < 8 * rates[2]  # KV reads and then compute take over
    # Longer contexts cost decode more (KV read per token).
    assert cost.decode_tokens_per_s(64, 16_384) < 0.5 * cost.decode_tokens_per_s(64, 512)


def test_moe_decode_reads_only_the_experts_in_use():
    mixtral = roofline("Mixtral-8x7B", "H100")
    full = mixtral._weight_bytes
    assert mixtral.weight_bytes_read(1) == pytest.approx(
        full - 32 * 6 * spec("Mixtral-8x7B").expert_params * 2, rel=0.001
    )  # 2 of 8 experts per layer at batch 1
    assert mixtral.weight_bytes_read(1000) == pytest.approx(full, rel=0.001)


def test_tensor_parallel_splits_the_weight_reads():
    one, four = roofline("Llama-3.1-70B", "H100"), roofline("Llama-3.1-70B", "H100", tp=4)
    assert four.weight_bytes_read(1) == pytest.approx(one.weight_bytes_read(1) / 4)
    assert four.decode_tokens_per_s(1, 512) > 3 * one.decode_tokens_per_s(1, 512)


def test_cpu_spec_from_cores():
    cpu = cpu_spec(4, ghz=2.0, bf16_flops_per_cycle=32)
    assert cpu.is_cpu and cpu.bf16_flops == 4 * 2.0e9 * 32
    with pytest.raises(ValueError):
        cpu_spec(0)


def request(**changes) -> PlanRequest:  # type: ignore[no-untyped-def]
    llama = spec("Llama-3.1-8B")
    values = dict(
        model=llama,
        gpu=gpu("H100"),
        weights=weight_format("bf16", llama),
        kv_dtype_bytes=2,
        traffic=Traffic(
            Arrivals(20.0),
            LengthDistribution.parse("lognormal:512,0.5"),
            LengthDistribution.parse("uniform:100,300"),
        ),
        slo=Slo(ttft_ms=500, tpot_ms=50),
        num_requests=300,
    )
    values.update(changes)
    return PlanRequest(**values)  # type: ignore[arg-type]


def test_replicas_are_the_smallest_count_that_meets_the_slo():
    plan = plan_capacity(request(traffic=request().traffic.at_rate(150.0)))
    assert plan.num_replicas is not None and plan.num_replicas > 1
    chosen = plan.chosen
    assert chosen is not None and chosen.is_enough
    assert chosen.ttft_at_slo_s <= 0.5 and chosen.tpot_at_slo_s <= 0.05
    fewer = [t for t in plan.trials if t.num_replicas == plan.num_replicas - 1]
    assert fewer and not fewer[0].is_enough  # one fewer was simulated and fails
    light = plan_capacity(request())
    assert light.num_replicas is not None and light.num_replicas <= plan.num_replicas
    assert "Replicas needed" in verdict(plan)
    assert set(plan_tables(plan)) == {"Inputs", "Memory", "Roofline", "Simulated replicas"}
    assert plan_to_dict(plan)["num_gpus"] == plan.num_replicas


def test_a_model_that_does_not_fit_says_which_tensor_parallel_does():
    llama = spec("Llama-3.1-70B")
    plan = plan_capacity(request(model=llama, weights=weight_format("bf16", llama)))
    assert plan.num_replicas is None and not plan.memory.fits
    assert plan.min_tensor_parallel == 4 and "tensor parallel 4 fits" in plan.note
    assert verdict(plan).startswith("No plan")


def test_an_slo_no_replica_count_meets():
    plan = plan_capacity(request(slo=Slo(ttft_ms=1.0)))
    assert plan.num_replicas is None and "with no queueing" in plan.note
    assert not plan.trials


def test_a_calibrated_cost_replaces_the_roofline():
    smol = spec("SmolLM2-135M")
    plan = plan_capacity(
        request(
            model=smol,
            gpu=cpu_spec(2),
            weights=weight_format("bf16", smol),
            traffic=Traffic(
                Arrivals(3.0),
                LengthDistribution.parse("uniform:64,384"),
                LengthDistribution.parse("uniform:16,96"),
            ),
            slo=Slo(ttft_ms=5000),
            max_num_seqs=32,
            max_num_batched_tokens=512,
            max_decode_slowdown=2.0,
            cost=LinearStepCost(0.045, 0.0012, 9e-7, 0.0002),
        )
    )
    assert plan.cost_model == "calibrated"
    # ~2.2 requests/s per replica on the 2-core machine, so 3 requests/s need two.
    assert plan.num_replicas == 2
