"""The layout of a partitioned queue (``partitions=N``, :class:`panqueue._keys.Layout`): its
partition count, placement and version, stored in the queue's home meta; declared by the first
producer or worker, read by every client, and changed by a worker of another count.

Clients remember the layout to route adds without a read (``ops/partitions.py``); every add names
the version it routes by, and a partition that is not in that version refuses it
(``lua/lib/layout.lua`` ``partition_problem``): the client reads the layout again and routes the
refused jobs anew. A layout changes only through :func:`change_layout`, while the queue holds no
job; a change that was interrupted is undone partition by partition (:func:`repair_partition`).
"""

from __future__ import annotations

import time
from typing import TypeVar

from panqueue._keys import LEGACY_PLACEMENT, SPREAD_PLACEMENT, Layout, QueueKeys
from panqueue._store.loader import SCRIPTS
from panqueue._store.ops.base import script_call
from panqueue._store.ops.batches import relay
from panqueue._store.transport import Command, Op
from panqueue.errors import ConfigError, PanqueueError

__all__ = ["LayoutBusy", "LayoutServed", "change_layout", "declare", "partition_count",
           "read_layout", "repair_partition"]

T = TypeVar("T")


def read_layout(name: str) -> Op[Layout | None]:
    """The layout stored in queue ``name``'s home meta; None while it has none (no producer or
    worker has declared it yet, so it may still become anything). A queue stored without a
    placement was declared before partitions were placed by slot: its partitions keep their
    "#i" tags."""
    count, placement, version, mode = yield Command(("HMGET", QueueKeys(name).meta, "np", "pl",
                                                     "lv", "mode"))
    if count is None:
        return None
    return Layout(int(count), LEGACY_PLACEMENT if placement is None else int(placement),
                  int(version or 0), (mode or b"").decode())


def partition_count(name: str) -> Op[int | None]:
    """The partition count stored for queue ``name``; None while it has none."""
    layout = yield from read_layout(name)
    return None if layout is None else layout.count


def declare(name: str, n: int, mode: str = "") -> Op[Layout]:
    """Store a producer's layout in the queue's home meta, where every client reads it (the
    add itself may go to another partition); the layout stored first wins. ``mode``: the
    producer's handler's, stored with a layout it stores."""
    home = QueueKeys(name)
    reply = yield script_call(SCRIPTS.declare, home, n, SPREAD_PLACEMENT, mode)
    count, placement, version, stored_mode = reply
    return Layout(int(count), LEGACY_PLACEMENT if placement is None else int(placement),
                  int(version or 0), (stored_mode or b"").decode())


class LayoutBusy(ConfigError):
    """Another client holds the queue's layout lock (a change is under way): try again."""


class LayoutServed(ConfigError):
    """Workers of the stored count are registered: the count can change once they have left
    (a stopped worker's entry goes at once, or, when its last call was lost, within three of
    its heartbeats, as a dead worker's)."""


# How long a layout change may hold the home's lock. The changer stops taking steps well before
# (_LEASE_MS / 2 after it took the lock), so that none lands after another may have taken it.
_LEASE_MS = 10_000


def _relayout(keys: QueueKeys, version: int | str, place: str, token: str = "",
              placement: int = SPREAD_PLACEMENT) -> Op[str | None]:
    """One step of a change (``lua/relayout.lua``): None, or why it was refused."""
    reply = yield script_call(SCRIPTS.relayout, keys, version, place, token, placement)
    return reply[1].decode() if reply[0] == b"!" else None


def change_layout(name: str, count: int, token: str) -> Op[Layout]:
    """Change queue ``name`` to ``count`` partitions placed by slot (a worker that declares
    another count than the stored one): :class:`ConfigError` naming the partition that holds
    jobs, or the workers that serve the old layout (nothing changed); :class:`LayoutBusy` when
    another change holds the lock. Under the home's lock, every partition of the old layout and
    every new one moves to the next version while it holds no job, one script each, then the
    home, where clients read the layout, moves last; a refusal moves the others back. From the
    first step on, a client that routes by the old layout is refused by the partitions already
    moved and reads the layout again, so no add lands in a partition that the new layout
    leaves out."""
    home = QueueKeys(name)
    if not (yield Command(("SET", home.relayout, token, "NX", "PX", _LEASE_MS))):
        raise LayoutBusy(f"queue {name!r}: another change of its layout is under way")
    return (yield from _released(home, token, _change(name, count, token)))


def _released(home: QueueKeys, token: str, op: Op[T]) -> Op[T]:
    """``op``, then the layout lock released, also when ``op`` fails with an error of ours.
    (Not in a ``finally``: an operation abandoned by a cancelled caller is closed, and can send
    nothing then; its lock expires with its lease.)"""
    try:
        result = yield from op
    except PanqueueError:
        yield from _relayout(home, "", "", token)
        raise
    yield from _relayout(home, "", "", token)
    return result


