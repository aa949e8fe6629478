"""What the operation modules share: a script call on one queue, a script's refusal, the
encoding of an error, and the settings' defaults."""

from __future__ import annotations

from typing import Any

from panqueue._codec import encode
from panqueue._job import ErrorInfo
from panqueue._keys import QueueKeys
from panqueue._store.loader import Script
from panqueue._store.transport import ScriptCall
from panqueue.errors import ConfigError

__all__ = ["DEFAULT_KEEP_COMPLETED", "DEFAULT_KEEP_EVENTS", "DEFAULT_KEEP_FAILED",
           "DEFAULT_KEEP_HISTORY",
           "SCHEMA_VERSION", "LayoutChanged", "check_refusal", "encode_error", "script_call"]

# The layout version written to {q:X}:meta field v (a later layout change migrates from it).
SCHEMA_VERSION = 1
# How many finished jobs a queue keeps by default (completed, and failed/cancelled each).
DEFAULT_KEEP_COMPLETED = 1000
DEFAULT_KEEP_FAILED = 10_000
# How many records a queue's history stream keeps by default (Retention.history; lib/settings.lua's
# HISTORY_MAXLEN for a queue no worker has set up).
DEFAULT_KEEP_HISTORY = 100_000
# How many events a queue's event stream keeps by default (Retention.events; lib/settings.lua's
# EVENTS_MAXLEN for a queue no worker has set up).
DEFAULT_KEEP_EVENTS = 10_000


def script_call(script: Script, keys: QueueKeys, *args: Any) -> ScriptCall:
    """A call of ``script`` on one queue: its prefix is the script's only key."""
    return ScriptCall(script, (keys.prefix,), args)


class LayoutChanged(ConfigError):
    """A script refused a request routed by a layout that is not the partition's (lib/layout.lua
    partition_problem): the caller reads the queue's layout again and routes anew."""


def check_refusal(keys: QueueKeys, reply: Any) -> None:
    """Raise :class:`ConfigError` if ``reply`` is a script's ``{'!', message}`` refusal (a
    queue setting that the request contradicts; :class:`LayoutChanged` for a stale layout)."""
    if isinstance(reply, list) and len(reply) == 2 and reply[0] == b"!":
        message = reply[1].decode()
        if message.startswith("layout changed"):
            raise LayoutChanged(f"queue {keys.name!r}: {message}")
        raise ConfigError(f"queue {keys.name!r}: {message}")


def encode_error(error: ErrorInfo) -> bytes:
    """An attempt's error as the job hash and the event stream store it."""
    return encode(error.to_wire())
