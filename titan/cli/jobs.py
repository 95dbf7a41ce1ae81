"""``titan jobs``: submit, follow, cancel and list jobs and batches on a running Titan, over its
HTTP API: the server and key are ``client.url`` and ``client.api_key`` of the settings
(``--url``/``--api-key``, else ``$TITAN_URL``/``$TITAN_API_KEY``, else ``--config``'s, else
the server the same settings describe), resolved as for every command.

An id starting ``batch_`` is a batch, any other a job. ``submit --batch FILE.jsonl`` uploads the
file, creates the batch and, with ``--wait``, shows a progress bar until it ends.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import httpx
import orjson
import typer

from titan.cli.options import ApiKeyOption, ConfigOption, UrlOption, client_settings
from titan.errors import TitanError

jobs_app = typer.Typer(help="Submit, follow, cancel and list async jobs and batches.",
                       no_args_is_help=True, add_completion=False)  # fmt: skip

FINAL_BATCH = ("completed", "failed", "expired", "cancelled")
FINAL_JOB = ("succeeded", "failed", "dead_letter", "cancelled", "expired")
POLL_S = 0.5


@contextlib.contextmanager
def _client(
    command: str, config_file: Path | None, url: str | None, api_key: str | None
) -> Iterator[httpx.Client]:
    """A client of the server the settings name; a server that cannot be reached is a message
    naming it and where its URL came from, never a traceback."""
    try:
        settings = client_settings(config_file, url, api_key)
    except TitanError as exc:
        typer.echo(f"titan jobs {command}: {exc.message}", err=True)
        raise typer.Exit(2) from None
    client_config = settings.config.client
    base_url = client_config.base_url(settings.config.server)
    key = client_config.bearer()
    if command == "submit":  # the one that writes: say where it went
        typer.echo(
            f"titan jobs submit: server {base_url} ({settings.origin('client', 'url')})", err=True
        )
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with httpx.Client(base_url=base_url, headers=headers, timeout=60) as client:
            yield client
    except httpx.TransportError as exc:
        typer.echo(
            f"titan jobs {command}: cannot reach {base_url} "
            f"(from {settings.origin('client', 'url')}): {exc or type(exc).__name__}. "
            "Is `titan serve` running there? Set --url or TITAN_URL.",
            err=True,
        )
        raise typer.Exit(1) from None


def _checked(response: httpx.Response) -> Any:
    if response.status_code >= 400:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text
        typer.echo(f"titan jobs: {response.status_code}: {message}", err=True)
        raise typer.Exit(1)
    return response.json()


def _print(data: Any) -> None:
    typer.echo(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode())


def _kind(object_id: str) -> str:
    return "batches" if object_id.startswith("batch_") else "jobs"


def _follow_batch(client: httpx.Client, batch: dict[str, Any]) -> dict[str, Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    columns = ("{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, transient=False) as progress:
        task = progress.add_task(batch["id"], total=batch["request_counts"]["total"])
        while True:
            counts = batch["request_counts"]
            done = counts["completed"] + counts["failed"]
            progress.update(task, completed=done,
                            description=f"{batch['id']} {batch['status']}")  # fmt: skip
            if batch["status"] in FINAL_BATCH:
                return batch
            time.sleep(POLL_S)
            batch = _checked(client.get(f"/v1/batches/{batch['id']}"))


def _follow_job(client: httpx.Client, job: dict[str, Any]) -> dict[str, Any]:
    while job["status"] not in FINAL_JOB:
        time.sleep(POLL_S)
        job = _checked(client.get(f"/v1/jobs/{job['id']}"))
    return job


@jobs_app.command("submit")
def submit(
    body: Annotated[
        Path | None, typer.Option(help="The request as a JSON file ('-': standard input).")
    ] = None,
    batch: Annotated[
        Path | None, typer.Option(help="A JSONL file of requests: submitted as a batch.")
    ] = None,
    endpoint: Annotated[str, typer.Option(help="The API path to run.")] = "/v1/chat/completions",
    priority: Annotated[int | None, typer.Option(min=0, max=9, help="0–9, higher first.")] = None,
    idempotency_key: Annotated[str | None, typer.Option(help="Resubmits return the first.")] = None,
    deadline: Annotated[float | None, typer.Option(help="Seconds it may wait to start.")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Follow it until it ends.")] = False,
    output: Annotated[
        Path | None, typer.Option(help="With --batch --wait: save the output file here.")
    ] = None,
    config_file: ConfigOption = None,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Submit one job (--body) or a batch (--batch)."""
    if (body is None) == (batch is None):
        typer.echo("titan jobs submit: give exactly one of --body or --batch.", err=True)
        raise typer.Exit(2)
    with _client("submit", config_file, url, api_key) as client:
        if batch is not None:
            files = {"file": (batch.name, batch.read_bytes(), "application/jsonl")}
            upload = _checked(client.post("/v1/files", files=files, data={"purpose": "batch"}))
            created = _checked(client.post("/v1/batches", json={
                "input_file_id": upload["id"], "endpoint": endpoint,
                "completion_window": "24h"}))  # fmt: skip
            result = _follow_batch(client, created) if wait else created
            if output is not None and result.get("output_file_id"):
                content = client.get(f"/v1/files/{result['output_file_id']}/content")
                output.write_bytes(content.content)
            _print(result)
            return
        raw = sys.stdin.read() if str(body) == "-" else body.read_text()  # type: ignore[union-attr]
        request: dict[str, Any] = {"endpoint": endpoint, "body": orjson.loads(raw)}
        optional = {"priority": priority, "idempotency_key": idempotency_key, "deadline": deadline}
        request |= {k: v for k, v in optional.items() if v is not None}
        job = _checked(client.post("/v1/jobs", json=request))
        _print(_follow_job(client, job) if wait else job)


