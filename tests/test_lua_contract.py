"""Each script's header is its contract, held against both sides: the ARGV it documents against
the ARGV the Python operation sends and the ARGV the Lua reads, its invariants stated; and every
name a script calls defined above the call once its includes are pasted in.

The header's ARGV grammar (the comment lines at the top of a script):

- It follows ``KEYS[1]``; an entry starts a line or a column (after two spaces).
- ``ARGV[i]`` documents fixed argument i; together they must be ARGV[1] .. ARGV[n].
- ``ARGV[i..]`` starts the variable tail after them; its text says its unit: ``pairs`` (2),
  ``groups of N`` (N), else one argument each.
- ``ARGV     none``: no arguments.
- A fixed argument that some call leaves out says ``absent`` in its text; a case below names
  how many of the last ones it leaves out.

Each case runs the operation that calls the script with sample inputs, answers what it asks
before (canned replies), and compares the arguments of the script's call with the header: the
fixed count plus the units of the tail the sample makes. So an argument added on one side only
fails here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Generator
from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from panqueue._codec import encode
from panqueue._durable import FOREVER_MS
from panqueue._job import ErrorInfo, JobState
from panqueue._keys import QueueKeys
from panqueue._options import MAX_PRIORITY, MAX_SECONDS, Retention
from panqueue._registry import HandlerOptions
from panqueue._store import transitions as tr
from panqueue._store.loader import SCRIPTS, Script
from panqueue._store.ops import batches, identity, layout, queue, schedules, select
from panqueue._store.ops.add import NewJob, add_jobs
from panqueue._store.ops.base import (
    DEFAULT_KEEP_COMPLETED,
    DEFAULT_KEEP_EVENTS,
    DEFAULT_KEEP_FAILED,
    DEFAULT_KEEP_HISTORY,
)
from panqueue._store.ops.explain import explain
from panqueue._store.ops.flow import read_flow
from panqueue._store.ops.workers import control as control_worker
from panqueue._store.ops.workers import workers
from panqueue._store.transport import Batch, Command, ScriptCall

LUA = Path(str(resources.files("panqueue._store") / "lua"))
DOCS = Path(__file__).parent.parent / "docs"

# ------------------------------------------------------------------------- the header's ARGV


@dataclass(frozen=True)
class Argv:
    """What a header documents: the fixed arguments' texts (ARGV[1] ..), the first position
    of the tail (None: no tail) and the size of its unit."""

    fixed: tuple[str, ...]
    tail: int | None
    unit: int


def header(name: str) -> str:
    """The script's header: its leading comment lines, without the ``-- `` and the includes."""
    lines = []
    for line in (LUA / f"{name}.lua").read_text().splitlines():
        if line.startswith("#!") or line.startswith("--!include"):
            continue
        if not line.startswith("--"):
            break
        lines.append(line[3:])
    return "\n".join(lines)


# An ARGV entry starts a line or follows two spaces (a column); "see ARGV[3]" in a text does not.
_ARGV = re.compile(r"(?:^|(?<=  ))ARGV(?:\[(\d+)(\.\.\.?)?\]|(\s+none\b))", re.M)
_END = re.compile(r"^(Returns|Invariants?:|Runs under)", re.M)


def documented_argv(name: str) -> Argv:
    text = header(name)
    text = text[text.index("\nKEYS[1]"):]  # the description above may mention ARGV
    end = _END.search(text)
    text = text[:end.start()] if end else text
    marks = list(_ARGV.finditer(text))
    assert marks, f"{name}.lua: the header documents no ARGV (write 'ARGV     none')"
    fixed: dict[int, str] = {}
    tail, unit = None, 1
    for mark, after in zip(marks, [*marks[1:], None], strict=True):
        said = text[mark.end():after.start() if after else len(text)]
        if mark[3]:
            assert len(marks) == 1, f"{name}.lua: 'ARGV none' and ARGV[i] both"
        elif mark[2]:
            assert tail is None, f"{name}.lua: two tails"
            tail = int(mark[1])
            group = re.search(r"\bgroups of (\d+)\b", said)
            unit = int(group[1]) if group else 2 if re.search(r"\bpairs\b", said) else 1
        else:
            assert int(mark[1]) not in fixed, f"{name}.lua: ARGV[{mark[1]}] twice"
            fixed[int(mark[1])] = said
    assert sorted(fixed) == list(range(1, len(fixed) + 1)), f"{name}.lua: ARGV gaps {fixed}"
    assert tail is None or tail == len(fixed) + 1, f"{name}.lua: the tail must follow ARGV[n]"
    return Argv(tuple(fixed[i] for i in sorted(fixed)), tail, unit)


