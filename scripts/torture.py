"""Torture run: worker processes under faults, then an audit of every job and every run.

    .venv/bin/python scripts/torture.py [--workers 4] [--jobs 2000] [--seconds 60]
                                        [--drain-seconds 40] [--seed N] [--keep]
                                        [--partition-changes 1]

What it starts (and stops again, by PID, whatever happens, Ctrl-C included):

* a private ``redis-server`` on a free loopback port with ``appendonly yes`` and
  ``appendfsync always``, its data directory kept across restarts;
* a :class:`panqueue.testing.FaultProxy` in front of it: the workers connect through the proxy,
  while this script adds jobs, tails the event streams and audits through direct connections;
* ``--workers`` worker processes (``python -m panqueue worker torture_app:queues``, asyncio and
  trio alternately), each serving three queues, one per executor: ``torture-inline``,
  ``torture-thread`` and ``torture-subprocess`` (see scripts/torture_app.py).

``--jobs`` jobs (custom ids ``t-000000``..., spread over the three queues, each sleeping 5 ms to
3 s; a quarter of them "stubborn": their blocking handler ignores ``should_stop()``) are added
during the first 90 % of the chaos window, each add retried until acknowledged.
Meanwhile a chaos loop, for ``--seconds``, does in random order: SIGKILL a worker (a replacement
starts at once), cut every connection through the proxy for a while, blackhole them, add
latency, lose replies (to any request, to any script call, or to the complete, claim or extend
script), restart Redis (SIGTERM or SIGKILL, down for up to 2 s), and fill Redis memory to OOM
(``maxmemory`` just above ``used_memory``, ``noeviction``, a ballast key grown until writes are
refused, held 1-3 s, then removed). Then every fault is lifted and the jobs are drained, up to
``--drain-seconds``.

``--partition-changes`` times, evenly spread over the adds, ``torture-partitioned`` is
redeployed with another partition count (3, then 4, 2, 3, ...), the way docs/scaling.md says a
count changes: the producer stops adding to that queue (its last add there goes through a new
client, which so learns the layout), the queue drains while the chaos goes on, its jobs' states
are read (the purge deletes them), every worker is stopped with SIGTERM, and once none is
registered the queue is purged and the workers start again with the new count, the first of
them changing the layout. The producer goes on, its first add to the queue through the client
that learned the old layout: refused by the new layout, it must read it and re-route.

Longer than our usual 300 lines: one self-contained command (processes, chaos, audit, report)
that a reader runs and reads top to bottom; its handlers live apart in torture_app.py.

The figures (what each one means is written up in docs/reliability.md):

* **added**: job ids whose add was acknowledged. **completed**: of those, how many are in the
  ``completed`` state at the end (``Retention(completed=-1)``: none is trimmed).
* **lost** (must be 0): added but not completed after the drain, with their states.
* **completed twice** (must be 0): jobs with more than one ``completed`` event. The queues'
  event streams are tailed live from a direct connection (XREAD from the first entry, resumed
  after every reconnect); the stream's ``entries-added`` counter proves no event was missed.
* **overlapping runs in one worker** (must be 0): from the handlers' journals, a run of a job
  that started while another run of the same job was still running in the same worker
  process (its subprocess children included). A run with no end record ends when its worker
  was killed or stopped.
* **completed without a run** (must be 0): completed jobs no handler run was recorded for.
* **partition count changes failed or skipped** (must be 0): changes whose queue did not drain
  in time, or whose layout does not have the new count after the redeploy. Counted too: the
  adds that were refused by a new layout and re-routed, and the handler runs by the backend of
  the worker (asyncio or trio) that ran them.
* **workers that died on their own** (must be 0): worker processes that exited while nobody
  asked them to (a replacement is started, so the run goes on). A worker that cannot start
  because Redis is unreachable at that moment exits by design: counted apart, and retried.
* allowed, counted: re-runs (runs beyond the first of each job), abandoned runs (killed,
  cancelled or stopped: no ``ok`` end), jobs whose handler finished ``ok`` more than once,
  runs of one job overlapping on two different workers (a lock expired while its holder was
  cut off), and stalls recorded in job histories.

It prints a timeline of the faults, a table, details of anything wrong (lost jobs with their
history, overlaps, the last log lines of dead workers, the warnings and errors the workers
logged), and a final JSON line. It exits 1 if a must-be-0 figure is not 0 (the checker's own
soundness included: no add given up, no event missed by the tail), 2 on bad options, 130 when
interrupted.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

# The workers run the panqueue of this checkout (PYTHONPATH below); so does this script, so that
# both agree on everything, the scripts' SHAs included.
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from panqueue import Dedup, JobState, SyncQueueClient  # noqa: E402
from panqueue._batch import SyncBatch  # noqa: E402
from panqueue._keys import BatchKeys, QueueKeys, partition_keys  # noqa: E402
from panqueue._store.ops.batches import callback_id  # noqa: E402
from panqueue._store.ops.layout import read_layout  # noqa: E402
from panqueue.embedded import RedisServer  # noqa: E402
from panqueue.errors import JobNotFound  # noqa: E402
from panqueue.errors import TimeoutError as PanqueueTimeoutError  # noqa: E402
from panqueue.testing import SCRIPT_CALLS, FaultProxy  # noqa: E402

QUEUES = ("torture-inline", "torture-thread", "torture-subprocess", "torture-partitioned")
PARTITIONED = "torture-partitioned"
# The partitioned queue's count at the start, as torture_app.py declares it, and the counts it
# is redeployed with, in turn, by --partition-changes.
PARTITIONS = 3
NEW_COUNTS = (4, 2, 3)
# How long the partitioned queue may take to drain before a change (the change is skipped).
CHANGE_DRAIN_TIMEOUT = 45.0
# Batches: every BATCH_EVERY-th job opens a batch, and it and the next BATCH_SIZE - 1 jobs are
# added in it (whatever their queues); its callback runs on CALLBACKS once all have ended.
BATCH_EVERY = 50
BATCH_SIZE = 5
CALLBACKS = "torture-callbacks"
# Every queue whose events the tail reads.
STREAMS = (*QUEUES, CALLBACKS)
ADD_SPREAD = 0.9  # jobs are added during this fraction of the chaos window
ADD_GIVE_UP = 30.0  # seconds one add is retried before it is given up (and reported)
WORKER_GRACE = 3.0
START_TIMEOUT = 60.0


def now_ns() -> int:
    return time.monotonic_ns()


@dataclass
class WorkerProc:
    proc: subprocess.Popen[bytes]
    backend: str
    log: Path
    started_ns: int
    gone_ns: int | None = None
    how: str = ""  # killed (by chaos), died (on its own), start-failed, stopped (at the end)
    reason: str = ""  # why it died: its last error line

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass
class Run:
    run: str
    job: str
    attempt: int
    worker: int
    pid: int
    start: int
    end: int | None = None
    outcome: str = ""  # "" when no end record was written


@dataclass
class Stats:
    chaos: collections.Counter[str] = field(default_factory=collections.Counter)
    add_errors: collections.Counter[str] = field(default_factory=collections.Counter)
    oom_refusals: int = 0
    replies_dropped: int = 0
    tail_reconnects: int = 0


class Torture:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.seed = args.seed if args.seed is not None else random.randrange(2**32)
        self.chaos_rng = random.Random(self.seed)
        self.jobs_rng = random.Random(self.seed + 1)
        self.t0 = time.monotonic()
        self.tmp = Path(tempfile.mkdtemp(prefix="panqueue-torture-"))
        self.journal_dir = self.tmp / "journal"
        self.logs_dir = self.tmp / "logs"
        self.journal_dir.mkdir()
        self.logs_dir.mkdir()
        self.server: RedisServer | None = None
        self.proxy: FaultProxy | None = None
        self.workers: list[WorkerProc] = []
        self.stop_threads = threading.Event()
        self.threads: list[threading.Thread] = []
        self.stats = Stats()
        self.added: dict[str, str] = {}  # job id -> queue, acknowledged adds
        self.flows: dict[str, str] = {}  # job id -> the job it depends on (partitioned queue)
        # Second adds under a dedup key that did not answer the key's job (must be none).
        self.dedup_mismatches: list[tuple[str, str]] = []
        self.dedup_keys = 0
        self.batches: dict[str, list[str]] = {}  # closed batch id -> its jobs' ids
        self.batch_details: list[str] = []  # the report's lines on batches gone wrong
        # The partition count changes: the partitioned queue's count now, every count it had,
        # the jobs a change purged (id -> their state, read just before), one record per
        # change, and adds that a partition refused as routed by an old layout (re-routed).
        self.partitions = PARTITIONS
        self.counts_seen = [PARTITIONS]
        self.purged: dict[str, str] = {}
        self.changes: list[dict[str, Any]] = []
        self.changes_skipped = 0
        self.stale_adds = 0
        self.change_requested = threading.Event()
        self.producer_paused = threading.Event()
        self.changed = threading.Event()
        self.stalls_purged = 0
        self.add_given_up: list[str] = []
        self.producer_done = threading.Event()
        self.completed_events: collections.Counter[str] = collections.Counter()
        self.events_read: collections.Counter[str] = collections.Counter()  # per stream
        self.event_kinds: collections.Counter[str] = collections.Counter()
        self.events_lock = threading.Lock()

    # ------------------------------------------------------------------ helpers

    def keys(self, queue: str, now: bool = False) -> list[QueueKeys]:
        """The key layouts of every partition of ``queue`` (one for most): of the partitioned
        queue, under every count it had, or only under its count ``now``."""
        if queue != PARTITIONED:
            return partition_keys(queue, 1)
        found: dict[str, QueueKeys] = {}
        for count in [self.partitions] if now else self.counts_seen:
            for keys in partition_keys(queue, count):
                found.setdefault(keys.prefix, keys)
        return list(found.values())

    def say(self, message: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {message}", flush=True)

    def direct(self) -> redis.Redis:
        assert self.server is not None
        return redis.Redis.from_url(self.server.url, socket_timeout=10,
                                    socket_connect_timeout=5, retry=Retry(NoBackoff(), 0))

    def sleep(self, seconds: float) -> None:
        """Sleep, keeping the worker count up meanwhile."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, 0.25))
            self.check_workers()

    # ------------------------------------------------------------------ workers

    def start_worker(self, backend: str) -> WorkerProc:
        assert self.proxy is not None
        log = self.logs_dir / f"worker-{len(self.workers):03d}-{backend}.log"
        env = dict(os.environ)
        env.pop("PANQUEUE_URL", None)
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "scripts"), str(ROOT)])
        env["TORTURE_JOURNAL_DIR"] = str(self.journal_dir)
        env["TORTURE_PARTITIONS"] = str(self.partitions)
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "panqueue", "worker", "torture_app:queues",
                 "--url", self.proxy.url, "--backend", backend, "--log-level", "warning",
                 "--grace", str(WORKER_GRACE), "--poll-interval", "1"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                cwd=ROOT, start_new_session=True)
        worker = WorkerProc(proc, backend, log, now_ns())
        self.workers.append(worker)
        return worker

    def alive_workers(self) -> list[WorkerProc]:
        return [w for w in self.workers if w.gone_ns is None]

    def check_workers(self) -> None:
        """Notice workers that exited on their own and start replacements."""
        for worker in self.alive_workers():
            code = worker.proc.poll()
            if code is None:
                continue
            worker.gone_ns = now_ns()
            lived = (worker.gone_ns - worker.started_ns) / 1e9
            lines = [x for x in worker.log.read_text(errors="replace").splitlines() if x]
            if len(lines) == 1 and lines[0].startswith("panqueue: error: cannot reach Redis"):
                # The command's fail-fast check: Redis was unreachable when it started (the
                # proxy cut, or Redis down or loading). By design; start another.
                worker.how = "start-failed"
            else:
                worker.how = "died"
                worker.reason = death_reason(lines, code)
                self.say(f"worker {worker.pid} ({worker.backend}) DIED on its own after "
                         f"{lived:.1f} s: {worker.reason}")
            self.start_worker(worker.backend)

    def stop_workers(self) -> None:
        for worker in self.alive_workers():
            with contextlib.suppress(ProcessLookupError):
                worker.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + WORKER_GRACE + 10
        for worker in self.alive_workers():
            try:
                worker.proc.wait(max(0.1, deadline - time.monotonic()))
                worker.how = "stopped"
            except subprocess.TimeoutExpired:
                worker.proc.kill()
                worker.proc.wait()
                worker.how = "stopped-by-sigkill"
            worker.gone_ns = now_ns()

    def kill_everything_we_started(self) -> None:
        """Every worker by its PID, then each worker's process group (the subprocess
        children of killed workers live on in it), then the proxy and the server."""
        for worker in self.workers:
            if worker.proc.poll() is None:
                worker.proc.kill()
                worker.proc.wait()
                worker.gone_ns = worker.gone_ns or now_ns()
        groups = {w.pid for w in self.workers}
        for pid in _leftover_children(groups):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if self.proxy is not None:
            self.proxy.stop()
        if self.server is not None:
            self.server.stop()

    # ------------------------------------------------------------------ producer, tailer

    def produce(self) -> None:
        assert self.server is not None
        n = self.args.jobs
        spread = self.args.seconds * ADD_SPREAD
        started = time.monotonic()
        client = SyncQueueClient(self.server.url)
        batch_id, members = "", []
        # A client that learned the partitioned queue's layout before a change, and its adds
        # still to make after it.
        stale: SyncQueueClient | None = None
        stale_left = 0
        try:
            for i in range(n):
                pause = started + spread * i / n - time.monotonic()
                if pause > 0 and self.stop_threads.wait(pause):
                    return
                queue = QUEUES[i % len(QUEUES)]
                job_id = f"t-{i:06d}"
                roll = self.jobs_rng.random()
                ms = (self.jobs_rng.uniform(5, 50) if roll < 0.80 else
                      self.jobs_rng.uniform(100, 500) if roll < 0.95 else
                      self.jobs_rng.uniform(1000, 3000))
                data = {"i": i, "ms": round(ms, 1), "stubborn": i % 4 == 1}
                options: dict[str, Any] = {}
                # A change of the partitioned queue's count was asked for: this job is added by
                # a new client, which so learns the layout, and the producer then waits for the
                # change; that client adds the queue's first job after it, and must be refused
                # by the new layout and re-route.
                pausing = queue == PARTITIONED and self.change_requested.is_set()
                if pausing:
                    if stale is not None:
                        stale.close()
                    stale, stale_left = SyncQueueClient(self.server.url), 2
                by_stale = queue == PARTITIONED and stale is not None and stale_left > 0
                if queue == PARTITIONED:
                    # Every other job of the partitioned queue is part of a flow: it waits for
                    # that queue's previous job (and so lives in its partition, its id's home
                    # holding a pointer); every fourth carries a dedup key, added twice.
                    parent = f"t-{i - len(QUEUES):06d}"
                    if i % 8 == 3 and parent in self.added and parent not in self.purged:
                        options["depends_on"] = [parent]
                    elif i % 16 == 7:
                        options["dedup"] = Dedup(f"dd-{i}", ttl=3600)
                if i % BATCH_EVERY == 0:
                    client, batch_id = self.retried(
                        client, job_id, lambda c: c.batch(on_complete=(CALLBACKS, {})).id)
                    members = []
                if i % BATCH_EVERY < BATCH_SIZE and batch_id and not options:
                    options["batch"] = batch_id
                if by_stale:
                    assert stale is not None
                    stale_left -= 1
                    known = stale.producer.layouts._known.get(queue)
                    _, added = self.add(stale, queue, data, job_id, options, keep=True)
                    relearned = stale.producer.layouts._known.get(queue)
                    # Refused as routed by the old layout, it read the new one and re-routed.
                    if added and known and relearned and relearned.version > known.version:
                        self.stale_adds += 1
                else:
                    client, added = self.add(client, queue, data, job_id, options)
                if "batch" in options:
                    members += [added] if added else []
                    if i % BATCH_EVERY == BATCH_SIZE - 1 and members:
                        client, closed = self.retried(
                            client, f"close {batch_id}",
                            lambda c, b=batch_id: SyncBatch(c, b).close().id)
                        if closed:
                            self.batches[batch_id] = members
                if not added:
                    continue
                self.added[job_id] = queue
                if "depends_on" in options:
                    self.flows[job_id] = options["depends_on"][0]
                if "dedup" in options:
                    # Another id, the same key: the key's job answers, and nothing is added.
                    client, again = self.add(client, queue, data, f"{job_id}-again", options)
                    self.dedup_keys += 1
                    if again and again != job_id:
                        self.dedup_mismatches.append((job_id, again))
                if pausing:
                    self.producer_paused.set()
                    while not self.changed.wait(0.25):
                        if self.stop_threads.is_set():
                            return
                    self.changed.clear()
        finally:
            client.close()
            if stale is not None:
                stale.close()
            self.producer_done.set()

    def add(self, client: SyncQueueClient, queue: str, data: dict[str, Any], job_id: str,
            options: dict[str, Any], keep: bool = False) -> tuple[SyncQueueClient, str]:
        """Add until acknowledged, the same id every time; (the client, the id of the job the
        add answered, or "" if it was given up); ``keep``: see :meth:`retried`."""
        batch_id = options.pop("batch", None)

        def add(c: SyncQueueClient) -> str:
            if batch_id is not None:
                return SyncBatch(c, batch_id).add(queue, data, job_id=job_id, **options).id
            return c.queue(queue).add(data, job_id=job_id, **options).id

        try:
            return self.retried(client, job_id, add, keep)
        finally:
            if batch_id is not None:
                options["batch"] = batch_id

    def retried(self, client: SyncQueueClient, what: str,
                call: Callable[[SyncQueueClient], str], keep: bool = False
                ) -> tuple[SyncQueueClient, str]:
        """``call`` until it is acknowledged; (the client, its answer, or "" if it was given
        up, ``what`` then being reported as given up). After an error the call is retried on a
        new client, or, ``keep``, on the same one (it reconnects; what it remembers stays)."""
        assert self.server is not None
        give_up = time.monotonic() + ADD_GIVE_UP
        while not self.stop_threads.is_set():
            try:
                return client, call(client)
            except Exception as exc:  # Redis down, loading, OOM...: retry, same id
                self.stats.add_errors[_summary(exc)] += 1
                if not keep:
                    client.close()
                    client = SyncQueueClient(self.server.url)
                if time.monotonic() > give_up:
                    self.add_given_up.append(what)
                    break
                time.sleep(0.1)
        return client, ""

    def tail_events(self) -> None:
        """Count ``completed`` events per job from the first stream entry on, resuming after
        every broken connection (Redis restarts) from the last id read."""
        last: dict[Any, Any] = {}
        client: redis.Redis | None = None
        while True:
            stopping = self.stop_threads.is_set()  # one more full read after the stop
            for key in (keys.events for q in STREAMS for keys in self.keys(q)):
                last.setdefault(key, "0-0")  # a new partition count's streams join
            try:
                if client is None:
                    client = self.direct()
                while True:
                    reply = client.xread(last, count=1000, block=None if stopping else 500)
                    if not reply:
                        break
                    with self.events_lock:
                        for key, entries in reply:
                            key = key.decode()
                            for entry_id, fields in entries:
                                last[key] = entry_id.decode()
                                self.events_read[key] += 1
                                kind = fields.get(b"ev", b"?").decode()
                                self.event_kinds[kind] += 1
                                if kind == "completed":
                                    self.completed_events[fields[b"id"].decode()] += 1
                    if not stopping:
                        break
            except redis.RedisError:
                self.stats.tail_reconnects += 1
                if client is not None:
                    client.close()
                client = None
                if stopping:
                    if self.stats.tail_reconnects > 1000:
                        return
                    time.sleep(0.2)
                    continue
                time.sleep(0.1)
                continue
            if stopping:
                client.close()
                return

    def events_missed(self) -> dict[str, int]:
        """Per stream, entries the server added that the tailer did not read (must be 0)."""
        missed = {}
        with self.direct() as client:
            for key in (keys.events for q in STREAMS for keys in self.keys(q)):
                try:
                    added = int(client.xinfo_stream(key)["entries-added"])
                except redis.ResponseError:  # no such stream: no event at all
                    added = 0
                missed[key] = added - self.events_read[key]
        return missed

    # ------------------------------------------------------------------ chaos

    def chaos(self) -> None:
        actions = [self.kill_worker, self.cut, self.blackhole, self.delay, self.drop_replies,
                   self.restart_redis, self.oom, self.client_kill]
        started = time.monotonic()
        end = started + self.args.seconds
        # The partition count changes, evenly spread over the time jobs are added.
        n = self.args.partition_changes
        change_at = [started + self.args.seconds * ADD_SPREAD * (k + 1) / (n + 1)
                     for k in range(n)]
        asked = 0.0
        while time.monotonic() < end or self.change_requested.is_set():
            if change_at and time.monotonic() >= change_at[0]:
                change_at.pop(0)
                if not self.producer_done.is_set():
                    asked = time.monotonic()
                    self.change_requested.set()
                    self.say(f"redeploy {PARTITIONED} with another partition count: the "
                             "producer stops adding to it, the queue drains")
            if self.change_requested.is_set() and (self.producer_paused.is_set()
                                                   or self.producer_done.is_set()):
                if self.partitioned_drained():
                    self.change_partitions(time.monotonic() - asked)
                    continue
                if time.monotonic() - asked > CHANGE_DRAIN_TIMEOUT:
                    self.changes_skipped += 1
                    self.say(f"{PARTITIONED} did not drain in {CHANGE_DRAIN_TIMEOUT} s: "
                             "its count change is skipped")
                    self.resume_producer()
                    continue
            if time.monotonic() >= end:
                self.sleep(0.25)  # past the window: only the change under way goes on
                continue
            action = self.chaos_rng.choice(actions)
            self.stats.chaos[action.__name__] += 1
            action()
            self.sleep(min(self.chaos_rng.uniform(0.3, 1.5), max(0.0, end - time.monotonic())))

    # ------------------------------------------------------------------ partition count change

    def partitioned_drained(self) -> bool:
        """Every job added to the partitioned queue since the last change completed, and it
        holds no other job."""
        assert self.server is not None
        expected = sum(1 for j, q in self.added.items() if q == PARTITIONED
                       and j not in self.purged)
        try:
            with SyncQueueClient(self.server.url) as client:
                counts = client.counts(PARTITIONED)
        except Exception:
            return False
        return counts.get(JobState.COMPLETED, 0) == expected == sum(counts.values())

    def resume_producer(self) -> None:
        self.change_requested.clear()
        self.producer_paused.clear()
        self.changed.set()

    def change_partitions(self, drained_s: float) -> None:
        """Redeploy the partitioned queue with the next count, as docs/scaling.md says: its jobs
        all completed (read here, as the purge deletes them), stop every worker (SIGTERM), wait
        until none is registered, purge the queue, start the workers with the new count (the
        first changes the layout), and let the producer go on: its first adds to the queue go
        through a client that learned the old layout, which must be refused and re-route."""
        assert self.server is not None
        old, new = self.partitions, NEW_COUNTS[len(self.changes) % len(NEW_COUNTS)]
        started = time.monotonic()
        epoch = sorted(j for j, q in self.added.items() if q == PARTITIONED
                       and j not in self.purged)
        states: dict[str, str] = {}
        stalls = 0
        client = self.retried_client(lambda c: c.ping())
        try:
            for job_id in epoch:
                info = self.retried_client(lambda c, j=job_id: c.get_job(PARTITIONED, j), client)
                states[job_id] = info.state.value
                stalls += sum(1 for h in info.history if h.get("type") == "Stalled")
            backends = [w.backend for w in self.alive_workers()]
            self.say(f"{len(epoch)} jobs of {PARTITIONED} completed ({drained_s:.1f} s); "
                     f"stopping {len(backends)} workers")
            self.stop_workers()
            deadline = time.monotonic() + START_TIMEOUT
            while self.retried_client(lambda c: c.workers(PARTITIONED), client):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"workers of {PARTITIONED} still registered after "
                                       f"{START_TIMEOUT} s")
                time.sleep(0.2)  # a killed worker leaves the registry within 3 heartbeats
            waited = time.monotonic() - started
            purged = self.retried_client(lambda c: c.purge(PARTITIONED), client)
            self.purged.update(states)
            self.stalls_purged += stalls
            self.partitions = new
            self.counts_seen = [*self.counts_seen, new]
            for backend in backends:
                self.start_worker(backend)
            self.wait_for_listeners(len(backends))
            layout = self.retried_client(
                lambda c: c._run(read_layout(PARTITIONED)), client)
        finally:
            client.close()
        changed = layout is not None and layout.count == new
        self.changes.append({"from": old, "to": new, "jobs": len(epoch), "purged": purged,
                             "changed": changed, "drain_s": round(drained_s, 1),
                             "stop_s": round(waited, 1),
                             "redeploy_s": round(time.monotonic() - started, 1)})
        self.say(f"{PARTITIONED}: {old} -> {new} partitions (layout {layout}); purged "
                 f"{purged} jobs; workers stopped and unregistered in {waited:.1f} s, "
                 f"redeployed in {time.monotonic() - started:.1f} s; the producer goes on")
        self.resume_producer()

    def retried_client(self, call: Callable[[SyncQueueClient], Any],
                       client: SyncQueueClient | None = None) -> Any:
        """``call(client)`` (a new client if None: returned then) until it answers, for up to
        ADD_GIVE_UP seconds (no fault is held during a change, but Redis may still load)."""
        assert self.server is not None
        own = client is None
        give_up = time.monotonic() + ADD_GIVE_UP
        while True:
            c = client or SyncQueueClient(self.server.url)
            try:
                answer = call(c)
                return c if own else answer
            except Exception:
                if own:
                    c.close()
                if time.monotonic() > give_up:
                    raise
                time.sleep(0.2)

    def hold(self, low: float, high: float, what: str) -> float:
        """Keep a fault on for a random time in [low, high] seconds (announced first)."""
        seconds = round(self.chaos_rng.uniform(low, high), 2)
        self.say(what.format(seconds))
        self.sleep(seconds)
        return seconds

    def kill_worker(self) -> None:
        alive = self.alive_workers()
        if not alive:
            return
        victim = self.chaos_rng.choice(alive)
        victim.proc.kill()
        victim.proc.wait()
        victim.gone_ns = now_ns()
        victim.how = "killed"
        replacement = self.start_worker(victim.backend)
        self.say(f"SIGKILL worker {victim.pid} ({victim.backend}); replacement "
                 f"{replacement.pid}")

    def cut(self) -> None:
        assert self.proxy is not None
        self.proxy.cut()
        self.hold(0.2, 2.0, "cut every connection for {} s")
        self.proxy.restore()

    def blackhole(self) -> None:
        assert self.proxy is not None
        self.proxy.blackhole()
        self.hold(0.5, 5.0, "blackhole for {} s")
        self.proxy.restore()

    def delay(self) -> None:
        assert self.proxy is not None
        latency = round(self.chaos_rng.uniform(0.005, 0.05), 3)
        self.proxy.delay(latency)
        self.hold(1.0, 4.0, f"{latency * 1000:.0f} ms latency per chunk for {{}} s")
        self.proxy.delay(0)

    def drop_replies(self) -> None:
        assert self.proxy is not None
        targets: list[tuple[str, bytes | tuple[bytes, ...] | None]] = [
            ("any request", None), ("any script call", SCRIPT_CALLS)]
        try:  # the scripts the runtime calls, by function name (internal: skipped if it moved)
            from panqueue._store.loader import SCRIPTS

            for name in ("complete", "claim", "extend"):
                function = getattr(SCRIPTS, name).function
                if function is not None:
                    targets.append((f"the {name} script", function.encode()))
        except (ImportError, AttributeError):
            pass
        what, match = self.chaos_rng.choice(targets)
        n = self.chaos_rng.randint(1, 3)
        before = self.proxy.replies_dropped
        self.proxy.drop_next_reply(n, match=match)
        with contextlib.suppress(PanqueueTimeoutError):
            self.proxy.wait_for_dropped_replies(before + n, timeout=3.0)
        self.proxy.clear_drops()
        used = self.proxy.replies_dropped - before
        self.stats.replies_dropped += used
        self.say(f"lose the replies to {n} x {what}: {used} lost")

    def restart_redis(self) -> None:
        assert self.server is not None
        hard = self.chaos_rng.random() < 0.5
        if hard:
            self.server.kill()
        else:
            self.server.stop()
        self.hold(0.2, 2.0, f"stop Redis ({'SIGKILL' if hard else 'SIGTERM'}) for {{}} s")
        started = time.monotonic()
        self.server.start(timeout=60)
        self.say(f"Redis answers again ({time.monotonic() - started:.1f} s to load)")

    def client_kill(self) -> None:
        """The server closes every client connection (as its ``timeout`` does to idle ones):
        command pools and wake-up subscriptions alike, with no fault on the network."""
        with self.direct() as client:
            killed = sum(int(client.execute_command("CLIENT", "KILL", "TYPE", kind))
                         for kind in ("normal", "pubsub"))
        self.say(f"the server closes every client connection: {killed} closed")

    def oom(self) -> None:
        with self.direct() as client:
            used = int(client.info("memory")["used_memory"])
            client.config_set("maxmemory-policy", "noeviction")
            client.config_set("maxmemory", used + 1024 * 1024)
            refused = False
            try:
                chunk = b"x" * 65536
                for _ in range(400):
                    try:
                        client.append("torture:ballast", chunk)
                    except redis.exceptions.OutOfMemoryError:
                        refused = True
                        break
                self.hold(1.0, 3.0, f"OOM for {{}} s (maxmemory = used_memory + 1 MB, "
                                    f"ballast grown until refused: {refused})")
            finally:
                client.delete("torture:ballast")
                client.config_set("maxmemory", 0)
        self.stats.oom_refusals += refused

    # ------------------------------------------------------------------ phases

    def wait_for_listeners(self, count: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        with self.direct() as client:
            while True:
                listening = min(n for _, n in client.pubsub_shardnumsub(
                    *(keys.notify for q in STREAMS for keys in self.keys(q, now=True))))
                if listening >= count:
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"only {listening} of {count} workers listen after "
                                       f"{START_TIMEOUT} s; see {self.logs_dir}")
                self.sleep(0.1)

    def drain(self) -> float:
        """Wait until every added job completed; returns the seconds it took."""
        started = time.monotonic()
        deadline = started + self.args.drain_seconds
        self.producer_done.wait(max(0.0, deadline - time.monotonic()))
        assert self.server is not None
        expected = collections.Counter(q for j, q in self.added.items() if j not in self.purged)
        expected[CALLBACKS] = len(self.batches)
        said = started
        while time.monotonic() < deadline:
            short: dict[str, str] = {}
            try:
                with SyncQueueClient(self.server.url) as client:
                    for q in (*QUEUES, CALLBACKS):
                        completed = client.counts(q)[JobState.COMPLETED]
                        if completed < expected[q]:
                            short[q] = f"{completed} of {expected[q]}"
            except Exception as exc:
                short["(counts unreadable)"] = type(exc).__name__
            if not short and self.producer_done.is_set():
                break
            if time.monotonic() - said >= 5:
                said = time.monotonic()
                self.say(f"draining: completed {short}")
            self.sleep(0.5)
        return time.monotonic() - started

    def run(self) -> dict[str, Any]:
        args = self.args
        self.say(f"seed {self.seed}; {args.workers} workers, {args.jobs} jobs, "
                 f"{args.seconds} s of chaos; temp dir {self.tmp}")
        self.server = RedisServer(directory=self.tmp / "redis", appendonly=True,
                                  extra_args=("--appendfsync", "always"))
        self.server.start()
        self.proxy = FaultProxy(self.server.port).start()
        self.say(f"redis-server pid {self.server.pid} on port {self.server.port} "
                 f"(appendfsync always); proxy on port {self.proxy.port}")
        backends = ["asyncio", "trio"]
        for i in range(args.workers):
            self.start_worker(backends[i % 2])
        self.wait_for_listeners(args.workers)
        self.say(f"{args.workers} workers listening: "
                 f"{', '.join(str(w.pid) for w in self.alive_workers())}")
        for target in (self.tail_events, self.produce):
            thread = threading.Thread(target=target, daemon=True, name=target.__name__)
            thread.start()
            self.threads.append(thread)
        self.chaos()
        self.say("chaos over: every fault lifted; draining")
        drain_seconds = self.drain()
        self.say(f"drain finished after {drain_seconds:.1f} s; stopping workers")
        self.stop_workers()
        self.stop_threads.set()
        for thread in self.threads:
            thread.join(15)
        return self.audit(drain_seconds)

    # ------------------------------------------------------------------ audit

    def read_journals(self) -> list[Run]:
        return read_journals(self.journal_dir, {w.pid: w.gone_ns for w in self.workers})

    def batch_snapshot(self, batch_id: str) -> str:
        """A batch as Redis holds it, read without relaying or firing anything: its state hash,
        job and ended counts, the outboxes it names and the entries of its jobs still in any
        outbox, whether the callback queue still owes it, and its callback job's state."""
        bkeys = BatchKeys(batch_id)
        callbacks = partition_keys(CALLBACKS, 1)[0]
        with self.direct() as r:
            state = {k.decode(): v.decode() for k, v in r.hgetall(bkeys.state).items()
                     if k not in (b"oc", b"os")}
            outboxes = sorted(m.decode() for m in r.smembers(bkeys.queues))
            waiting = [e.decode() for keys in (k for q in QUEUES for k in self.keys(q))
                       for e in r.zrange(keys.batch_outbox, 0, -1)
                       if e.decode().startswith(batch_id + "\t")]
            owed = r.zscore(callbacks.batches, batch_id)
            callback = r.hget(callbacks.job(callback_id(batch_id, "complete")), "s")
            return (f"batch {batch_id} in Redis: state {state}; jobs {r.scard(bkeys.jobs)}, "
                    f"ended {r.scard(bkeys.ended)}; outboxes {outboxes}; still in outboxes "
                    f"{waiting}; owed by {CALLBACKS}: {owed}; callback job state {callback!r}")

    def audit(self, drain_seconds: float) -> dict[str, Any]:
        runs = self.read_journals()
        by_job: dict[str, list[Run]] = collections.defaultdict(list)
        for run in runs:
            by_job[run.job].append(run)

        overlapping_same, overlapping_across = find_overlaps(by_job)

        states: collections.Counter[str] = collections.Counter()
        lost: list[dict[str, Any]] = []
        stalls = 0
        completed_ids = set()
        assert self.server is not None
        with SyncQueueClient(self.server.url) as client:
            for job_id, queue in sorted(self.added.items()):
                if job_id in self.purged:  # read before a partition count change purged it
                    state = self.purged[job_id]
                    states[state] += 1
                    if state == JobState.COMPLETED.value:
                        completed_ids.add(job_id)
                    else:
                        lost.append({"id": job_id, "queue": queue, "state": state})
                    continue
                try:
                    info = client.get_job(queue, job_id)
                except JobNotFound:
                    states["missing"] += 1
                    lost.append({"id": job_id, "queue": queue, "state": "missing"})
                    continue
                states[info.state.value] += 1
                stalls += sum(1 for h in info.history if h.get("type") == "Stalled")
                if info.state is JobState.COMPLETED:
                    completed_ids.add(job_id)
                else:
                    lost.append({"id": job_id, "queue": queue, "state": info.state.value,
                                 "attempts": info.attempts,
                                 "failure_reason": info.failure_reason,
                                 "error": None if info.error is None else
                                 f"{info.error.type}: {info.error.message}",
                                 "history": [h.get("type") for h in info.history]})
        missed = self.events_missed()
        fired: collections.Counter[str] = collections.Counter()
        with SyncQueueClient(self.server.url) as client:
            for offset in range(0, len(self.batches) * 2 + 1, 1000):
                for info in client.list_jobs(CALLBACKS, JobState.COMPLETED, limit=1000,
                                             offset=offset):
                    fired[str(info.result)] += 1
        # Each closed batch's callback ran and completed exactly once.
        callbacks_wrong = sorted(b for b in self.batches if fired[b] != 1)
        self.batch_details = []
        with SyncQueueClient(self.server.url) as client:
            for batch_id in callbacks_wrong[:5]:
                # What Redis holds before info() relays anything (info() may fire the batch).
                self.batch_details.append(self.batch_snapshot(batch_id))
                try:
                    info = SyncBatch(client, batch_id).info()
                except Exception as exc:  # the report says what it could not read
                    info = f"unreadable: {exc}"
                members = []
                for job_id in self.batches[batch_id]:
                    queue = self.added.get(job_id)
                    try:
                        state = (client.get_job(queue, job_id).state.value if queue else "?")
                    except JobNotFound:
                        state = "gone"
                    members.append(f"{job_id}:{state}")
                self.batch_details.append(
                    f"batch {batch_id}: callback completed {fired[batch_id]} times; {info}; "
                    f"members {members}")
        stalls += self.stalls_purged
        twice = {j: n for j, n in self.completed_events.items() if n > 1}
        without_run = sorted(j for j in completed_ids if j not in by_job)
        out_of_order = flow_violations(self.flows, by_job)
        proxy = self.proxy
        assert proxy is not None
        died = [w for w in self.workers if w.how == "died"]
        backend_of = {w.pid: w.backend for w in self.workers}
        figures: dict[str, Any] = {
            "seed": self.seed,
            "workers": self.args.workers,
            "jobs": self.args.jobs,
            "chaos_seconds": self.args.seconds,
            "added": len(self.added),
            "add_given_up": len(self.add_given_up),
            "completed": len(completed_ids),
            "lost": len(lost),
            "lost_by_state": dict(sorted(
                collections.Counter(item["state"] for item in lost).items())),
            "completed_twice": len(twice),
            "overlapping_runs_same_worker": len(overlapping_same),
            "completed_without_run": len(without_run),
            "flow_jobs": len(self.flows),
            "flow_jobs_started_before_their_dependency": len(out_of_order),
            "batches": len(self.batches),
            "batch_callbacks_missing_or_twice": len(callbacks_wrong),
            "dedup_keys": self.dedup_keys,
            "dedup_mismatches": len(self.dedup_mismatches),
            "partition_counts": self.counts_seen,
            "partition_count_changes": sum(1 for c in self.changes if c["changed"]),
            "partition_count_changes_failed": self.changes_skipped + sum(
                1 for c in self.changes if not c["changed"]),
            "partition_changes": self.changes,
            "stale_layout_adds": self.stale_adds,
            "runs_by_backend": dict(sorted(collections.Counter(
                backend_of.get(r.worker, "?") for r in runs).items())),
            "runs": len(runs),
            "reruns": sum(len(r) - 1 for r in by_job.values()),
            "jobs_run_more_than_once": sum(1 for r in by_job.values() if len(r) > 1),
            "abandoned_runs": sum(1 for r in runs if r.outcome != "ok"),
            "jobs_finished_ok_more_than_once": sum(
                1 for r in by_job.values() if sum(x.outcome == "ok" for x in r) > 1),
            "concurrent_runs_on_two_workers": overlapping_across,
            "stalls_recorded": stalls,
            "completed_events": sum(self.completed_events.values()),
            "events_missed_by_tail": sum(missed.values()),
            "workers_started": len(self.workers),
            "workers_killed": sum(1 for w in self.workers if w.how == "killed"),
            "workers_died": len(died),
            "worker_deaths": dict(collections.Counter(w.reason for w in died)),
            "worker_start_failures": sum(1 for w in self.workers if w.how == "start-failed"),
            "chaos_actions": dict(sorted(self.stats.chaos.items())),
            "replies_dropped": self.stats.replies_dropped,
            "oom_refusals": self.stats.oom_refusals,
            "proxy_connections": proxy.connections_accepted,
            "add_errors": dict(self.stats.add_errors),
            "drain_seconds": round(drain_seconds, 1),
            "total_seconds": round(time.monotonic() - self.t0, 1),
        }
        figures["ok"] = not (figures["lost"] or figures["completed_twice"]
                             or figures["overlapping_runs_same_worker"]
                             or figures["completed_without_run"]
                             or figures["flow_jobs_started_before_their_dependency"]
                             or figures["dedup_mismatches"]
                             or figures["batch_callbacks_missing_or_twice"]
                             or figures["events_missed_by_tail"]
                             or figures["add_given_up"] or figures["workers_died"]
                             or figures["partition_count_changes_failed"])
        self.print_report(figures, lost, twice, overlapping_same, without_run, died, by_job)
        return figures

    def print_report(self, f: dict[str, Any], lost: list[dict[str, Any]],
                     twice: dict[str, int], overlapping: list[tuple[Run, Run]],
                     without_run: list[str], died: list[WorkerProc],
                     by_job: dict[str, list[Run]]) -> None:
        rows = [
            ("jobs added (acknowledged)", f["added"], ""),
            ("adds given up", f["add_given_up"], "0"),
            ("jobs completed", f["completed"], f"{f['added']}"),
            ("lost (added, not completed)", f["lost"], "0"),
            ("completed twice", f["completed_twice"], "0"),
            ("overlapping runs in one worker", f["overlapping_runs_same_worker"], "0"),
            ("completed without a run", f["completed_without_run"], "0"),
            ("flow jobs started before their dependency",
             f"{f['flow_jobs_started_before_their_dependency']} of {f['flow_jobs']}", "0"),
            ("batches whose callback did not complete once",
             f"{f['batch_callbacks_missing_or_twice']} of {f['batches']}", "0"),
            ("second dedup adds answered by another job",
             f"{f['dedup_mismatches']} of {f['dedup_keys']}", "0"),
            ("events missed by the tail", f["events_missed_by_tail"], "0"),
            (f"{PARTITIONED} partition counts", " -> ".join(map(str, f["partition_counts"])),
             ""),
            ("partition count changes failed or skipped", f["partition_count_changes_failed"],
             "0"),
            ("adds refused by an old layout, re-routed", f["stale_layout_adds"], ""),
            ("handler runs by worker backend",
             ", ".join(f"{k} {v}" for k, v in f["runs_by_backend"].items()), ""),
            ("handler runs", f["runs"], ""),
            ("re-runs (beyond the first)", f["reruns"], "allowed"),
            ("abandoned runs", f["abandoned_runs"], "allowed"),
            ("jobs finished ok more than once", f["jobs_finished_ok_more_than_once"],
             "allowed"),
            ("runs overlapping on two workers", f["concurrent_runs_on_two_workers"],
             "allowed"),
            ("stalls recorded", f["stalls_recorded"], "allowed"),
            ("workers started / killed", f"{f['workers_started']} / {f['workers_killed']}",
             ""),
            ("workers that died on their own", f["workers_died"], "0"),
            ("chaos actions", ", ".join(f"{k} {v}" for k, v in f["chaos_actions"].items()), ""),
            ("replies lost / OOM refusals", f"{f['replies_dropped']} / {f['oom_refusals']}",
             ""),
            ("drain / total seconds", f"{f['drain_seconds']} / {f['total_seconds']}", ""),
        ]
        width = max(len(r[0]) for r in rows)
        print()
        print(f"{'figure':<{width}}  {'value':>12}  must be")
        for name, value, must in rows:
            print(f"{name:<{width}}  {value!s:>12}  {must}")
        if f["lost_by_state"]:
            print(f"\nlost jobs by state: {f['lost_by_state']}")
            for item in lost[:10]:
                job_runs = by_job.get(item["id"], [])
                print(f"  {item} runs: "
                      f"{[(r.worker, r.outcome or 'no end') for r in job_runs]}")
        if twice:
            print(f"\njobs completed twice (first 10): {dict(list(twice.items())[:10])}")
        for earlier, later in overlapping[:10]:
            print(f"\noverlap in worker {earlier.worker}: job {earlier.job} run {earlier.run} "
                  f"(attempt {earlier.attempt}, pid {earlier.pid}, {earlier.outcome or 'no end'})"
                  f" and run {later.run} (attempt {later.attempt}, pid {later.pid}) started "
                  f"{(later.start - earlier.start) / 1e6:.0f} ms later")
        if self.batch_details:
            print("\nbatches whose callback did not complete once (first 5):")
            for line in self.batch_details:
                print(f"  {line}")
        if without_run:
            print(f"\ncompleted without a recorded run: {without_run[:10]}")
        if died:
            print("\nworkers that died on their own, by reason:")
            for reason, count in collections.Counter(w.reason for w in died).most_common():
                print(f"  {count:5d}  {reason}")
        for worker in died[:2]:
            tail = worker.log.read_text(errors="replace").splitlines()[-12:]
            lived = ((worker.gone_ns or 0) - worker.started_ns) / 1e9
            print(f"\nworker {worker.pid} ({worker.backend}) died after {lived:.1f} s; "
                  "its last lines:")
            print("\n".join(f"    {line[:220]}" for line in tail))
        logged = worker_log_summary(self.logs_dir)
        if logged:
            print("\nworker logs, warnings and errors (count, message):")
            for message, count in logged.most_common(15):
                print(f"  {count:5d}  {message}")
        print()

    def cleanup(self) -> None:
        self.stop_threads.set()
        self.kill_everything_we_started()
        if self.args.keep:
            print(f"kept {self.tmp}", file=sys.stderr)
        else:
            shutil.rmtree(self.tmp, ignore_errors=True)


