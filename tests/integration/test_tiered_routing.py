"""Tiered routing with the real embedding classifier (all-MiniLM-L6-v2): small talk goes to the
small model, the rest to the large one. In-process simulated deployments, real HTTP."""

from __future__ import annotations

import httpx
import pytest

from tests.integration.harness import running_titan

pytestmark = pytest.mark.slow


def simulated(name: str) -> dict:
    return {"name": name, "deployments": [{"backend": "simulated", "profile": {"ttft_s": 0.001}}]}


def test_small_talk_goes_to_the_small_model():
    config = {
        "models": [
            {
                **simulated("large"),
                "tiers": [
                    {
                        "model": "small",
                        "similar_to": ["hi there!", "hello, how are you?", "thanks a lot"],
                        "min_similarity": 0.6,
                    }
                ],
            },
            simulated("small"),
        ],
        "probes": {"enabled": False},
    }
    with running_titan(config) as titan:

        def served_by(text: str) -> str:
            body = {"model": "large", "messages": [{"role": "user", "content": text}]}
            response = httpx.post(f"{titan}/v1/chat/completions", json=body, timeout=30)
            assert response.status_code == 200
            return response.headers["x-titan-model"]

        assert served_by("Hello! How are you today?") == "small"
        assert served_by("thank you so much") == "small"
        assert served_by("Derive the Navier-Stokes equations from first principles.") == "large"
        assert served_by("Write a SQL query joining orders and customers by id.") == "large"
