"""The embedded engine: continuous batching over a paged KV cache, in-process PyTorch.

Imports nothing from titan but ``titan.errors``; only ``titan.backends.embedded`` imports it.
"""
