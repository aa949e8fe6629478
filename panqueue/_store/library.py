"""A script as a Redis Functions library: its includes defined once, at ``FUNCTION LOAD``.

A script sent with EVALSHA runs its whole text on every call: before its first statement it
defines every function of its includes again (80-odd closures for the busiest scripts, about
half of a single ``add()``'s server work). As a library, the includes' functions are defined
when the library is loaded, and a call (``FCALL``) runs only what must run per call:

* the includes' top-level statements that are not definitions of functions or of literal
  constants (the queue's key names, made from ``KEYS[1]``; the caches and lists a call fills,
  such as ``META = nil``), in their order, from small reset functions;
* the script's own file, as it is, as the body of the registered function (which lets go of
  the call's ``KEYS`` and ``ARGV`` when it returns).

Each include's per-call local is declared at the library's top level, where its functions see
it, and assigned at every call; so a call starts from the state an EVALSHA starts from. What the
split does not recognise (a top-level statement of another form in an include, or code of the
script's own before its last include) leaves the script without a library: it is then called
with EVALSHA, as it always could be (``tests/test_functions.py`` holds every script to having
one).

The library and its one function are named ``pq_`` and the SHA1 of the library's text, so a
changed script is a new library and two versions of panqueue can serve one server side by side.
"""

from __future__ import annotations

import hashlib
import re

__all__ = ["library_of"]

# A top-level statement of an include starts at column 0 (the project's Lua style), with
# anything but a comment or the closing line of a block or a constructor.
_STATEMENT = re.compile(r"^(?=\S)(?!--|end\b|else|elseif|until|\}|\))", re.MULTILINE)
_FUNCTION = re.compile(r"local function (\w+)|function (\w+)\s*\(|(\w+)\s*=\s*function\b")
_CONSTANT = re.compile(
    r"local (\w+)\s*=\s*(?:-?\d+|'[^'\\\n]*'|\"[^\"\\\n]*\")\s*(?:--[^\n]*)?\s*\Z")
_LOCAL = re.compile(r"local (\w+(?:\s*,\s*\w+)*)(?:\s*(=)(.*)|\s*(?:--[^\n]*)?)\Z", re.DOTALL)
_TOKEN = re.compile(r"--\[(=*)\[.*?\]\1\]|--[^\n]*|\[(=*)\[.*?\]\2\]|\"(?:\\.|[^\"\\])*\""
                    r"|'(?:\\.|[^'\\])*'|([A-Za-z_]\w*)", re.DOTALL)
_FLAGS = re.compile(r"#!lua flags=([\w,-]+)")
# Lua 5.1 allows a function 60 upvalues: a reset function assigns at most this many names.
_RESET_NAMES = 40
_RUN = "__pq_run"


def _names(text: str) -> set[str]:
    """The identifiers of a piece of Lua, outside strings and comments."""
    return {found.group(3) for found in _TOKEN.finditer(text) if found.group(3)}


def _statements(text: str) -> list[str]:
    starts = [found.start() for found in _STATEMENT.finditer(text)]
    head = text[:starts[0]] if starts else text
    if head.strip() and not all(line.lstrip().startswith("--")
                                for line in head.splitlines() if line.strip()):
        raise ValueError("code before the first top-level statement")
    if not starts:
        return []
    return [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]


def _code(statement: str) -> str:
    """The statement without its trailing comment lines."""
    lines = statement.rstrip().split("\n")
    while len(lines) > 1 and lines[-1].lstrip().startswith("--"):
        lines.pop()
    return "\n".join(lines).rstrip()


def library_of(pieces: list[tuple[str, str]], own: str) -> tuple[str, str] | None:
    """``(name, text)`` of the library of the script assembled from ``pieces`` (see
    ``loader.pieces``; ``own``: the script's own file), or None when it cannot have one."""
    included = [text for path, text in pieces if path != own]
    first = pieces[0][1] if pieces else ""
    flags = _FLAGS.match(first)
    # The script's own text before its (last) include may only be comments.
    own_texts = [text for path, text in pieces if path == own]
    last_include = max((i for i, (path, _) in enumerate(pieces) if path != own), default=-1)
    before = [text for i, (path, text) in enumerate(pieces) if path == own and i < last_include]
    for text in before:
        for line in text.splitlines():
            stripped = line.strip()
            if stripped and not stripped.startswith(("--", "#!")):
                return None
    body = "".join(own_texts[len(before):])
    if body.startswith("#!"):
        body = body.split("\n", 1)[1]
    try:
        statements = [s for text in included for s in _statements(text)]
    except ValueError:
        return None
    functions: set[str] = set()
    for statement in statements:
        found = _FUNCTION.match(statement)
        if found:
            functions.add(found.group(1) or found.group(2) or found.group(3))
    defined: list[str] = []  # the includes' text at load: definitions and declarations
    per_call: list[tuple[str, set[str]]] = []  # (assignment, the names it touches)
    declared: set[str] = set()
    for statement in statements:
        code = _code(statement)
        definition = _FUNCTION.match(code) or _CONSTANT.match(code)
        if definition:
            defined.append(statement)
            declared.update(name for name in definition.groups() if name)
            continue
        local = _LOCAL.match(code)
        if local is None:
            return None  # a top-level statement of another kind: keep the script whole
        names = [name.strip() for name in local.group(1).split(",")]
        defined.append(f"local {', '.join(names)}\n")
        declared.update(names)
        if local.group(2):
            value = local.group(3)
            per_call.append((f"{', '.join(names)} ={value}", _names(code) & declared))
        else:
            cleared = [name for name in names if name not in functions]
            if cleared:
                per_call.append((f"{', '.join(cleared)} = nil", set(cleared)))
    resets: list[str] = []
    chunk: list[str] = []
    touched: set[str] = set()
    for assignment, touches in per_call:
        if chunk and len(touched | touches) > _RESET_NAMES:
            resets.append("\n".join(chunk))
            chunk, touched = [], set()
        chunk.append(assignment)
        touched |= touches
    if chunk:
        resets.append("\n".join(chunk))
    parts = ["local KEYS, ARGV\n", *defined]
    for number, reset in enumerate(resets):
        parts.append(f"local function __pq_reset{number}()\n{reset}\nend\n")
    calls = "".join(f"  __pq_reset{number}()\n" for number in range(len(resets)))
    # The call's arguments are let go when it returns: a bulk add's would otherwise stay in
    # the library's memory until its next call.
    parts.append(f"local function __pq_body()\n{body}\nend\n"
                 f"local function {_RUN}(keys, argv)\n  KEYS, ARGV = keys, argv\n{calls}"
                 f"  local reply = __pq_body()\n  KEYS, ARGV = nil, nil\n  return reply\nend\n")
    core = "".join(parts)
    flag_list = flags.group(1).split(",") if flags else []
    lua_flags = "{" + ", ".join(f"'{flag}'" for flag in flag_list) + "}"
    name = "pq_" + hashlib.sha1((core + lua_flags).encode()).hexdigest()
    text = (f"#!lua name={name}\n{core}"
            f"redis.register_function{{function_name = '{name}', callback = {_RUN}, "
            f"flags = {lua_flags}}}\n")
    return name, text
