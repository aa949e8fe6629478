"""What an operation asks the transport for: a script call, a command, a batch of them, a scan;
and the commands a script call is sent as (:func:`script_steps`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from typing import Any, TypeVar

import redis.exceptions

from panqueue._store.loader import Script

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class ScriptCall:
    script: Script
    keys: tuple[str, ...]
    args: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Command:
    args: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Batch:
    """Requests sent in one round trip, in order, not as a transaction.

    A script in a batch is sent with EVAL (its whole body): a pipeline cannot fall back from
    EVALSHA to EVAL for one command without reordering the others.

    ``route`` (a key): on Redis Cluster, send the whole batch on one connection to the master
    that owns this key's slot. Commands without keys (INFO, WAITAOF) need it to reach the node
    that holds the queue; without it, each command goes where its own keys live.
    """

    commands: tuple[Command | ScriptCall, ...]
    route: str | None = None


@dataclass(frozen=True, slots=True)
class Scan:
    """Every key that matches ``match`` (a SCAN run to its end, over every master of a
    cluster); the reply is a list of key names (bytes). Not allowed in a :class:`Batch`."""

    match: str


Request = ScriptCall | Command | Batch | Scan
Op = Generator[Request, Any, T]


# A server's refusals of a command that may write, before it runs (redis-py gives the first
# two their own class and strips the code from the message).
_NO_WRITES_NOW = (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError)
_NO_WRITES_CODES = ("NOREPLICAS", "MISCONF")

# The commands of one script call: each yield a command, its reply (or error) sent back in.
Steps = Generator[tuple[Any, ...], Any, Any]


def _no_writes_now(exc: redis.exceptions.ResponseError) -> bool:
    return isinstance(exc, _NO_WRITES_NOW) or str(exc).startswith(_NO_WRITES_CODES)


class Functions:
    """Whether a transport calls scripts as Redis Functions (``FCALL``): until the server or
    the user's ACL refuses them (a server before Redis 7, a user without ``FCALL`` or
    ``FUNCTION LOAD``); from then on it sends EVALSHA."""

    __slots__ = ("on",)

    def __init__(self) -> None:
        self.on = True


def script_steps(call: ScriptCall, functions: Functions) -> Steps:
    """The commands one script call is sent as, one at a time: each yielded command's reply is
    sent back in, or its error (a ``redis.exceptions.ResponseError``) thrown in; what the
    generator returns is the call's reply, what it raises its error.

    First ``FCALL`` of the script's library (``panqueue/_store/library.py``). A server without
    the library answers "Function not found": ``FUNCTION LOAD REPLACE`` (the same library loaded
    twice, by two workers at once, is no error) and ``FCALL`` again.

    A server that takes no writes now (over ``maxmemory``, a replica, too few replicas, a failed
    save) refuses a function that may write before it runs, where it refuses a script sent with
    EVALSHA only at the script's first write (so a script that only reads, or only deletes on a
    full server, runs): that call goes by EVALSHA, as does one whose library cannot be loaded
    for memory, so that such a server treats a call as it always has. Then EVALSHA, and EVAL
    when the server lacks the script.
    """
    script = call.script
    if script.function is not None and functions.on:
        try:
            return (yield _function_args(call))
        except redis.exceptions.ResponseError as exc:
            if _no_writes_now(exc):
                pass  # this call by EVALSHA
            elif str(exc).startswith("Function not found"):
                library = script.library  # made now, on the first call that needs it
                if library is not None:  # (None: it cannot have one after all; EVALSHA)
                    try:
                        yield ("FUNCTION", "LOAD", "REPLACE", library)
                    except redis.exceptions.ResponseError as load_error:
                        if not _no_writes_now(load_error):
                            functions.on = False
                    else:
                        return (yield _function_args(call))
            elif (isinstance(exc, redis.exceptions.NoPermissionError)
                  or str(exc).lower().startswith("unknown command")):
                functions.on = False
            else:
                raise
    try:
        return (yield _script_args(call, cached=True))
    except redis.exceptions.NoScriptError:
        return (yield _script_args(call, cached=False))


def call_script(call: ScriptCall, functions: Functions,
                send: Callable[[tuple[Any, ...]], Any]) -> Any:
    """The reply of a script call, its commands (:func:`script_steps`) sent with ``send``."""
    steps = script_steps(call, functions)
    command: tuple[Any, ...] | None = next(steps)
    result = None
    while command is not None:
        try:
            reply, error = send(command), None
        except redis.exceptions.ResponseError as exc:
            reply, error = None, exc
        command, result = _step(steps, reply, error)
    return result


async def call_script_async(call: ScriptCall, functions: Functions,
                            send: Callable[[tuple[Any, ...]], Awaitable[Any]]) -> Any:
    """:func:`call_script` with a ``send`` to await."""
    steps = script_steps(call, functions)
    command: tuple[Any, ...] | None = next(steps)
    result = None
    while command is not None:
        try:
            reply, error = await send(command), None
        except redis.exceptions.ResponseError as exc:
            reply, error = None, exc
        command, result = _step(steps, reply, error)
    return result


def _step(steps: Steps, reply: Any, error: redis.exceptions.ResponseError | None
          ) -> tuple[tuple[Any, ...] | None, Any]:
    """The command to send next, or None and the call's reply."""
    try:
        return (steps.send(reply) if error is None else steps.throw(error)), None
    except StopIteration as done:
        return None, done.value


def _function_args(call: ScriptCall) -> tuple[Any, ...]:
    return ("FCALL", call.script.function, len(call.keys), *call.keys, *call.args)


def _script_args(call: ScriptCall, *, cached: bool) -> tuple[Any, ...]:
    """EVALSHA (``cached``) or EVAL arguments for a script call."""
    script = call.script
    return ("EVALSHA" if cached else "EVAL", script.sha if cached else script.body,
            len(call.keys), *call.keys, *call.args)


def _batch_args(request: Command | ScriptCall) -> tuple[Any, ...]:
    if isinstance(request, ScriptCall):
        return _script_args(request, cached=False)  # see Batch: no EVALSHA in a pipeline
    return request.args