def _change(name: str, count: int, token: str) -> Op[Layout]:
    home = QueueKeys(name)
    started = time.monotonic()
    current = (yield from read_layout(name)) or Layout(1)
    if current.count == count:
        return current  # another worker changed it meanwhile
    new = Layout(count, SPREAD_PLACEMENT, current.version + 1)
    old_parts, new_parts = current.keys(name), new.keys(name)
    # The endings of batch jobs that no worker relayed (a cancel from a client, a worker stopped
    # before its relay) go to their batches first: no worker of the new layout looks at the
    # outbox of a partition it leaves out or names anew, and a partition whose outbox holds an
    # ending refuses to move (relayout.lua).
    for keys in old_parts:
        try:
            yield from relay(keys)
        except ConfigError:
            pass  # a callback its queue refused: the ending is recorded, the sweep adds it
    deadline = started + _LEASE_MS / 2000
    new_index = {keys.prefix: keys.partition for keys in new_parts}
    old_prefixes = {keys.prefix for keys in old_parts}
    steps = [(keys, f"{count}:{new_index[keys.prefix]}" if keys.prefix in new_index
              else "0:0", f"{current.count}:{keys.partition}") for keys in old_parts[1:]]
    steps += [(keys, f"{count}:{keys.partition}", "0:0") for keys in new_parts[1:]
              if keys.prefix not in old_prefixes]
    moved: list[tuple[QueueKeys, str]] = []
    problem = None
    for keys, place, before in steps:
        if time.monotonic() > deadline:
            problem = ConfigError(f"queue {name!r}: the change of its partition count took "
                                  "too long and was stopped (the next worker undoes it)")
            break
        if (refused := (yield from _relayout(keys, new.version, place))):
            problem = _held(name, current, count, keys, refused)
            break
        moved.append((keys, before))
    if problem is None:
        refused = yield from _relayout(home, new.version, f"{count}:0", token)
        if refused is None:
            return new
        problem = (_held(name, current, count, home, refused) if refused.startswith("holds")
                   else _served(name, current, count, refused))
    if time.monotonic() < deadline:
        # Back to the old layout: no client routed by the new one yet (the home never named
        # it), and the old one's clients were refused, so these hold no job. Past the deadline
        # the lock may be another's by now: the next worker gives them back (repair_partition).
        for keys, before in reversed(moved):
            yield from _relayout(keys, current.version, before)
    raise problem


def _held(name: str, current: Layout, count: int, keys: QueueKeys,
          refused: str = "holds jobs") -> ConfigError:
    what = ("holds jobs (the count changes only while the queue holds no job: drain and purge "
            "it first; see docs/scaling.md)" if refused == "holds jobs" else
            "holds endings of batch jobs that reached no batch yet (they were relayed "
            "just before; start the worker again)")
    return ConfigError(
        f"queue {name!r}: partition count mismatch: the queue has {current.count} "
        f"partition(s), this worker says {count}, and its partition {keys.partition} "
        f"({keys.prefix[:-1]}) {what}")


def _served(name: str, current: Layout, count: int, refused: str) -> ConfigError:
    if not refused.startswith("live workers"):
        return ConfigError(f"queue {name!r}: the change of its partition count lost its lock "
                           "(it took too long) and was stopped (the next worker undoes it)")
    live = refused.rpartition(" ")[2]
    return LayoutServed(
        f"queue {name!r}: partition count mismatch: the queue has {current.count} "
        f"partition(s), this worker says {count}, and {live} live worker(s) serve it with "
        f"{current.count} (stop them first; a worker that died leaves the registry within three "
        "heartbeats; see docs/scaling.md)")


def repair_partition(keys: QueueKeys, token: str) -> Op[bool]:
    """Give ``keys`` (a partition of the queue's stored layout, refusing it) back to that
    layout: a change that was interrupted left it moved, empty, to a version the home never
    named. Under the home's lock, so that no change is under way. False: the stored layout is
    not the one ``keys`` belongs to any more (the caller reads it again)."""
    home = QueueKeys(keys.name)
    if not (yield Command(("SET", home.relayout, token, "NX", "PX", _LEASE_MS))):
        raise LayoutBusy(f"queue {keys.name!r}: a change of its layout is under way")
    return (yield from _released(home, token, _give_back(keys)))


def _give_back(keys: QueueKeys) -> Op[bool]:
    stored = yield from read_layout(keys.name)
    if stored is None or stored.version != keys.version or stored.count != keys.partitions:
        return False
    if (yield from _relayout(keys, keys.version, f"{keys.partitions}:{keys.partition}")):
        raise ConfigError(
            f"queue {keys.name!r}: partition {keys.partition} ({keys.prefix[:-1]}) holds jobs "
            f"under another layout than the queue's (version {keys.version})")
    return True
