"""The ``titan`` command line: serve now; worker, chat, bench, chaos, keys and config later."""
