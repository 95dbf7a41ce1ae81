"""The load generator behind ``titan bench URL``: closed- and open-loop load against any
OpenAI-compatible endpoint, vLLM ``bench serve``'s metrics, sweeps and their knee, reports.

Usage from code::

    run = run_load_sync(LoadTarget("http://127.0.0.1:8000/v1", "my-model"), OpenLoop(rate=50),
                        workload_by_name("chat"), duration_s=30)
    print(summarize(run, Slo(ttft_s=0.5)))

See docs/load-testing.md for the definitions.
"""

from titan.loadgen.arrivals import Arrivals, ClosedLoop, OpenLoop
from titan.loadgen.client import NOT_SENT, TRANSPORT_FAILURE, LoadTarget, Sample
from titan.loadgen.metrics import Slo, stats, summarize, tpot_of
from titan.loadgen.runner import LoadRun, run_load, run_load_sync
from titan.loadgen.sweep import MIN_ATTAINMENT, SweepPoint, find_knee, run_sweep
from titan.loadgen.workloads import BUILT_IN, Workload, workload_by_name

__all__ = [
    "BUILT_IN",
    "MIN_ATTAINMENT",
    "NOT_SENT",
    "TRANSPORT_FAILURE",
    "Arrivals",
    "ClosedLoop",
    "LoadRun",
    "LoadTarget",
    "OpenLoop",
    "Sample",
    "Slo",
    "SweepPoint",
    "Workload",
    "find_knee",
    "run_load",
    "run_load_sync",
    "run_sweep",
    "stats",
    "summarize",
    "tpot_of",
    "workload_by_name",
]
