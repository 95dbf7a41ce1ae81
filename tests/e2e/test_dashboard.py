"""The live dashboard in a real headless Chromium (Debian's ``chromium``, driven by Playwright):
the page loads, every chart draws, the charts change while load runs, and the page fetches
nothing from anywhere but Titan (its chart library included).

The screenshot is kept at ``tests/artifacts/dashboard.png`` (git-ignored), also when the test
fails.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import ConsoleMessage, Page, sync_playwright

from tests.integration.harness import running_titan

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = Path("/usr/bin/chromium")  # Debian's; `make test` installs it (never a download)
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
SCREENSHOT = ARTIFACTS / "dashboard.png"
CHARTS = [
    "chart-requests",
    "chart-errors",
    "chart-latency",
    "chart-ttft",
    "chart-queue",
    "chart-kv",
    "chart-cache",
]
CONFIG = {
    "models": [
        {"name": "sim", "deployments": [{"backend": "simulated", "profile": {"ttft_s": 0.01}}]}
    ],
    "probes": {"enabled": False},
}
LOAD_LIMIT_S = 30.0  # the load stops by itself, whatever happens to the test
WAIT_MS = 20_000


class Load:
    """Chat completions from a few threads until stopped (or LOAD_LIMIT_S)."""

    def __init__(self, base_url: str, num_threads: int = 3):
        self.base_url = base_url
        self.stopping = threading.Event()
        self.statuses: list[int] = []
        self.errors: list[str] = []
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(num_threads)]

    def __enter__(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(timeout=10)

    def _run(self) -> None:
        # temperature 0: the same request each time, so the response cache answers most.
        body = {"model": "sim", "temperature": 0,
                "messages": [{"role": "user", "content": "hello"}]}  # fmt: skip
        deadline = time.monotonic() + LOAD_LIMIT_S
        with httpx.Client(base_url=self.base_url, timeout=10) as client:
            while not self.stopping.is_set() and time.monotonic() < deadline:
                try:
                    self.statuses.append(client.post("/v1/chat/completions", json=body).status_code)
                except httpx.HTTPError as exc:
                    self.errors.append(repr(exc))
                self.stopping.wait(0.01)


def _keep_errors(message: ConsoleMessage, errors: list[str]) -> None:
    if message.type == "error":  # a failed load, a CSP violation, an exception logged
        errors.append(message.text)


def _plotted(page: Page, chart: str, trace: int = 0) -> list[float | None]:
    return page.evaluate(f"() => document.getElementById('{chart}').data[{trace}].y")


def test_dashboard_draws_and_moves_under_load():
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: `make test` installs it (apt-get install chromium)")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    requested: list[str] = []
    page_errors: list[str] = []
    with running_titan(CONFIG) as base_url, sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"]
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.on("request", lambda request: requested.append(request.url))
            page.on("pageerror", lambda error: page_errors.append(str(error)))
            page.on("console", lambda message: _keep_errors(message, page_errors))
            try:
                page.goto(f"{base_url}/dashboard", wait_until="load")
                # Every chart drew: Plotly's SVG and the traces the page gave it.
                page.wait_for_function(
                    """(ids) => ids.every((id) => {
                        const chart = document.getElementById(id);
                        return chart && chart.querySelector('.main-svg') && chart.data
                            && chart.data.length > 0;
                    })""",
                    arg=CHARTS,
                    timeout=WAIT_MS,
                )
                page.wait_for_selector("#status.status-live", timeout=WAIT_MS)
                assert max(_plotted(page, "chart-requests"), default=0) == 0  # nothing sent yet
                assert page.locator("#models .model").all_inner_texts() == ["sim"]

                with Load(base_url) as load:
                    # Requests per second and the latency percentiles go above zero, and the
                    # lines are drawn in the SVG, not only in the data.
                    page.wait_for_function(
                        """() => {
                            const y = (id, i) => document.getElementById(id).data[i].y;
                            const line = document.querySelector(
                                '#chart-requests .scatterlayer .trace path.js-line');
                            return y('chart-requests', 0).filter((v) => v > 0).length >= 2
                                && y('chart-latency', 0).some((v) => v > 0)
                                && y('chart-ttft', 1).some((v) => v > 0)
                                && y('chart-cache', 0).some((v) => v > 0)
                                && line && (line.getAttribute('d') || '').length > 0;
                        }""",
                        timeout=WAIT_MS,
                    )
                    page.wait_for_function(
                        "() => Number(document.getElementById('tile-requests').textContent) > 0",
                        timeout=WAIT_MS,
                    )
                assert load.statuses and set(load.statuses) == {200}, load.errors
                assert max(_plotted(page, "chart-requests")) > 0
                row = page.locator("#deployments tbody tr").first
                assert "healthy" in row.inner_text() and "closed" in row.inner_text()
                successes = int(row.locator("td").nth(6).inner_text())
                assert successes > 0
            finally:
                page.screenshot(path=str(SCREENSHOT), full_page=True)
        finally:
            browser.close()

    assert SCREENSHOT.stat().st_size > 10_000
    assert not page_errors, page_errors
    # Everything the page loaded came from Titan itself: no CDN, no request off the machine.
    assert requested and all(
        urlsplit(url).scheme == "data" or url.startswith(f"{base_url}/") for url in requested
    ), [url for url in requested if not url.startswith(base_url)]
    assert any(url.endswith("/dashboard/static/plotly.min.js") for url in requested)
