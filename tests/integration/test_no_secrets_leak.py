"""No secret and no prompt leaves Titan through its observability or its errors: with an
``openai`` deployment holding an upstream API key, a master key, a client key, request logs on
(content logging off, the default) and tracing on, neither stderr/stdout, the log records, the
``/metrics`` text, the exported spans' attributes nor any error body holds the upstream key, the
master key, the client key's secret part or the prompt text — for answered requests and refused
ones (bad key 401, unknown model 404, invalid body 400, an upstream failure) — and neither the
data-at-rest key nor what a guardrail matched."""

from __future__ import annotations

import logging
import secrets

import httpx
import openai
import pytest

import titan.api.app
from tests.backends.upstream_fakes import VLLM, Canned, FakeUpstream
from tests.integration.harness import running_titan
from titan.observability.spans import Span

pytestmark = pytest.mark.slow

UPSTREAM_KEY = f"sk-upstream-{secrets.token_hex(16)}"
MASTER = f"master-{secrets.token_hex(16)}"
DATA_KEY = secrets.token_hex(32)  # data_at_rest.encryption_keys: 32 bytes, hex
EMAIL = f"quokka.{secrets.token_hex(6)}@example.com"  # a guardrail flags it, never logs it
PROMPT = f"zebra-quartz-{secrets.token_hex(8)} tell me the launch codes; mail {EMAIL}"
PROMPT_MARK = PROMPT.split()[0]  # the distinctive part, on its own


class CollectingExporter:
    def __init__(self) -> None:
        self.spans: list[Span] = []

    def add(self, span: Span) -> None:
        self.spans.append(span)

    def shutdown(self) -> None:
        pass


def config(upstream: FakeUpstream) -> dict:
    deployment = {"backend": "openai", "base_url": upstream.base_url, "api_key": UPSTREAM_KEY}
    return {
        "models": [{"name": "gpt", "deployments": [deployment]}],
        "probes": {"enabled": False},
        "storage": "memory://",
        "data_at_rest": {"encryption_keys": [DATA_KEY]},
        "guardrails": {"policies": [{"name": "pii", "action": "flag", "detect": ["email"]}]},
        "auth": {"master_key": MASTER, "key_cache_s": 0},
        "cache": {"exact": False, "semantic": False},
        "jobs": {"workers": 0},
        "observability": {"log_requests": True, "tracing": {"enabled": True}},
    }


