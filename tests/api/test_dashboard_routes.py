"""The dashboard's routes over ASGI: the page and its assets (Plotly's from the installed package),
the data with ``?since=``, and what they refuse. The browser test is tests/e2e/test_dashboard.py."""

from __future__ import annotations

import asyncio

import httpx
from starlette.applications import Starlette


async def test_the_page_and_its_assets(client: httpx.AsyncClient):
    page = await client.get("/dashboard")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    assert 'src="dashboard/static/plotly.min.js"' in page.text
    assert "http://" not in page.text and "https://" not in page.text  # nothing from elsewhere

    plotly = await client.get("/dashboard/static/plotly.min.js")
    assert plotly.status_code == 200 and "javascript" in plotly.headers["content-type"]
    assert len(plotly.content) > 1_000_000 and b"plotly" in plotly.content[:2000].lower()
    for name, kind in (("dashboard.js", "javascript"), ("dashboard.css", "text/css")):
        asset = await client.get(f"/dashboard/static/{name}")
        assert asset.status_code == 200 and kind in asset.headers["content-type"]
        assert asset.headers["cache-control"] == "no-cache" and asset.headers["etag"]


async def test_only_the_known_files_are_served(client: httpx.AsyncClient):
    for name in ("index.html", "__init__.py", "..%2F__init__.py", "nope.js"):
        response = await client.get(f"/dashboard/static/{name}")
        assert response.status_code == 404, name
        assert response.json()["error"]["code"] == "not_found"


async def test_the_data_and_since(app: Starlette, client: httpx.AsyncClient):
    first = (await client.get("/dashboard/data")).json()  # the first look starts the sampler
    assert first["samples"] == [] and first["interval_s"] == 1.0
    dashboard = app.state.titan.pipeline.dashboard
    assert dashboard.is_running
    for _ in range(2):
        await asyncio.sleep(0.01)  # samples' times are to the millisecond
        dashboard.sample()

    data = (await client.get("/dashboard/data")).json()
    samples = data["samples"]
    assert len(samples) >= 2  # the background task may have added one
    assert data["models"] == app.state.titan.pipeline.model_ids()
    assert [row["health"] for row in data["deployments"]] == ["healthy"]
    latest = samples[-1]
    assert latest["engine_batch"] == 0  # an embedded engine serves: its batch is shown
    assert latest["requests_per_s"] == 0.0 and latest["latency_p99_s"] is None

    since = samples[0]["t"]
    newer = [s["t"] for s in (await client.get(f"/dashboard/data?since={since}")).json()["samples"]]
    assert newer[: len(samples) - 1] == [s["t"] for s in samples[1:]]
    assert all(t > since for t in newer)

    bad = await client.get("/dashboard/data", params={"since": "yesterday"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "since"