@jobs_app.command("status")
def status(
    object_id: Annotated[str, typer.Argument(help="A job id or a batch id.")],
    wait: Annotated[bool, typer.Option("--wait", help="Follow it until it ends.")] = False,
    config_file: ConfigOption = None,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Show a job (its result or error) or a batch (its counts and files)."""
    with _client("status", config_file, url, api_key) as client:
        found = _checked(client.get(f"/v1/{_kind(object_id)}/{object_id}"))
        if wait:
            found = _follow_batch(client, found) if _kind(object_id) == "batches" else \
                _follow_job(client, found)  # fmt: skip
        _print(found)


@jobs_app.command("cancel")
def cancel(
    object_id: Annotated[str, typer.Argument(help="A job id or a batch id.")],
    config_file: ConfigOption = None,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """Cancel a job (a running one stops, its engine work aborted) or a batch."""
    with _client("cancel", config_file, url, api_key) as client:
        if _kind(object_id) == "batches":
            _print(_checked(client.post(f"/v1/batches/{object_id}/cancel")))
        else:
            _print(_checked(client.delete(f"/v1/jobs/{object_id}")))


@jobs_app.command("list")
def list_(
    status: Annotated[str | None, typer.Option(help="Only jobs in this state.")] = None,
    batches: Annotated[bool, typer.Option("--batches", help="List batches, not jobs.")] = False,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 20,
    config_file: ConfigOption = None,
    url: UrlOption = None,
    api_key: ApiKeyOption = None,
) -> None:
    """List jobs (newest first) or batches, one per line."""
    params: dict[str, Any] = {"limit": limit}
    if status is not None:
        params["status"] = status
    with _client("list", config_file, url, api_key) as client:
        page = _checked(client.get("/v1/batches" if batches else "/v1/jobs", params=params))
    for item in page["data"]:
        if batches:
            counts = item["request_counts"]
            typer.echo(f"{item['id']}  {item['status']:<11} {counts['completed']}/"
                       f"{counts['total']} done, {counts['failed']} failed")  # fmt: skip
        else:
            typer.echo(f"{item['id']}  {item['status']:<11} attempts {item['attempts']}  "
                       f"{item['endpoint']}")  # fmt: skip
