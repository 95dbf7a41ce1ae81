"""``titan jobs`` against a real server: submit and wait, status, list, cancel, and a batch
followed with its progress bar to its output file."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from tests.integration.harness import running_titan
from tests.integration.test_jobs_api import CHAT, simulated
from titan.cli.main import build_cli


def test_jobs_cli_end_to_end(tmp_path):
    runner, cli = CliRunner(), build_cli()
    body = tmp_path / "request.json"
    body.write_text(json.dumps(CHAT))
    requests = tmp_path / "requests.jsonl"
    requests.write_text("\n".join(json.dumps({
        "custom_id": f"r{n}", "method": "POST", "url": "/v1/chat/completions", "body": CHAT,
    }) for n in range(5)) + "\n{broken\n")  # fmt: skip
    with running_titan(simulated()) as titan:

        def run(*args: str):
            result = runner.invoke(cli, ["jobs", *args, "--url", titan])
            assert result.exit_code == 0, result.output
            return result.stdout

        submitted = runner.invoke(cli, ["jobs", "submit", "--body", str(body), "--url", titan])
        assert f"server {titan} (--url)" in submitted.stderr  # where the job went, and why
        job = json.loads(run("submit", "--body", str(body), "--wait", "--priority", "8"))
        assert job["status"] == "succeeded" and job["priority"] == 8
        assert json.loads(run("status", job["id"]))["result"] == job["result"]
        assert job["id"] in run("list", "--status", "succeeded")
        assert json.loads(run("cancel", job["id"]))["status"] == "succeeded"  # already done

        output = tmp_path / "answers.jsonl"
        printed = run("submit", "--batch", str(requests), "--wait", "--output", str(output))
        batch = json.loads(printed[printed.index("{") :])
        assert batch["status"] == "completed" and batch["request_counts"] == {
            "total": 6, "completed": 5, "failed": 1}  # fmt: skip
        assert [json.loads(x)["custom_id"] for x in output.read_text().splitlines()] == [
            f"r{n}" for n in range(5)]  # fmt: skip
        assert batch["id"] in run("list", "--batches")

        missing = runner.invoke(cli, ["jobs", "status", "job_nope", "--url", titan])
        assert missing.exit_code == 1 and "404" in missing.output
        both = runner.invoke(cli, ["jobs", "submit", "--url", titan])
        assert both.exit_code == 2


def test_a_worker_refuses_a_queue_only_it_could_see(monkeypatch):
    monkeypatch.delenv("TITAN_STORAGE", raising=False)
    result = CliRunner().invoke(build_cli(), ["worker", "--storage", "memory://"])
    assert result.exit_code == 2 and "sqlite:///PATH or redis://" in result.output
