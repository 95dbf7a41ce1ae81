"""Titan against what a user would run instead, side by side in one run; not installed with Titan.

``python -m benchmarks NAME`` (or ``make bench NAME=...``) runs one and writes its section of
bench/RESULTS.md and its raw numbers under bench/out/.

- ``base``: the one ``Benchmark`` interface and ``measure`` (the record of when, the command,
  the machine and the versions; the JSON; the section); ``results_file``: RESULTS.md's
  sections and the pieces every report shares; ``runner``, ``cli``, ``*_commands``: the
  command line.
- Per benchmark, its workload (``X_bench`` or ``X``) and its report (``X_report``, which
  declares its ``BENCHMARK``): engine, structured, planner, quality, cuda, llamacpp,
  constrained; gateway, admission, cache, context, jobs, observability, loadgen.
- Their load goes through titan.loadgen's client (``gateway_load``, ``admission_load``,
  ``server_load``, ``llamacpp_load``) or wrk; their servers start through titan.chaos.processes.
"""