def lua_reads(name: str) -> set[int]:
    """The ARGV positions the script's own code reads by number (its header aside)."""
    code = "\n".join(line.split("--", 1)[0]
                     for line in (LUA / f"{name}.lua").read_text().splitlines())
    return {int(n) for n in re.findall(r"\bARGV\[(\d+)\]", code)}


# ------------------------------------------------------------------------- what Python sends

Answer = Callable[[Any], Any]


def _canned(item: Any) -> Any:
    """A plain reply to whatever an operation asks before the call a case looks at."""
    if isinstance(item, Batch):
        return [_canned(request) for request in item.requests]
    if isinstance(item, ScriptCall):
        if item.script.name.startswith("batch_") and item.script is not SCRIPTS.batch_callback:
            return [b"open", b"1", b"0", b"0", b"0", b"", b"", b""]  # batch_layout's answer
        return 1
    command = item.args[0]
    return {"SMEMBERS": set(), "ZRANGE": [], "HGET": None, "GET": None, "EXISTS": 0,
            "TIME": [b"1700000000", b"0"]}.get(command, 1)


def sent(script: Script, op: Generator[Any, Any, Any], answer: Answer = _canned
         ) -> tuple[Any, ...]:
    """The arguments of the first call of ``script`` that ``op`` makes."""
    item = op.send(None)
    while True:
        if isinstance(item, ScriptCall) and item.script is script:
            op.close()
            return item.args
        item = op.send(answer(item))


def answering(replies: dict[str, Any]) -> Answer:
    """Canned replies, with ``replies`` for these commands (ZRANGE ...) or scripts (by name)."""
    def answer(item: Any) -> Any:
        name = item.script.name if isinstance(item, ScriptCall) else (
            item.args[0] if isinstance(item, Command) else None)
        return replies[name] if name in replies else _canned(item)
    return answer


K = QueueKeys("q")
PARTS = (K,)
JOB = NewJob("j", b"\x90")
POINTER = identity._Pointer(K, "id", "j", "0\ttok\t1")
FAILURE = tr.Failure("j", "t", 1, 5, 0, ErrorInfo("E", "m"), 3, False, "")
# A batch that fires: a job failed, so its on_success is not added (and its parent stops
# waiting for it, batch_unregister), its on_complete is (batch_callback), then it is marked added.
FIRED = [b"fire", b"1", b"0", b"1", b"1", encode(["cq", {}]), encode(["sq", {}]), b"p"]


@dataclass(frozen=True)
class Case:
    script: str
    label: str
    op: Callable[[], Generator[Any, Any, Any]]
    units: int = 0  # units of the tail the sample sends
    absent: int = 0  # the last fixed arguments this call leaves out
    answer: Answer = _canned


