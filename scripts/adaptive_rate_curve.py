"""Adaptive rate limits against an outside API with hidden per-tenant limits, and their curve.

    .venv/bin/python scripts/adaptive_rate_curve.py [--url redis://127.0.0.1:6379/0]
        [--out docs/img/adaptive-rate.png] [--recover-every 1.0] [--max 30] [--fixed]

A fake API (in this process) accepts at most 5 calls per second for tenant "A" and 12 for
tenant "B" (accepted calls in any 0.9 s window: 0.1 s of slack for the workers' scheduling
delays) and answers everything else "429, retry after" the time until its window frees. Two
workers serve a keyed queue with
``RateLimit(max=30, per=1.0, per_key=True, adaptive=True, recover_every=...)``; each job calls
the API for its tenant and raises ``RateLimited(retry_after=...)`` on a 429. Neither the queue
nor the handler knows the hidden rates: the limit of each tenant's key settles around its rate.

The run samples each key's effective limit (what the claim allows now) every 0.1 s and writes a
PNG (matplotlib, extra ``panqueue[docs]``) of the effective limit, the accepted calls per second
and the 429s over time, per tenant. It produced ``docs/img/adaptive-rate.png``. ``--fixed``
runs the same with a fixed limit and prints the same summary, for comparison.
``tests/test_adaptive_rate.py`` runs the same scenario (``run_scenario``) and checks that it
converges, loses no job and spends no attempt on a 429.

Without ``--url`` (or ``$PANQUEUE_URL``) it starts a private Redis-compatible server.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from panqueue import Job, QueueClient, RateLimit, RateLimited, Registry, Worker
from panqueue._keys import QueueKeys
from panqueue._store.ops.rate import effective_rate_limit
from panqueue._store.transport import open_async_transport
from panqueue.embedded import url_or_private_server

WINDOW = 1.0  # the queue's rate-limit window (s)
# The API counts accepted calls over a slightly shorter window: the calls of one of the queue's
# windows reach it spread by the workers' scheduling delays, up to this much later than they
# started (a real API's burst allowance does the same for network jitter).
SLACK = 0.1
HIDDEN = {"A": 5, "B": 12}  # calls per window the API accepts, per tenant
JOBS = {"A": 80, "B": 190}  # about 20 s of work each at the hidden rates' AIMD average
SETTLED = 5.0  # seconds after which the limits have come down (for the printed summary)


class FakeApi:
    """An outside service with a hidden rate per tenant: at most ``rates[t]`` accepted calls in
    any window of ``WINDOW - SLACK`` seconds; any other call is refused with the seconds until
    the window frees (a 429 with Retry-After). It records what it accepted and refused, and
    when."""

    def __init__(self, rates: dict[str, int]) -> None:
        self.rates = rates
        self.accepted: dict[str, list[float]] = {t: [] for t in rates}
        self.refused: dict[str, list[float]] = {t: [] for t in rates}

    def call(self, tenant: str, now: float | None = None) -> float | None:
        """None when accepted, else the retry-after in seconds. ``now``: the time the call is
        judged at (``time.monotonic``'s clock), by default when it arrives."""
        now = time.monotonic() if now is None else now
        window = WINDOW - SLACK
        recent = [t for t in self.accepted[tenant] if t > now - window]
        if len(recent) < self.rates[tenant]:
            self.accepted[tenant].append(now)
            return None
        self.refused[tenant].append(now)
        return max(0.01, recent[-self.rates[tenant]] + window - now)


@dataclass
class Run:
    """What one scenario run saw, times in seconds since its start."""

    accepted: dict[str, list[float]]
    refused: dict[str, list[float]]
    limits: dict[str, list[tuple[float, int]]]  # (time, effective limit) samples per tenant
    completions: Counter[str]  # job id -> successful handler runs
    attempts: set[int] = field(default_factory=set)  # job.attempt of every handler call
    job_ids: list[str] = field(default_factory=list)
    duration: float = 0.0


def build_registry(api: FakeApi, queue: str, rate: RateLimit, calls: list[tuple[str, int]],
                   completions: Counter[str],
                   started: Callable[[Job], Awaitable[float]] | None = None) -> Registry:
    """The queue's handler: each job calls the API for its tenant, judged when the call
    arrives, or with ``started`` at the time that returns for the job (see run_scenario)."""
    queues = Registry()

    @queues.handler(queue, mode="keyed", key_concurrency=8, concurrency=8, rate_limit=rate)
    async def call_api(job: Job) -> None:
        calls.append((job.id, job.attempt))
        at = None if started is None else await started(job)
        retry_after = api.call(job.data["tenant"], at)
        if retry_after is not None:
            raise RateLimited(retry_after=retry_after)
        completions[job.id] += 1

    return queues


async def sample_limits(url: str, queue: str, started: float,
                        limits: dict[str, list[tuple[float, int]]]) -> None:
    """Record each tenant's effective limit every 0.1 s (until cancelled)."""
    transport = open_async_transport(url)
    try:
        keys = QueueKeys(queue)
        while True:
            for tenant, samples in limits.items():
                limit = await transport.run(effective_rate_limit(keys, tenant))
                samples.append((time.monotonic() - started, limit or 0))
            await anyio.sleep(0.1)
    finally:
        await transport.aclose()


async def run_scenario(url: str, queue: str = "adaptive-demo", *, maximum: int = 30,
                       recover_every: float = 1.0, workers: int = 2, adaptive: bool = True,
                       jobs: dict[str, int] | None = None, timeout: float = 60.0,
                       by_start: bool = False) -> Run:
    """Add every tenant's jobs, run ``workers`` workers until all are completed, and return what
    the API and the handlers saw. ``adaptive=False``: the same with a fixed limit, to compare.

    ``by_start``: the API judges each call at the time its job started (the server's clock, as
    the rate limit counts starts) rather than when the call arrives, so that how late the
    workers' event loops run a started job (which a loaded host stretches past the API's
    slack) plays no part: what is left is the limit's own dynamics."""
    jobs = JOBS if jobs is None else jobs
    api = FakeApi(HIDDEN)
    calls: list[tuple[str, int]] = []
    completions: Counter[str] = Counter()
    rate = RateLimit(maximum, per=WINDOW, per_key=True, adaptive=adaptive,
                     recover_every=recover_every)
    client = QueueClient(url)

    async def started_at(job: Job) -> float:
        info = await client.queue(queue).job(job.id).info()
        assert info.started_at is not None
        # The server's clock is this host's: moved onto time.monotonic's.
        return info.started_at.timestamp() - (time.time() - time.monotonic())

    registry = build_registry(api, queue, rate, calls, completions,
                              started_at if by_start else None)
    limits: dict[str, list[tuple[float, int]]] = {t: [] for t in jobs}
    run_workers = [Worker(registry, queue, url=url, grace=5.0) for _ in range(workers)]
    async with client, anyio.create_task_group() as tg:
        for worker in run_workers:
            await tg.start(worker.run)
        started = time.monotonic()
        tg.start_soon(sample_limits, url, queue, started, limits)
        handle = client.queue(queue)
        handles = [await handle.add({"tenant": tenant, "n": n}, key=tenant)
                   for tenant, count in jobs.items() for n in range(count)]
        with anyio.fail_after(timeout):
            for handle in handles:
                await handle.result()
        duration = time.monotonic() - started
        for worker in run_workers:
            await worker.shutdown(grace=5.0)
        tg.cancel_scope.cancel()

    def since_start(times: dict[str, list[float]]) -> dict[str, list[float]]:
        return {t: [x - started for x in ts] for t, ts in times.items()}

    return Run(since_start(api.accepted), since_start(api.refused), limits, completions,
               {attempt for _, attempt in calls}, [h.id for h in handles], duration)


def plot(run: Run, out: Path, title: str) -> None:
    """Effective limit, accepted calls per second and 429s over time, one panel per tenant."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tenants = list(run.limits)
    fig, axes = plt.subplots(len(tenants), 1, figsize=(9, 3.2 * len(tenants)), sharex=True)
    for ax, tenant in zip(axes, tenants, strict=True):
        times, values = zip(*run.limits[tenant], strict=True)
        ax.step(times, values, where="post", label="effective limit (starts / s)")
        seconds = int(run.duration) + 1
        per_second = Counter(int(t) for t in run.accepted[tenant])
        ax.bar([s + 0.5 for s in range(seconds)], [per_second[s] for s in range(seconds)],
               width=0.9, alpha=0.35, color="tab:green", label="accepted calls / s")
        ax.axhline(HIDDEN[tenant], color="tab:red", linestyle="--",
                   label=f"hidden rate ({HIDDEN[tenant]} / s)")
        refused = run.refused[tenant]
        ax.plot(refused, [0.5] * len(refused), "x", color="tab:red", label="429")
        ax.set_ylabel(f"tenant {tenant}")
        ax.set_ylim(0, max(values) + 2)
        ax.legend(loc="upper right", fontsize=8)
    axes[-1].set_xlabel("seconds")
    fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="Redis URL (default: $PANQUEUE_URL or a private server)")
    parser.add_argument("--out", type=Path, default=Path("docs/img/adaptive-rate.png"))
    parser.add_argument("--recover-every", type=float, default=1.0)
    parser.add_argument("--max", type=int, default=30)
    parser.add_argument("--fixed", action="store_true",
                        help="a fixed limit of --max instead, for comparison (no figure)")
    args = parser.parse_args()

    async def go(url: str) -> Run:
        return await run_scenario(url, f"adaptive-demo-{int(time.time())}", maximum=args.max,
                                  recover_every=args.recover_every, adaptive=not args.fixed)

    if args.url:
        run = anyio.run(go, args.url)
    else:
        with url_or_private_server() as url:
            run = anyio.run(go, url)
    print(f"all jobs completed in {run.duration:.1f} s")
    for tenant in run.limits:
        accepted = [t for t in run.accepted[tenant] if t >= SETTLED]
        refused = [t for t in run.refused[tenant] if t >= SETTLED]
        rate = len(accepted) / (max(accepted) - SETTLED) if accepted else 0.0
        print(f"tenant {tenant}: {len(run.accepted[tenant])} accepted, "
              f"{len(run.refused[tenant])} refused; after {SETTLED:g} s: {rate:.1f} accepted/s "
              f"({rate / HIDDEN[tenant]:.0%} of its hidden rate), refused "
              f"{len(refused) / max(1, len(accepted)):.0%} as many; final limit "
              f"{run.limits[tenant][-1][1]}")
    if args.fixed:
        return
    plot(run, args.out, f"RateLimit(max={args.max}, per={WINDOW}, per_key=True, adaptive=True, "
                        f"recover_every={args.recover_every}), 2 workers")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
