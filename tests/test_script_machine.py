"""A state machine over the Lua scripts themselves, against a real Redis.

Hypothesis drives one queue through random sequences of script calls, exactly as workers and
producers send them (EVALSHA with the ARGV the scripts document), and after every step reads the
whole queue back from Redis and checks it.

The model
---------
Redis is the state; the machine keeps only what clients would know:

* ``handed``: every (job id, lock token) pair a claim-bearing reply (claim, complete, fail) has
  handed out. A pair is *live* while the job's ``tk`` field still equals the token, *stale*
  afterwards. Rules that need a lock pick live pairs mostly, and stale pairs or a bogus token
  otherwise, so the wrong-token paths run too.
* ``deps`` / ``born`` / ``completed``: the dependencies each job was created with, which
  incarnation of each was meant (a custom id can be deleted and created again), and which
  incarnations have ever completed (from the ``completed`` events).
* ``sent`` / ``sent_claiming``: the last few calls (of any script; of claim, complete and fail)
  with their ARGV and reply, for the resend rules, and ``first_reply``: per request id, the
  answer a resend must repeat.

Three queues run the same rules: ``GlobalQueue`` (priorities, one wait ZSET), ``KeyedQueue``
(setup.lua with mode keyed, key concurrency 1 or 2) and ``TrimmedQueue`` (global, retention
keep = 1, so trimming runs on every finish); the first two keep every finished job (keep = -1).

Time is never waited for. Lock TTLs and delays are a minute long; a lock "expires" when a rule
sets its score in the active ZSET to 0, a delayed job "comes due" when its score in the delayed
ZSET is set to 0 (and promote.lua runs at once, so a claim never promotes by surprise).

Transitions (rules): add a batch (custom ids, priorities, delays, dependencies, dedup keys),
claim n jobs with a fresh token, complete a batch (right and wrong tokens, with and without
claiming next jobs), fail (retry now, retry delayed, final, attempts exhausted), extend locks,
let locks expire, sweep stalled jobs, release, cancel, remove, retry failed jobs, make delayed
jobs due and promote them, pause / resume, report progress, and resend one of the last calls
verbatim (a client whose reply was lost; a second rule picks among claim / complete / fail).

Invariants (after every step, read from Redis)
-----------------------------------------------
* Every job hash is in exactly one state container and that container matches its ``s`` field
  (keyed mode: waiting jobs in the per-key lists ``k:wait:<key>``); no container holds a
  member without a job hash. Finished sets therefore hold only finished jobs.
* A job has a lock token exactly while it is active, and every active (id, token) pair was
  handed to a client by some reply: nothing is locked behind every client's back. A reply never
  hands out a job that was already active under another lock.
* Keyed mode: meta ``kw`` is the total length of the key lists; ``k:active`` per key counts the
  key's active jobs, never exceeds the key concurrency and is gone for idle keys; a key is in
  ``k:ready`` exactly when it has waiting jobs, free capacity and no rate-limit pause.
* Dependency edges: B is in ``deps:A`` exactly when A is in ``needs:B``; both jobs exist, A has
  not completed nor been cancelled. A blocked job's ``needs`` are exactly its dependencies that
  have not completed yet, none of them failed or lost. A job never runs (waiting, delayed,
  active, completed), even after a retry, before every dependency has completed; a failed job
  whose dependency can never complete is marked ``dx`` so that no retry moves it back.
* Jobs disappear only with a ``removed`` event and never while active (or, when the queue keeps
  few finished jobs, by retention of finished jobs).

Every rule also checks its own script's answer against the state before the call (statuses,
counts, claim order and the resulting states).

Resends: claim, complete and fail carry a fresh lock token that doubles as a request id. A
resent call must answer the same statuses, hand out the same jobs (those the token still holds)
and change nothing. (A claim that claimed nothing may claim afresh when resent: it changed
nothing the first time.) For every other script a resend must only keep the invariants.
"""

from __future__ import annotations

import itertools
import re
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from panqueue._codec import encode
from panqueue._job import ErrorInfo
from panqueue._keys import QueueKeys
from panqueue._store.loader import SCRIPTS, Script
from panqueue._store.ops import NewJob, add_call, encode_error, parse_added
from panqueue._store.ops.events import WATCH_MS
from panqueue._store.status import Status
from panqueue._store.transport import ScriptCall, SyncTransport
from tests.bounds import examples

LOCK_TTL = 60_000
DELAY = 60_000
DEDUP_TTL = 3_600_000
HISTORY = 3  # how far back a resend may reach
CUSTOM_IDS = ("c0", "c1", "c2")
DEDUP_KEYS = ("d0", "d1")
CONCURRENCY_KEYS = ("a", "b", "c")
ERR = encode_error(ErrorInfo("ValueError", "boom"))
STALL_ERR = encode_error(ErrorInfo("Stalled", "lock expired"))

# lua/lib/wait_order.lua: the set's members scored below this go before the list "wl".
WAIT_LIST_PLACE = (1_000_000 + 1) * 2**32
# The container of each state (keyed mode keeps waiting jobs in per-key lists instead; global
# mode's default priority, in the list "wl").
CONTAINERS = {"waiting": "wait", "delayed": "delayed", "blocked": "blocked", "active": "active",
              "completed": "completed", "failed": "failed", "cancelled": "cancelled"}
FINAL = frozenset({"completed", "failed", "cancelled"})
FINAL_EVENTS = frozenset({"completed", "failed", "cancelled"})
CLAIMING = frozenset({"claim", "complete", "fail", "snooze", "rate_limited"})
# The finishing scripts that answer LOCK_LOST alone when the token does not match.
REFUSABLE = frozenset({"fail", "snooze", "rate_limited"})
# The scripts that may trim.
FINISHING = frozenset({"complete", "fail", "snooze", "rate_limited", "stalled", "release",
                       "cancel", "expire"})

# No explain phase: it traces every line (slow before Python 3.12) to annotate a failure; and
# one failure shrunk, not each distinct one (shrinking replays whole runs against Redis).
# 30 runs of 40 steps per queue in every run (about half a minute each on two busy cores);
# 100 with --long.
SETTINGS = settings(max_examples=examples(30, 100), stateful_step_count=40, deadline=None,
                    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
                    report_multiple_bugs=False,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])


def text(value: bytes | None) -> str | None:
    return None if value is None else value.decode()


