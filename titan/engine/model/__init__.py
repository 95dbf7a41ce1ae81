"""Llama-family decoder (SmolLM2, Llama, Qwen2 shapes): config, weights loading, forward pass."""
