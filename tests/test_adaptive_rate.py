"""Adaptive rate limits (``RateLimit(adaptive=True)``): a handler's ``RateLimited`` halves the
effective limit of its key or queue, each clean recovery step raises it by one up to the maximum.

First the scripts themselves against a real server (the cut, the climb, per-key independence,
resends), then a convergence run: workers calling a fake outside API that refuses above a
hidden per-tenant rate.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from panqueue import ConfigError, Job, QueueClient, RateLimit, RateLimited, Registry
from panqueue._store.loader import SCRIPTS
from panqueue._store.ops import server_time_ms
from panqueue._store.ops.rate import effective_rate_limit
from panqueue._store.status import Status
from panqueue.testing import run_worker
from scripts.adaptive_rate_curve import HIDDEN, SETTLED, SLACK, WINDOW, run_scenario
from tests.helpers import wait_until
from tests.store_fixtures import ScriptStore, open_store

STEP_MS = 60_000  # the recovery step of the script tests: no climb happens while they run


class RateStore(ScriptStore):
    """One queue's scripts called directly, with its settings as a worker would write them."""

    def setup(self, mode: str, rate_max: int, *, per_key: bool = False, step_ms: int = STEP_MS,
              per_ms: int = 60_000) -> None:
        reply = self.call(SCRIPTS.setup, mode, 100, rate_max, per_ms, 1 if per_key else 0, 1,
                          -1, 0, step_ms)
        assert reply == [b"ok"]

    def limit(self, key: str | None = None) -> int | None:
        return self.t.run(effective_rate_limit(self.keys, key))

    def fresh_window(self, key: str | None = None) -> None:
        """Forget the starts counted so far and any pause, to see what the limit alone allows."""
        self.redis.delete(self.keys.rate if key is None else f"{self.keys.rate}:{key}")
        self.redis.hdel(self.keys.meta, "pu")
        if key is not None and self.redis.zscore(self.keys.limited, key) is not None:
            self.redis.zadd(self.keys.limited, {key: 1})

    def past_cut(self, key: str | None = None) -> None:
        """Wait until the server clock is past the last cut (jobs claimed in the millisecond of
        a cut count as started before it)."""
        saved = (self.redis.get(f"{self.keys.prefix}rle:{key}") if key is not None
                 else self.redis.hget(self.keys.meta, "rle"))
        assert saved is not None, "no cut is in force"
        cut = int(saved.split(b":")[1])
        wait_until(lambda: self.t.run(server_time_ms()) > cut, what="the next millisecond")

    def age_cut(self, steps: float, key: str | None = None) -> None:
        """Move the last cut ``steps`` recovery steps into the past (as if that time went by
        without a RateLimited)."""
        where = (self.keys.meta, "rle") if key is None else (f"{self.keys.prefix}rle:{key}", None)
        saved = (self.redis.hget(*where) if where[1] else self.redis.get(where[0]))
        assert saved is not None, "no cut is in force"
        limit, cut = saved.decode().split(":")
        moved = f"{limit}:{int(cut) - int(steps * STEP_MS)}"
        if where[1]:
            self.redis.hset(where[0], where[1], moved)
        else:
            self.redis.set(where[0], moved, keepttl=True)


@pytest.fixture
def store(redis_url: str, queue_name: str) -> Iterator[RateStore]:
    with open_store(redis_url, queue_name, RateStore) as opened:
        yield opened


# ----------------------------------------------------------------------------- the scripts


def test_each_rate_limited_halves_the_queue_limit_rounding_down_and_never_below_one(
        store: RateStore) -> None:
    store.setup("global", 7)
    store.add(20)
    expected = [3, 1, 1]
    for n, limit in enumerate(expected):
        store.fresh_window()
        [job] = store.claim(f"w:{n}")
        assert store.rate_limited(job, f"w:{n}") == Status.RATE_LIMITED
        assert store.limit() == limit
        store.past_cut()
    # The claim honours the effective limit, not the configured maximum.
    store.fresh_window()
    assert len(store.claim("w:9", n=10)) == 1


def test_the_limit_climbs_back_by_one_per_clean_step_up_to_the_maximum(store: RateStore) -> None:
    store.setup("global", 9)
    store.add(40)
    [job] = store.claim("w:1")
    store.rate_limited(job, "w:1")
    assert store.limit() == 4
    store.age_cut(2.5)  # two whole steps without a RateLimited
    assert store.limit() == 6
    store.fresh_window()
    assert len(store.claim("w:2", n=20)) == 6
    store.age_cut(100)
    assert store.limit() == 9  # never above the maximum
    store.fresh_window()
    assert len(store.claim("w:3", n=20)) == 9


def test_a_cut_halves_the_limit_in_force_not_the_maximum(store: RateStore) -> None:
    store.setup("global", 20)
    store.add(10)
    [first] = store.claim("w:1")
    store.rate_limited(first, "w:1")
    store.age_cut(3)  # 10, then three clean steps: 13
    store.fresh_window()
    [second] = store.claim("w:2")
    store.rate_limited(second, "w:2")
    assert store.limit() == 6


