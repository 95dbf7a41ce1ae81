"""The gateway over real HTTP: Titan in front of simulated OpenAI-compatible upstreams, driven by
the official openai SDK. Each test injects one kind of transient and checks clients never see it."""

from __future__ import annotations

import statistics
import time

import httpx
import openai
import pytest

from tests.integration.harness import deployment_stats, running_titan
from tests.simulate.harness import running_simulator, wait_for_stats
from titan.config import Outage, SimulationProfile

MESSAGES = [{"role": "user", "content": "hello"}]


def gateway_config(*upstreams: tuple[str, str], **sections) -> dict:
    """One model "m" with an openai deployment per (name, base URL)."""
    timeouts = sections.pop("timeouts", {})
    return {
        "models": [
            {
                "name": "m",
                "deployments": [
                    {
                        "backend": "openai",
                        "name": name,
                        "base_url": f"{url}/v1",
                        "upstream_model": "simulated",
                        "timeouts": timeouts,
                    }
                    for name, url in upstreams
                ],
            }
        ],
        "probes": {"enabled": False},
        **sections,
    }


def client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)


def test_a_deployment_failing_every_request_is_ejected_and_clients_see_no_error():
    broken = SimulationProfile(error_probability=1.0, error_status=503)
    with (
        running_simulator(SimulationProfile(ttft_s=0.002)) as healthy_url,
        running_simulator(broken) as broken_url,
        running_titan(
            gateway_config(
                ("healthy", healthy_url),
                ("broken", broken_url),
                breaker={"consecutive_errors": 3, "open_s": 60},
                routing={"policy": "round_robin"},
            )
        ) as titan,
    ):
        sdk = client(titan)
        for _ in range(40):
            reply = sdk.chat.completions.with_raw_response.create(
                model="m", messages=MESSAGES, max_tokens=4
            )
            assert reply.headers["x-titan-deployment"] == "healthy"
            assert reply.parse().choices[0].message.content
        stats = deployment_stats(titan, "m")
        assert stats["broken"]["state"] == "open"
        assert stats["broken"]["failures"] == 3  # ejected after three, never tried again
        assert httpx.get(f"{broken_url}/stats").json()["errors"] == {"503": 3}


def test_latency_spikes_are_hedged_and_the_tail_drops():
    spiky = SimulationProfile(seed=3, ttft_s=0.01, spike_probability=0.2, spike_multiplier=40)
    steady = SimulationProfile(ttft_s=0.01)

    def tail_latency(hedge: dict) -> tuple[float, dict]:
        with (
            running_simulator(spiky) as spiky_url,
            running_simulator(steady) as steady_url,
            running_titan(
                gateway_config(
                    ("spiky", spiky_url),
                    ("steady", steady_url),
                    hedge=hedge,
                    routing={"policy": "round_robin"},
                )
            ) as titan,
        ):
            sdk = client(titan)
            latencies = []
            for _ in range(80):
                started = time.perf_counter()
                sdk.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2)
                latencies.append(time.perf_counter() - started)
            stats = httpx.get(f"{titan}/stats").json()["models"]["m"]
            return statistics.quantiles(latencies, n=100)[98], stats

    plain_p99, _ = tail_latency({"enabled": False})
    hedged_p99, stats = tail_latency({"enabled": True, "max_fraction": 0.5, "min_delay_s": 0.0})
    assert stats["hedges"] > 0
    assert hedged_p99 < plain_p99 / 2, (hedged_p99, plain_p99)


