"""The Lua scripts on their own: lock tokens, the stalled sweep, and invariants under random
interleavings of every transition (hypothesis)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from panqueue._codec import encode
from panqueue._keys import QueueKeys
from panqueue._store.loader import SCRIPTS
from panqueue._store.ops import NewJob, add_jobs
from panqueue._store.status import Status
from panqueue._store.transitions import parse_claim
from panqueue._store.transport import SyncTransport
from tests.store_fixtures import ScriptStore


def test_worker_that_lost_its_lock_cannot_finish_a_reclaimed_job(store: ScriptStore) -> None:
    [job_id] = store.add()
    assert store.claim("worker-a:1") == [job_id]
    store.expire_locks()
    assert store.sweep() == (1, 0)
    assert store.state(job_id) == "waiting"
    assert store.claim("worker-b:1") == [job_id]
    # Worker A comes back: every finishing script refuses its stale token, and changes nothing.
    before = store.t.client.hgetall(store.keys.job(job_id))
    assert store.complete(job_id, "worker-a:1") == Status.LOCK_LOST
    assert store.fail(job_id, "worker-a:1") == Status.LOCK_LOST
    assert store.extend(30_000, job_id, "worker-a:1") == [job_id, "worker-a:1"]  # the lost lock
    assert store.t.client.hgetall(store.keys.job(job_id)) == before
    assert store.complete(job_id, "worker-b:1") == Status.COMPLETED
    assert store.state(job_id) == "completed"


def test_stalled_sweep_fails_a_job_after_too_many_stalls(store: ScriptStore) -> None:
    [job_id] = store.add()
    for round_ in range(3):
        assert store.claim(f"w:{round_}") == [job_id]
        store.expire_locks()
        requeued, failed = store.sweep(max_stalls=2)
        if round_ < 2:
            assert (requeued, failed) == (1, 0)
        else:
            assert (requeued, failed) == (0, 1)
    assert store.state(job_id) == "failed"
    assert store.t.client.hget(store.keys.job(job_id), "fr") == b"stalled"
    assert store.t.client.zscore(store.keys.failed, job_id) is not None


def test_cancelled_active_job_whose_worker_died_ends_cancelled_not_rerun(
        store: ScriptStore) -> None:
    [job_id] = store.add()
    store.claim("w:1")
    assert store.call(SCRIPTS.cancel, job_id, -1) == b"active"
    store.expire_locks()
    assert store.sweep() == (0, 1)
    assert store.state(job_id) == "cancelled"
    assert store.claim("w:2") == []


def test_sweep_leaves_jobs_with_live_locks_alone(store: ScriptStore) -> None:
    ids = store.add(3)
    assert store.claim("w:1", n=3, ttl_ms=60_000) == ids
    assert store.sweep() == (0, 0)
    assert store.extend(60_000, ids[0], "w:1", ids[1], "w:1") == []
    assert [store.state(i) for i in ids] == ["active"] * 3


def test_claim_takes_up_to_n_jobs_in_one_call_and_nothing_while_paused(store: ScriptStore) -> None:
    ids = store.add(5)
    store.call(SCRIPTS.pause, "1")
    assert store.claim("w:1", n=5) == []
    store.call(SCRIPTS.pause, "0")
    assert store.claim("w:2", n=3) == ids[:3]
    assert store.claim("w:3", n=3) == ids[3:]


def test_complete_claims_the_next_job_in_the_same_call(store: ScriptStore) -> None:
    first, second = store.add(2)
    assert store.claim("w:1") == [first]
    reply = store.call(SCRIPTS.complete, -1, "w:2", 1000, 1, first, "w:1", encode(1), 1)
    jobs, _ = parse_claim(reply, 1)
    assert [j.id for j in jobs] == [second]
    assert store.state(second) == "active"
    assert store.t.client.hget(store.keys.job(second), "tk") == b"w:2"


def test_complete_records_a_batch_and_claims_one_job_per_freed_slot(store: ScriptStore) -> None:
    ids = store.add(5)
    assert store.claim("w:1", n=3) == ids[:3]
    store.expire_locks()
    store.sweep()  # ids[0..2] back to waiting; a new claim takes them with another token
    assert store.claim("w:2", n=2) == ids[:2]
    reply = store.call(SCRIPTS.complete, -1, "w:3", 30_000, 3,
                       ids[0], "w:2", encode(0), 1,    # completes, wants a next job
                       ids[2], "w:1", encode(2), 1,    # stale token: lock lost, unchanged
                       ids[1], "w:2", encode(1), 0)    # completes, wants none
    assert [Status(x) for x in reply[:3]] == [
        Status.COMPLETED, Status.LOCK_LOST, Status.COMPLETED]
    jobs, _ = parse_claim(reply, 3)
    assert [j.id for j in jobs] == [ids[2]]  # one next job, for the one slot that asked
    assert [store.state(i) for i in ids] == ["completed", "completed", "active", "waiting",
                                             "waiting"]


def test_a_completion_of_several_jobs_releases_each_ones_dependents_and_trims_once(
        store: ScriptStore) -> None:
    """A completion call writes the active and completed sets, looks for dependents and
    deletes what retention drops once for all its jobs: each job's part must still be done."""
    old = store.add(2, tags=("thumbs",))
    store.claim("w:0", n=2)
    store.call(SCRIPTS.complete, 2, "", 30_000, 2, old[0], "w:0", encode(0), 0,
               old[1], "w:0", encode(1), 0)
    ids = store.add(3)
    [after_second] = [job_id for job_id, _ in store.t.run(add_jobs(store.keys, [
        NewJob(None, encode("after"), depends_on=(ids[1],))]))]
    assert store.state(after_second) == "blocked"
    assert store.claim("w:1", n=3) == ids
    reply = store.call(SCRIPTS.complete, 2, "w:2", 30_000, 3,
                       ids[0], "w:1", encode(0), 0,
                       ids[1], "w:1", encode(1), 0,
                       ids[2], "w:9", encode(2), 0)    # stale token: stays active
    assert [Status(x) for x in reply[:3]] == [
        Status.COMPLETED, Status.COMPLETED, Status.LOCK_LOST]
    assert store.state(after_second) == "waiting"  # the second's dependent, released
    r = store.t.client
    assert r.zrange(store.keys.active, 0, -1) == [ids[2].encode()]
    # Retention keeps the newest two completed jobs: the older two are deleted, their tag's
    # index with them.
    assert set(r.zrange(store.keys.completed, 0, -1)) == {ids[0].encode(), ids[1].encode()}
    assert [r.exists(store.keys.job(i)) for i in old] == [0, 0]
    assert r.zcard(store.keys.prefix + "tag:thumbs") == 0


