"""``python -m benchmarks NAME``: see benchmarks/cli.py."""

from benchmarks.cli import build_app

if __name__ == "__main__":
    build_app()(prog_name="python -m benchmarks")
