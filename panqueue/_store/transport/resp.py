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


class _Incomplete(Exception):
    pass


#: What a reader's ``gets`` returns until a whole reply has arrived.
MORE = object()


class PyReader:
    """Replies (RESP2 and RESP3) from bytes fed in pieces, as redis-py's own Python parser
    returns them: hiredis' Reader in Python, for when hiredis is not installed. :meth:`gets`
    returns the next whole reply, or :data:`MORE`."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def gets(self) -> Any:
        try:
            reply, self._pos = self._parse(self._pos)
        except _Incomplete:
            return MORE
        if self._pos == len(self._buffer) or self._pos > RECEIVE_SIZE:
            del self._buffer[:self._pos]
            self._pos = 0
        return reply

    def _parse(self, pos: int) -> tuple[Any, int]:
        buffer = self._buffer
        end = buffer.find(b"\r\n", pos)
        if end < 0:
            raise _Incomplete
        kind, line, pos = buffer[pos], bytes(buffer[pos + 1:end]), end + 2
        if kind in _BLOBS:  # $ bulk string, = verbatim string, ! blob error
            size = int(line)
            if size < 0:
                return None, pos
            if len(buffer) < pos + size + 2:
                raise _Incomplete
            blob = bytes(buffer[pos:pos + size])
            pos += size + 2
            if kind == 61:  # =: "txt:" and the text
                return blob[4:], pos
            return (error_reply(blob.decode("utf-8", "replace")) if kind == 33 else blob), pos
        if kind in _AGGREGATES:  # * array, ~ set, > push, % map, | attributes
            count = int(line)
            if count < 0:
                return None, pos
            items = []
            for _ in range(count * 2 if kind in (37, 124) else count):
                item, pos = self._parse(pos)
                items.append(item)
            if kind == 37:
                return dict(zip(items[::2], items[1::2], strict=True)), pos
            if kind == 124:  # attributes describe the reply that follows; nothing reads them
                return self._parse(pos)
            return items, pos
        if kind == 43:  # + status
            return line, pos
        if kind in (58, 40):  # : integer, ( big number
            return int(line), pos
        if kind == 44:  # , double
            return float(line), pos
        if kind == 35:  # # boolean
            return line == b"t", pos
        if kind == 95:  # _ null
            return None, pos
        if kind == 45:  # - error
            return error_reply(line.decode("utf-8", "replace")), pos
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
