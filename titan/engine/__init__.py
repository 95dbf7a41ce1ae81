"""The embedded engine: continuous batching over a paged KV cache, in-process PyTorch.

Three jobs apart: building (``builder``: weights, device, kernels, KV sizing), the core step on
token ids (``core``: scheduler, runner, sampler), and output processing (``output_processor``:
detokenizing, stop strings, logprob texts). ``Engine`` composes them; ``AsyncEngine`` runs it.

Imports nothing from titan but ``titan.errors``; only ``titan.backends.embedded`` imports it.
"""
