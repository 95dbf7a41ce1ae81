"""``python -m titan`` is the ``titan`` command."""

from titan.cli.main import main

if __name__ == "__main__":
    main()
