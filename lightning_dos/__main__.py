"""Owns ``python -m lightning_dos``: the same command line as the ``lightning-dos`` console script."""

import sys

from lightning_dos.cli import main

if __name__ == "__main__":
    sys.exit(main())
