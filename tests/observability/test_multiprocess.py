"""Several worker processes: with PROMETHEUS_MULTIPROC_DIR set, each process writes its counts
and histograms to that folder and /metrics in any of them shows the sums."""

from __future__ import annotations

import subprocess
import sys

from prometheus_client.parser import text_string_to_metric_families

from titan.observability.metrics import MULTIPROC_ENV, TitanMetrics

WRITER = """
from titan.observability.metrics import TitanMetrics
from titan.observability.records import RequestRecord
metrics = TitanMetrics()
record = RequestRecord("r", "chat", model="m", ttft_s=0.1, total_s=0.2)
record.claim_report()
metrics.observe(record, None)
"""


def test_metrics_from_several_processes_are_summed(tmp_path, monkeypatch):
    env = {MULTIPROC_ENV: str(tmp_path)}
    for _ in range(2):  # two worker processes, each serving one request
        subprocess.run([sys.executable, "-c", WRITER], check=True, env={**env, "PATH": ""})
    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
    text = TitanMetrics().render().decode()
    found = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert found[("titan_requests_total", (("model", "m"), ("status", "200")))] == 2
    assert found[("titan_time_to_first_token_seconds_count", (("model", "m"),))] == 2
