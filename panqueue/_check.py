"""Argument checks written once: ints in a range, numbers, flags, one of a few names.

Each refuses with one :class:`~panqueue.errors.ConfigError` line, ``"<what> must be
<expected>, got <value>"``, where ``what`` names the argument as the user wrote it
(``"concurrency"``, ``"Retention.history"``). ``bool`` is a subclass of ``int`` in Python, so
``True`` passes a plain ``isinstance(value, int)``: every check here refuses a bool where a
number is expected, and :func:`check_flag` accepts nothing but one. The domain checks built on
these (durations, attempts, priorities, partitions) live beside what they check.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeGuard

from panqueue.errors import ConfigError

__all__ = ["MAX_CONCURRENCY", "MAX_COUNT", "check_flag", "check_int", "check_number",
           "check_one_of", "is_int", "is_number"]

# The largest int check_int takes when the caller names no upper bound: every count and
# size reaches the server, whose scripts hold numbers as doubles (exact up to 2**53); a larger
# one failed there, or in the worker, long after it was accepted.
MAX_COUNT = 2**53
# The most jobs one worker of a queue runs at once (a handler's concurrency, a control command's).
MAX_CONCURRENCY = 10_000


def is_int(value: object) -> TypeGuard[int]:
    """An int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    """An int or a float that is not a bool (NaN and the infinities included)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_int(value: object, what: str, *, low: int | None = None, high: int | None = None,
              note: str = "", expected: str | None = None) -> int:
    """``value`` if it is an int from ``low`` to ``high`` (``low`` may be open; ``high`` is
    :data:`MAX_COUNT` when not given). The message says ``"an int >= low"`` (and ``"(at most
    2**53)"`` to a larger one) or ``"an int between low and high"``, then ``note`` (what a
    special value means, for example ``" (-1 keeps all)"``); ``expected`` replaces both."""
    capped = high is None
    top = MAX_COUNT if high is None else high
    if is_int(value) and (low is None or value >= low) and value <= top:
        return value
    if expected is None:
        if capped:
            expected = "an int" if low is None else f"an int >= {low}"
            if is_int(value) and value > top:  # the cap is named when it is what refused
                expected += " (at most 2**53)"
        elif low is not None:
            expected = f"an int between {low} and {top}"
        else:
            expected = f"an int <= {top}"
    raise ConfigError(f"{what} must be {expected}{note}, got {value!r}")


def check_number(value: object, what: str, *,
                 expected: str = "a number of seconds") -> int | float:
    """``value`` if it is an int or a float, any (the caller checks the range)."""
    if not is_number(value):
        raise ConfigError(f"{what} must be {expected}, got {value!r}")
    return value


def check_flag(value: object, what: str, *, expected: str = "a bool") -> bool:
    """``value`` if it is ``True`` or ``False``; a truthy 1 or ``"yes"`` is refused."""
    if not isinstance(value, bool):
        raise ConfigError(f"{what} must be {expected}, got {value!r}")
    return value


def check_one_of(value: object, what: str, choices: Sequence[str]) -> str:
    """``value`` if it is one of ``choices``, named in the message as ``'a', 'b' or 'c'``."""
    if isinstance(value, str) and value in choices:
        return value
    *rest, last = (repr(choice) for choice in choices)
    expected = f"{', '.join(rest)} or {last}" if rest else last
    raise ConfigError(f"{what} must be {expected}, got {value!r}")