def test_a_claim_hands_over_data_of_any_length_whole_however_many_parts_it_is_stored_in(
        store: ScriptStore) -> None:
    """Data of 65 to 512 bytes is stored in parts of 64 (lib/job_data.lua); a claim reads the
    first two and the others only when there are more: every boundary reads back whole, and
    so does the reply a resent completion repeats from memory (lib/memo.lua)."""
    sizes = [0, 1, 63, 64, 65, 127, 128, 129, 191, 192, 193, 448, 511, 512, 513, 2000]
    datas = [bytes(range(65, 91)) * (n // 26) + b"z" * (n % 26) for n in sizes]
    ids = [job_id for job_id, _ in store.t.run(add_jobs(store.keys, [
        NewJob(None, data) for data in datas]))]
    args = ("w:1", 30_000, len(ids))
    jobs, _ = parse_claim(store.call(SCRIPTS.claim, *args))
    assert [(j.id, j.data) for j in jobs] == list(zip(ids, datas, strict=True))
    resent, _ = parse_claim(store.call(SCRIPTS.claim, *args))
    assert [(j.id, j.data) for j in resent] == list(zip(ids, datas, strict=True))
    parts = store.t.client.hkeys(store.keys.job(ids[sizes.index(193)]))
    assert {b"d", b"d1", b"d2", b"d3"} <= set(parts)  # four parts: the claim read all four


def test_claim_reports_when_the_next_delayed_job_is_due(store: ScriptStore) -> None:
    store.add(delay_ms=5_000)
    reply = store.call(SCRIPTS.claim, "w:1", 1000, 1)
    jobs, wake_in = parse_claim(reply)
    assert jobs == []
    assert 4_000 < wake_in <= 5_000


def test_retry_with_delay_goes_through_delayed(store: ScriptStore) -> None:
    [job_id] = store.add()
    store.claim("w:1")
    assert store.fail(job_id, "w:1", max_attempts=3, delay_ms=60_000) == Status.RETRY_DELAYED
    assert store.state(job_id) == "delayed"
    # The token is gone once the attempt is recorded.
    assert store.fail(job_id, "w:1") == Status.LOCK_LOST


# ----------------------------------------------------------------------------- invariants

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(1, 3), st.integers(-1, 1), st.booleans()),
        st.tuples(st.just("claim"), st.integers(1, 3)),
        st.tuples(st.just("complete"), st.integers(0, 20)),
        st.tuples(st.just("fail"), st.integers(0, 20), st.integers(1, 3)),
        st.tuples(st.just("stale"), st.integers(0, 20)),
        st.tuples(st.just("expire_and_sweep"),),
        st.tuples(st.just("promote_all"),),
        st.tuples(st.just("cancel"), st.integers(0, 20)),
        st.tuples(st.just("retry_failed"),),
    ),
    min_size=1,
    max_size=40,
)

