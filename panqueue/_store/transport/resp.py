"""Redis' wire protocol (RESP2 and RESP3) for the trio transport (:mod:`.native`): commands
packed, replies read from bytes that arrive in pieces, error replies made into the exceptions
redis-py raises for them. hiredis does the packing and reading when it is installed; the
Python reader and packer here do it otherwise, reading what hiredis reads."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import redis.exceptions

hiredis: Any
try:
    import hiredis
except ImportError:  # the pure-Python reader below
    hiredis = None

RECEIVE_SIZE = 65536
_E = redis.exceptions

# Error codes and the classes redis-py raises for them (it drops the code from the message);
# "ERR" keeps ResponseError except for these messages.
_ERROR_CLASSES: dict[str, type[_E.RedisError]] = {
    "OOM": _E.OutOfMemoryError, "WRONGPASS": _E.AuthenticationError,
    "EXECABORT": _E.ExecAbortError, "LOADING": _E.BusyLoadingError,
    "NOSCRIPT": _E.NoScriptError, "READONLY": _E.ReadOnlyError,
    "NOAUTH": _E.AuthenticationError, "NOPERM": _E.NoPermissionError, "ASK": _E.AskError,
    "TRYAGAIN": _E.TryAgainError, "MOVED": _E.MovedError, "CLUSTERDOWN": _E.ClusterDownError,
    "CROSSSLOT": _E.ClusterCrossSlotError, "MASTERDOWN": _E.MasterDownError,
    "ERR": _E.ResponseError,
}
_ERR_MESSAGES: dict[str, type[_E.RedisError]] = {
    "max number of clients reached": _E.ConnectionError,
    "invalid password": _E.AuthenticationError,
    "Client sent AUTH, but no password is set": _E.AuthenticationError,
}


def error_reply(message: str) -> _E.RedisError:
    """The exception redis-py makes of an error reply."""
    code = message.split(" ", 1)[0]
    cls = _ERROR_CLASSES.get(code)
    if cls is None:
        return _E.ResponseError(message)
    message = message[len(code) + 1:]
    if code == "ERR":
        cls = _ERR_MESSAGES.get(message, _E.ResponseError)
    return cls(message)


#: What a reader's ``gets`` returns until a whole reply has arrived.
MORE = object()

# No value (yet): the head of an aggregate, whose items are still to come, or a whole set of
# attributes (``|``), which describe the reply that follows and are read as nothing.
_NOTHING = object()


class _Aggregate:
    """An aggregate reply begun and not yet whole: its kind and the items read so far."""

    __slots__ = ("items", "kind", "wanted")

    def __init__(self, kind: int, wanted: int) -> None:
        self.kind = kind
        self.wanted = wanted
        self.items: list[Any] = []

    def value(self) -> Any:
        if self.kind == 37:  # % map
            items = self.items
            return dict(zip(items[::2], items[1::2], strict=True))
        if self.kind == 124:
            return _NOTHING
        return self.items


class PyReader:
    """Replies (RESP2 and RESP3) from bytes fed in pieces, as redis-py's own Python parser
    returns them: hiredis' Reader in Python, for when hiredis is not installed. :meth:`gets`
    returns the next whole reply, or :data:`MORE`.

    It reads each element once, however many pieces a reply arrives in: the aggregates begun
    stay open on a stack with the items read so far, and a piece that ends inside an element
    leaves the parse position at that element's first byte. A reply of n bytes in k pieces
    then costs O(n + k) rather than the O(n * k) of parsing it again from its start at every
    piece (a reply of megabytes took seconds)."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._pos = 0  # the first byte of the element to read next
        # Where the search for the end of the line at _pos goes on from: a line that is still
        # arriving (a long status, say) is not searched again from its start.
        self._searched = 0
        self._open: list[_Aggregate] = []  # the aggregates begun, the innermost last

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def gets(self) -> Any:
        # One loop over the elements, with the position in locals (written back on the way
        # out): the reader without hiredis is the one that must not be slow.
        buffer, opened = self._buffer, self._open
        pos, searched = self._pos, self._searched
        try:
            while True:
                end = buffer.find(b"\r\n", searched)
                if end < 0:
                    # The line's "\r" may be the last byte here: search again from it.
                    searched = max(pos, len(buffer) - 1)
                    return MORE
                kind, after = buffer[pos], end + 2
                value: Any
                if kind in _BLOBS:  # $ bulk string, = verbatim string, ! blob error
                    size = int(buffer[pos + 1:end])
                    if size < 0:
                        value = None
                    elif len(buffer) < after + size + 2:
                        searched = pos  # (its header is read again: a few bytes)
                        return MORE
                    else:
                        value = bytes(buffer[after:after + size])
                        after += size + 2
                        if kind == 61:  # =: "txt:" and the text
                            value = value[4:]
                        elif kind == 33:
                            value = error_reply(value.decode("utf-8", "replace"))
                elif kind in _AGGREGATES:  # * array, ~ set, > push, % map, | attributes
                    count = int(buffer[pos + 1:end])
                    aggregate = _Aggregate(kind, count * 2 if kind in (37, 124) else count)
                    if count < 0:
                        value = None
                    elif aggregate.wanted:
                        opened.append(aggregate)
                        value = _NOTHING
                    else:
                        value = aggregate.value()
                else:
                    value = _simple(kind, bytes(buffer[pos + 1:end]))
                pos = searched = after
                # A whole element: it is an item of the innermost open aggregate, and may be
                # the last one it wanted, which makes that aggregate an item of the next, ...
                while value is not _NOTHING and opened:
                    innermost = opened[-1]
                    innermost.items.append(value)
                    if len(innermost.items) < innermost.wanted:
                        value = _NOTHING
                        break
                    opened.pop()
                    value = innermost.value()
                if value is not _NOTHING and not opened:
                    return value
        finally:
            if pos == len(buffer) or pos > RECEIVE_SIZE:  # drop the bytes read: all, or many
                del buffer[:pos]
                searched -= pos
                pos = 0
            self._pos, self._searched = pos, searched


