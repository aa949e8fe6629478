"""What an operation asks the transport for: a script call, a command, a batch of them, a scan;
and the EVALSHA / EVAL arguments of a script call."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypeVar

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


def _script_args(call: ScriptCall, *, cached: bool) -> tuple[Any, ...]:
    """EVALSHA (``cached``) or EVAL arguments for a script call."""
    script = call.script
    return ("EVALSHA" if cached else "EVAL", script.sha if cached else script.body,
            len(call.keys), *call.keys, *call.args)


def _batch_args(request: Command | ScriptCall) -> tuple[Any, ...]:
    if isinstance(request, ScriptCall):
        return _script_args(request, cached=False)  # see Batch: no EVALSHA in a pipeline
    return request.args
