"""A script as a Redis Functions library: its includes defined once, at ``FUNCTION LOAD``.

A script sent with EVALSHA runs its whole text on every call: before its first statement it
defines every function of its includes again (80-odd closures for the busiest scripts, about
half of a single ``add()``'s server work). As a library, the includes' functions are defined
when the library is loaded, and a call (``FCALL``) runs only what must run per call:

* the includes' top-level statements that are not definitions of functions or of literal
  constants, from small functions: those made from ``KEYS[1]`` alone (the queue's key names)
  only when a call's prefix differs from the last call's, those made from literal constants
  alone at the first call, the rest (the caches and lists a call fills, such as
  ``META = nil``, and every table) at every call, in their order; a name that any function
  assigns too is always of the last kind;
* the script's own file, as it is, as the body of the registered function (which lets go of
  the call's ``KEYS`` and ``ARGV`` when it returns).

Each include's per-call local is declared at the library's top level, where its functions see
it, and assigned before the body runs as its kind says; so a call starts from the state an
EVALSHA starts from. What the
split does not recognise (a top-level statement of another form in an include, or code of the
script's own before its last include) leaves the script without a library: it is then called
with EVALSHA, as it always could be (``tests/test_functions.py`` holds every script to having
one).

The library and its one function are named ``pq_`` and a SHA1 of the script and of the code
that makes its library (:func:`function_name`), so a changed script is a new library and two
versions of panqueue can serve one server side by side; a process makes a library's text only
when a server lacks it.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections import Counter
from pathlib import Path

__all__ = ["function_name", "library_of"]

# A top-level statement of an include starts at column 0 (the project's Lua style), with
# anything but a comment or the closing line of a block or a constructor.
_STATEMENT = re.compile(r"^(?=\S)(?!--|end\b|else|elseif|until|\}|\))", re.MULTILINE)
_FUNCTION = re.compile(r"local function (\w+)|function (\w+)\s*\(|(\w+)\s*=\s*function\b")
_CONSTANT = re.compile(
    r"local (\w+)\s*=\s*(?:-?\d+|'[^'\\\n]*'|\"[^\"\\\n]*\")\s*(?:--[^\n]*)?\s*\Z")
_LOCAL = re.compile(r"local (\w+(?:\s*,\s*\w+)*)(?:\s*(=)(.*)|\s*(?:--[^\n]*)?)\Z", re.DOTALL)
_TOKEN = re.compile(r"--\[(=*)\[.*?\]\1\]|--[^\n]*|\[(=*)\[.*?\]\2\]|\"(?:\\.|[^\"\\])*\""
                    r"|'(?:\\.|[^'\\])*'|([A-Za-z_]\w*)", re.DOTALL)
# A statement that assigns: its targets (names, fields, indexes), then a single "=".
_ASSIGNMENT = re.compile(
    r"(?:^|;|\bthen|\bdo|\belse)\s*(?:local\s+)?"
    r"((?:[A-Za-z_][\w.\[\]]*\s*,\s*)*[A-Za-z_][\w.\[\]]*)\s*=(?!=)", re.MULTILINE)
_FREE = re.compile(r"(?:(?<=\.\.)|(?<![.:\w]))[A-Za-z_]\w*")
_KEYWORDS = {"and", "or", "not", "nil", "true", "false"}
_FLAGS = re.compile(r"#!lua flags=([\w,-]+)")
# Lua 5.1 allows a function 60 upvalues: a reset function assigns at most this many names.
_RESET_NAMES = 40
_RUN = "__pq_run"


def _free_names(text: str) -> set[str]:
    """The names a piece of Lua reads (not the fields after a ``.`` or ``:``), keywords
    left out."""
    return set(_FREE.findall(_bare(text))) - _KEYWORDS


def _statements(text: str) -> list[str]:
    starts = [found.start() for found in _STATEMENT.finditer(text)]
    head = text[:starts[0]] if starts else text
    if head.strip() and not all(line.lstrip().startswith("--")
                                for line in head.splitlines() if line.strip()):
        raise ValueError("code before the first top-level statement")
    if not starts:
        return []
    return [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]


def _bare(text: str) -> str:
    """A piece of Lua without its strings and comments."""
    return _TOKEN.sub(lambda found: found.group(3) or " ", text)


def _assigned(text: str) -> Counter[str]:
    """How many statements of ``text`` assign each name (a name that a function assigns as
    well as its top-level statement is state of the call, never cached)."""
    counts: Counter[str] = Counter()
    for found in _ASSIGNMENT.finditer(_bare(text)):
        counts.update(target.strip() for target in found.group(1).split(","))
    return counts


def _chunks(assignments: list[tuple[str, set[str]]]) -> list[str]:
    """The assignments in order, in groups that each touch at most ``_RESET_NAMES`` names
    (Lua 5.1 allows a function 60 upvalues)."""
    chunks: list[str] = []
    chunk: list[str] = []
    touched: set[str] = set()
    for assignment, touches in assignments:
        if chunk and len(touched | touches) > _RESET_NAMES:
            chunks.append("\n".join(chunk))
            chunk, touched = [], set()
        chunk.append(assignment)
        touched |= touches
    if chunk:
        chunks.append("\n".join(chunk))
    return chunks


def _code(statement: str) -> str:
    """The statement without its trailing comment lines."""
    lines = statement.rstrip().split("\n")
    while len(lines) > 1 and lines[-1].lstrip().startswith("--"):
        lines.pop()
    return "\n".join(lines).rstrip()


def function_name(body: str) -> str:
    """The name of the library (and of its one function) of the script whose assembled text is
    ``body``: ``pq_`` and a SHA1 of the text and of the code that makes the library from it
    (this module and the loader), so that a process knows the name without making the library,
    which it does only when a server lacks it."""
    return "pq_" + hashlib.sha1(_maker() + body.encode()).hexdigest()


@functools.cache
def _maker() -> bytes:
    here = Path(__file__).parent
    return hashlib.sha1((here / "library.py").read_bytes()
                        + (here / "loader.py").read_bytes()).digest()


def library_of(pieces: list[tuple[str, str]], own: str, name: str) -> str | None:
    """The text of library ``name``, of the script assembled from ``pieces`` (see
    ``loader.pieces``; ``own``: the script's own file), or None when it cannot have one."""
    flags = _FLAGS.match(pieces[0][1]) if pieces else None
    # What follows the last include is the script's own code; before it, its own text may only
    # be comments (and its shebang).
    last_include = max((i for i, (path, _) in enumerate(pieces) if path != own), default=-1)
    included = [text for path, text in pieces[:last_include + 1] if path != own]
    for path, text in pieces[:last_include + 1]:
        if path == own and any(line.strip() and not line.strip().startswith(("--", "#!"))
                               for line in text.splitlines()):
            return None
    body = "".join(text for _path, text in pieces[last_include + 1:])
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
    # The per-call assignments, (assignment, the names it touches), by when they must run.
    once: list[tuple[str, set[str]]] = []  # from literal constants alone: at the first call
    keyed: list[tuple[str, set[str]]] = []  # from KEYS[1] alone: when the prefix changes
    every: list[tuple[str, set[str]]] = []  # the rest (caches, lists, tables): every call
    declared: set[str] = set()
    constants: set[str] = set()
    prefixed: set[str] = set()  # the names made from KEYS[1]
    assigned = _assigned("".join(included) + body)
    for statement in statements:
        code = _code(statement)
        definition = _FUNCTION.match(code) or _CONSTANT.match(code)
        if definition:
            defined.append(statement)
            declared.update(name for name in definition.groups() if name)
            if _CONSTANT.match(code):
                constants.add(definition.group(1))
            continue
        local = _LOCAL.match(code)
        if local is None:
            return None  # a top-level statement of another kind: keep the script whole
        names = [name.strip() for name in local.group(1).split(",")]
        defined.append(f"local {', '.join(names)}\n")
        declared.update(names)
        if not local.group(2):
            cleared = [name for name in names if name not in functions]
            if cleared:
                every.append((f"{', '.join(cleared)} = nil", set(cleared)))
            continue
        value = local.group(3)
        assignment = (f"{', '.join(names)} ={value}", _free_names(code) & declared)
        used, bare = _free_names(value), _bare(value)
        plain = "{" not in bare and all(assigned[name] <= 1 for name in names)
        if plain and used <= constants | {"string", "math"}:
            once.append(assignment)
            constants.update(names)  # as good as a constant from the first call on
        elif plain and "(" not in bare and used <= constants | prefixed | {"KEYS"}:
            keyed.append(assignment)
            prefixed.update(names)
        else:
            every.append(assignment)
    parts = ["local KEYS, ARGV\nlocal __pq_prefix, __pq_ready\n", *defined]
    run = ["  KEYS, ARGV = keys, argv\n"]
    for kind, assignments, guard, after in (
            ("once", once, "if not __pq_ready then\n", "  __pq_ready = true\nend\n"),
            ("keys", keyed, "if KEYS[1] ~= __pq_prefix then\n", "  __pq_prefix = KEYS[1]\nend\n"),
            ("reset", every, "", "")):
        chunks = _chunks(assignments)
        for number, chunk in enumerate(chunks):
            parts.append(f"local function __pq_{kind}{number}()\n{chunk}\nend\n")
        if chunks:
            run.append(guard + "".join(f"  __pq_{kind}{number}()\n"
                                       for number in range(len(chunks))) + after)
    # The call's arguments are let go when it returns: a bulk add's would otherwise stay in
    # the library's memory until its next call.
    parts.append(f"local function __pq_body()\n{body}\nend\n"
                 f"local function {_RUN}(keys, argv)\n{''.join(run)}"
                 f"  local reply = __pq_body()\n  KEYS, ARGV = nil, nil\n  return reply\nend\n")
    core = "".join(parts)
    flag_list = flags.group(1).split(",") if flags else []
    lua_flags = "{" + ", ".join(f"'{flag}'" for flag in flag_list) + "}"
    return (f"#!lua name={name}\n{core}"
            f"redis.register_function{{function_name = '{name}', callback = {_RUN}, "
            f"flags = {lua_flags}}}\n")
