"""How long the endurance tests run: a bounded version in every run, the full one with ``--long``.

``scripts/test.sh`` runs the bounded versions (the suite stays within its time on two cores);
``scripts/test.sh --long`` runs the full ones, for a release or after a change to the scripts,
the claim or the runtime's recovery. tests/conftest.py sets :data:`LONG` from the option before
any test module is imported, so a module may read it at import time (in ``@settings``).
"""

from __future__ import annotations

#: True with ``--long``.
LONG = False


def examples(bounded: int, full: int) -> int:
    """Hypothesis ``max_examples``: ``full`` with ``--long``, else ``bounded``."""
    return full if LONG else bounded


def seconds(bounded: float, full: float) -> float:
    """A duration: ``full`` with ``--long``, else ``bounded``."""
    return full if LONG else bounded