@dataclass
class Snapshot:
    """One queue as read from Redis."""

    jobs: dict[str, dict[str, bytes]]
    sets: dict[str, dict[str, float]]  # state -> member -> score, in score order
    klists: dict[str, list[str]]  # key -> waiting job ids (keyed mode)
    kactive: dict[str, int]
    ready: list[str]
    limited: list[str]
    meta: dict[str, bytes]
    dependents: dict[str, set[str]]  # "deps:<id>": the jobs waiting for <id>
    needs: dict[str, set[str]]  # "needs:<id>": the dependencies <id> still waits for
    flows: dict[str, set[str]]  # "flow:<id>": every job added depending on <id>

    def state(self, job_id: str) -> str | None:
        h = self.jobs.get(job_id)
        return None if h is None else h[b"s"].decode()

    def get(self, job_id: str, name: str) -> str | None:
        return text(self.jobs.get(job_id, {}).get(name.encode()))

    def in_state(self, state: str) -> list[str]:
        return sorted(i for i in self.jobs if self.state(i) == state)

    def summary(self) -> dict[str, tuple[str | None, ...]]:
        """What a resent call must not change: each job's state, lock, attempts, stalls."""
        return {i: (self.get(i, "s"), self.get(i, "tk"), self.get(i, "a"), self.get(i, "sc"),
                    self.get(i, "cx"), self.get(i, "dx")) for i in self.jobs}


@dataclass
class Sent:
    """One script call as a client sent it, and the reply it got."""

    name: str
    args: tuple[Any, ...]
    reply: Any
    token: str = ""  # the request id of claim / complete / fail
    claim_at: int = 0  # where the claim part of the reply starts


@dataclass
class Step:
    """What one step expects, checked once the queue has been read back."""

    checks: list[Callable[[Snapshot, Snapshot], None]] = field(default_factory=list)


def claimed_ids(reply: list[Any], offset: int) -> list[str]:
    """The ids of the claim part of a claim / complete / fail reply, read straight from the
    scripts' reply format: count, wake_in, then 5 fields per job, its id first."""
    count = int(reply[offset])
    return [reply[offset + 2 + 5 * n].decode() for n in range(count)]

# add.lua's fields per job but its data, as its header says ("its other fields as a msgpack
# array of N"; tests/test_lua_contract.py holds the header to what Python sends).
ADD_FIELDS = int(re.search(r"msgpack\s+array of (\d+)", (
    Path(__file__).parents[1] / "panqueue" / "_store" / "lua" / "add.lua").read_text())[1])