CASES = [
    Case("add", "one job", lambda: add_jobs(K, [JOB]), units=1),
    Case("add", "two jobs", lambda: add_jobs(K, [JOB, JOB]), units=2),
    Case("identity_reserve", "dd", lambda: identity.reserve_identity(K, "dd", "k", "p", 9, "keep")),
    Case("identity_reserve", "clear", lambda: identity._clear(POINTER), absent=1),
    Case("identity_reserve", "forget", lambda: identity.forget_deleted(PARTS, K), absent=2,
         answer=answering({"ZRANGE": [b"j\t0\ttok"]})),
    Case("identity_check", "look", lambda: identity._look(PARTS, POINTER)),
    Case("claim", "plain", lambda: tr.claim(K, "t", 1000, 2)),
    Case("claim", "withdrawing", lambda: tr.claim(K, "t", 1000, 2, withdraw=("a", "b")), units=2),
    Case("complete", "one job", lambda: tr.complete_batch(
        K, [tr.Completion("j", "t", b"\xc0")], claim_next=True, keep=1, token="n", ttl_ms=1),
        units=1),
    Case("fail", "attempt", lambda: tr.end_attempt(K, FAILURE, max_snoozes=None,
                                                   claim_next=True, keep=1, token="n", ttl_ms=1)),
    Case("snooze", "attempt", lambda: tr.end_attempt(K, tr.Snoozing("j", "t", 1, 5, 10),
                                                     max_snoozes=None, claim_next=True, keep=1,
                                                     token="n", ttl_ms=1)),
    Case("rate_limited", "attempt", lambda: tr.end_attempt(
        K, tr.Throttled("j", "t", 1, 5, 10), max_snoozes=None, claim_next=True, keep=1,
        token="n", ttl_ms=1)),
    Case("suspend", "sleep", lambda: tr.end_attempt(
        K, tr.Suspended("j", "t", 1, 5, 10, "sleep", 0), max_snoozes=None, claim_next=True,
        keep=1, token="n", ttl_ms=1)),
    Case("suspend", "signal", lambda: tr.end_attempt(
        K, tr.Suspended("j", "t", 1, 5, 0, "signal", 1, timeout_ms=9, name="go"),
        max_snoozes=None, claim_next=True, keep=1, token="n", ttl_ms=1)),
    Case("step", "result", lambda: tr.step_done(K, "j", "t", "a", b"\x01")),
    Case("signal_take", "take", lambda: tr.take_signal(K, "j", "t", 0, "go"),
         answer=answering({"signal_take": [0]})),
    Case("signal", "send", lambda: queue.signal(K, "j", "go", b"\xc0"),
         answer=answering({"signal": 1})),
    Case("rate_take", "starts", lambda: tr.take_starts(K, 1, 10, 1000, "s")),
    Case("pause_for", "ms", lambda: tr.pause_for(K, 5)),
    Case("extend", "one lock", lambda: tr.extend(K, 1000, [("j", "t")]), units=1),
    Case("release", "two locks", lambda: tr.release(K, [("j", "t"), ("i", "t")]), units=2),
    Case("progress", "value", lambda: tr.progress(K, "j", "t", "p", b"\x01", 10)),
    Case("stalled", "sweep", lambda: tr.sweep_stalled(K, 1, 1)),
    Case("expire", "sweep", lambda: tr.expire_due(K)),
    Case("promote", "due", lambda: tr.promote(K)),
    Case("heartbeat", "beat", lambda: tr.heartbeat(K, "w", 1000, host="h", pid=1, queues=["q"],
                                                   concurrency=1, running=[])),
    Case("control", "stop", lambda: control_worker([("w", ["q"])], "stop")),
    Case("heartbeat", "leave", lambda: tr.leave_registry(K, "w")),
    Case("peers", "read", lambda: tr.peers(K)),
    Case("setup", "worker", lambda: queue.setup_queue(K, "global", 1, 0, 0, False)),
    Case("pause", "pause", lambda: queue.pause(K, True)),
    Case("cancel", "job", lambda: queue.cancel(K, "j")),
    Case("retry", "ids", lambda: queue.retry_failed(K, ["a", "b"]), units=2),
    Case("retry", "oldest", lambda: queue.retry_failed(K, None)),
    Case("remove", "job", lambda: queue.remove(K, "j")),
    Case("select", "tag", lambda: select.select_ids(K, (JobState.FAILED,), "t", "E", 5)),
    Case("clean", "ages", lambda: queue.clean(K, 1, 1)),
    Case("purge", "all", lambda: queue.purge(K, None), units=1),
    Case("purge", "states", lambda: queue.purge(K, ["waiting", "failed"]), units=2),
    Case("schedule_set", "set", lambda: schedules.schedule_set(K, "n", b"\x80", 1)),
    Case("schedule_tick", "one tick", lambda: schedules.schedule_tick(
        K, "n", [1], [False], 1, 2, "skip", 0, b"\x80", 0, b""), units=1),
    Case("schedule_done", "ticks", lambda: schedules.schedule_done(K, "n", [1, 2]), units=2),
    Case("schedule_remove", "remove", lambda: schedules.remove_schedule(K, "n")),
    Case("declare", "count", lambda: layout.declare("q", 2)),
    Case("relayout", "step", lambda: layout._relayout(K, 1, "2:0", "tok")),
    Case("workers", "list", lambda: workers(K)),
    Case("flow", "job", lambda: read_flow(K, "j")),
    Case("explain", "waiting job", lambda: explain(K, "j"),
         answer=answering({"HMGET": [b"waiting", None, None, None, None, None],
                           "workers": []})),
    Case("batch_open", "open", lambda: batches.open_batch("b", ("q", {}), None, "")),
    Case("batch_register", "one job", lambda: batches.add_to_batch("b", K, [JOB]), units=1),
    Case("batch_record", "relay", lambda: batches.relay(K), units=1,
         answer=answering({"ZRANGE": [b"b\tj\tcompleted"]})),
    Case("batch_close", "close", lambda: batches.close_batch("b")),
    Case("batch_info", "info", lambda: batches.batch_info("b")),
    Case("batch_unregister", "fired", lambda: batches.close_batch("b"), units=1,
         answer=answering({"batch_close": FIRED})),
    Case("batch_callback", "fired", lambda: batches.close_batch("b"), units=1,
         answer=answering({"batch_close": FIRED})),
    Case("batch_added", "fired", lambda: batches.close_batch("b"),
         answer=answering({"batch_close": FIRED})),
]


