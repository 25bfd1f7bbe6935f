"""Owns ``python -m lightning_dos.bench``: the same command as ``lightning-dos bench``."""

from lightning_dos.bench import main

raise SystemExit(main())
