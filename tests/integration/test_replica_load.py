"""Titan scrapes its upstreams' Prometheus endpoints and shows their load in /stats: a stand-in
vLLM over real HTTP, then a real Titan read as a model server."""

from __future__ import annotations

import random

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from tests.integration.harness import deployment_stats, running_titan
from tests.router.expositions import VLLM
from tests.simulate.harness import running_simulator, serving, wait_for_stats
from titan.config import DeploymentMetrics, LoadScrapeConfig, OpenAIDeployment, SimulationProfile
from titan.service.load_scraper import LoadScrapers, scrape_target


def metrics_server(state: dict) -> Starlette:
    """``/metrics`` answers ``state["text"]`` (or ``state["status"]``); records what it saw."""

    async def metrics(request: Request) -> Response:
        state.setdefault("authorizations", []).append(request.headers.get("authorization"))
        if state.get("status", 200) != 200:
            return PlainTextResponse("down", status_code=state["status"])
        return PlainTextResponse(state["text"], media_type="text/plain; version=0.0.4")

    return Starlette(routes=[Route("/metrics", metrics)])


def config_with(url: str, **metrics) -> dict:
    return {
        "models": [{"name": "m", "deployments": [{
            "backend": "openai", "name": "vllm-a", "base_url": f"{url}/v1",
            "upstream_model": "simulated", "metrics": metrics,
        }]}],
        "routing": {"load": {"interval_s": 0.05, "stale_after_s": 0.5}},
        "probes": {"enabled": False},
    }  # fmt: skip


def load_of(stats: dict) -> dict:
    return stats["models"]["m"]["deployments"]["vllm-a"]["load"]


def test_stats_show_the_vllm_load_and_follow_it():
    state = {"text": VLLM}
    with (
        serving(metrics_server(state), lifespan="off") as url,
        running_titan(config_with(url)) as titan,
    ):
        stats = wait_for_stats(titan, lambda s: load_of(s)["current"] is not None)
        load = load_of(stats)
        assert load["url"] == f"{url}/metrics"  # the base_url's origin
        assert load["current"] == {
            "waiting": 4.0, "running": 22.0, "kv_usage": 0.375, "prefix_hit_rate": 0.4,
        }  # fmt: skip
        exported = httpx.get(f"{titan}/metrics").text  # and in Titan's own metrics
        assert 'titan_replica_kv_cache_usage_perc{deployment="vllm-a",model="m"} 0.375' in exported
        # The server fills up: the next scrapes see it, with the hit rate of the new prompts.
        grown = {"} 3.0\n": "} 30.0\n", "} 3000.0": "} 3800.0", "} 6000.0": "} 7000.0"}
        text = VLLM
        for old, new in grown.items():  # engine 0: 27 more waiting, 800 hits of 1,000 tokens
            text = text.replace(old, new)
        state["text"] = text
        stats = wait_for_stats(titan, lambda s: (load_of(s)["current"] or {})["waiting"] == 31.0)
        assert load_of(stats)["current"]["waiting"] == 31.0
        assert load_of(stats)["current"]["prefix_hit_rate"] == 0.8  # 800 of 1,000 new tokens
        # It stops answering: failures are counted, the reading ages out, requests never see it.
        state["status"] = 503
        stats = wait_for_stats(titan, lambda s: load_of(s)["current"] is None)
        load = load_of(stats)
        assert load["current"] is None and load["failures"] >= 1
        assert load["last_error"] == "ValueError: HTTP 503"


def test_a_titan_upstream_is_read_under_its_own_names():
    """A real Titan (simulated backend, an admission cap so its queue gauges exist) as the model
    server: its /metrics under the ``titan`` names, its model selected by label."""
    upstream_config = {
        "models": [{"name": "simulated", "max_concurrency": 4,
                    "deployments": [{"backend": "simulated"}]}],
        "probes": {"enabled": False},
    }  # fmt: skip
    with running_titan(upstream_config) as upstream:
        config = config_with(upstream, server="titan", model_name="simulated")
        with running_titan(config) as titan:
            stats = wait_for_stats(titan, lambda s: load_of(s)["current"] is not None)
            current = load_of(stats)["current"]
            assert (current["waiting"], current["running"]) == (0.0, 0.0)
            assert current["kv_usage"] is None  # no engine behind that Titan
            answer = httpx.post(f"{titan}/v1/chat/completions", json={
                "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            })  # fmt: skip
            assert answer.status_code == 200
            assert deployment_stats(titan, "m")["vllm-a"]["load"]["failures"] == 0


async def test_one_fetch_per_url_feeds_every_model_and_credentials_stay_home(clock):
    """Two models of one wildcard upstream share a fetch; a metrics URL on another origin never
    gets the deployment's key."""
    state = {"text": VLLM + 'vllm:num_requests_running{model_name="other"} 4.0\n'}
    with serving(metrics_server(state), lifespan="off") as url:
        load = LoadScrapeConfig()
        home = OpenAIDeployment(backend="openai", base_url=f"{url}/v1", api_key="sk-secret",
                                metrics=DeploymentMetrics())  # fmt: skip
        targets = [
            scrape_target(home, "a", load, now=clock, discovered_model="other"),
            scrape_target(home, "b", load, now=clock,
                          discovered_model="meta-llama/Llama-3.1-8B-Instruct"),
        ]  # fmt: skip
        scrapers = LoadScrapers([t for t in targets if t], rng=random.Random(0))
        scrapers.start()
        try:
            await scrapers.scrape_once(targets[0].url, targets)  # type: ignore[arg-type, union-attr]
        finally:
            await scrapers.stop()
        assert [t.tracker.current().running for t in targets] == [4.0, 22.0]  # type: ignore[union-attr]
        assert state["authorizations"][-1] == "Bearer sk-secret"
        elsewhere = home.model_copy(
            update={"metrics": DeploymentMetrics(url="http://127.0.0.1:9/metrics")}
        )
        target = scrape_target(elsewhere, "c", load, now=clock)
        assert target is not None and target.headers == {}
        unscraped = home.model_copy(update={"metrics": None})
        assert scrape_target(unscraped, "d", load, now=clock) is None


def test_a_simulated_upstream_without_metrics_is_not_scraped():
    with running_simulator(SimulationProfile()) as url:
        config = config_with(url)
        del config["models"][0]["deployments"][0]["metrics"]
        with running_titan(config) as titan:
            assert deployment_stats(titan, "m")["vllm-a"]["load"] is None
