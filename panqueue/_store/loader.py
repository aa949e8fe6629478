"""The Lua scripts: one file per operation in ``lua/``, sharing the includes in ``lua/lib/``.

A line ``--!include NAME`` pastes ``lua/lib/NAME`` in its place. Includes are resolved in the
order they are named, depth first (an include names the includes it needs the same way), and
each is pasted once per script: Lua locals must be defined before the code that uses them, and
twice would redefine them. An unknown include, an include cycle or a ``#!lua`` shebang anywhere
but on a script's first line is an error when the script is assembled (on its first use; the
tests assemble every one), not a script Redis refuses later.

Each script's header states its KEYS, its ARGV, what it returns and its invariants; the ARGV
follow one grammar (``ARGV[i]``, a tail ``ARGV[i..]``, ``ARGV     none``), which
``tests/test_lua_contract.py`` reads to hold them to what Python sends and what the Lua reads.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Iterator
from importlib import resources

from panqueue._store.library import function_name, library_of

__all__ = ["SCRIPTS", "Script", "ScriptSourceError", "assemble", "pieces"]

_INCLUDE = "--!include "
_SHEBANG = "#!"
# A line that is an include or a shebang: the only lines assembling looks at.
_DIRECTIVE = re.compile(r"^(?:--!include |#!).*$", re.MULTILINE)


class ScriptSourceError(Exception):
    """A Lua source that cannot be assembled: an unknown include, a cycle, a misplaced shebang."""


class Script:
    """A Lua script with its SHA1, called with EVALSHA (EVAL when the server lacks it), and
    the same script as a Redis Functions library, called with FCALL (``function``: the name of
    its function; None when it has no library: ``panqueue/_store/library.py``). The library's
    text is made on first use of :attr:`library`."""

    __slots__ = ("_library", "_parts", "body", "function", "name", "sha")

    def __init__(self, name: str, body: str,
                 parts: list[tuple[str, str]] | None = None) -> None:
        self.name = name
        self.body = body
        self.sha = hashlib.sha1(body.encode()).hexdigest()
        self._parts = parts  # what assemble joined, to make the library from
        self._library: str | None = None
        self.function = None if parts is None else function_name(body)

    @property
    def library(self) -> str | None:
        """The text of the script's library (None, and :attr:`function` None, when it
        cannot have one)."""
        if self._library is None and self._parts is not None and self.function is not None:
            self._library = library_of(self._parts, self.name + ".lua", self.function)
            if self._library is None:
                self.function = None
        return self._library

    def __repr__(self) -> str:
        return f"Script({self.name!r})"


def assemble(name: str, read: Callable[[str], str]) -> str:
    """The body of script ``name``: ``read(name + ".lua")`` with its includes pasted in.

    ``read`` returns the text of a path relative to ``lua/`` (``"lib/" + NAME`` for an include)
    and raises :class:`FileNotFoundError` when there is none.
    """
    return "".join(text for _path, text in pieces(name, read))


def pieces(name: str, read: Callable[[str], str]) -> list[tuple[str, str]]:
    """What :func:`assemble` joins, in order: ``(path, text)``, each text a run of one file's
    lines (the script's own file is ``name + ".lua"``), the include lines left out."""
    chunks: list[tuple[str, str]] = []
    pasted: set[str] = set()

    def paste(path: str, chain: tuple[str, ...]) -> None:
        try:
            text = read(path)
        except FileNotFoundError:
            where = f"{chain[-1]} includes" if chain else "no such script:"
            raise ScriptSourceError(f"{where} {path}, which does not exist") from None
        start = 0  # the text from here to the next include line is copied as it is
        for found in _DIRECTIVE.finditer(text):
            line = found.group()
            if line.startswith(_SHEBANG):
                if chain or found.start() != 0:
                    number = text.count("\n", 0, found.start()) + 1
                    raise ScriptSourceError(
                        f"{path}:{number}: a shebang ({line!r}) is only allowed on a script's "
                        "first line (Redis reads the flags there)")
                continue
            chunks.append((path, text[start:found.start()]))
            start = found.end() + 1
            include = "lib/" + line[len(_INCLUDE):].strip()
            if include in chain or include == path:
                cycle = " -> ".join((*chain, path, include))
                raise ScriptSourceError(f"include cycle: {cycle}")
            if include not in pasted:
                pasted.add(include)
                paste(include, (*chain, path))
        rest = text[start:]
        chunks.append((path, rest if not rest or rest.endswith("\n") else rest + "\n"))

    paste(name + ".lua", ())
    return chunks


@functools.cache  # each include is pasted into many scripts: read each file once
def _read(path: str) -> str:
    source = resources.files(__package__).joinpath("lua", *path.split("/"))
    if not source.is_file():
        raise FileNotFoundError(path)
    return source.read_text(encoding="utf-8")


def _load(name: str) -> Script:
    parts = pieces(name, _read)
    return Script(name, "".join(text for _path, text in parts), parts)


class _Scripts:
    """Every script, by operation name (the name of its file in ``lua/``), assembled on first
    use: a process loads the scripts it calls (the CLI's commands a few of the 47).
    ``tests/test_lua_contract.py`` assembles every one."""

    add: Script
    identity_reserve: Script
    identity_check: Script
    claim: Script
    complete: Script
    fail: Script
    snooze: Script
    rate_limited: Script
    suspend: Script
    step: Script
    signal_take: Script
    signal: Script
    rate_take: Script
    explain: Script
    flow: Script
    pause_for: Script
    extend: Script
    stalled: Script
    expire: Script
    release: Script
    promote: Script
    pause: Script
    cancel: Script
    retry: Script
    remove: Script
    select: Script
    progress: Script
    schedule_set: Script
    schedule_tick: Script
    schedule_done: Script
    schedule_remove: Script
    clean: Script
    setup: Script
    relayout: Script
    declare: Script
    heartbeat: Script
    peers: Script
    control: Script
    workers: Script
    purge: Script
    batch_open: Script
    batch_register: Script
    batch_unregister: Script
    batch_close: Script
    batch_record: Script
    batch_added: Script
    batch_callback: Script
    batch_info: Script

    def __getattr__(self, name: str) -> Script:
        if name not in _NAMES:
            raise AttributeError(f"no Lua script {name!r}")
        script = _load(name)
        setattr(self, name, script)  # the next lookup does not come here
        return script

    def __iter__(self) -> Iterator[Script]:
        return (getattr(self, name) for name in _NAMES)


_NAMES = tuple(_Scripts.__annotations__)
SCRIPTS = _Scripts()
