"""Native kernels built at run time with the machine's C compiler (optional: torch fallbacks)."""
