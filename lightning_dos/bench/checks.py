"""Owns what every mode's settings check with: each ``validate`` lists every problem it finds, then raises one
``ValueError`` naming them all (:func:`raise_problems`). No torch import here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def is_count(value: Any, least: int) -> bool:
    """Whether ``value`` is an integer (not a bool) of at least ``least``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def repeated(values: Sequence[Any]) -> list[Any]:
    """The values given more than once, sorted."""
    return sorted({value for value in values if list(values).count(value) > 1})


def problems_of(check: Callable[[], Any]) -> list[str]:
    """The message of the ``ValueError`` that ``check()`` raises, as a list; empty when it raises none."""
    try:
        check()
    except ValueError as err:
        return [str(err)]
    return []


def raise_problems(prefix: str, problems: Sequence[str]) -> None:
    """Raise one ``ValueError``: ``prefix`` and every problem, joined by ``; ``; nothing without problems."""
    if problems:
        raise ValueError(prefix + "; ".join(problems))
