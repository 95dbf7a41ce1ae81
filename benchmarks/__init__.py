"""Titan against what a user would run instead, side by side in one run; not installed with Titan.

``python -m benchmarks NAME`` (or ``make bench NAME=...``) runs one and writes its section of
bench/RESULTS.md and its raw numbers under bench/out/.
"""