def test_refusals_of_jobs_started_before_the_last_cut_cut_nothing_more(store: RateStore) -> None:
    store.setup("global", 16)
    store.add(10)
    together = store.claim("w:1", n=4)  # in flight at the same time, refused together
    for job in together:
        store.rate_limited(job, "w:1")
    assert store.limit() == 8
    store.past_cut()
    store.fresh_window()
    [later] = store.claim("w:2")  # started under the new limit: its refusal counts
    store.rate_limited(later, "w:2")
    assert store.limit() == 4


def test_per_key_limits_are_cut_independently(store: RateStore) -> None:
    store.setup("keyed", 8, per_key=True)
    store.add(10, key="a")
    store.add(10, key="b")
    claimed = store.claim("w:1", n=2)
    assert len(claimed) == 2  # one of each key (round robin)
    key_of = {job: store.redis.hget(store.keys.job(job), "k") for job in claimed}
    [of_a] = [job for job, key in key_of.items() if key == b"a"]
    store.rate_limited(of_a, "w:1")
    assert (store.limit("a"), store.limit("b")) == (4, 8)
    assert store.limit() is None  # the limit is per key: the queue has none of its own
    for key in ("a", "b"):
        store.fresh_window(key)
    jobs = store.claim("w:2", n=20)
    keys = [store.redis.hget(store.keys.job(job), "k") for job in jobs]
    # b was claimed once before; the fresh window lets it start 8 more, a only 4.
    assert (keys.count(b"a"), keys.count(b"b")) == (4, 8)
    # A key's state lasts only until its limit is back at the maximum.
    ttl = store.redis.pttl(f"{store.keys.prefix}rle:a")
    assert 4 * STEP_MS < ttl <= 4 * STEP_MS + 1000
    assert store.redis.exists(f"{store.keys.prefix}rle:b") == 0


def test_a_global_limit_on_a_keyed_queue_is_cut_for_the_whole_queue(store: RateStore) -> None:
    store.setup("keyed", 6)
    store.add(5, key="a")
    store.add(5, key="b")
    [job, _] = store.claim("w:1", n=2)
    store.rate_limited(job, "w:1")
    assert store.limit() == 3 and store.limit("a") is None
    store.fresh_window()
    store.redis.zadd(store.keys.limited, {"a": 1, "b": 1})  # the handler's pause is over
    assert len(store.claim("w:2", n=10)) == 3


def test_a_resent_rate_limited_cuts_once(store: RateStore) -> None:
    store.setup("global", 12)
    store.add(3)
    [job] = store.claim("w:1")
    assert store.rate_limited(job, "w:1", request="w:2") == Status.RATE_LIMITED
    saved = store.redis.hget(store.keys.meta, "rle")
    assert store.rate_limited(job, "w:1", request="w:2") == Status.RATE_LIMITED
    assert store.redis.hget(store.keys.meta, "rle") == saved and store.limit() == 6
    assert store.redis.hget(store.keys.job(job), "a") == b"0"


def test_a_fixed_limit_is_not_cut(store: RateStore) -> None:
    store.setup("global", 12, step_ms=0)
    store.add(3)
    [job] = store.claim("w:1")
    store.rate_limited(job, "w:1")
    assert store.limit() == 12 and store.redis.hget(store.keys.meta, "rle") is None


def test_a_key_whose_pause_ends_waits_while_its_window_is_over_the_cut_limit(
        store: RateStore) -> None:
    store.setup("keyed", 8, per_key=True)
    store.add(10, key="a")
    started = store.claim("w:1", n=3)
    assert len(started) == 3
    store.rate_limited(started[0], "w:1")
    store.rate_limited(started[1], "w:1")  # in flight with the first: no second cut
    assert store.limit("a") == 4
    store.redis.delete(store.keys.rate + ":a")
    now = store.t.run(server_time_ms())
    # Five starts in the window against a limit of 4: the second oldest must leave first.
    store.redis.zadd(store.keys.rate + ":a", {f"s{i}": now - 50_000 + i * 1000 for i in range(5)})
    store.redis.zadd(store.keys.limited, {"a": 1})  # the handler's pause is over
    assert store.claim("w:2", n=5) == []
    assert store.redis.zscore(store.keys.limited, "a") == pytest.approx(now + 11_000, abs=500)


def test_setup_stores_the_recovery_step_only_for_an_adaptive_limit(store: RateStore) -> None:
    store.setup("global", 5, step_ms=1500)
    assert store.redis.hget(store.keys.meta, "rla") == b"1500"
    store.redis.hset(store.keys.meta, "rle", "2:0")
    store.setup("global", 5, step_ms=0)  # a worker with a fixed limit: the cut state goes too
    assert store.redis.hmget(store.keys.meta, "rla", "rle") == [None, None]
    store.setup("global", 0, step_ms=1500)  # no limit at all: nothing to adapt
    assert store.redis.hget(store.keys.meta, "rla") is None