def test_no_first_byte_in_time_is_retried_on_another_deployment():
    silent = SimulationProfile(ttft_s=30.0)  # accepts, then sends nothing for 30 s
    with (
        running_simulator(silent) as silent_url,
        running_simulator(SimulationProfile(ttft_s=0.002)) as healthy_url,
        running_titan(
            gateway_config(
                ("silent", silent_url),
                ("healthy", healthy_url),
                timeouts={"first_byte_s": 0.3},
                routing={"policy": "round_robin"},
                hedge={"enabled": False},
            )
        ) as titan,
    ):
        sdk = client(titan)
        for stream in (False, True):
            started = time.perf_counter()
            reply = sdk.chat.completions.with_raw_response.create(
                model="m", messages=MESSAGES, max_tokens=3, stream=stream
            )
            if stream:
                assert list(reply.parse())  # the whole stream came through
            assert time.perf_counter() - started < 5
            assert reply.headers["x-titan-deployment"] == "healthy"
        # The abandoned attempts were cancelled upstream, not left to run.
        stats = wait_for_stats(silent_url, lambda s: s["cancelled"] >= 1)
        assert stats["cancelled"] >= 1


def test_a_half_open_breaker_recovers_after_an_outage():
    outage = SimulationProfile(
        ttft_s=0.002, outages=(Outage(start_s=0, duration_s=1.0, status=503),)
    )
    with (
        running_simulator(outage) as flaky_url,
        running_simulator(SimulationProfile(ttft_s=0.002)) as healthy_url,
        running_titan(
            gateway_config(
                ("flaky", flaky_url),
                ("healthy", healthy_url),
                breaker={"consecutive_errors": 1, "open_s": 0.2},
                probes={"enabled": True, "interval_s": 0.1, "timeout_s": 0.5},
                routing={"policy": "round_robin"},
            )
        ) as titan,
    ):
        sdk = client(titan)
        assert sdk.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2)
        deadline = time.monotonic() + 10
        while True:
            stats = deployment_stats(titan, "m")["flaky"]
            if stats["state"] == "closed" and stats["successes"] > 0:
                break
            assert time.monotonic() < deadline, stats
            sdk.chat.completions.create(model="m", messages=MESSAGES, max_tokens=2)
            time.sleep(0.05)
        assert stats["breaker_openings"] >= 1


def test_a_client_that_disconnects_cancels_the_upstream_request():
    slow = SimulationProfile(ttft_s=0.01, inter_token_s=0.1, output_tokens=100)
    with (
        running_simulator(slow) as upstream,
        running_titan(gateway_config(("only", upstream))) as titan,
    ):
        body = {"model": "m", "messages": MESSAGES, "max_tokens": 100, "stream": True}
        with (
            httpx.Client(timeout=30) as http,
            http.stream("POST", f"{titan}/v1/chat/completions", json=body) as response,
        ):
            lines = response.iter_lines()
            assert next(lines).startswith("data: ")
        stats = wait_for_stats(upstream, lambda s: s["cancelled"] >= 1, timeout_s=5)
        assert stats["cancelled"] == 1 and stats["completed"] == 0


@pytest.mark.parametrize("stream", [False, True])
def test_tools_and_vendor_fields_reach_an_openai_upstream_without_a_400(stream):
    with (
        running_simulator(SimulationProfile(ttft_s=0.002)) as upstream,
        running_titan(gateway_config(("only", upstream))) as titan,
    ):
        sdk = client(titan)
        reply = sdk.chat.completions.create(
            model="m",
            messages=MESSAGES,
            max_tokens=2,
            stream=stream,
            extra_body={"vendor_knob": 1},
            tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        )
        if stream:
            assert list(reply)
        else:
            assert reply.choices


def test_upstream_without_a_model_name_serves_every_model_it_lists():
    """`titan serve --upstream URL` without --model: the upstream's /models become Titan's."""
    from titan.cli.main import serve_settings

    with running_simulator(SimulationProfile(ttft_s=0.002), model="upstream-llm") as upstream:
        environ = {"TITAN_PROBES__ENABLED": "false"}
        config = serve_settings(upstream=f"{upstream}/v1", environ=environ).config
        with running_titan(config) as titan:
            sdk = client(titan)
            assert [m.id for m in sdk.models.list()] == ["upstream-llm"]
            reply = sdk.chat.completions.create(model="upstream-llm", messages=MESSAGES)
            assert reply.choices[0].message.content
            with pytest.raises(openai.NotFoundError):
                sdk.chat.completions.create(model="other", messages=MESSAGES)