def test_every_script_has_a_case() -> None:
    assert {case.script for case in CASES} == {script.name for script in SCRIPTS}


@pytest.mark.parametrize("case", CASES, ids=lambda case: f"{case.script}-{case.label}")
def test_python_sends_the_argv_the_header_documents(case: Case) -> None:
    documented = documented_argv(case.script)
    args = sent(getattr(SCRIPTS, case.script), case.op(), case.answer)
    if case.units:
        assert documented.tail is not None, f"{case.script}.lua documents no ARGV[i..]"
    expected = len(documented.fixed) - case.absent + case.units * documented.unit
    assert len(args) == expected, (
        f"{case.script}.lua documents {len(documented.fixed)} fixed ARGV and a tail of "
        f"{documented.unit} per unit; {case.label!r} sends {len(args)}: {args!r}")
    for said in documented.fixed[len(documented.fixed) - case.absent:]:
        assert "absent" in said, f"{case.script}.lua: left out, but not documented absent: {said}"


@pytest.mark.parametrize("name", sorted(script.name for script in SCRIPTS))
def test_lua_reads_only_documented_argv(name: str) -> None:
    documented = documented_argv(name)
    reads = lua_reads(name)
    tail = documented.tail or float("inf")
    unknown = {n for n in reads if len(documented.fixed) < n < tail}
    assert not unknown, f"{name}.lua reads ARGV{sorted(unknown)}, which its header does not name"
    if documented.tail is None and documented.fixed:
        assert max(reads, default=0) == len(documented.fixed), (
            f"{name}.lua documents ARGV[{len(documented.fixed)}] but reads up to "
            f"ARGV[{max(reads, default=0)}]")


@pytest.mark.parametrize("name", sorted(script.name for script in SCRIPTS))
def test_every_header_states_keys_argv_returns_and_invariants(name: str) -> None:
    text = header(name)
    for part in ("KEYS[1]", "Returns", "Invariant"):
        assert re.search(rf"^{re.escape(part)}", text, re.M), f"{name}.lua: no {part} line"


# ------------------------------------------------------------------------- the includes

# What a script may call or name without defining it: Lua's and Redis's own globals.
_GLOBALS = {"redis", "cjson", "cmsgpack", "bit", "struct", "string", "math", "table", "tonumber",
            "tostring", "type", "ipairs", "pairs", "unpack", "select", "error", "pcall",
            "assert", "next", "KEYS", "ARGV"}
_KEYWORDS = {"and", "elseif", "end", "for", "function", "if", "in", "local", "not", "or",
             "return", "then", "until", "while"}


def _code(body: str) -> str:
    """``body`` without its comments, its strings emptied."""
    body = re.sub(r"'(?:\\.|[^'\\\n])*'", "''", body)
    body = re.sub(r'"(?:\\.|[^"\\\n])*"', '""', body)
    return re.sub(r"--[^\n]*", "", body)


