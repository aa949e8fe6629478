"""The event loop's side of the thread executor: how an attempt waits for its call in a thread
(an asyncio future, a parked trio task: not an ``anyio.Event``), and how finished calls are
delivered, by one loop callback per burst of them (every callback from a thread costs the loop a
wake-up)."""

from __future__ import annotations

import asyncio
import threading
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import anyio.lowlevel

__all__ = ["Waiting", "_Loop", "current_loop"]


class Waiting(Protocol):
    """What a loop knows of a call: the primitive its attempt waits on (set by
    :meth:`_Loop.prepare`, an asyncio future or a parked trio task)."""

    waiter: Any


class _Loop(ABC):
    """The event loop side of the calls made from one loop: how an attempt waits for its call,
    and the delivery of finished calls by one loop callback per burst."""

    def __init__(self, lock: threading.Lock, token: anyio.lowlevel.EventLoopToken) -> None:
        self.lock = lock  # the pool's: guards finished and scheduled
        self.token = token
        self.finished: list[Waiting] = []
        self.scheduled = False

    @abstractmethod
    def current(self) -> bool:
        """Whether this is the loop running the calling task."""

    @abstractmethod
    def prepare(self, call: Waiting) -> None:
        """Before the call is submitted: what the attempt will wait on."""

    @abstractmethod
    def wait(self, call: Waiting) -> Awaitable[Any]:
        """What to await until the call is delivered (cancellable)."""

    @abstractmethod
    def wake(self, call: Waiting) -> None:
        """On the loop: let the attempt waiting for ``call`` go on."""

    @abstractmethod
    def post(self) -> None:
        """From a thread: have the loop run :meth:`deliver` soon. Does nothing if the loop is
        gone: nobody waits any more."""

    @abstractmethod
    def soon(self, fn: Callable[[], None]) -> None:
        """On the loop: run ``fn`` once the callbacks ready now have run."""

    def deliver(self) -> None:
        with self.lock:
            calls, self.finished = self.finished, []
            self.scheduled = False
        for call in calls:
            self.wake(call)


class _AsyncioLoop(_Loop):
    def __init__(self, lock: threading.Lock, token: anyio.lowlevel.EventLoopToken) -> None:
        super().__init__(lock, token)
        self.loop = asyncio.get_running_loop()

    def current(self) -> bool:
        return asyncio._get_running_loop() is self.loop

    def prepare(self, call: Waiting) -> None:
        call.waiter = self.loop.create_future()

    def wait(self, call: Waiting) -> Awaitable[Any]:
        waiter: Awaitable[Any] = call.waiter
        return waiter

    def wake(self, call: Waiting) -> None:
        waiter = call.waiter
        if not waiter.done():  # else cancelled: the attempt stopped waiting
            waiter.set_result(None)

    def post(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self.deliver)
        except RuntimeError:  # the loop is closed
            pass

    def soon(self, fn: Callable[[], None]) -> None:
        self.loop.call_soon(fn)


class _TrioLoop(_Loop):
    def __init__(self, lock: threading.Lock, token: anyio.lowlevel.EventLoopToken) -> None:
        import trio

        super().__init__(lock, token)
        self.trio = trio
        self.trio_token: Any = token.native_token
        self.soon_calls: list[Callable[[], None]] = []  # see soon()
        self.parked: Any = None
        self.runner = False

    def current(self) -> bool:
        try:
            return self.trio.lowlevel.current_trio_token() is self.trio_token
        except RuntimeError:
            return False

    def prepare(self, call: Waiting) -> None:
        call.waiter = self.trio.lowlevel.current_task()

    def wait(self, call: Waiting) -> Awaitable[Any]:
        lowlevel = self.trio.lowlevel

        def abort(_: Any) -> Any:
            call.waiter = None  # no longer parked: wake() must not reschedule it
            return lowlevel.Abort.SUCCEEDED

        return lowlevel.wait_task_rescheduled(abort)  # type: ignore[no-any-return]

    def wake(self, call: Waiting) -> None:
        task, call.waiter = call.waiter, None
        if task is not None:
            self.trio.lowlevel.reschedule(task)

    def post(self) -> None:
        try:
            self.trio_token.run_sync_soon(self.deliver)
        except self.trio.RunFinishedError:
            pass

    def soon(self, fn: Callable[[], None]) -> None:
        # Through a parked system task: run_sync_soon() would cost a write to trio's wake-up
        # socket each time.
        self.soon_calls.append(fn)
        task, self.parked = self.parked, None
        if task is not None:
            self.trio.lowlevel.reschedule(task)
        elif not self.runner:
            self.runner = True
            self.trio.lowlevel.spawn_system_task(self.run_soon_calls)

    async def run_soon_calls(self) -> None:
        lowlevel = self.trio.lowlevel

        def abort(_: Any) -> Any:  # the run is ending
            self.parked = None
            return lowlevel.Abort.SUCCEEDED

        while True:
            calls, self.soon_calls = self.soon_calls, []
            for fn in calls:
                fn()
            if not self.soon_calls:
                self.parked = lowlevel.current_task()
                await lowlevel.wait_task_rescheduled(abort)


def current_loop(lock: threading.Lock) -> _Loop:
    token = anyio.lowlevel.current_token()
    if isinstance(token.native_token, asyncio.AbstractEventLoop):
        return _AsyncioLoop(lock, token)
    return _TrioLoop(lock, token)
