"""Payload validation and the msgpack encoding of everything panqueue stores.

Job data and results must be JSON-compatible values (None, bool, int, float, str, list, dict with
str keys). They are checked before anything is written and stored as msgpack. Nothing here can
construct an arbitrary Python object from bytes: ext types are refused on decode.

A job's encoded data over a client's ``compress_over_bytes`` (1 KiB by default) is stored
compressed (zlib at level 1: about a third of JSON-like data's size, for tens of µs a KiB) when
that makes it smaller: the byte 0xc1, which msgpack never uses, then the zlib stream. ``decode``
undoes it, so every reader sees the same value.
"""

from __future__ import annotations

import contextlib
import json
import math
import zlib
from typing import Any

import msgpack

from panqueue._check import check_int
from panqueue.errors import PayloadError

__all__ = ["DEFAULT_COMPRESS_OVER", "DEFAULT_MAX_PAYLOAD", "check_compress_over",
           "check_json_compatible", "check_max_payload", "check_size", "compress", "decode",
           "encode", "encode_checked"]

# The default bound of one job's encoded data and options, and of one result (1 MiB).
DEFAULT_MAX_PAYLOAD = 1_048_576

# A job's encoded data over this many bytes is stored compressed (compress_over_bytes).
DEFAULT_COMPRESS_OVER = 1024
# The first byte of a compressed value: 0xc1 is the one byte msgpack never uses.
_COMPRESSED = b"\xc1"
_COMPRESS_LEVEL = 1  # zlib's fastest: most of the saving of level 6 for half the time

_MAX_DEPTH = 100
_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1

_packer = msgpack.Packer(use_bin_type=True)


def _refuse_ext(code: int, data: bytes) -> Any:
    raise PayloadError(
        f"stored value uses msgpack extension type {code}, which panqueue never writes")


def encode(value: Any) -> bytes:
    """Encode an already-validated value. (A str that UTF-8 cannot encode, a lone surrogate,
    which JSON's ``\\ud800`` escapes make, is refused by the checks; here it is a
    :class:`PayloadError` all the same, never a ``UnicodeEncodeError``.)"""
    try:
        data: bytes = _packer.pack(value)
    except UnicodeEncodeError as exc:
        raise PayloadError(f"a string is not valid UTF-8 ({exc.reason}: "
                           f"{exc.object[exc.start:exc.end]!r})") from None
    return data


def compress(blob: bytes, over: int | None) -> bytes:
    """``blob`` (encoded) compressed when it is over ``over`` bytes (``None``: never) and that
    makes it smaller; else ``blob`` itself. :func:`decode` reads either."""
    if over is None or len(blob) <= over:
        return blob
    packed = _COMPRESSED + zlib.compress(blob, _COMPRESS_LEVEL)
    return packed if len(packed) < len(blob) else blob


def decode(blob: bytes | None) -> Any:
    """Decode a stored value (compressed or not); ``None`` (a missing field) decodes to
    ``None``."""
    if blob is None:
        return None
    if blob[:1] == _COMPRESSED:
        with contextlib.suppress(zlib.error):  # no zlib stream: msgpack says what is wrong
            blob = zlib.decompress(blob[1:])
    return msgpack.unpackb(blob, raw=False, strict_map_key=True, ext_hook=_refuse_ext)


def check_max_payload(limit: object) -> int | None:
    """Return a valid ``max_payload_bytes`` (None: no bound), else raise ConfigError."""
    if limit is None:
        return None
    return check_int(limit, "max_payload_bytes", low=1)


def check_compress_over(over: object) -> int | None:
    """Return a valid ``compress_over_bytes`` (None: never compress), else raise ConfigError."""
    if over is None:
        return None
    return check_int(over, "compress_over_bytes", low=0)


def check_size(size: int, limit: int | None, what: str) -> None:
    """Raise :class:`PayloadError` if ``size`` (bytes, encoded) is over ``limit``."""
    if limit is not None and size > limit:
        raise PayloadError(f"{what} is {size:,} bytes encoded, over the limit of {limit:,} bytes "
                           "(max_payload_bytes)")


def encode_checked(value: Any, what: str = "data") -> bytes:
    """Validate ``value`` as JSON-compatible, then encode it."""
    check_json_compatible(value, what)
    return encode(value)


def check_json_compatible(value: Any, path: str = "data") -> None:
    """Raise :class:`PayloadError` naming the first path whose value is not JSON-compatible."""
    try:
        _check(value, 0)
    except _Invalid as bad:
        where = path + "".join(reversed(bad.segments))
        raise PayloadError(f"{where}: {bad.problem}") from None


class _Invalid(Exception):
    """Raised deep in the walk; each level adds its path segment on the way out."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        self.segments: list[str] = []


def _check_text(text: str, what: str = "") -> None:
    """A str that UTF-8 cannot encode (a lone surrogate) is not JSON-compatible."""
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        shown = repr(text) if len(text) <= 40 else repr(text[:40]) + "..."
        raise _Invalid(f"{what}{shown} is not valid UTF-8 ({exc.reason})") from None


def _check(value: Any, depth: int) -> None:
    # The happy path builds no strings: paths are assembled only when something is wrong.
    kind = type(value)
    if kind is str:
        if not value.isascii():
            _check_text(value)
        return
    if kind is bool or value is None:
        return
    if kind is int:
        if not _INT_MIN <= value <= _INT_MAX:
            raise _Invalid(f"integer {value} does not fit in 64 bits")
        return
    if kind is float:
        if not math.isfinite(value):
            raise _Invalid(f"{value!r} is not JSON-compatible (not a finite number)")
        return
    if depth >= _MAX_DEPTH:
        raise _Invalid(f"nested deeper than {_MAX_DEPTH} levels")
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise _Invalid(
                    f"key {key!r} is {type(key).__name__}; only str keys are JSON-compatible"
                )
            if not key.isascii():
                _check_text(key, "key ")
            try:
                _check(item, depth + 1)
            except _Invalid as bad:
                bad.segments.append(f"[{json.dumps(key)}]")
                raise
        return
    if kind is list or kind is tuple:
        for index, item in enumerate(value):
            try:
                _check(item, depth + 1)
            except _Invalid as bad:
                bad.segments.append(f"[{index}]")
                raise
        return
    # Subclasses of the plain types (IntEnum, OrderedDict, ...) are accepted by value.
    if isinstance(value, (str, int, float, dict, list, tuple)):
        _check(_plain(value), depth)
        return
    raise _Invalid(f"{kind.__name__} is not JSON-compatible")


def _plain(value: Any) -> Any:
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, dict):
        return dict(value)
    return list(value)
