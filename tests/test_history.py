"""The history stream: every ending of a job appends exactly one record (lua/lib/records.lua),
bounded by Retention(history=); and its export to Parquet (panqueue.spark.export_history), which
writes each record once, even when an export process is killed between its write and its
acknowledgement and run again."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from collections import Counter
from datetime import UTC
from pathlib import Path

import anyio
import pytest
import redis
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from panqueue import (
    ConfigError,
    Fail,
    Job,
    JobState,
    QueueClient,
    RateLimited,
    Registry,
    Retention,
    Snooze,
    SyncQueueClient,
    Worker,
)
from panqueue._job import ErrorInfo
from panqueue._keys import QueueKeys, partition_keys
from panqueue._store import ops
from panqueue._store.loader import SCRIPTS
from panqueue._store.ops import encode_error
from panqueue._store.transport import ScriptCall, SyncTransport
from panqueue.spark import HISTORY_SCHEMA, enqueue_dataframe, export_history
from tests.helpers import async_wait_until, subprocess_env, wait_until
from tests.store_fixtures import ScriptStore

ERR = encode_error(ErrorInfo("ValueError", "boom", "Traceback (most recent call last): ..."))
STALL_ERR = encode_error(ErrorInfo("Stalled", "lock expired"))


def complete(store: ScriptStore, job_id: str, token: str) -> None:
    """Complete as a worker does, with a fresh request id."""
    store.complete(job_id, token, request=token + ":next")


def fail(store: ScriptStore, job_id: str, token: str, max_attempts: int = 1) -> None:
    """Fail as a worker does: the error with its traceback, a fresh request id."""
    store.fail(job_id, token, max_attempts, error=ERR, request=token + ":next")


def test_every_ending_appends_exactly_one_history_record(store: ScriptStore) -> None:
    done, retried, waiting, parent, stalled = store.add(5)
    [child] = store.add(1, depends_on=(parent,))
    assert store.claim("worker-a:x1:1") == [done]
    complete(store, done, "worker-a:x1:1")
    # Failed after a retry: the retry writes nothing, the final failure one record.
    assert store.claim("w:b:c:x2:1") == [retried]
    fail(store, retried, "w:b:c:x2:1", max_attempts=2)
    assert store.claim("w:b:c:x2:2") == [waiting]  # the retried job went to the back
    store.call(SCRIPTS.cancel, waiting, -1)  # an active job: only marked, not ended yet
    fail(store, waiting, "w:b:c:x2:2")  # its handler stopped: it ends cancelled
    assert store.claim("w:b:c:x2:3") == [parent]
    fail(store, parent, "w:b:c:x2:3")  # fails, and its blocked dependent fails with it
    [born_failed] = store.add(1, depends_on=(parent,))  # added after its dependency failed
    # Stalled beyond max_stalls (0): the sweep fails it, naming the worker whose lock expired.
    assert store.claim("worker-s:x3:1", ttl_ms=1) == [stalled]
    wait_until(lambda: store.call(SCRIPTS.stalled, 0, 1000, -1, STALL_ERR)[1] == 1,
               what="the 1 ms lock to expire")
    assert store.claim("w:x4:1") == [retried]
    fail(store, retried, "w:x4:1", max_attempts=2)

    records = store.history()
    assert Counter(r["id"] for r in records) == {
        done: 1, waiting: 1, parent: 1, child: 1, born_failed: 1, stalled: 1, retried: 1}
    by_id = {r["id"]: r for r in records}
    assert list(by_id[done]) == ["id", "state", "attempts", "enqueued", "started", "finished",
                                 "reason", "error_type", "error_message", "worker"]
    assert {k: by_id[done][k] for k in ("state", "attempts", "reason", "error_type",
                                        "worker")} == {
        "state": "completed", "attempts": "1", "reason": "", "error_type": "", "worker": "worker-a"}
    assert (int(by_id[done]["enqueued"]) <= int(by_id[done]["started"])
            <= int(by_id[done]["finished"]))
    assert {k: by_id[retried][k] for k in ("state", "attempts", "reason", "error_type",
                                           "error_message", "worker")} == {
        "state": "failed", "attempts": "2", "reason": "max_attempts_exceeded",
        "error_type": "ValueError", "error_message": "boom", "worker": "w"}
    assert (by_id[waiting]["state"], by_id[waiting]["reason"], by_id[waiting]["worker"]) == (
        "cancelled", "cancelled", "w:b:c")  # a worker name may hold colons
    for dependent in (child, born_failed):
        assert (by_id[dependent]["state"], by_id[dependent]["reason"],
                by_id[dependent]["error_type"], by_id[dependent]["started"],
                by_id[dependent]["worker"]) == (
            "failed", "dependency_failed", "DependencyFailed", "", "")
    assert (by_id[stalled]["reason"], by_id[stalled]["error_type"],
            by_id[stalled]["worker"]) == ("stalled", "Stalled", "worker-s")
    [cancelled_waiting] = store.add(1)
    store.call(SCRIPTS.cancel, cancelled_waiting, -1)
    assert store.history()[-1] | {"enqueued": "", "finished": ""} == {
        "id": cancelled_waiting, "state": "cancelled", "attempts": "0", "enqueued": "",
        "started": "", "finished": "", "reason": "cancelled", "error_type": "",
        "error_message": "", "worker": ""}


def test_a_job_released_after_its_cancel_was_requested_records_one_cancelled_ending(
        store: ScriptStore) -> None:
    [job_id, requeued] = store.add(2)
    assert store.claim("worker-r:x5:1", n=2) == [job_id, requeued]
    store.call(SCRIPTS.cancel, job_id, -1)  # active: marked for its worker
    assert store.call(SCRIPTS.release, job_id, "worker-r:x5:1", requeued, "worker-r:x5:1") == 2
    [record] = store.history()  # the released job went back to waiting: no record
    assert (record["id"], record["state"], record["reason"], record["worker"]) == (
        job_id, "cancelled", "cancelled", "worker-r")


def test_retention_history_bounds_the_stream_and_zero_turns_it_off(store: ScriptStore) -> None:
    store.t.run(ops.setup_queue(store.keys, "global", 1, 0, 0, False, keep_history=300))
    [parent] = store.add(1)
    store.add(3000, depends_on=(parent,))
    store.call(SCRIPTS.cancel, parent, -1)  # one script ends 3001 jobs
    length = store.t.client.xlen(store.keys.history)
    assert 300 <= length <= 400  # MAXLEN ~ trims whole nodes (100 entries each)
    store.t.run(ops.setup_queue(store.keys, "global", 1, 0, 0, False, keep_history=0))
    [more] = store.add(1)
    store.call(SCRIPTS.cancel, more, -1)
    assert store.t.client.xlen(store.keys.history) == length
    with pytest.raises(ConfigError, match=r"Retention\.history must be an int >= 0"):
        Retention(history=-1)


@pytest.mark.anyio
async def test_a_worker_stores_its_retention_and_records_carry_its_name(
        redis_url: str, queue_name: str) -> None:
    registry = Registry()

    @registry.handler(queue_name, retention=Retention(history=1000))
    async def handle(job: Job) -> int:
        return int(job.data)

    async with anyio.create_task_group() as tg:
        worker = Worker(registry, queue_name, url=redis_url, name="history-worker")
        tg.start_soon(worker.run)
        with SyncQueueClient(redis_url) as client:
            handles = client.queue(queue_name).add_bulk(list(range(5)))
            for handle in handles:
                await anyio.to_thread.run_sync(lambda h=handle: h.result(timeout=10))
        await worker.shutdown(5)
    client_redis = redis.Redis.from_url(redis_url)
    try:
        assert client_redis.hget(QueueKeys(queue_name).meta, "kh") == b"1000"
        records = client_redis.xrange(QueueKeys(queue_name).history)
    finally:
        client_redis.close()
    assert sorted(f[b"id"].decode() for _, f in records) == sorted(h.id for h in handles)
    assert {f[b"worker"] for _, f in records} == {b"history-worker"}


@pytest.mark.anyio
async def test_a_job_ended_by_a_snooze_or_a_rate_limit_records_the_worker_that_ran_it(
        redis_url: str, queue_name: str) -> None:
    """Whichever way an attempt ends its job (a failure, a snooze past max_snoozes, a snooze
    or a RateLimited that finds the job's cancellation requested), the record names the
    worker of that attempt, as a completion's does."""
    registry = Registry()

    @registry.handler(queue_name, max_snoozes=0, retention=Retention(history=1000))
    async def handle(job: Job) -> None:
        if job.data.endswith("-cancelled"):
            # Requested while the attempt runs; shielded, the handler goes on to its own
            # ending (the cancellation would reach it at its next checkpoint, which never comes).
            with anyio.CancelScope(shield=True):
                async with QueueClient(redis_url) as client:
                    await client.cancel(queue_name, job.id)
        if job.data.startswith("snooze"):
            raise Snooze(0)
        if job.data.startswith("limited"):
            raise RateLimited(0)
        raise Fail("no")

    hows = ["fail", "snooze", "snooze-cancelled", "limited-cancelled"]
    async with QueueClient(redis_url) as client:
        queue = client.queue(queue_name)
        handles = {how: await queue.add(how) for how in hows}

        async def all_ended() -> bool:
            states = [(await handle.info()).state for handle in handles.values()]
            return all(state in (JobState.FAILED, JobState.CANCELLED) for state in states)

        async with anyio.create_task_group() as tg:
            worker = Worker(registry, queue_name, url=redis_url, name="ending-worker")
            tg.start_soon(worker.run)
            await async_wait_until(all_ended, what="every job to end")
            await worker.shutdown(5)
    client_redis = redis.Redis.from_url(redis_url)
    try:
        records = client_redis.xrange(QueueKeys(queue_name).history)
    finally:
        client_redis.close()
    ending = {f[b"id"].decode(): (f[b"state"], f[b"reason"], f[b"worker"]) for _, f in records}
    assert len(records) == len(hows)
    assert {how: ending[handle.id] for how, handle in handles.items()} == {
        "fail": (b"failed", b"explicit_fail", b"ending-worker"),
        "snooze": (b"failed", b"max_snoozes_exceeded", b"ending-worker"),
        "snooze-cancelled": (b"cancelled", b"cancelled", b"ending-worker"),
        "limited-cancelled": (b"cancelled", b"cancelled", b"ending-worker")}


# --------------------------------------------------------------------------- export (Spark)


def finish_jobs(store: ScriptStore, n: int) -> list[str]:
    """``n`` jobs that end (cancelled: one record each, the fastest ending to produce)."""
    ids = store.add(n)
    for job_id in ids:
        store.call(SCRIPTS.cancel, job_id, -1)
    return ids


def exported_ids(spark: SparkSession, path: Path) -> Counter[str]:
    return Counter(row.id for row in spark.read.parquet(str(path)).select("id").collect())


def test_export_writes_each_record_once_and_a_rerun_exports_nothing_new(
        spark: SparkSession, store: ScriptStore, redis_url: str, tmp_path: Path) -> None:
    first = finish_jobs(store, 120)
    out = tmp_path / "history"
    stats = export_history(spark, store.keys.name, url=redis_url, path=out, batch_size=50)
    assert (stats.exported, stats.batches, stats.lost) == (120, 3, 0)
    assert export_history(spark, store.keys.name, url=redis_url, path=out).exported == 0
    second = finish_jobs(store, 30)
    assert export_history(spark, store.keys.name, url=redis_url, path=str(out)).exported == 30
    assert exported_ids(spark, out) == Counter(first + second)  # earlier batches were kept
    frame = spark.read.parquet(str(out))
    assert [(f.name, f.dataType) for f in frame.schema.fields] == [
        *((f.name, f.dataType) for f in HISTORY_SCHEMA.fields), ("date", T.DateType()),
        ("batch", T.StringType())]
    row = frame.filter(frame.id == first[0]).first()
    assert row is not None
    assert (row.queue, row.state, row.failure_reason, row.attempts) == (
        store.keys.name, "cancelled", "cancelled", 0)
    # PySpark hands timestamps back as naive local times (Django's tests set the process's
    # TZ, to America/Chicago by default); the date column is the UTC date.
    assert row.finished_at is not None
    assert row.date == row.finished_at.astimezone(UTC).date()
    # Everything is acknowledged: nothing pending for the export group.
    assert store.t.client.xpending(store.keys.history, "export")["pending"] == 0


def test_export_refuses_bad_arguments_with_one_clear_error(
        spark: SparkSession, redis_url: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="path must be a non-empty str"):
        export_history(spark, "q", url=redis_url, path="")
    with pytest.raises(ConfigError, match="batch_size must be an int >= 1"):
        export_history(spark, "q", url=redis_url, path=tmp_path, batch_size=0)
    with pytest.raises(ConfigError, match="queue name"):
        export_history(spark, "bad{name}", url=redis_url, path=tmp_path)
    with pytest.raises(ConfigError, match="spark must be a SparkSession"):
        export_history(None, "q", url=redis_url, path=tmp_path)  # type: ignore[arg-type]
    assert not any(tmp_path.iterdir())


# The export process of the next test: two batches are written and acknowledged; of the
# third, half the rows are written (as when a write dies after some of its files committed),
# then the process stops before the acknowledgement and waits there to be killed.
KILLED_EXPORT = """
import os, sys, threading
from pathlib import Path
from pyspark.sql import SparkSession
import panqueue.spark as pqspark

url, queue, out, marker = sys.argv[1:5]
os.environ["PYSPARK_PYTHON"] = sys.executable
spark = (SparkSession.builder.master("local[2]").config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1").config("spark.ui.enabled", "false")
         .getOrCreate())
spark.sparkContext.setLogLevel("OFF")
write = pqspark._write_batch
written = []

def write_then_hang(spark, queue, batch, rows, path):
    written.append(1)
    if len(written) < 3:
        return write(spark, queue, batch, rows, path)
    write(spark, queue, batch, rows[: len(rows) // 2], path)
    Path(marker).write_text("written")
    threading.Event().wait()

pqspark._write_batch = write_then_hang
pqspark.export_history(spark, queue, url=url, path=out, batch_size=40)
"""


# A JVM of its own, started beside the session's: about 30 s alone, minutes under the whole
# suite's load (as the JVM examples, test_examples.py); a guard against a hang, not a bound.
@pytest.mark.timeout(300)
def test_an_export_killed_mid_write_and_run_again_writes_every_record_once(
        spark: SparkSession, store: ScriptStore, redis_url: str, tmp_path: Path) -> None:
    ids = finish_jobs(store, 200)
    out, marker = tmp_path / "history", tmp_path / "written"
    script = tmp_path / "export.py"
    script.write_text(textwrap.dedent(KILLED_EXPORT))
    process = subprocess.Popen([sys.executable, str(script), redis_url, store.keys.name,
                                str(out), str(marker)], env=subprocess_env(),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(marker.exists, timeout=240, what="the export to write half a batch")
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(30)
    # Two batches written and acknowledged, half of the third written: 100 records.
    assert exported_ids(spark, out) == Counter(ids[:100])
    assert store.t.client.xpending(store.keys.history, "export")["pending"] == 40
    stats = export_history(spark, store.keys.name, url=redis_url, path=out, batch_size=40)
    assert (stats.exported, stats.lost) == (120, 0)  # the unacknowledged batch, then the rest
    assert exported_ids(spark, out) == Counter(ids)


def test_records_trimmed_before_an_export_read_them_are_counted_as_lost(
        spark: SparkSession, store: ScriptStore, redis_url: str, tmp_path: Path) -> None:
    store.t.run(ops.setup_queue(store.keys, "global", 1, 0, 0, False, keep_history=100))
    store.t.run(ops.open_history_export(store.keys))
    finish_jobs(store, 450)
    kept = store.t.client.xlen(store.keys.history)
    stats = export_history(spark, store.keys.name, url=redis_url, path=tmp_path / "h")
    assert (stats.exported, stats.lost) == (kept, 450 - kept)


def test_a_partitioned_queue_exports_every_partitions_history_once(
        spark: SparkSession, redis_url: str, queue_name: str, tmp_path: Path) -> None:
    """Three partitions, three streams: rows enqueued from Spark spread over them, and one
    export writes every record once (batches named per partition, so equal stream ids of two
    partitions cannot overwrite each other)."""
    registry = Registry()

    @registry.handler(queue_name, partitions=3)
    async def work(job: Job) -> None: ...

    with SyncQueueClient(redis_url) as client:
        client.queue(work).add(None, job_id="declares-3-partitions")
        frame = spark.createDataFrame([(f"row-{i}", i) for i in range(90)], ["id", "n"])
        stats = enqueue_dataframe(frame, queue_name, url=redis_url, id_column="id",
                                  data_column="n")
        assert stats.added == 90
        ids = [f"id:row-{i}" for i in range(90)]  # enqueue_dataframe prefixes the column
        transport = SyncTransport(redis_url)
        try:
            homes: Counter[int] = Counter()
            for keys in partition_keys(queue_name, 3):
                homes[keys.partition] = sum(transport.client.exists(keys.job(i)) for i in ids)
                for job_id in ids:
                    if transport.client.exists(keys.job(job_id)):
                        transport.execute(ScriptCall(SCRIPTS.cancel, (keys.prefix,),
                                                     (job_id, -1)))
        finally:
            transport.close()
        assert sum(homes.values()) == 90 and min(homes.values()) > 10
    out = tmp_path / "history"
    stats = export_history(spark, queue_name, url=redis_url, path=out, batch_size=20)
    assert stats.exported == 90 and stats.lost == 0
    assert exported_ids(spark, out) == Counter(ids)
    assert export_history(spark, queue_name, url=redis_url, path=out).exported == 0
