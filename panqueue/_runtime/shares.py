"""A partitioned queue's share-out: which partitions a worker serves first, and when the slots
busy in a partition go back to the claim loop (``claimer.py``) to be shared out again.

The workers of a partitioned queue share its partitions out. Before a claim, at most once a
second, the loop reads the queue's claiming workers (lua/peers.lua: live in the registry, not
paused by a command, no blocked event loop, a concurrency above 0). With W of them sorted by
name, the i-th owns the partitions p with p mod W = i (W < N), or partition i mod N (W >= N):
every partition is some claiming worker's own. A worker alone, or not in the registry yet, owns
every partition.

A claim asks the worker's own partitions first and the others only for what they could not
fill, so a slot never stays free while any partition has work; within each group, those where
the worker runs the fewest jobs first. A recording claims the slot's
next job in the same partition (:meth:`Shares.keeps`), so while every partition is busy each is
served by its own workers, whose completions batch as on one partition, instead of every
worker's slots thinning out over all of them. The slots go back to the claim loop to be shared
out again: in one of the worker's own partitions, those of its next recording once a second
(a partition of its own that filled up while the slots were busy in the others waits about
that long at most); in another's, where they help, every one of them a second after the loop
last placed slots there, or at once when a wake-up says that work appeared in some partition
(the loop then asks the worker's own partitions first again). Helping
so costs what serving costs, one call that completes and claims, not a claim per job.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from panqueue._keys import QueueKeys
from panqueue._store import transitions
from panqueue._store.transport import AsyncTransport
from panqueue.errors import PanqueueError

__all__ = ["PEERS_EVERY", "RESPREAD_EVERY", "Shares"]

# How often a partition's slots go back to the claim loop to be shared out again, and how often
# at most the loop reads which workers claim.
RESPREAD_EVERY = 1.0
PEERS_EVERY = 1.0


class Shares:
    """One worker's share of the partitions ``parts`` (``name``: its name in the registry)."""

    def __init__(self, parts: list[QueueKeys], name: str, heard: Callable[[], bool]) -> None:
        self._parts = parts
        self._name = name
        self._heard = heard  # whether a wake-up came since the loop's last claim
        self.own = frozenset(range(len(parts)))  # the indexes of this worker's partitions
        first = time.monotonic() + RESPREAD_EVERY
        self._respread_at = [first] * len(parts)  # when each partition's slots go back next
        self._help_until = [0.0] * len(parts)  # until when slots that help in a partition stay
        self._peers_due = 0.0  # when the claiming workers are next read
        self.busy = [0] * len(parts)  # this worker's busy slots in each partition (the loop's)

    def keeps(self, index: int) -> bool:
        """Whether a recording in partition ``index`` claims its slots' next jobs there: in
        this worker's partitions, all but the first recording after a second has passed since
        the partition's slots were last shared out; in another's, every recording until a
        second after the loop last placed slots there (:meth:`helping`), or until work
        appeared somewhere (a wake-up came since the loop's last claim: the partition that got
        it may be one of this worker's own, which the loop asks first)."""
        if len(self._parts) == 1:
            return True
        now = time.monotonic()
        if index not in self.own:
            if self._heard():
                self._help_until = [0.0] * len(self._parts)
            return now < self._help_until[index]
        if now >= self._respread_at[index]:
            self._respread_at[index] = now + RESPREAD_EVERY
            return False
        return True

    async def groups(self, transport: AsyncTransport
                     ) -> tuple[list[QueueKeys], list[QueueKeys]]:
        """(this worker's partitions, the others), the claiming workers read again first if a
        second has passed; on a failed read the share stays as it was (the claim that follows
        meets the same trouble, and reports it)."""
        if time.monotonic() >= self._peers_due:
            self._peers_due = time.monotonic() + PEERS_EVERY
            try:
                self._share(await transport.run(transitions.peers(self._parts[0])))
            except PanqueueError:
                pass
        return ([keys for keys in self._parts if keys.partition in self.own],
                [keys for keys in self._parts if keys.partition not in self.own])

    def helping(self, keys: QueueKeys) -> None:
        """The loop placed slots in ``keys``, a partition of another worker's: they stay there
        for a second."""
        self._help_until[keys.partition] = time.monotonic() + RESPREAD_EVERY

    def _share(self, peers: list[str]) -> None:
        n = len(self._parts)
        names = sorted(set(peers))
        if self._name not in names or len(names) == 1:
            self.own = frozenset(range(n))
            return
        i, w = names.index(self._name), len(names)
        self.own = frozenset(range(i, n, w) if w < n else (i % n,))
