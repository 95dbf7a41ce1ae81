"""`titan keys create | list | revoke` against a SQLite store."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from titan.cli.keys import keys_app, parse_duration
from titan.errors import AuthenticationError, InvalidRequestError
from titan.limits.keys import ApiKey, KeyRing
from titan.storage.factory import open_storage


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'titan.db'}"


def invoke(args: list[str]):  # type: ignore[no-untyped-def]
    # A wide terminal: rich would otherwise fold the table's columns at 80.
    return CliRunner().invoke(keys_app, args, env={"COLUMNS": "250"})


def create(url: str, *extra: str) -> dict[str, str]:
    result = invoke(["create", "--tenant", "acme", "--json", "--storage", url, *extra])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 1
    payload = json.loads(lines[0])
    assert set(payload) == {"key", "tenant", "key_id", "store"}
    assert "will not be shown again" in result.stderr
    return payload


def stored(url: str, presented: str) -> ApiKey:
    async def run() -> ApiKey:
        storage = await open_storage(url)
        try:
            return await KeyRing(storage.documents).authenticate(presented)
        finally:
            await storage.close()

    return asyncio.run(run())


def test_create_json_prints_a_key_that_authenticates(url: str) -> None:
    before = time.time()
    created = create(
        url,
        "--name",
        "ci",
        "--models",
        "smol, big",
        "--rpm",
        "60",
        "--tpm",
        "1000",
        "--max-concurrency",
        "2",
        "--priority",
        "batch",
        "--expires-in",
        "30d",
        "--budget-usd",
        "12.5",
        "--budget-period",
        "day",
    )
    assert created["tenant"] == "acme" and created["key"].startswith("sk-titan-")
    record = stored(url, created["key"])
    assert record.key_id == created["key_id"] and record.name == "ci"
    policy = record.policy
    assert policy.models == ("smol", "big") and policy.priority == "batch"
    assert (policy.rpm, policy.tpm, policy.max_concurrency) == (60, 1000, 2)
    assert policy.budget is not None and (policy.budget.usd, policy.budget.period) == (12.5, "day")
    assert policy.expires_at is not None
    assert before + 30 * 86_400 <= policy.expires_at <= time.time() + 30 * 86_400


def test_create_without_json_prints_the_key_once_with_a_warning(url: str) -> None:
    result = invoke(["create", "--tenant", "acme", "--storage", url])
    assert result.exit_code == 0, result.output
    key = next(word for word in result.stdout.split() if word.startswith("sk-titan-"))
    assert result.stdout.count(key) == 1
    assert "will not be shown again" in result.output
    assert stored(url, key).tenant == "acme"


def test_list_never_shows_the_hash_or_the_key(url: str) -> None:
    first = create(url)
    second = create(url, "--tenant", "globex")  # a later --tenant wins
    hashes = [stored(url, k["key"]).secret_hash for k in (first, second)]

    table = invoke(["list", "--storage", url])
    assert table.exit_code == 0, table.output
    assert first["key_id"] in table.stdout and second["key_id"] in table.stdout
    rows = json.loads(invoke(["list", "--json", "--storage", url]).stdout)
    assert [row["key_id"] for row in rows] == [first["key_id"], second["key_id"]]
    only = json.loads(invoke(["list", "--tenant", "globex", "--json", "--storage", url]).stdout)
    assert [row["key_id"] for row in only] == [second["key_id"]]
    for output in (table.output, json.dumps(rows)):
        assert "secret_hash" not in output
        for secret in [first["key"], second["key"], *hashes]:
            assert secret not in output


def test_revoke(url: str) -> None:
    created = create(url)
    result = invoke(["revoke", created["key_id"], "--storage", url])
    assert result.exit_code == 0, result.output
    with pytest.raises(AuthenticationError, match="was revoked"):
        stored(url, created["key"])
    rows = json.loads(invoke(["list", "--json", "--storage", url]).stdout)
    assert rows[0]["revoked_at"] is not None
    assert "revoked" in invoke(["list", "--storage", url]).stdout

    unknown = invoke(["revoke", "0123456789ab", "--storage", url])
    assert unknown.exit_code == 1
    assert "no key with id '0123456789ab'" in unknown.stderr


def test_storage_comes_from_the_config_file(
    tmp_path: Path, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TITAN_STORAGE")  # the variable would override the file's storage
    config = tmp_path / "titan.yaml"
    config.write_text(f"storage: '{url}'\n")
    created = create("unused", "--storage", url)
    rows = json.loads(invoke(["list", "--json", "--config", str(config)]).stdout)
    assert [row["key_id"] for row in rows] == [created["key_id"]]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tenant", "acme corp"], "invalid tenant name 'acme corp'"),
        (["--tenant", "acme", "--expires-in", "soon"], "invalid duration 'soon'"),
        (["--tenant", "acme", "--budget-period", "day"], "--budget-period needs --budget-usd"),
        (["--tenant", "acme", "--budget-usd", "0"], "--budget-usd: Input should be greater than 0"),
    ],
)
def test_bad_input_exits_2_with_a_message(url: str, args: list[str], message: str) -> None:
    result = invoke(["create", *args, "--storage", url])
    assert result.exit_code == 2
    assert message in result.stderr
    assert "Traceback" not in result.output


def test_a_bad_storage_url_exits_2() -> None:
    result = invoke(["list", "--storage", "ftp://nowhere"])
    assert result.exit_code == 2
    assert "unsupported URL" in result.stderr


def test_durations() -> None:
    assert parse_duration("30d") == 30 * 86_400
    assert parse_duration("12h") == 12 * 3600
    assert parse_duration("90m") == 90 * 60
    assert parse_duration("1.5w") == 1.5 * 7 * 86_400
    for bad in ("", "30", "0d", "-1h", "3y"):
        with pytest.raises(InvalidRequestError):
            parse_duration(bad)


def test_create_in_a_real_process(url: str) -> None:
    code = "import sys; from titan.cli.keys import keys_app; keys_app(sys.argv[1:])"
    done = subprocess.run(
        [sys.executable, "-c", code, "create", "--tenant", "acme", "--json", "--storage", url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert done.stdout == json.dumps(payload, separators=(",", ":")) + "\n"
    assert stored(url, payload["key"]).key_id == payload["key_id"]