def read_journals(journal_dir: Path, gone: dict[int, int | None]) -> list[Run]:
    """Every run the handlers recorded. A run without an end record (its process was killed
    mid-run, or a thread handler was abandoned) ends when its worker was gone, ``gone`` being
    worker pid -> monotonic ns; None if that is unknown too."""
    runs: dict[str, Run] = {}
    ends: dict[str, tuple[int, str]] = {}
    for path in journal_dir.glob("journal-*.log"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if parts[:1] == ["S"] and len(parts) == 7:
                run, job, attempt, worker, pid, start = parts[1:]
                runs[run] = Run(run, job, int(attempt), int(worker), int(pid), int(start))
            elif parts[:1] == ["E"] and len(parts) == 4:
                ends[parts[1]] = (int(parts[2]), parts[3])
    for run in runs.values():
        if run.run in ends:
            run.end, run.outcome = ends[run.run]
        else:
            run.end = gone.get(run.worker)
    return list(runs.values())


def flow_violations(flows: dict[str, str], by_job: dict[str, list[Run]]) -> list[str]:
    """The jobs of flows (job id -> the job it depends on) that started before their
    dependency completed: a job is released only once its dependency completed, which is after
    that dependency's first run that ended ok, so no run of it may start before that end."""
    out_of_order = []
    for child, parent in flows.items():
        parent_ok = [r.end for r in by_job.get(parent, []) if r.outcome == "ok" and r.end]
        child_starts = [r.start for r in by_job.get(child, [])]
        if child_starts and (not parent_ok or min(child_starts) < min(parent_ok)):
            out_of_order.append(child)
    return out_of_order


def find_overlaps(by_job: dict[str, list[Run]]) -> tuple[list[tuple[Run, Run]], int]:
    """Pairs of runs of one job where the later one started before the earlier one ended, in
    the same worker (returned: must not happen), and the number of such pairs on two
    different workers (allowed: a lock expired while its holder was cut off or hung)."""
    same: list[tuple[Run, Run]] = []
    across = 0
    for job_runs in by_job.values():
        job_runs.sort(key=lambda r: r.start)
        for i, later in enumerate(job_runs):
            for earlier in job_runs[:i]:
                if earlier.end is not None and later.start >= earlier.end:
                    continue
                if earlier.worker == later.worker:
                    same.append((earlier, later))
                else:
                    across += 1
    return same, across


_LOG_LINE = re.compile(r"\[(warning|error|critical)\s*\] (.*?)(?= \w+=|$)")


def worker_log_summary(logs_dir: Path) -> collections.Counter[str]:
    """Warnings and errors the workers logged, by message, and the last line of each
    traceback (for example a subprocess child of a killed worker writing to its pipe)."""
    found: collections.Counter[str] = collections.Counter()
    for log in logs_dir.glob("*.log"):
        lines = log.read_text(errors="replace").splitlines()
        for i, line in enumerate(lines):
            if line.startswith("Traceback"):
                last = next((x for x in lines[i + 1:] if x and not x[0].isspace()), line)
                found[f"traceback: {last.strip()[:140]}"] += 1
            elif line.startswith("panqueue: error:"):
                found[f"fatal: {line[len('panqueue: error: '):][:140]}"] += 1
            elif match := _LOG_LINE.search(line):
                found[f"{match[1]}: {match[2][:140]}"] += 1
    return found


def death_reason(lines: list[str], code: int) -> str:
    """The line that says why a worker exited: the command's error line, or the last line
    of a traceback, else its exit code. Port numbers are left out so reasons group."""
    for line in reversed(lines):
        if line.startswith("panqueue: error:") or (line[:1].isalpha() and ": " in line
                                                    and not line.startswith("panqueue:")):
            return re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:<port>", line)[:200]
    return f"exit code {code}"


def _summary(exc: BaseException) -> str:
    text = re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:<port>", str(exc))
    return f"{type(exc).__name__}: {text[:100]}"


def _leftover_children(groups: set[int]) -> list[int]:
    """PIDs of our Python processes still in one of the workers' process groups: subprocess
    children of killed workers (a group outlives its leader while a member is alive)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "
        if int(fields[2]) in groups and cmdline.startswith(sys.executable.encode()):
            found.append(int(stat.parent.name))
    return found


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=4, help="worker processes (default 4)")
    parser.add_argument("--jobs", type=int, default=2000, help="jobs to add (default 2000)")
    parser.add_argument("--seconds", type=float, default=60.0,
                        help="seconds of chaos (default 60)")
    parser.add_argument("--drain-seconds", type=float, default=40.0,
                        help="how long the drain after the chaos may take (default 40)")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    parser.add_argument("--partition-changes", type=int, default=1,
                        help="times the partitioned queue is redeployed with another partition "
                             "count during the run (default 1)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temp dir (journals, worker logs, Redis data)")
    return parser.parse_args(argv)


def _sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.workers < 1 or args.jobs < 1 or args.seconds <= 0 or args.partition_changes < 0:
        print("torture: --workers, --jobs and --seconds must be positive, "
              "--partition-changes not negative", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _sigterm)
    torture = Torture(args)
    try:
        figures = torture.run()
    except KeyboardInterrupt:
        print("torture: interrupted; stopping everything it started", file=sys.stderr)
        return 130
    finally:
        torture.cleanup()
    print(json.dumps(figures))
    return 0 if figures["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