def test_adaptive_options_are_validated() -> None:
    assert RateLimit(10, adaptive=True, recover_every=0.5).recover_every_ms == 500
    assert RateLimit(10, recover_every=0.5).recover_every_ms == 0
    with pytest.raises(ConfigError, match=r"RateLimit\.adaptive must be a bool"):
        RateLimit(10, adaptive="yes")  # type: ignore[arg-type]
    for bad in (0, -1.0, float("nan"), "60", 0.0001):
        with pytest.raises(ConfigError, match=r"RateLimit\.recover_every"):
            RateLimit(10, adaptive=True, recover_every=bad)  # type: ignore[arg-type]
    Registry().handler("q", mode="keyed", rate_limit=RateLimit(5, per_key=True, adaptive=True))


# ----------------------------------------------------------------------------- a worker


refused_once: set[str] = set()
explained = Registry()


@explained.handler("adaptive-explain", attempts=1,
                   rate_limit=RateLimit(4, per=60.0, adaptive=True))
async def refuse_first_call(job: Job) -> None:
    """Refuse the first call of a job whose data starts with "refuse" (unique per test)."""
    if job.data.startswith("refuse") and job.data not in refused_once:
        refused_once.add(job.data)
        raise RateLimited(retry_after=0)


@pytest.mark.anyio
async def test_explain_names_the_cut_limit_of_the_queue(redis_url: str, queue_name: str
                                                        ) -> None:
    queue = "adaptive-explain"
    async with run_worker(explained, queue, redis_url), QueueClient(redis_url) as client:
        refused = await client.queue(queue).add(f"refuse-{queue_name}")
        await refused.result(timeout=20)  # two starts: the refused one and its re-run
        waiting = await client.queue(queue).add("wait")
        explanation = await client.explain(queue, waiting.id)
        info = await refused.info()
    # The cut took the limit from 4 to 2, which the two starts have used up (a fixed limit of 4
    # would have let the second job run).
    assert explanation.reason == "rate_limited", explanation
    assert "(2 starts per 60 s, cut from 4 by RateLimited) is used up until" in (
        explanation.detail)
    assert info.attempts == 1


# ----------------------------------------------------------------------------- convergence

# The scenario of scripts/adaptive_rate_curve.py: a fake API with hidden per-tenant rates
# (A 5/s, B 12/s, with 0.1 s of slack for scheduling delays), RateLimit(max=30, per=1.0,
# per_key=True, adaptive=True, recover_every=1.0), two workers sharing the queue. The limits
# settle within a few seconds (30 -> 15 -> 7 -> 3 takes three refused windows), so "after
# convergence" starts at SETTLED.


def accepted_rate(times: list[float], start: float) -> float:
    """Accepted calls per second from ``start`` to the last one."""
    later = [t for t in times if t >= start]
    return len(later) / (max(later) - start)


# One backend: the dynamics live in the scripts and the fake API, not in the event loop, and the
# run takes about 15 s. The API judges each call at its job's start (by_start): a loaded host
# runs a started job's handler late, past the API's slack, and then refuses calls whose starts
# the limit had spaced out (seven refusals in six seconds where two are the rule, once, with
# the whole suite on two cores).
@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_per_key_limits_converge_to_each_tenants_hidden_rate(
        redis_url: str, queue_name: str) -> None:
    run = await run_scenario(redis_url, queue_name, jobs={"A": 60, "B": 150}, timeout=40.0,
                             by_start=True)
    # No job lost, each completed exactly once, no attempt spent on a 429.
    assert sorted(run.completions) == sorted(run.job_ids)
    assert set(run.completions.values()) == {1}
    assert run.attempts == {1}
    for tenant, hidden in HIDDEN.items():
        accepted, refused = run.accepted[tenant], run.refused[tenant]
        end = max(accepted)
        # Halving on a 429 and climbing by one per clean second keeps the limit between about
        # half the hidden rate and just above it once it has settled (never near the max of 30).
        later = [limit for t, limit in run.limits[tenant] if SETTLED <= t <= end]
        assert later and hidden // 2 - 1 <= min(later) and max(later) <= hidden + 2, (
            tenant, later)
        # So the accepted rate stays close to the hidden one: halving and climbing back by one
        # averages about 3/4 of it or more; the API itself lets through at most its rate over
        # its slightly shorter window.
        rate = accepted_rate(accepted, SETTLED)
        assert 0.6 * hidden <= rate <= hidden / (WINDOW - SLACK), (tenant, rate)
        # And 429s are rare: about one per climb back above the hidden rate.
        late_refusals = len([t for t in refused if t >= SETTLED])
        assert late_refusals <= 0.2 * len([t for t in accepted if t >= SETTLED]), (
            tenant, late_refusals)
    # Before settling, the limits came down from the maximum in a few refused windows: the
    # first refusal within a second of the tenant's first call (not of the run's start: the
    # jobs are added one by one, and on a busy machine tenant B's come seconds later).
    assert all(run.refused[t] and min(run.refused[t]) - min(run.accepted[t]) < 1.0
               for t in HIDDEN), {t: (min(run.accepted[t]), run.refused[t][:3]) for t in HIDDEN}
