"""The worker's first step: settle the queue's layout (its partitions) and set each partition up.

The layout is stored in the queue's home meta (``_store/ops/layout.py``). A worker whose
handler declares the stored count sets up the stored layout's partitions. One that declares
another count changes the layout, which is possible only while no partition holds a job
(``change_layout``; otherwise a :class:`ConfigError` names the partition that holds jobs and
nothing changes). A partition that refuses the stored layout was left moved by a change that
was interrupted: it is given back to the stored layout (``repair_partition``) and set up again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

import anyio

from panqueue._keys import Layout, QueueKeys
from panqueue._runtime.trouble import Trouble
from panqueue._store.ops.base import LayoutChanged
from panqueue._store.ops.layout import (
    LayoutBusy,
    LayoutServed,
    change_layout,
    declare,
    read_layout,
    repair_partition,
)
from panqueue._store.transport import AsyncTransport, Op
from panqueue.errors import ConfigError

__all__ = ["settle_layout"]

T = TypeVar("T")


class Served(Protocol):
    """How the worker sends one step of its start (``Worker._when_served``): again while the
    server cannot serve yet."""

    def __call__(self, trouble: Trouble, call: Callable[[], Awaitable[T]], /) -> Awaitable[T]:
        ...

# How long a worker waits for another client's layout change to end (the lease of its lock,
# with a margin), polling every _BUSY_POLL seconds, and how often it starts over when the layout
# changes under its own setup.
_BUSY_WAIT = 12.0
_BUSY_POLL = 0.05
_ATTEMPTS = 10
_LEAVE_POLL = 0.25


async def settle_layout(transport: AsyncTransport, name: str, count: int, token: str,
                        served: Served, trouble: Trouble,
                        setup: Callable[[QueueKeys], Awaitable[None]], *,
                        leave_wait: float) -> list[QueueKeys]:
    """Settle queue ``name``'s layout for a worker declaring ``count`` partitions and set up
    each partition with ``setup``; returns the partitions. ``served`` sends one step (the
    worker waits out a server that cannot serve yet, reporting to ``trouble``); ``token``
    names this worker's layout lock. A count change that workers of the old count are in the
    way of is tried again for ``leave_wait`` seconds (the life of a registry entry that its
    worker could not remove), then refused."""
    for _ in range(_ATTEMPTS):
        layout = await _leave_retry(leave_wait, lambda: _busy_retry(
            lambda: served(trouble, lambda: transport.run(_layout_for(name, count, token)))))
        parts = layout.keys(name)
        if await _set_up(transport, parts, token, served, trouble, setup):
            return parts
    raise ConfigError(f"queue {name!r}: its layout kept changing while this worker started")


def _layout_for(name: str, count: int, token: str) -> Op[Layout]:
    layout = yield from read_layout(name)
    if layout is None:
        layout = yield from declare(name, count)
    if layout.count == count:
        return layout
    return (yield from change_layout(name, count, token))


async def _set_up(transport: AsyncTransport, parts: list[QueueKeys], token: str,
                  served: Served, trouble: Trouble,
                  setup: Callable[[QueueKeys], Awaitable[None]]) -> bool:
    """Set up every partition; False when the stored layout is no longer ``parts``'."""
    for keys in parts:
        def set_up(keys: QueueKeys = keys) -> Awaitable[None]:
            return setup(keys)

        def repair(keys: QueueKeys = keys) -> Awaitable[bool]:
            return transport.run(repair_partition(keys, token))

        try:
            await served(trouble, set_up)
        except LayoutChanged:
            if not await _busy_retry(lambda: served(trouble, repair)):
                return False
            await served(trouble, set_up)
    return True


async def _leave_retry(wait: float, call: Callable[[], Awaitable[T]]) -> T:
    """``call()``, again while workers of the old count are registered, for up to ``wait``
    seconds: a stopped worker whose last call was lost, or one that died, leaves the registry
    within that time; a live one keeps its entry, and the change is refused."""
    return await _retry(call, LayoutServed, wait, _LEAVE_POLL)


async def _busy_retry(call: Callable[[], Awaitable[T]]) -> T:
    """``call()``, again while another client's layout change holds the lock (for up to the
    lock's lease)."""
    return await _retry(call, LayoutBusy, _BUSY_WAIT, _BUSY_POLL)


async def _retry(call: Callable[[], Awaitable[T]], error: type[Exception], wait: float,
                 poll: float) -> T:
    """``call()``, again every ``poll`` seconds while it raises ``error``, for up to ``wait``
    seconds; then the error stands."""
    deadline = anyio.current_time() + wait
    while True:
        try:
            return await call()
        except error:
            if anyio.current_time() > deadline:
                raise
            await anyio.sleep(poll)
