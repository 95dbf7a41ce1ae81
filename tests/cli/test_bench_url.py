"""``titan bench URL``: its help, refusing bad input with one line and exit code 2, and (slow)
load tests end to end against a simulator."""

from __future__ import annotations

import socket
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from tests.loadgen.servers import serving, simulator
from titan.cli.bench_url import report_meta
from titan.cli.main import build_cli
from titan.config import SimulationProfile

QUICK = SimulationProfile(ttft_s=0.005, inter_token_s=0.001, output_tokens=4)


def invoke(*args: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    environment = {"COLUMNS": "200", "OPENAI_API_KEY": "", "TITAN_API_KEY": "", **(env or {})}
    return CliRunner().invoke(build_cli(), ["bench", *args], env=environment)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_help_shows_the_url_form():
    result = invoke("--help")
    assert result.exit_code == 0 and "URL" in result.stdout
    assert "--sweep-rate" in result.stdout and "--slo-ttft-ms" in result.stdout


def test_a_missing_url_is_refused():
    assert invoke().exit_code == 2


def one_line_failure(result, message: str) -> None:  # type: ignore[no-untyped-def]
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("titan bench: ")
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rate", "5", "--concurrency", "2"], "--concurrency and --rate exclude each other"),
        (["--sweep-rate", "1,2", "--sweep-concurrency", "1"], "exclude each other"),
        (["--concurrency", "2", "--burstiness", "0.5"], "--burstiness shapes open-loop"),
        (["--workload", "burst"], "the burst workload sends in bursts"),
        (["--sweep-rate", "1,x"], "'x' is not a number"),
        (["--sweep-concurrency", "1.5"], "whole numbers"),
        (["--rate", "inf"], "--rate inf sends everything at once"),
        (["--rate", "1", "--burstiness", "0"], "--burstiness must be above 0"),
        (["--workload", "poems"], "unknown workload 'poems'"),
    ],
)
def test_bad_flags_are_one_line(args: list[str], message: str):
    one_line_failure(invoke(f"http://127.0.0.1:{closed_port()}/v1", *args), message)


def test_an_unreachable_url_is_one_line():
    port = closed_port()
    one_line_failure(
        invoke(f"http://127.0.0.1:{port}/v1"), f"cannot reach http://127.0.0.1:{port}/v1/models"
    )
    one_line_failure(
        invoke(f"http://127.0.0.1:{port}", "--model", "m"), f"cannot reach 127.0.0.1:{port}"
    )
    one_line_failure(invoke("http://"), "is not an http:// or https:// URL")


def test_a_bad_jsonl_line_is_one_line(tmp_path: Path):
    path = tmp_path / "requests.jsonl"
    path.write_text('{"prompt": "fine"}\n{"prompt": \n')
    one_line_failure(
        invoke(f"http://127.0.0.1:{closed_port()}", "--workload", f"jsonl:{path}"),
        f"{path}:2: not valid JSON",
    )


@pytest.mark.slow
def test_a_concurrency_sweep_with_a_report(tmp_path: Path):
    with simulator(QUICK, model="sim-model") as url:
        result = invoke(
            f"{url}/v1",
            "--sweep-concurrency",
            "2,1",
            "--num-requests",
            "6",
            "--slo-ttft-ms",
            "200",
            "--output",
            str(tmp_path / "report"),
        )
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "model sim-model" in out and "concurrency 1: latency (ms)" in out
    assert "Knee: concurrency 2, the highest with ≥ 90% SLO attainment" in out
    report = orjson.loads((tmp_path / "report" / "report.json").read_bytes())
    assert [p["load"] for p in report["points"]] == [1.0, 2.0]
    assert all(p["num_ok"] == 6 and p["total_output_tokens"] == 24 for p in report["points"])
    assert report["meta"]["model"] == "sim-model" and report["meta"]["slo"]["ttft_s"] == 0.2
    assert (tmp_path / "report" / "report.html").stat().st_size > 1_000_000  # plotly inside


@pytest.mark.slow
def test_an_open_loop_run_of_whole_completions_with_the_environments_key():
    seen: list[tuple[str, str]] = []

    async def recording(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        headers = dict(scope["headers"])
        seen.append((scope["path"], headers.get(b"authorization", b"").decode()))
        body = (
            b'{"choices": [{"text": "hi"}], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}'
        )
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": body})

    with serving(recording, lifespan="off") as url:
        result = invoke(
            url,
            "--model",
            "m",
            "--rate",
            "40",
            "--duration",
            "0.5",
            "--no-stream",
            "--endpoint",
            "completions",
            env={"TITAN_API_KEY": "sk-env"},
        )
    assert result.exit_code == 0, result.output
    assert "rate 40/s: latency (ms)" in result.stdout and "Knee" not in result.stdout
    assert seen and set(seen) == {("/v1/completions", "Bearer sk-env")}


def test_the_reports_command_line_never_shows_the_api_key(monkeypatch: pytest.MonkeyPatch):
    argv = ["titan", "bench", "http://h/v1", "--api-key", "sk-secret-1", "--rate", "2"]
    monkeypatch.setattr("sys.argv", argv)
    meta = report_meta("http://h/v1", "m", "sk-secret-1", {"seed": 0})
    assert "sk-secret-1" not in orjson.dumps(meta).decode()
    assert meta["command"] == "titan bench http://h/v1 --api-key '***' --rate 2"
    assert meta["seed"] == 0 and meta["model"] == "m"
