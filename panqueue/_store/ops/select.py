"""Jobs picked by a filter (a tag, a state, an error type) and the bulk operations on them:
listing a filtered page, cancelling, retrying and removing every job that matches.

The filter runs on the server (``lua/select.lua``), which reads a tag's index or a state's
set a bounded slice per call and sends back only the matches. A bulk operation first picks
its jobs, page by page, then changes them in batches with the scripts that change one job
(``cancel.lua``, ``retry.lua``, ``remove.lua``), each of which checks the job's state again:
a job that moved on meanwhile is left as it is and not counted, and running the same bulk
operation again changes only what is still left to change.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from panqueue._check import check_int
from panqueue._job import JobInfo, JobState
from panqueue._keys import QueueKeys
from panqueue._store.loader import SCRIPTS
from panqueue._store.ops.add import check_tag
from panqueue._store.ops.base import DEFAULT_KEEP_FAILED, script_call
from panqueue._store.ops.jobs import STATE_SETS, list_ids, read_jobs
from panqueue._store.transport import Batch, Command, Op
from panqueue.errors import ConfigError

__all__ = ["BULK_BATCH", "cancel_jobs", "count_matching", "filtered_list", "remove_jobs",
           "retry_jobs", "select_ids"]

# How many set members one call of select.lua reads at most (it holds the server that long).
SELECT_BUDGET = 2000
# How many jobs one round trip of a bulk operation changes (and one page of its selection).
BULK_BATCH = 500

_UNFINISHED = (JobState.WAITING, JobState.DELAYED, JobState.BLOCKED, JobState.ACTIVE)


def check_state(state: JobState | str) -> JobState:
    try:
        return JobState(state)
    except ValueError:
        raise ConfigError(f"unknown job state {state!r} (one of: "
                          f"{', '.join(s.value for s in JobState)})") from None


def check_error_type(error_type: object) -> str:
    if not isinstance(error_type, str) or not error_type or not error_type.isprintable():
        raise ConfigError(f"error_type must be an exception's type name (a non-empty str, "
                          f"such as 'TimeoutError'), got {error_type!r}")
    return error_type


def select_ids(keys: QueueKeys, states: Collection[JobState] | None, tag: str | None,
               error_type: str | None, limit: int | None, offset: int = 0,
               newest_first: bool = False) -> Op[list[str]]:
    """The ids of up to ``limit`` jobs (``None``: all) that match, after the first ``offset``
    matches: jobs with ``tag`` (read from its index, in the order they were added), else the
    jobs of the one state in ``states`` (in its set's order), in ``states`` (``None``: any),
    whose last error is of type ``error_type`` (``None``: any)."""
    if tag is not None:
        what, source = "tag", tag
    else:
        if not states or len(states) != 1:
            raise ConfigError("a filter without a tag names one state")
        what, source = "set", STATE_SETS[next(iter(states))]
    wanted = "" if states is None else ",".join(sorted(s.value for s in states))
    if what == "set" and source == STATE_SETS[JobState.WAITING] and (
            yield Command(("HGET", keys.meta, "mode"))) == b"keyed":
        return (yield from _keyed_waiting(keys, wanted, error_type, limit, offset))
    rank, skip = 0, offset
    ids: list[str] = []
    while limit is None or len(ids) < limit:
        want = SELECT_BUDGET if limit is None else limit - len(ids)
        reply = yield script_call(SCRIPTS.select, keys, what, source, wanted, error_type or "",
                                  rank, 1 if newest_first else 0, skip, want, SELECT_BUDGET)
        rank, skip = int(reply[0]), int(reply[1])
        ids += [member.decode() for member in reply[2:]]
        if rank < 0:
            break
    return ids


def _keyed_waiting(keys: QueueKeys, wanted: str, error_type: str | None, limit: int | None,
                   offset: int) -> Op[list[str]]:
    """:func:`select_ids` of a keyed queue's waiting jobs, which wait in a list per key: the
    listing's pages (it knows their order, :func:`list_ids`), each filtered on the server."""
    ids: list[str] = []
    skip, at = offset, 0
    while limit is None or len(ids) < limit:
        page = yield from list_ids(keys, JobState.WAITING, SELECT_BUDGET, at)
        if not page:
            break
        at += len(page)
        want = SELECT_BUDGET if limit is None else limit - len(ids)
        reply = yield script_call(SCRIPTS.select, keys, "ids", "", wanted, error_type or "", 0,
                                  0, skip, want, SELECT_BUDGET, *page)
        skip = int(reply[1])
        ids += [member.decode() for member in reply[2:]]
        if len(page) < SELECT_BUDGET:
            break
    return ids


def filtered_list(keys: QueueKeys, state: JobState | str, tag: str | None,
                  error_type: str | None, limit: int, offset: int) -> Op[list[JobInfo]]:
    """One page of the jobs in ``state`` that carry ``tag`` and whose last error is of type
    ``error_type`` (either may be ``None``, not both): with a tag in the order the jobs were
    added, else in the state's own order; finished states newest first."""
    state = check_state(state)
    check_int(limit, "limit", low=1)
    check_int(offset, "offset", low=0)
    if tag is not None:
        check_tag(tag)
    if error_type is not None:
        check_error_type(error_type)
    ids = yield from select_ids(keys, (state,), tag, error_type, limit, offset,
                                newest_first=state.is_final)
    return (yield from read_jobs(keys, ids, states=(state,)))


def _pick(keys: QueueKeys, states: Sequence[JobState], tag: str | None,
          error_type: str | None) -> Op[list[str]]:
    """Every job a bulk operation changes, oldest first. Without a tag or an error type the
    state's own listing is read (it knows a keyed queue's waiting jobs), a page at a time."""
    if tag is not None or error_type is not None:
        return (yield from select_ids(keys, states, tag, error_type, None))
    ids: list[str] = []
    for state in states:
        offset = 0
        while True:
            page = yield from list_ids(keys, state, BULK_BATCH, offset)
            ids += page
            offset += len(page)
            if len(page) < BULK_BATCH:
                break
    return ids


def count_matching(keys: QueueKeys, states: Sequence[JobState | str], tag: str | None,
                   error_type: str | None) -> Op[int]:
    """How many jobs a bulk operation over ``states`` with this filter would pick now (what a
    confirmation shows before it runs)."""
    if tag is not None:
        check_tag(tag)
    if error_type is not None:
        check_error_type(error_type)
    ids = yield from _pick(keys, [check_state(s) for s in states], tag, error_type)
    return len(ids)


def _chunks(ids: Sequence[str]) -> list[Sequence[str]]:
    return [ids[i:i + BULK_BATCH] for i in range(0, len(ids), BULK_BATCH)]


def _states_of(name: str, tag: str | None, state: JobState | str | None,
               allowed: Sequence[JobState], refusal: str) -> list[JobState]:
    """The states a bulk operation ``name`` looks at: ``state`` alone, or every one of
    ``allowed`` when only a tag is given."""
    if tag is None and state is None:
        raise ConfigError(f"{name} needs a filter: tag= or state= (or both)")
    if tag is not None:
        check_tag(tag)
    if state is None:
        return list(allowed)
    chosen = check_state(state)
    if chosen not in allowed:
        raise ConfigError(f"{name}: {refusal.format(state=chosen.value)}")
    return [chosen]


def cancel_jobs(keys: QueueKeys, tag: str | None, state: JobState | str | None) -> Op[int]:
    """Cancel every job that carries ``tag`` and is in ``state`` (``None``: any state not
    final); returns how many were cancelled (an active one counts once its cancel is asked
    of its worker)."""
    states = _states_of("cancel_jobs", tag, state, _UNFINISHED,
                        "a {state} job is finished: there is nothing to cancel")
    ids = yield from _pick(keys, states, tag, None)
    # Each job must still be in the state it was picked in (a delayed one may have come due, a
    # waiting one started, since): the script leaves one that moved on.
    wanted = "" if state is None else states[0].value
    changed = 0
    for chunk in _chunks(ids):
        replies: Any = yield Batch(tuple(
            script_call(SCRIPTS.cancel, keys, job_id, DEFAULT_KEEP_FAILED, wanted)
            for job_id in chunk))
        changed += sum(1 for before in replies
                       if before and JobState(before.decode()) in _UNFINISHED
                       and (not wanted or before.decode() == wanted))
    return changed


def remove_jobs(keys: QueueKeys, tag: str | None, state: JobState | str | None) -> Op[int]:
    """Delete every job that carries ``tag`` and is in ``state`` (``None``: any state but
    active); returns how many were deleted. Active jobs are never removed: cancel them."""
    allowed = [s for s in JobState if s is not JobState.ACTIVE]
    states = _states_of("remove_jobs", tag, state, allowed,
                        "{state} jobs are held by their workers and cannot be removed: cancel "
                        "them (cancel_jobs) and remove them once they are cancelled")
    ids = yield from _pick(keys, states, tag, None)
    removed = 0
    for chunk in _chunks(ids):
        # Each job must still be in the state it was picked in (a removal before it in this
        # call may have failed it, as a blocked dependent; a worker may have finished it).
        replies: Any = yield Batch(tuple(
            script_call(SCRIPTS.remove, keys, job_id, "" if state is None else states[0].value)
            for job_id in chunk))
        removed += sum(1 for reply in replies if int(reply) == 1)
    return removed


def retry_jobs(keys: QueueKeys, tag: str | None, error_type: str | None) -> Op[int]:
    """Move every failed job that carries ``tag`` and whose error is of type ``error_type``
    (``None``: any) back to waiting, a chunk a script call; returns how many moved."""
    if tag is not None:
        check_tag(tag)
    if error_type is not None:
        check_error_type(error_type)
    ids = yield from select_ids(keys, (JobState.FAILED,), tag, error_type, None)
    moved = 0
    for chunk in _chunks(ids):
        reply = yield script_call(SCRIPTS.retry, keys, len(chunk), *chunk)
        moved += int(reply)
    return moved