class ScriptMachine(RuleBasedStateMachine):
    """The rules and invariants shared by every queue configuration."""

    transport: ClassVar[SyncTransport]
    mode: ClassVar[str] = "global"
    keep: ClassVar[int] = -1  # retention passed to every script that trims

    def __init__(self) -> None:
        super().__init__()
        self.client = self.transport.client
        self.client.flushdb()
        self.keys = QueueKeys("machine")
        self.prefix = self.keys.prefix
        self.kc = 1
        self.counter = itertools.count(1)
        self.handed: dict[tuple[str, str], None] = {}  # ordered set of (job id, token)
        self.deps: dict[str, list[tuple[str, int | None]]] = {}  # job -> (dependency, born)
        self.born: dict[str, int] = {}
        self.births = itertools.count(1)
        self.completed: set[tuple[str, int]] = set()  # (id, born) that ever completed
        self.sent: list[Sent] = []  # the last calls of any script
        self.sent_claiming: list[Sent] = []  # the last claim / complete / fail calls
        self.first_reply: dict[str, Any] = {}  # request id -> the answer a resend must repeat
        self.step = Step()
        self.last_event = "0-0"
        self.last: Snapshot

    # ------------------------------------------------------------------ plumbing

    def setup_queue(self, kc: int) -> None:
        self.kc = kc
        reply = self.call("setup", SCRIPTS.setup, self.mode, kc, 0, 0, 0, 1, self.keep,
                          record=False)
        assert reply == [b"ok"], reply
        # Somebody reads the queue's events: the scripts write every one (checked below).
        self.client.set(self.keys.events_read, 1, px=WATCH_MS)
        self.last = self.snapshot()

    def token(self) -> str:
        return f"w{next(self.counter)}"

    def call(self, name: str, script: Script, *args: Any, token: str = "", claim_at: int = 0,
             record: bool = True) -> Any:
        if self.keep >= 0 and name in FINISHING:
            # Retention drops the oldest finished job; calls 1 ms apart never tie on the
            # finish time, so a replayed example trims the same jobs (hypothesis replays them).
            time.sleep(0.0011)
        reply = self.transport.execute(ScriptCall(script, (self.prefix,), args))
        if name in CLAIMING:
            self.first_reply.setdefault(token, reply)
        if record:
            for history in (self.sent, self.sent_claiming) if name in CLAIMING else (self.sent,):
                history.append(Sent(name, args, reply, token, claim_at))
                del history[:-HISTORY]
        return reply

    def expect(self, check: Callable[[Snapshot, Snapshot], None]) -> None:
        self.step.checks.append(check)

    def snapshot(self) -> Snapshot:
        c, prefix = self.client, self.prefix
        job_ids, key_names, dep_ids, need_ids, flow_ids = [], [], [], [], []
        for raw in c.scan_iter(match=prefix + "*", count=1000):
            name = raw.decode()[len(prefix):]
            if name.startswith("job:") and not name.endswith(":logs"):
                job_ids.append(name[4:])
            elif name.startswith("k:wait:"):
                key_names.append(name[7:])
            elif name.startswith("deps:"):
                dep_ids.append(name[5:])
            elif name.startswith("needs:"):
                need_ids.append(name[6:])
            elif name.startswith("flow:"):
                flow_ids.append(name[5:])
        job_ids.sort()
        key_names.sort()
        pipe = c.pipeline(transaction=False)
        for i in job_ids:
            pipe.hgetall(prefix + "job:" + i)
        for k in key_names:
            pipe.lrange(prefix + "k:wait:" + k, 0, -1)
        for d in dep_ids:
            pipe.smembers(prefix + "deps:" + d)
        for d in need_ids:
            pipe.smembers(prefix + "needs:" + d)
        for d in flow_ids:
            pipe.smembers(prefix + "flow:" + d)
        for container in CONTAINERS.values():
            pipe.zrange(prefix + container, 0, -1, withscores=True)
        pipe.lrange(prefix + "wl", 0, -1)
        pipe.hgetall(prefix + "k:active")
        pipe.zrange(prefix + "k:ready", 0, -1)
        pipe.zrange(prefix + "k:limited", 0, -1)
        pipe.hgetall(prefix + "meta")
        replies: Iterator[Any] = iter(pipe.execute())
        jobs = {i: next(replies) for i in job_ids}
        klists = {k: [x.decode() for x in next(replies)] for k in key_names}
        dependents = {d: {x.decode() for x in next(replies)} for d in dep_ids}
        needs = {d: {x.decode() for x in next(replies)} for d in need_ids}
        flows = {d: {x.decode() for x in next(replies)} for d in flow_ids}
        sets = {state: {m.decode(): score for m, score in next(replies)} for state in CONTAINERS}
        # Global mode's default priority waits in the list "wl": in the wait order, after the
        # set's members of a higher priority (lua/lib/wait_order.lua).
        listed = [x.decode() for x in next(replies)]
        waiting = sets["waiting"]
        sets["waiting"] = {
            **{m: score for m, score in waiting.items() if score < WAIT_LIST_PLACE},
            **dict.fromkeys(listed, float(WAIT_LIST_PLACE)),
            **{m: score for m, score in waiting.items() if score >= WAIT_LIST_PLACE}}
        assert len(sets["waiting"]) == len(waiting) + len(listed), "a job in both wait places"
        kactive = {k.decode(): int(v) for k, v in next(replies).items()}
        ready = [k.decode() for k in next(replies)]
        limited = [k.decode() for k in next(replies)]
        meta = {k.decode(): v for k, v in next(replies).items()}
        return Snapshot(jobs, sets, klists, kactive, ready, limited, meta, dependents, needs,
                        flows)

    def events(self) -> list[tuple[str, str]]:
        entries = self.client.xrange(self.keys.events, "(" + self.last_event, "+")
        if entries:
            self.last_event = entries[-1][0].decode()
        return [(e[b"ev"].decode(), e[b"id"].decode()) for _, e in entries]

    # ------------------------------------------------------------------ model helpers

    def live(self, s: Snapshot) -> list[tuple[str, str]]:
        return [(i, t) for (i, t) in self.handed if s.get(i, "tk") == t]

    def draw_locks(self, data: st.DataObject, s: Snapshot, most: int) -> list[tuple[str, str]]:
        """Up to `most` (job id, token) pairs for distinct jobs: mostly live locks, sometimes a
        stale token or a bogus one."""
        live = self.live(s)
        every = list(self.handed)
        pairs: list[tuple[str, str]] = []
        for _ in range(data.draw(st.integers(1, most), label="locks")):
            kind = data.draw(st.sampled_from(["live", "live", "live", "stale", "bogus"]),
                             label="token kind")
            if kind == "live" and live:
                pair = data.draw(st.sampled_from(live))
            elif kind == "bogus" and every:
                pair = (data.draw(st.sampled_from(every))[0], "bogus")
            elif every:
                pair = data.draw(st.sampled_from(every))
            else:
                continue
            if pair[0] not in {i for i, _ in pairs}:
                pairs.append(pair)
        return pairs

    def dep_status(self, s: Snapshot, dep: str, born: int | None) -> str:
        """'done' (this incarnation completed), 'pending' (it may still complete), 'failed' (it
        may complete after a retry) or 'lost' (cancelled, or deleted before completing)."""
        if born is not None and (dep, born) in self.completed:
            return "done"
        if born is None or self.born.get(dep) != born or dep not in s.jobs:
            return "lost"
        state = s.state(dep)
        if state == "cancelled":
            return "lost"
        return "failed" if state == "failed" else "pending"

    def record_added(self, before: Snapshot, items: list[NewJob], reply: Any) -> list[str]:
        added = parse_added(self.keys, reply)  # raises on a refused batch
        assert len(added) == len(items)
        created: list[str] = []
        resolved: dict[str, str] = {}  # a dependency on an item means the job it became
        for item, (job_id, new) in zip(items, added, strict=True):
            if item.job_id is not None and item.job_id != job_id:
                resolved[item.job_id] = job_id
            if not new:
                continue  # an existing job (same custom id, or a live dedup key) is returned
            assert item.job_id in (None, job_id)
            deps = []
            for d in (resolved.get(d, d) for d in item.depends_on):
                if d in created:
                    deps.append((d, self.born[d]))
                elif d in before.jobs:
                    deps.append((d, self.born.get(d)))
                else:
                    deps.append((d, None))
            self.born[job_id] = next(self.births)
            self.deps[job_id] = deps
            created.append(job_id)
        return created

    def claimable_count(self, s: Snapshot) -> int:
        """How many jobs a claim of unlimited size would take now."""
        if "paused" in s.meta or int(s.meta.get("pu", 0)) > time.time() * 1000:
            return 0  # paused, or paused until later by a handler's RateLimited
        if self.mode == "global":
            return len(s.sets["waiting"])
        total = 0
        for key, ids in s.klists.items():
            running = sum(1 for i in s.in_state("active") if s.get(i, "k") == key)
            if key not in s.limited:
                total += min(len(ids), max(0, self.kc - running))
        return total

    def check_handed_out(self, before: Snapshot, reply: list[Any], offset: int, token: str,
                         finishing: str | list[str] = ()) -> list[str]:
        """Record the jobs a reply claimed; none of them may have been running already (but
        the job a fail retries, or the jobs a resent call already holds)."""
        ids = claimed_ids(reply, offset)
        assert len(ids) == len(set(ids)), f"a job handed out twice in one reply: {ids}"
        exempt = [finishing] if isinstance(finishing, str) else finishing
        for i in ids:
            assert before.state(i) != "active" or i in exempt, (
                f"job {i} handed out under {token} while active under {before.get(i, 'tk')}")
            self.handed[(i, token)] = None

        def locked(_: Snapshot, after: Snapshot) -> None:
            for i in ids:
                if after.get(i, "tk") is not None or after.state(i) == "active":
                    assert after.get(i, "tk") == token, (i, token, after.get(i, "tk"))

        self.expect(locked)
        return ids

    def check_claim(self, before: Snapshot, ids: list[str], n: int) -> None:
        """A plain claim takes exactly what is claimable, in order."""
        assert len(ids) == min(n, self.claimable_count(before)), (ids, n)
        if not ids:
            return
        if self.mode == "global":
            assert ids == list(before.sets["waiting"])[:n]
        else:
            for key, queued in before.klists.items():
                taken = [i for i in ids if before.get(i, "k") == key]
                assert taken == queued[:len(taken)], f"key {key}: took {taken} of {queued}"

    def check_short_claim(self, wanted: int, got: int) -> None:
        """A claim that got fewer jobs than it asked for left nothing claimable."""
        if got < wanted:
            self.expect(lambda _, after: self._nothing_claimable(after))

    def _nothing_claimable(self, after: Snapshot) -> None:
        assert self.claimable_count(after) == 0, "a claim came back short of claimable jobs"

    # ------------------------------------------------------------------ invariants

    @invariant()
    def queue_is_consistent(self) -> None:
        before, after = self.last, self.snapshot()
        events = self.events()
        self.completed |= {(i, self.born[i]) for ev, i in events if ev == "completed"}
        self.check_structure(after)
        self.check_dependencies(after)
        self.check_disappearances(before, after, events)
        step, self.step = self.step, Step()
        for check in step.checks:
            check(before, after)
        self.last = after

    def check_structure(self, s: Snapshot) -> None:
        where: dict[str, list[str]] = defaultdict(list)
        for state, members in s.sets.items():
            for m in members:
                where[m].append(state)
        for ids in s.klists.values():
            for m in ids:
                where[m].append("waiting")
        if self.mode == "keyed":
            assert not s.sets["waiting"], "keyed queue with jobs in the global wait set"
        else:
            assert not s.klists and not s.kactive and not s.ready, "keyed structures"
        for job_id, h in s.jobs.items():
            state = h[b"s"].decode()
            assert where.pop(job_id, []) == [state], (
                f"job {job_id} is {state} but sits in {where.get(job_id)}")
            assert (b"tk" in h) == (state == "active"), f"job {job_id} {state} with tk {h}"
            if state == "active":
                pair = (job_id, h[b"tk"].decode())
                assert pair in self.handed, f"job {job_id} locked by {pair[1]}, never handed out"
            if state in FINAL:
                assert b"ft" in h, f"finished job {job_id} without ft"
            assert (b"k" in h) == (self.mode == "keyed"), f"job {job_id} key field in {h}"
        assert not where, f"state containers hold ids without a job: {dict(where)}"
        if self.mode == "keyed":
            self.check_keyed(s)

    def check_keyed(self, s: Snapshot) -> None:
        assert int(s.meta.get("kw", b"0")) == sum(len(v) for v in s.klists.values()), "kw"
        running: dict[str, int] = defaultdict(int)
        for i in s.in_state("active"):
            running[s.get(i, "k") or ""] += 1
        for key in set(running) | set(s.kactive) | set(s.klists) | set(s.ready):
            active, waiting = running.get(key, 0), len(s.klists.get(key, []))
            assert active <= self.kc, f"key {key} runs {active} jobs, concurrency {self.kc}"
            assert s.kactive.get(key, 0) == active, (
                f"k:active[{key}] = {s.kactive.get(key)}, {active} running")
            if not waiting and not active:
                assert key not in s.kactive, f"idle key {key} left in k:active"
            eligible = waiting > 0 and active < self.kc and key not in s.limited
            assert (key in s.ready) == eligible, (
                f"key {key}: ready={key in s.ready}, waiting {waiting}, running {active}")

    def check_dependencies(self, s: Snapshot) -> None:
        # The two sides of every edge agree, and an edge joins two jobs, the dependency not
        # completed nor cancelled.
        edges = {(a, b) for a, bs in s.dependents.items() for b in bs}
        assert edges == {(a, b) for b, As in s.needs.items() for a in As}, "one-sided edges"
        for a, b in edges:
            assert a in s.jobs and b in s.jobs, f"edge {a} -> {b} of a deleted job"
            assert s.state(a) not in ("completed", "cancelled"), f"edge {a} -> {b}: {s.state(a)}"
        for job_id in s.jobs:
            state = s.state(job_id)
            status: dict[str, set[str]] = defaultdict(set)
            for d, born in self.deps.get(job_id, []):
                status[self.dep_status(s, d, born)].add(d)
            needs = s.needs.get(job_id, set())
            if needs:
                assert state in ("blocked", "failed"), f"job {job_id} is {state}, needs {needs}"
            if state == "blocked":
                assert not status["lost"] and not status["failed"], (
                    f"job {job_id} blocked on {status['lost'] | status['failed']}")
                assert status["pending"] and needs == status["pending"], (
                    f"blocked job {job_id} needs {needs}, unfinished deps {status['pending']}")
            elif state in ("waiting", "delayed", "active", "completed"):
                early = status["pending"] | status["failed"] | status["lost"]
                assert not early, f"job {job_id} is {state} before its dependencies {early}"
            elif state == "failed" and status["lost"]:
                assert s.get(job_id, "dx"), f"job {job_id} lost {status['lost']}, no dx"
        self.check_flow_records(s)

    def check_flow_records(self, s: Snapshot) -> None:
        # A flow's record (lib/flow_record.lua) lives exactly as long as its jobs: each job's
        # dp names what it was added depending on, and flow:A holds the existing jobs added
        # depending on this incarnation of A (not on a deleted job whose id A reuses).
        expected = set()
        for b in s.jobs:
            deps = self.deps.get(b)
            if deps is None:
                continue  # made by a script the model does not follow (a schedule's tick)
            assert (s.get(b, "dp") or "").split("\n") == [d for d, _ in deps] or (
                not deps and s.get(b, "dp") is None), f"job {b}: dp {s.get(b, 'dp')!r}"
            expected |= {(d, b) for d, born in deps
                         if born is not None and self.born.get(d) == born and d in s.jobs}
        recorded = {(a, b) for a, bs in s.flows.items() for b in bs}
        assert recorded == expected, (
            f"flow records {sorted(recorded - expected)} of no dependency, "
            f"dependencies {sorted(expected - recorded)} not recorded")

    def check_disappearances(self, before: Snapshot, after: Snapshot,
                             events: list[tuple[str, str]]) -> None:
        removed = {i for ev, i in events if ev == "removed"}
        finished = {i for ev, i in events if ev in FINAL_EVENTS}
        added = {i for ev, i in events if ev == "added"}
        for i in removed:
            assert before.state(i) != "active", f"active job {i} removed"
        for i in set(before.jobs) - set(after.jobs):
            trimmed = self.keep >= 0 and (before.state(i) in FINAL or i in finished)
            assert i in removed or trimmed, f"job {i} ({before.state(i)}) vanished"
        assert set(after.jobs) - set(before.jobs) <= added, "a job appeared without 'added'"
        if self.keep >= 0:  # only complete.lua adds to this set, and it always trims
            assert len(after.sets["completed"]) <= self.keep, "completed jobs not trimmed"

    # ------------------------------------------------------------------ producers

    @rule(data=st.data())
    def add_jobs(self, data: st.DataObject) -> None:
        """A batch of 1-3 jobs: custom ids, priorities, delays, dependencies, dedup."""
        before = self.last
        items: list[NewJob] = []
        batch_custom: list[str] = []
        for n in range(data.draw(st.integers(1, 3), label="batch size")):
            custom = data.draw(st.none() | st.sampled_from(CUSTOM_IDS), label="custom id")
            pool = sorted(set(before.jobs) | set(batch_custom))
            dedup = data.draw(st.none() | st.tuples(st.sampled_from(DEDUP_KEYS),
                                                     st.sampled_from(["keep", "extend",
                                                                      "replace"])),
                              label="dedup")
            # (a dependency may be named twice, or be replaced by dedup in the same call)
            deps = data.draw(st.lists(st.sampled_from(pool), max_size=2),
                             label="depends on") if pool else []
            items.append(NewJob(
                custom, encode(n),
                priority=data.draw(st.integers(0, 2), label="priority"),
                delay_ms=DELAY if data.draw(st.booleans(), label="delayed") else 0,
                key=data.draw(st.sampled_from(CONCURRENCY_KEYS), label="key")
                if self.mode == "keyed" else "",
                depends_on=tuple(deps),
                dedup_key=dedup[0] if dedup else "",
                dedup_ttl_ms=DEDUP_TTL if dedup else 0,
                dedup_strategy=dedup[1] if dedup else "",
                expires_in_ms=DELAY if data.draw(st.booleans(), label="deadline") else 0))
            if custom:
                batch_custom.append(custom)
        call = add_call(self.keys, items)
        reply = self.call("add", SCRIPTS.add, *call.args)
        created = self.record_added(before, items, reply)

        def states(_: Snapshot, after: Snapshot) -> None:
            for job_id in created:
                assert after.state(job_id) in (None, "waiting", "delayed", "blocked", "failed")

        self.expect(states)

    @rule(data=st.data())
    def deadlines_pass(self, data: st.DataObject) -> None:
        """The deadline to start by of some jobs that have not started passes and a worker's
        upkeep sweeps: each ends CANCELLED "expired", unless an expired dependency failed it
        first (dependency_failed); a running job is not touched."""
        before = self.last
        candidates = sorted(i for i in before.jobs if before.get(i, "x") is not None
                            and before.state(i) in ("waiting", "delayed", "blocked"))
        chosen = data.draw(st.lists(st.sampled_from(candidates), unique=True, max_size=3),
                           label="past their deadline") if candidates else []
        for job_id in chosen:
            self.client.hset(self.prefix + "job:" + job_id, "x", 1)
            self.client.zadd(self.prefix + "expires", {job_id: 1})
        swept = int(self.call("expire", SCRIPTS.expire, 1000))
        assert (swept == len(chosen)) if len(chosen) < 2 else (1 <= swept <= len(chosen))

        def expired(_: Snapshot, after: Snapshot) -> None:
            for job_id in chosen:
                ending = (after.state(job_id), after.get(job_id, "fr"))
                assert ending in (("cancelled", "expired"), ("failed", "dependency_failed"),
                                  (None, None)), ending
            for job_id in set(before.jobs) - set(chosen):
                if before.state(job_id) == "active":
                    assert after.state(job_id) == "active"

        self.expect(expired)

    # ------------------------------------------------------------------ workers

    @rule(n=st.integers(1, 3))
    def claim_jobs(self, n: int) -> None:
        """A worker with n free slots claims with a fresh token."""
        before = self.last
        token = self.token()
        reply = self.call("claim", SCRIPTS.claim, token, LOCK_TTL, n, token=token)
        ids = self.check_handed_out(before, reply, 0, token)
        self.check_claim(before, ids, n)

    @precondition(lambda self: self.handed)
    @rule(data=st.data())
    def complete_jobs(self, data: st.DataObject) -> None:
        """A batch of completions (right and wrong tokens), each maybe asking for a next job."""
        before = self.last
        pairs = self.draw_locks(data, before, 3)
        fetch = [data.draw(st.booleans(), label="claim next") for _ in pairs]
        token = self.token()
        args: list[Any] = [self.keep, token, LOCK_TTL, len(pairs)]
        for (job_id, tk), f in zip(pairs, fetch, strict=True):
            args += [job_id, tk, encode(f"result of {job_id}"), 1 if f else 0]
        reply = self.call("complete", SCRIPTS.complete, *args, token=token,
                          claim_at=len(pairs))
        statuses = [int(x) for x in reply[:len(pairs)]]
        expected = [Status.COMPLETED if before.get(i, "tk") == tk else Status.LOCK_LOST
                    for i, tk in pairs]
        assert statuses == expected, (pairs, statuses)
        wanted = sum(1 for s, f in zip(statuses, fetch, strict=True)
                     if s == Status.COMPLETED and f)
        ids = self.check_handed_out(before, reply, len(pairs), token)
        assert len(ids) <= wanted
        self.check_short_claim(wanted, len(ids))

        def finished(before: Snapshot, after: Snapshot) -> None:
            for (job_id, _), status in zip(pairs, statuses, strict=True):
                if status == Status.COMPLETED:
                    assert after.state(job_id) in ("completed", None)
                elif job_id not in ids:  # (a stale job may be claimed as a next job)
                    trimmed = self.keep >= 0 and before.state(job_id) in FINAL
                    if not (trimmed and job_id not in after.jobs):
                        assert after.summary().get(job_id) == before.summary().get(job_id)

        self.expect(finished)

    @precondition(lambda self: self.handed)
    @rule(data=st.data(), outcome=st.sampled_from(["retry now", "retry delayed", "final",
                                                    "attempts exhausted"]),
          fetch=st.integers(0, 1))
    def fail_job(self, data: st.DataObject, outcome: str, fetch: int) -> None:
        """An attempt fails: retried now or later, or failed for good; maybe claims next."""
        before = self.last
        [(job_id, tk)] = self.draw_locks(data, before, 1) or [("nope", "bogus")]
        token = self.token()
        max_attempts = 1 if outcome == "attempts exhausted" else 5
        delay = DELAY if outcome == "retry delayed" else 0
        final = 1 if outcome == "final" else 0
        entry = encode({"attempt": 1, "type": "ValueError", "message": "boom"})
        reply = self.call("fail", SCRIPTS.fail, job_id, tk, ERR, entry, max_attempts, delay,
                          final, "", self.keep, fetch, token, LOCK_TTL, token=token, claim_at=1)
        if before.get(job_id, "tk") != tk:
            assert reply == [Status.LOCK_LOST], reply
            self.expect(lambda b, a: self._unchanged(b, a, "a refused fail"))
            return
        attempts = int(before.get(job_id, "a") or 0)
        if before.get(job_id, "cx") is not None:
            expected = Status.CANCELLED
        elif final or attempts >= max_attempts:
            expected = Status.FAILED
        else:
            expected = Status.RETRY_DELAYED if delay else Status.RETRY_NOW
        assert int(reply[0]) == expected, (outcome, reply[0])
        ids = self.check_handed_out(before, reply, 1, token, finishing=job_id)
        assert len(ids) <= fetch
        self.check_short_claim(fetch, len(ids))

        def outcome_state(_: Snapshot, after: Snapshot) -> None:
            state = after.state(job_id)
            if expected == Status.RETRY_NOW:
                assert state == "waiting" or (state == "active" and job_id in ids), state
            else:
                wanted = {Status.RETRY_DELAYED: "delayed", Status.FAILED: "failed",
                          Status.CANCELLED: "cancelled"}[expected]
                assert state in (wanted, None), (expected, state)

        self.expect(outcome_state)

    @precondition(lambda self: self.handed)
    @rule(data=st.data(), delay=st.sampled_from([0, DELAY]), cap=st.sampled_from([-1, 0, 2]),
          fetch=st.integers(0, 1))
    def snooze_job(self, data: st.DataObject, delay: int, cap: int, fetch: int) -> None:
        """The handler snoozes its job: delayed (or waiting) again without using an attempt,
        or failed once it snoozed more than the cap; maybe claims next."""
        before = self.last
        [(job_id, tk)] = self.draw_locks(data, before, 1) or [("nope", "bogus")]
        token = self.token()
        entry = encode({"attempt": 1, "type": "Snoozed", "message": "snoozed"})
        reply = self.call("snooze", SCRIPTS.snooze, job_id, tk, delay, entry, cap, self.keep,
                          fetch, token, LOCK_TTL, token=token, claim_at=1)
        if before.get(job_id, "tk") != tk:
            assert reply == [Status.LOCK_LOST], reply
            self.expect(lambda b, a: self._unchanged(b, a, "a refused snooze"))
            return
        attempts = int(before.get(job_id, "a") or 0)
        snoozes = int(before.get(job_id, "sn") or 0) + 1
        if before.get(job_id, "cx") is not None:
            expected = Status.CANCELLED
        elif 0 <= cap < snoozes:
            expected = Status.FAILED
        else:
            expected = Status.SNOOZED
        assert int(reply[0]) == expected, (cap, snoozes, reply[0])
        ids = self.check_handed_out(before, reply, 1, token, finishing=job_id)
        assert len(ids) <= fetch
        self.check_short_claim(fetch, len(ids))

        def outcome_state(_: Snapshot, after: Snapshot) -> None:
            state = after.state(job_id)
            if expected == Status.SNOOZED:
                if delay:
                    assert state == "delayed", state
                else:
                    assert state == "waiting" or (state == "active" and job_id in ids), state
                if state != "active":  # the snooze gave back the attempt the claim took
                    assert int(after.get(job_id, "a") or 0) == attempts - 1
                    assert int(after.get(job_id, "sn") or 0) == snoozes
            else:
                wanted = {Status.FAILED: "failed", Status.CANCELLED: "cancelled"}[expected]
                assert state in (wanted, None), (expected, state)

        self.expect(outcome_state)

    @precondition(lambda self: self.handed)
    @rule(data=st.data(), fetch=st.integers(0, 1))
    def rate_limit_job(self, data: st.DataObject, fetch: int) -> None:
        """The handler was refused for now: the job waits again, without using an attempt, and
        its key or the whole queue pauses (for longer than a run lasts); maybe claims next."""
        before = self.last
        [(job_id, tk)] = self.draw_locks(data, before, 1) or [("nope", "bogus")]
        token = self.token()
        entry = encode({"attempt": 1, "type": "RateLimited", "retry_after_ms": DELAY})
        reply = self.call("rate_limited", SCRIPTS.rate_limited, job_id, tk, DELAY, entry,
                          self.keep, fetch, token, LOCK_TTL, token=token, claim_at=1)
        if before.get(job_id, "tk") != tk:
            assert reply == [Status.LOCK_LOST], reply
            self.expect(lambda b, a: self._unchanged(b, a, "a refused rate_limited"))
            return
        attempts = int(before.get(job_id, "a") or 0)
        cancelled = before.get(job_id, "cx") is not None
        expected = Status.CANCELLED if cancelled else Status.RATE_LIMITED
        assert int(reply[0]) == expected, reply[0]
        ids = self.check_handed_out(before, reply, 1, token, finishing=job_id)
        assert job_id not in ids and len(ids) <= fetch
        self.check_short_claim(fetch, len(ids))

        def outcome_state(_: Snapshot, after: Snapshot) -> None:
            state = after.state(job_id)
            if expected == Status.CANCELLED:
                assert state in ("cancelled", None), state
                return
            assert state == "waiting", state
            assert int(after.get(job_id, "a") or 0) == attempts - 1
            if self.mode == "global":
                assert int(after.meta["pu"]) > time.time() * 1000
            else:
                assert after.get(job_id, "k") in after.limited

        self.expect(outcome_state)

    @precondition(lambda self: self.handed)
    @rule(data=st.data())
    def extend_locks(self, data: st.DataObject) -> None:
        """Renewal: only the holder of a job's current token moves its deadline."""
        before = self.last
        pairs = self.draw_locks(data, before, 3)
        args = [x for pair in pairs for x in pair]
        flat = [x.decode() for x in self.call("extend", SCRIPTS.extend, LOCK_TTL, *args)]
        lost = list(zip(flat[::2], flat[1::2], strict=True))
        mismatched = [(i, tk) for i, tk in pairs if before.get(i, "tk") != tk]
        # Lost locks are answered as (job id, token) pairs, in the order asked.
        assert lost == mismatched, (pairs, lost)

        def deadlines(before: Snapshot, after: Snapshot) -> None:
            for i, tk in pairs:
                old, new = before.sets["active"].get(i), after.sets["active"].get(i)
                if (i, tk) in mismatched:
                    assert new == old or after.state(i) != "active"
                else:
                    assert new is not None and new > 0 and (old is None or new >= old)

        self.expect(deadlines)

    @precondition(lambda self: self.last.sets["active"])
    @rule(data=st.data())
    def let_locks_expire(self, data: st.DataObject) -> None:
        """Time passes for some running jobs: their lock deadline is now in the past."""
        active = sorted(self.last.sets["active"])
        expired = data.draw(st.lists(st.sampled_from(active), min_size=1, unique=True),
                            label="expire")
        self.client.zadd(self.keys.active, dict.fromkeys(expired, 0))

    @rule(max_stalls=st.integers(0, 2))
    def sweep_stalled(self, max_stalls: int) -> None:
        """The stalled sweep: past-deadline jobs back to waiting, or failed, or cancelled."""
        before = self.last
        reply = self.call("stalled", SCRIPTS.stalled, max_stalls, 1000, self.keep, STALL_ERR)
        expired = [i for i, score in before.sets["active"].items() if score <= 0]
        to_end = [i for i in expired if before.get(i, "cx") is not None
                  or int(before.get(i, "sc") or 0) + 1 > max_stalls]
        assert [int(x) for x in reply] == [len(expired) - len(to_end), len(to_end)], (
            reply, expired)

        def moved(_: Snapshot, after: Snapshot) -> None:
            for i in expired:
                if i in to_end:
                    assert after.state(i) in ("failed", "cancelled", None)
                else:
                    assert after.state(i) == "waiting"
                    assert int(after.get(i, "a") or 0) == int(before.get(i, "a") or 0) - 1

        self.expect(moved)

    @precondition(lambda self: self.handed)
    @rule(data=st.data())
    def release_jobs(self, data: st.DataObject) -> None:
        """Forced shutdown: a worker gives its running jobs back (or ends cancelled ones)."""
        before = self.last
        pairs = self.draw_locks(data, before, 3)
        args = [x for pair in pairs for x in pair]
        released = int(self.call("release", SCRIPTS.release, *args))
        mine = [i for i, tk in pairs if before.get(i, "tk") == tk]
        assert released == len(mine)

        def moved(_: Snapshot, after: Snapshot) -> None:
            for i in mine:
                wanted = "cancelled" if before.get(i, "cx") is not None else "waiting"
                assert after.state(i) == wanted, (i, after.state(i))

        self.expect(moved)

    @precondition(lambda self: self.handed)
    @rule(data=st.data(), kind=st.sampled_from(["p", "l"]))
    def report_progress(self, data: st.DataObject, kind: str) -> None:
        """Progress or a log line, accepted from the lock holder only."""
        before = self.last
        [(job_id, tk)] = self.draw_locks(data, before, 1) or [("nope", "bogus")]
        reply = self.call("progress", SCRIPTS.progress, job_id, tk, kind, encode(50), 10)
        assert int(reply) == (1 if before.get(job_id, "tk") == tk else 0)

    # ------------------------------------------------------------------ operators

    def pick_job(self, data: st.DataObject) -> str:
        pool = sorted(set(self.last.jobs) | set(CUSTOM_IDS) | {"nope"})
        return data.draw(st.sampled_from(pool), label="job")

    @rule(data=st.data())
    def cancel_job(self, data: st.DataObject) -> None:
        """Cancel: at once when not started, by marking when active, a no-op when final."""
        before = self.last
        job_id = self.pick_job(data)
        reply = self.call("cancel", SCRIPTS.cancel, job_id, self.keep)
        state = before.state(job_id)
        assert text(reply) == state, (reply, state)

        def moved(before: Snapshot, after: Snapshot) -> None:
            if state in ("waiting", "delayed", "blocked"):
                assert after.state(job_id) in ("cancelled", None)
            elif state == "active":
                assert after.state(job_id) == "active" and after.get(job_id, "cx") == "1"
            elif state is not None:
                assert after.summary()[job_id] == before.summary()[job_id]

        self.expect(moved)

    @rule(data=st.data())
    def remove_job(self, data: st.DataObject) -> None:
        """Remove: refused for an active job, otherwise the job is gone."""
        before = self.last
        job_id = self.pick_job(data)
        reply = int(self.call("remove", SCRIPTS.remove, job_id, ""))
        state = before.state(job_id)
        assert reply == (0 if state is None else -1 if state == "active" else 1)
        if reply == 1:
            self.expect(lambda _, after: self._gone(after, job_id))

    def _gone(self, after: Snapshot, job_id: str) -> None:
        assert job_id not in after.jobs

    @rule(data=st.data())
    def retry_failed_jobs(self, data: st.DataObject) -> None:
        """retry.lua: named failed jobs (or all of them) back to waiting, or to blocked while a
        dependency may still complete; a job whose dependency cannot complete stays failed."""
        before = self.last
        failed = before.in_state("failed")
        if data.draw(st.booleans(), label="all failed jobs"):
            ids: list[str] = []
            candidates = failed
        else:
            pool = sorted(set(before.jobs) | {"nope"})
            ids = data.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3),
                            label="retry ids")
            candidates = sorted({i for i in ids if i in failed})
        moved = int(self.call("retry", SCRIPTS.retry, 1000, *ids))

        def outcome(_: Snapshot, after: Snapshot) -> None:
            left = [i for i in candidates if after.state(i) != "failed"]
            assert moved == len(left), (moved, left)
            for i in candidates:
                if i in left:
                    assert after.state(i) in ("waiting", "blocked"), (i, after.state(i))
                    assert after.get(i, "a") == "0"
                    assert (after.state(i) == "blocked") == bool(after.needs.get(i))
                else:  # it stays only for a dependency that cannot complete now
                    stuck = [a for a in after.needs.get(i, ()) if after.state(a) == "failed"]
                    assert after.get(i, "dx") or stuck, f"failed job {i} was not retried"

        self.expect(outcome)

    @rule(data=st.data())
    def promote_due_jobs(self, data: st.DataObject) -> None:
        """Some delayed jobs come due (their score is set in the past) and are promoted."""
        before = self.last
        delayed = sorted(before.sets["delayed"])
        due = data.draw(st.lists(st.sampled_from(delayed), unique=True), label="due") \
            if delayed else []
        if due:
            self.client.zadd(self.keys.delayed, dict.fromkeys(due, 0))
        moved, _wake_in = self.call("promote", SCRIPTS.promote)
        assert int(moved) == len(due)

        def waiting(_: Snapshot, after: Snapshot) -> None:
            for i in due:
                assert after.state(i) == "waiting"

        self.expect(waiting)

    @rule(paused=st.booleans())
    def pause_or_resume(self, paused: bool) -> None:
        assert self.call("pause", SCRIPTS.pause, "1" if paused else "0") == 1

    # ------------------------------------------------------------------ lost replies

    @precondition(lambda self: self.sent)
    @rule(data=st.data())
    def resend_a_recent_call(self, data: st.DataObject) -> None:
        """A client lost the reply of one of its last calls and sends it again verbatim."""
        self.resend(data.draw(st.sampled_from(self.sent[::-1]), label="resent call"))

    @precondition(lambda self: self.sent_claiming)
    @rule(data=st.data())
    def resend_a_recent_claim_complete_or_fail(self, data: st.DataObject) -> None:
        """The same, for the calls that carry a request id (more often: they promise more)."""
        self.resend(data.draw(st.sampled_from(self.sent_claiming[::-1]), label="resent call"))

    def resend(self, sent: Sent) -> None:
        before = self.last
        script = getattr(SCRIPTS, sent.name)
        reply = self.call(sent.name, script, *sent.args, token=sent.token,
                          claim_at=sent.claim_at)
        if sent.name == "add" and not (isinstance(reply, list) and reply[:1] == [b"!"]):
            # (a resent add may be refused: a dependency of it may be gone by now)
            self.record_added(before, self._items_of(sent), reply)
        if sent.name in CLAIMING:
            self.check_resent_claiming_call(before, sent, reply)
        # Other scripts: the invariants must hold, nothing more.

    def check_resent_claiming_call(self, before: Snapshot, sent: Sent, reply: Any) -> None:
        """A resent claim / complete / fail answers as the first call did and changes nothing
        (its token is its request id)."""
        first = self.first_reply[sent.token]
        if sent.name in REFUSABLE and first == [Status.LOCK_LOST]:
            assert reply == first, f"resent refused fail answered {reply}"
            self.expect(lambda b, a: self._unchanged(b, a, "a resent refused fail"))
            return
        first_ids = claimed_ids(first, sent.claim_at)
        if sent.name == "claim" and not first_ids:
            # An empty claim changed nothing and is not remembered: its resend may claim like
            # a new one. If it does, that claim is what the token now stands for.
            ids = self.check_handed_out(before, reply, 0, sent.token)
            self.check_claim(before, ids, int(sent.args[2]))
            if ids:
                self.first_reply[sent.token] = reply
            return
        held = [i for i in first_ids if before.get(i, "tk") == sent.token]
        refused = sent.name in REFUSABLE and reply == [Status.LOCK_LOST]
        ids = [] if refused else self.check_handed_out(before, reply, sent.claim_at,
                                                       sent.token, finishing=held)
        statuses = [int(x) for x in first[:sent.claim_at]]
        again = [int(x) for x in reply[:sent.claim_at]]
        assert again == statuses, f"resent {sent.name}: statuses {again}, first {statuses}"
        assert ids == held, f"resent {sent.name} handed out {ids}; still held: {held}"
        self.expect(lambda b, a: self._unchanged(b, a, f"a resent {sent.name}"))

    def _items_of(self, sent: Sent) -> list[NewJob]:
        """The jobs of a sent add call, read back from its ARGV."""
        import msgpack

        from panqueue._codec import decode

        args = sent.args
        items = []
        fields: list[Any] = [b""] * ADD_FIELDS  # '': the item before's fields (none: defaults)
        fields[1] = fields[2] = fields[3] = fields[8] = fields[10] = fields[11] = 0
        for n in range(int(args[0])):
            b = 3 + n * 2  # each job's data and fields, after 3 leading ones
            if args[b + 1]:
                fields = msgpack.unpackb(args[b + 1], raw=True)  # raw strings (add_call)
                assert len(fields) == ADD_FIELDS, fields
            deps = tuple(decode(fields[6])) if fields[6] else ()
            items.append(NewJob(fields[0].decode() or None, args[b], depends_on=deps,
                                expires_in_ms=int(fields[10])))
        return items

    def _unchanged(self, before: Snapshot, after: Snapshot, what: str) -> None:
        changed = {i: (before.summary().get(i), v) for i, v in after.summary().items()
                   if before.summary().get(i) != v}
        gone = set(before.jobs) - set(after.jobs)
        assert not changed and not gone, f"{what} changed jobs: {changed}, deleted {gone}"


class GlobalQueue(ScriptMachine):
    """A global-mode queue (priorities, one wait ZSET), keeping every finished job."""

    @initialize()
    def set_up(self) -> None:
        self.setup_queue(1)


class KeyedQueue(ScriptMachine):
    """A keyed-mode queue: per-key FIFO lists, key concurrency 1 or 2."""

    mode = "keyed"

    @initialize(kc=st.integers(1, 2))
    def set_up(self, kc: int) -> None:
        self.setup_queue(kc)


class TrimmedQueue(ScriptMachine):
    """A global-mode queue that keeps one finished job per finished set (retention trims)."""

    keep = 1

    @initialize()
    def set_up(self) -> None:
        self.setup_queue(1)


@pytest.mark.parametrize("machine", [GlobalQueue, KeyedQueue, TrimmedQueue],
                         ids=["global", "keyed", "keep-1"])
def test_scripts_keep_the_queue_consistent(redis_url: str,
                                           machine: type[ScriptMachine]) -> None:
    transport = SyncTransport(redis_url)
    machine.transport = transport
    try:
        run_state_machine_as_test(machine, settings=SETTINGS)
    finally:
        transport.close()

