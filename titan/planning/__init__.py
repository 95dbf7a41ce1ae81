"""Capacity planning: how much memory a model needs on a GPU, how fast it can prefill and
decode there (a roofline), and a discrete-event simulation of continuous batching that predicts
TTFT and TPOT at a request rate, hence the replicas a traffic needs.

Pure: the standard library and numpy only; nothing here loads a model or touches a device.
``docs/capacity-planning.md`` states every formula.
"""