_SETS = {"waiting": "wait", "delayed": "delayed", "active": "active", "completed": "completed",
         "failed": "failed", "cancelled": "cancelled"}


def check_invariants(store: ScriptStore, all_ids: set[str], completions: dict[str, int]) -> None:
    client = store.t.client
    members: dict[str, list[str]] = {}
    for state, attr in _SETS.items():
        for member in client.zrange(getattr(store.keys, attr), 0, -1):
            members.setdefault(member.decode(), []).append(state)
    for member in client.lrange(store.keys.wait_list, 0, -1):  # the default priority's
        members.setdefault(member.decode(), []).append("waiting")
    # No job is lost and none is in two places: each is in exactly the set its state names.
    assert set(members) == all_ids
    for job_id in all_ids:
        h = client.hgetall(store.keys.job(job_id))
        state = h[b"s"].decode()
        assert members[job_id] == [state], (job_id, members[job_id], state)
        assert (b"tk" in h) == (state == "active")
    # None completed twice.
    assert all(n == 1 for n in completions.values())


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_no_job_is_lost_or_completed_twice_under_any_interleaving(
        redis_url: str, ops: list[tuple[Any, ...]]) -> None:
    transport = SyncTransport(redis_url)
    transport.client.flushdb()
    store = ScriptStore(transport, QueueKeys("prop"))
    all_ids: set[str] = set()
    active: list[tuple[str, str]] = []  # (job id, token) as workers believe
    stale: list[tuple[str, str]] = []  # tokens of workers that lost their lock
    completions: dict[str, int] = {}
    counter = 0
    try:
        for op in ops:
            kind = op[0]
            if kind == "add":
                _, n, priority, delayed = op
                all_ids.update(store.add(n, priority=priority, delay_ms=60_000 if delayed else 0))
            elif kind == "claim":
                counter += 1
                token = f"w:{counter}"
                active += [(i, token) for i in store.claim(token, n=op[1])]
            elif kind in ("complete", "fail", "stale") and (active or stale):
                pool = stale if kind == "stale" and stale else active
                if not pool:
                    continue
                job_id, token = pool.pop(op[1] % len(pool))
                if kind == "fail":
                    result = store.fail(job_id, token, max_attempts=op[2])
                else:
                    result = store.complete(job_id, token)
                    if result == Status.COMPLETED:
                        completions[job_id] = completions.get(job_id, 0) + 1
                if pool is stale:
                    assert result == Status.LOCK_LOST
            elif kind == "expire_and_sweep":
                store.expire_locks()
                store.sweep(max_stalls=1)
                stale += active
                active = []
            elif kind == "promote_all":
                for member in transport.client.zrange(store.keys.delayed, 0, -1):
                    transport.client.zadd(store.keys.delayed, {member: 0})
                store.call(SCRIPTS.promote)
            elif kind == "cancel" and all_ids:
                job_id = sorted(all_ids)[op[1] % len(all_ids)]
                store.call(SCRIPTS.cancel, job_id, -1)
            elif kind == "retry_failed":
                store.call(SCRIPTS.retry, 1000)
            check_invariants(store, all_ids, completions)
    finally:
        transport.close()



# ----------------------------------------------------------------------------- keyed mode

KEYED_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.sampled_from("abc"), st.integers(1, 3)),
        st.tuples(st.just("claim"), st.integers(1, 4)),
        st.tuples(st.just("complete"), st.integers(0, 30)),
        st.tuples(st.just("fail"), st.integers(0, 30), st.integers(1, 2)),
        st.tuples(st.just("expire_and_sweep"),),
        st.tuples(st.just("cancel"), st.integers(0, 30)),
        st.tuples(st.just("retry_failed"),),
    ),
    min_size=1,
    max_size=40,
)


