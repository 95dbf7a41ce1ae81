"""Benchmarks: Titan's engine against baselines measured in the same run (``titan bench``)."""
