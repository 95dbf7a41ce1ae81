"""Chaos runs (``titan chaos SCENARIO``, docs/chaos.md): simulated or real backends behind
Titan, a load, a timeline of faults (latency spikes, error bursts, stalls, outages, processes
killed and restarted) and SLO assertions, with a report of what happened around each fault.

- ``scenario``: the YAML format; ``scenario_files``: files and the shipped ``scenarios/``;
  ``titan_config``: the titan.yaml a scenario's Titan runs with;
- ``systems``: starting the backends and Titan (``processes``) and acting on them;
  ``faults``: the timeline;
- ``load_driver``, ``sampling``: the load, and Titan's and the backends' state over time, as
  ``records``;
- ``measures``, ``checks``, ``verdicts``: the assertions; ``windows``, ``report``, ``html``: the
  report; ``runner``: one run, start to end.
"""