def _simple(kind: int, line: bytes) -> Any:
    """A reply that is its first line alone."""
    if kind == 43:  # + status
        return line
    if kind in (58, 40):  # : integer, ( big number
        return int(line)
    if kind == 44:  # , double
        return float(line)
    if kind == 35:  # # boolean
        return line == b"t"
    if kind == 95:  # _ null
        return None
    if kind == 45:  # - error
        return error_reply(line.decode("utf-8", "replace"))
    raise _E.InvalidResponse(f"Protocol Error: {bytes([kind])!r}, {line!r}")


_BLOBS = frozenset(b"$=!")
_AGGREGATES = frozenset(b"*~>%|")


def new_reader() -> Any:
    if hiredis is None:
        return PyReader()
    return hiredis.Reader(replyError=error_reply, protocolError=_E.InvalidResponse,
                          notEnoughData=MORE)


def _encode(arg: Any) -> bytes:
    if isinstance(arg, bytes):
        return arg
    if isinstance(arg, str):
        return arg.encode()
    if isinstance(arg, int) and not isinstance(arg, bool):
        return b"%d" % arg
    if isinstance(arg, float):
        return repr(arg).encode()
    raise _E.DataError(f"Invalid input of type: '{type(arg).__name__}'. Convert to a bytes, "
                       "string, int or float first.")


def pack_py(args: Sequence[Any]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = _encode(arg)
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def _pack_hiredis(args: Sequence[Any]) -> bytes:
    try:
        return bytes(hiredis.pack_command(tuple(args)))
    except TypeError as exc:  # an argument of another type: as redis-py reports it
        raise _E.DataError(str(exc)) from None


pack: Callable[[Sequence[Any]], bytes] = pack_py if hiredis is None else _pack_hiredis