def test_no_secret_or_prompt_in_logs_metrics_spans_or_error_bodies(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture, caplog: pytest.LogCaptureFixture
):
    # INFO everywhere (DEBUG would add this test's own clients' request dumps), DEBUG for Titan.
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.DEBUG, logger="titan")
    exporter = CollectingExporter()
    build_pipeline = titan.api.app.build_pipeline

    def traced_pipeline(*args, **kwargs):
        pipeline = build_pipeline(*args, **kwargs)
        pipeline.tracer.exporter = exporter
        return pipeline

    monkeypatch.setattr(titan.api.app, "build_pipeline", traced_pipeline)
    messages = [{"role": "user", "content": PROMPT}]
    bodies: list[str] = []  # every error body the clients saw
    with FakeUpstream() as upstream, running_titan(config(upstream)) as base:
        made = httpx.post(
            f"{base}/admin/keys",
            json={"tenant": "acme"},
            headers={"Authorization": f"Bearer {MASTER}"},
        )
        assert made.status_code == 201, made.text
        client_key = made.json()["key"]
        key_secret = client_key.split("-", 3)[3]  # sk-titan-<key id>-<secret>
        assert len(key_secret) >= 16
        wrong_key = f"sk-titan-{client_key.split('-')[2]}-{secrets.token_hex(16)}"

        upstream.will_answer(Canned.json(VLLM.completion), Canned.sse(VLLM.stream))
        with openai.OpenAI(base_url=f"{base}/v1", api_key=client_key, max_retries=0) as sdk:
            answer = sdk.chat.completions.create(model="gpt", messages=messages, max_tokens=8)
            assert answer.choices[0].message.content
            streamed = sdk.chat.completions.create(
                model="gpt", messages=messages, max_tokens=8, stream=True
            )
            assert list(streamed)
            # The upstream got the prompt and its key: both were really in play.
            assert upstream.received[0].headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
            assert PROMPT in upstream.received[0].body.decode()

            with pytest.raises(openai.NotFoundError) as unknown:
                sdk.chat.completions.create(model="no-such-model", messages=messages)
            bodies.append(unknown.value.response.text)

            # Enough failures for every retry Titan makes.
            exploded = Canned.json({"error": {"message": "upstream exploded"}}, status=500)
            upstream.will_answer(*[exploded] * 4)
            with pytest.raises(openai.APIStatusError) as failed:
                sdk.chat.completions.create(model="gpt", messages=messages, max_tokens=8)
            assert failed.value.status_code >= 500
            bodies.append(failed.value.response.text)

        with openai.OpenAI(base_url=f"{base}/v1", api_key=wrong_key, max_retries=0) as stranger:
            with pytest.raises(openai.AuthenticationError) as denied:
                stranger.chat.completions.create(model="gpt", messages=messages)
            bodies.append(denied.value.response.text)

        auth = {"Authorization": f"Bearer {client_key}"}
        # Invalid in a field other than the messages.
        invalid = httpx.post(
            f"{base}/v1/chat/completions",
            headers=auth,
            json={"model": "gpt", "messages": messages, "max_tokens": "many"},
        )
        assert invalid.status_code == 400, invalid.text
        bodies.append(invalid.text)
        # Free text where a short token belongs is described by its length, never quoted.
        prompt_as_role = httpx.post(
            f"{base}/v1/chat/completions",
            headers=auth,
            json={"model": "gpt", "messages": [{"role": PROMPT, "content": "hi"}]},
        )
        assert prompt_as_role.status_code == 400, prompt_as_role.text
        bodies.append(prompt_as_role.text)
        bad_json = httpx.post(
            f"{base}/v1/chat/completions",
            headers=auth,
            content=f'{{"model": "gpt", "messages": "{PROMPT}'.encode(),
        )
        assert bad_json.status_code == 400, bad_json.text
        bodies.append(bad_json.text)
        master_wrong = httpx.get(
            f"{base}/admin/keys", headers={"Authorization": f"Bearer {MASTER}x"}
        )
        assert master_wrong.status_code == 401
        bodies.append(master_wrong.text)

        metrics = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {MASTER}"})
        assert metrics.status_code == 200 and "titan_requests_total" in metrics.text
        assert 'policy="pii"' in metrics.text, "the guardrail never matched"
    # Titan has shut down: request logs flushed, spans exported.

    out, err = capfd.readouterr()
    records = [
        f"{record.name} {record.getMessage()} {record.__dict__!r}" for record in caplog.records
    ]
    # Request lines go straight to stderr, as the titan.requests logger's would.
    assert '"logger":"titan.requests"' in err and '"status":401' in err, "no request log"
    spans = [f"{span.name} {span.attributes!r}" for span in exporter.spans]
    assert any(span.name == "titan.attempt" for span in exporter.spans), "no spans exported"
    seen = {
        "stdout": out,
        "stderr": err,
        "log records": "\n".join(records),
        "/metrics": metrics.text,
        "span attributes": "\n".join(spans),
        "error bodies": "\n".join(bodies),
    }
    forbidden = {
        "the upstream key": UPSTREAM_KEY,
        "the master key": MASTER,
        "the client key's secret": key_secret,
        "the wrong key's secret": wrong_key.split("-", 3)[3],
        "the prompt": PROMPT_MARK,
        "the flagged email": EMAIL,
        "the data key": DATA_KEY,
    }
    leaks = [
        f"{what} in {where}"
        for where, text in seen.items()
        for what, secret in forbidden.items()
        if secret in text
    ]
    assert not leaks, (leaks, [b for b in bodies if PROMPT_MARK in b])