def undefined_names(body: str) -> list[str]:
    """The functions a script calls and the constants (UPPER_CASE) it names that no local,
    parameter or loop variable defines above the use. A Lua local is visible only after its
    definition: a use above it (an include pasted too late, or missing) reads a global, nil."""
    code = _code(body)
    defined: dict[str, int] = {}
    patterns = (r"\blocal\s+function\s+(\w+)", r"\blocal\s+(?!function\b)([\w\s,]+?)\s*(?:=|\n)",
                r"\bfunction\s*[\w.:]*\s*\(([^)]*)\)", r"\bfor\s+([\w\s,]+?)\s*(?:=|\bin\b)")
    for pattern in patterns:
        for match in re.finditer(pattern, code):
            for name in match[1].split(","):
                defined.setdefault(name.strip(), match.start())
    missing = set()
    for match in re.finditer(r"(?<![.:\w])(?:([A-Za-z_]\w*)(?=\s*\()|([A-Z][A-Z0-9_]+)\b)", code):
        name = match[1] or match[2]
        if name in _GLOBALS or name in _KEYWORDS:
            continue
        if match[1] and code[:match.start()].rstrip().endswith("function"):
            continue  # the name being defined
        if defined.get(name, len(code)) > match.start():
            missing.add(name)
    return sorted(missing)


@pytest.mark.parametrize("name", sorted(script.name for script in SCRIPTS))
def test_every_name_a_script_uses_is_defined_above_its_use(name: str) -> None:
    assert undefined_names(getattr(SCRIPTS, name).body) == [], (
        f"{name}.lua: include what defines these (above their use)")


def test_a_name_used_above_its_definition_is_found() -> None:
    assert undefined_names("local function a()\n  return b()\nend\nlocal function b()\nend\n"
                           ) == ["b"]
    assert undefined_names("local X = 1\nlocal function f(y)\n  return X + y + LIMIT\nend\n"
                           ) == ["LIMIT"]


@pytest.mark.parametrize("path", sorted((LUA / "lib").glob("*.lua")), ids=lambda p: p.name)
def test_no_include_is_longer_than_about_120_lines(path: Path) -> None:
    """An include is one concern, short enough to read whole."""
    assert len(path.read_text().splitlines()) <= 125, f"{path.name}: split it by concern"


# ------------------------------------------------------------------------- the defaults


def lua_numbers(path: Path) -> dict[str, int]:
    """``local NAME = 123`` or ``'123'`` (an UPPER_CASE name: a constant; as text, it is
    passed to ``redis.call`` as it is) -> {"NAME": 123}."""
    return {m[1]: int(m[2]) for m in re.finditer(r"^local ([A-Z][A-Z0-9_]*) = '?(-?\d+)\b",
                                                 path.read_text(), re.M)}


# The Lua constants that Python knows too, with Python's figure. The Lua ones apply where no
# worker has told the queue otherwise (a queue only producers have used), so they must be
# what a worker sets by default.
SHARED = {
    ("lib/settings.lua", "HISTORY_MAXLEN"): DEFAULT_KEEP_HISTORY,
    ("lib/settings.lua", "EVENTS_MAXLEN"): DEFAULT_KEEP_EVENTS,
    ("lib/settings.lua", "KEEP_FAILED"): DEFAULT_KEEP_FAILED,
    ("lib/settings.lua", "KEY_CONCURRENCY"): next(
        f.default for f in fields(HandlerOptions) if f.name == "key_concurrency"),
    ("lib/wait_order.lua", "MAX_PRIORITY"): MAX_PRIORITY,
    ("suspend.lua", "FOREVER_MS"): FOREVER_MS,
}
# The Lua constants Python does not know, and why: a new constant is sorted into one or the
# other here, so a default that Python also has cannot be added on one side unnoticed.
LUA_ONLY = {
    ("lib/settings.lua", "ENDINGS_KEPT"): "the endings a queue that keeps no events keeps "
                                          "(Retention's docstring says about 1,000)",
    ("lib/delayed.lua", "PROMOTE_BATCH"): "a bound on one script's work",
    ("lib/calls.lua", "TRIM_EVERY"): "how often a capped stream is trimmed: the slack over its "
                                     "cap (tests/test_job_control.py's retention test)",
    ("lib/wait_order.lua", "WAIT_SEQ_SPAN"): "the wait order's encoding",
    ("lib/job_data.lua", "DATA_PART"): "Redis's default hash-max-listpack-value (a part of data)",
    ("lib/new_job_checks.lua", "MAX_TIME_MS"): "the range of a time in a double (checked below)",
    ("lib/identity.lua", "FENCE_MS"): "how long a fenced add's token is kept",
    ("lib/batch_layout.lua", "OPEN_TTL_MS"): "how long an open batch is kept",
    ("lib/batch_layout.lua", "DONE_TTL_MS"): "how long a done batch is kept for info()",
    ("rate_take.lua", "GRACE_PERCENT"): "the rate grace (docs/scaling.md, checked below)",
    ("rate_take.lua", "GRACE_MIN_MS"): "the rate grace (docs/scaling.md, checked below)",
}
# lib/status.lua's constants are Status (tests/test_lua_layout.py).
_SOURCES = [*sorted((LUA / "lib").glob("*.lua")), LUA / "rate_take.lua", LUA / "suspend.lua"]


