"""Owns ``python -m lightning_dos.bench``: the same command as ``lightning-dos bench``."""

from lightning_dos.bench import main

if __name__ == "__main__":  # a spawned child (SuperOffload's, ZenFlow's optimizer process) re-imports this module
    raise SystemExit(main())