def check_keyed_invariants(store: ScriptStore, all_ids: set[str], completions: dict[str, int],
                           limit: int) -> None:
    client = store.t.client
    prefix = store.keys.prefix
    jobs = {i: client.hgetall(store.keys.job(i)) for i in all_ids}
    assert all(jobs.values()), "a job was lost"
    by_key_active: dict[str, int] = {}
    listed: dict[str, list[str]] = {}
    for h in jobs.values():
        key = h[b"k"].decode()
        if h[b"s"] == b"active":
            by_key_active[key] = by_key_active.get(key, 0) + 1
    for key in "abc":
        listed[key] = [x.decode() for x in client.lrange(prefix + "k:wait:" + key, 0, -1)]
    counters = {k.decode(): int(v) for k, v in client.hgetall(prefix + "k:active").items()}
    ready = {k.decode() for k in client.zrange(prefix + "k:ready", 0, -1)}
    for key in "abc":
        active = by_key_active.get(key, 0)
        assert active <= limit, f"key {key} runs {active} jobs, more than {limit}"
        assert counters.get(key, 0) == active
        waiting = [i for i, h in jobs.items() if h[b"k"].decode() == key and h[b"s"] == b"waiting"]
        assert sorted(listed[key]) == sorted(waiting)  # each waiting job listed exactly once
        eligible = bool(waiting) and active < limit
        assert (key in ready) == eligible, f"readiness of key {key}"
        if not waiting and not active:
            assert key not in counters  # structures of an idle key are removed
    assert int(client.hget(store.keys.meta, "kw") or 0) == sum(len(v) for v in listed.values())
    assert all(n == 1 for n in completions.values())


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=KEYED_OPS, limit=st.integers(1, 2))
def test_keyed_mode_invariants_under_any_interleaving(
        redis_url: str, ops: list[tuple[Any, ...]], limit: int) -> None:
    transport = SyncTransport(redis_url)
    transport.client.flushdb()
    store = ScriptStore(transport, QueueKeys("keyed-prop"))
    store.call(SCRIPTS.setup, "keyed", limit, 0, 0, 0, 1, -1)
    all_ids: set[str] = set()
    active: list[tuple[str, str]] = []
    completions: dict[str, int] = {}
    counter = 0
    try:
        for op in ops:
            kind = op[0]
            if kind == "add":
                _, key, n = op
                jobs = [NewJob(None, encode(key), key=key) for _ in range(n)]
                all_ids.update(i for i, _ in transport.run(add_jobs(store.keys, jobs)))
            elif kind == "claim":
                counter += 1
                token = f"w:{counter}"
                active += [(i, token) for i in store.claim(token, n=op[1])]
            elif kind in ("complete", "fail") and active:
                job_id, token = active.pop(op[1] % len(active))
                if kind == "complete":
                    if store.complete(job_id, token) == Status.COMPLETED:
                        completions[job_id] = completions.get(job_id, 0) + 1
                else:
                    store.fail(job_id, token, max_attempts=op[2])
            elif kind == "expire_and_sweep":
                store.expire_locks()
                store.sweep(max_stalls=5)
                active = []
            elif kind == "cancel" and all_ids:
                store.call(SCRIPTS.cancel, sorted(all_ids)[op[1] % len(all_ids)], -1)
            elif kind == "retry_failed":
                store.call(SCRIPTS.retry, 1000)
            check_keyed_invariants(store, all_ids, completions, limit)
    finally:
        transport.close()


def test_keyed_round_robin_does_not_starve_a_small_key(store: ScriptStore) -> None:
    store.call(SCRIPTS.setup, "keyed", 1, 0, 0, 0, 1, -1)
    big = [i for i, _ in store.t.run(add_jobs(
        store.keys, [NewJob(None, encode(n), key="big") for n in range(1000)]))]
    small = [i for i, _ in store.t.run(add_jobs(
        store.keys, [NewJob(None, encode(n), key="small") for n in range(2)]))]
    served = []
    for n in range(6):
        [job_id] = store.claim(f"w:{n}")
        served.append(job_id)
        assert store.complete(job_id, f"w:{n}") == Status.COMPLETED
    assert served == [big[0], small[0], big[1], small[1], big[2], big[3]]