def test_every_lua_constant_is_held_to_python_or_known_to_be_the_scripts_own() -> None:
    found = {(str(path.relative_to(LUA)), name)
             for path in _SOURCES if path.name != "status.lua" for name in lua_numbers(path)}
    assert found == set(SHARED) | set(LUA_ONLY)


@pytest.mark.parametrize("where", sorted(SHARED), ids=lambda where: where[1])
def test_a_default_both_sides_know_is_the_same(where: tuple[str, str]) -> None:
    path, name = where
    assert lua_numbers(LUA / path)[name] == SHARED[where]


def test_the_scripts_defaults_are_what_a_worker_sets_by_default() -> None:
    retention = Retention()
    assert (retention.completed, retention.failed, retention.history, retention.events) == (
        DEFAULT_KEEP_COMPLETED, DEFAULT_KEEP_FAILED, DEFAULT_KEEP_HISTORY, DEFAULT_KEEP_EVENTS)


def test_python_accepts_no_time_the_scripts_refuse() -> None:
    max_time_ms = lua_numbers(LUA / "lib" / "new_job_checks.lua")["MAX_TIME_MS"]
    assert max_time_ms == 2**52
    assert max_time_ms > MAX_SECONDS * 1000


def test_the_rate_grace_is_what_the_docs_say() -> None:
    grace = lua_numbers(LUA / "rate_take.lua")
    said = f"{grace['GRACE_PERCENT']} % of the window, at least {grace['GRACE_MIN_MS']} ms"
    assert said in " ".join((DOCS / "scaling.md").read_text().split())
    assert said in " ".join(header("rate_take").split())


def _without_comments(path: Path) -> str:
    """A Lua file without its comments."""
    return "\n".join(line.split("--", 1)[0] for line in path.read_text().splitlines())


@pytest.mark.parametrize("path", sorted(LUA.rglob("*.lua")), ids=lambda p: p.name)
def test_every_key_a_script_touches_comes_from_its_keys_prefix(path: Path) -> None:
    """A prefix (``QueueClient(prefix=...)``) confines an application to ``{<prefix>:*`` only if
    no script names a key but from KEYS: the scripts read KEYS[1] alone (a queue's or a batch's
    prefix, or rate_take's one key), take it as it is, and never write a hash tag of their own
    (a literal "{") that would put a key outside it."""
    code = _without_comments(path)
    assert set(re.findall(r"KEYS\[(\w+)\]", code)) <= {"1"}, f"{path.name} reads KEYS past [1]"
    literals = re.findall(r"'[^'\n]*'|\"[^\"\n]*\"", code)
    assert not [s for s in literals if "{" in s], f"{path.name} builds a hash tag"
    for use in re.finditer(r"KEYS\[1\]", code):
        line = code[code.rfind("\n", 0, use.start()) + 1 : code.find("\n", use.end())]
        assert re.fullmatch(r"local (P|B|key, .*) = KEYS\[1\].*", line.strip()), (
            f"{path.name}: KEYS[1] used other than as the prefix: {line.strip()}")
