"""Loading the Lua scripts: one file per state transition, plus the shared ``_lib.lua``."""

from __future__ import annotations

import hashlib
from importlib import resources

__all__ = ["SCRIPTS", "Script"]

_INCLUDE = "--!include "


class Script:
    """A Lua script with its SHA1, called with EVALSHA (EVAL when the server lacks it)."""

    __slots__ = ("body", "name", "sha")

    def __init__(self, name: str, body: str) -> None:
        self.name = name
        self.body = body
        self.sha = hashlib.sha1(body.encode()).hexdigest()

    def __repr__(self) -> str:
        return f"Script({self.name!r})"


def _read(name: str) -> str:
    return (resources.files(__package__) / "scripts" / name).read_text(encoding="utf-8")


def _load(name: str) -> Script:
    lines = []
    for line in _read(f"{name}.lua").splitlines():
        if line.startswith(_INCLUDE):
            lines.append(_read(line[len(_INCLUDE) :].strip()))
        else:
            lines.append(line)
    return Script(name, "\n".join(lines) + "\n")


class _Scripts:
    def __init__(self) -> None:
        self.add = _load("add")
        self.claim = _load("claim")
        self.complete = _load("complete")
        self.fail = _load("fail")
        self.extend = _load("extend")
        self.stalled = _load("stalled")
        self.release = _load("release")
        self.promote = _load("promote")
        self.pause = _load("pause")
        self.cancel = _load("cancel")
        self.retry = _load("retry")
        self.remove = _load("remove")
        self.progress = _load("progress")
        self.schedule = _load("schedule")
        self.clean = _load("clean")
        self.setup = _load("setup")


SCRIPTS = _Scripts()
