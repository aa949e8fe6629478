"""The Spark data sources (panqueue.spark_sources) on the shared local[2] session and a private
Redis: format("panqueue") reads what read_jobs reads, with state and time filters served by
the store, and enqueues like enqueue_dataframe; format("panqueue-history") streams each
history record once per checkpoint."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import pytest
import redis
from pyspark import TaskContext
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.streaming import StreamingQuery

from panqueue import Job, JobState, Registry, SyncQueueClient
from panqueue.spark import (
    HISTORY_SCHEMA,
    JOB_SCHEMA,
    enqueue_dataframe,
    export_history,
    read_jobs,
    register,
)
from panqueue.testing import drain, run_worker


@pytest.fixture
def sources(spark: SparkSession) -> SparkSession:
    register(spark)
    return spark


# Spark gives the Python worker it starts for a streaming source a fixed 10 s to connect back
# (PythonWorkerFactory.createSimpleWorker, not configurable); with the whole suite on two cores
# (10 to 40 runnable processes) a start has taken longer, and the query failed before its
# first batch. Such a query is started again from its checkpoint, as after any failure, at
# most twice; a query that failed otherwise, or after a batch, fails the test.
_NO_WORKER = "Python worker failed to connect back"


def run_query(start: Callable[[], StreamingQuery],
              run: Callable[[StreamingQuery], None]) -> None:
    for attempt in range(3):
        query = start()
        try:
            run(query)
            return
        except StreamingQueryException as exc:
            if _NO_WORKER not in str(exc) or query.recentProgress or attempt == 2:
                raise
        finally:
            query.stop()


def until_done(query: StreamingQuery) -> None:
    """Wait for a query with an availableNow trigger to end, and check it ended well."""
    query.awaitTermination(120)
    assert query.exception() is None


def finish(url: str, queue: str, numbers: range, prefix: str | None = None) -> None:
    """Add a job per number and run a worker until all have ended: multiples of 5 fail."""
    registry = Registry(prefix=prefix)

    @registry.handler(queue, attempts=1)
    async def work(job: Job) -> int:
        if job.data % 5 == 0:
            raise ValueError(f"bad {job.data}")
        return int(job.data)

    with SyncQueueClient(url, prefix=prefix) as client:
        q = client.queue(work)
        for n in numbers:
            q.add(n, job_id=f"n{n}")

    async def main() -> None:
        async with run_worker(registry, queue, url, concurrency=4):
            await drain(url, queue, prefix=prefix)

    anyio.run(main)


def server_now_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def hgetalls(client: redis.Redis) -> int:
    """Job hashes read since the last CONFIG RESETSTAT (one HGETALL per job record)."""
    return int(client.info("commandstats").get("cmdstat_hgetall", {}).get("calls", 0))


def test_read_format_is_read_jobs_with_state_and_time_filters_served_by_the_store(
        sources: SparkSession, redis_url: str, redis_client: redis.Redis,
        queue_name: str) -> None:
    finish(redis_url, queue_name, range(20))
    between = server_now_ms(redis_client)
    wait_until_next_ms(redis_client, between)
    finish(redis_url, queue_name, range(20, 30))
    with SyncQueueClient(redis_url) as client:
        for n in range(30, 36):
            client.queue(queue_name).add(n, job_id=f"n{n}")  # no worker: these stay waiting
        client.queue(queue_name).add(99, job_id="later", delay=3600)

    jobs = (sources.read.format("panqueue").option("url", redis_url)
            .option("queue", queue_name).load())
    assert jobs.schema == JOB_SCHEMA
    rows = sorted(jobs.collect())
    assert rows == sorted(read_jobs(sources, queue_name, url=redis_url).collect())
    states = [r.state for r in rows]
    assert {s: states.count(s) for s in set(states)} == {
        "completed": 24, "failed": 6, "waiting": 6, "delayed": 1}
    # One input partition per queue partition and state, read in parallel.
    assert jobs.rdd.getNumPartitions() == len(JobState)

    redis_client.config_resetstat()
    failed = jobs.where(F.col("state") == "failed").collect()
    assert sorted(r.id for r in failed) == sorted(f"n{n}" for n in range(0, 30, 5))
    assert hgetalls(redis_client) == 6  # only the failed set's jobs were read

    redis_client.config_resetstat()
    cutoff = F.timestamp_millis(F.lit(between))
    late = jobs.where((F.col("finished_at") > cutoff) & F.col("state").isin("completed", "failed"))
    assert sorted(r.id for r in late.collect()) == sorted(f"n{n}" for n in range(20, 30))
    assert hgetalls(redis_client) == 10  # the finished sets read by score: the second wave

    redis_client.config_resetstat()
    open_jobs = jobs.where(F.col("state") != "completed").where(F.col("finished_at").isNull())
    assert sorted(r.id for r in open_jobs.collect()) == sorted(
        [f"n{n}" for n in range(30, 36)] + ["later"])
    assert hgetalls(redis_client) == 6 + 7  # the failed and cancelled sets are read too

    # Without pushdown (a session that keeps spark.sql.python.filterPushdown.enabled off):
    # the same rows, every set read.
    plain = (sources.read.format("panqueue").option("url", redis_url)
             .option("queue", queue_name).option("pushdown", "false").load())
    redis_client.config_resetstat()
    assert sorted(plain.where(F.col("state") == "failed").collect()) == sorted(failed)
    assert hgetalls(redis_client) == 37


def wait_until_next_ms(client: redis.Redis, ms: int) -> None:
    """Return once the server's clock is past ``ms`` (jobs finished after it score higher)."""
    while server_now_ms(client) <= ms:
        pass


def test_read_format_refuses_bad_options_with_one_clear_line(
        sources: SparkSession, redis_url: str) -> None:
    with pytest.raises(Exception, match="option 'queue' is required"):
        sources.read.format("panqueue").option("url", redis_url).load().collect()
    with pytest.raises(Exception, match="option 'states': 'done' is not a valid JobState"):
        (sources.read.format("panqueue").option("url", redis_url).option("queue", "q")
         .option("states", "done").load().collect())


def test_write_format_enqueues_like_enqueue_dataframe_exactly_once(
        sources: SparkSession, redis_url: str, redis_client: redis.Redis, queue_name: str,
        tmp_path: Path) -> None:
    failures = str(tmp_path)

    @F.udf(T.LongType(), useArrow=False)
    def fail_first_attempt(n):  # type: ignore[no-untyped-def]  # hints would make Spark guess a UDF kind
        # The first attempt of each task dies late in its partition, after it had enqueued
        # most of its rows: the retry finds them and adds only the rest.
        context = TaskContext.get()
        if context is not None and context.attemptNumber() == 0 and n % 2000 == 1900:
            Path(failures, f"failed-{n}").touch()
            raise RuntimeError("simulated executor failure")
        return n

    df = (sources.range(0, 4000, numPartitions=2)
          .withColumn("n", fail_first_attempt(F.col("id"))).drop("id")
          .withColumn("name", F.concat(F.lit("user "), F.col("n").cast("string"))))
    writer = (df.write.format("panqueue").option("url", redis_url).option("queue", queue_name)
              .option("id_column", "n").option("batch_size", "100").option("priority", "3"))
    writer.mode("append").save()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["failed-1900", "failed-3900"]
    writer.mode("append").save()  # a re-run adds nothing
    with SyncQueueClient(redis_url) as client:
        assert client.counts(queue_name)[JobState.WAITING] == 4000
        info = client.get_job(queue_name, "n:7")
    assert info.data == {"n": 7, "name": "user 7"} and info.priority == 3
    ids = {k.decode().rsplit(":", 1)[1]
           for k in redis_client.scan_iter(match=f"{{q:{queue_name}}}:job:*", count=1000)}
    assert ids == {str(n) for n in range(4000)}

    # Spark's default save mode is refused by Spark; overwrite by the source, with its reason.
    with pytest.raises(Exception, match="UNSUPPORTED_DATA_SOURCE_SAVE_MODE"):
        df.write.format("panqueue").option("url", redis_url).option("queue", queue_name).save()
    with pytest.raises(Exception, match=r"only adds jobs: write with mode\('append'\)"):
        writer.mode("overwrite").save()
    with pytest.raises(Exception, match="id_column 'nope' is not a column"):
        writer.option("id_column", "nope").mode("append").save()
    with SyncQueueClient(redis_url) as client:
        assert client.counts(queue_name)[JobState.WAITING] == 4000


def test_history_stream_delivers_each_record_once_per_checkpoint(
        sources: SparkSession, redis_url: str, queue_name: str, tmp_path: Path) -> None:
    finish(redis_url, queue_name, range(12))
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def start_stream() -> StreamingQuery:
        stream = (sources.readStream.format("panqueue-history").option("url", redis_url)
                  .option("queue", queue_name).load())
        return (stream.writeStream.format("parquet").option("path", str(out))
                .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
                .start())

    def run_stream() -> None:
        run_query(start_stream, until_done)

    run_stream()
    run_stream()  # restarted from its checkpoint: nothing new
    finish(redis_url, queue_name, range(12, 20))
    run_stream()
    written = sources.read.parquet(str(out))
    assert written.schema == HISTORY_SCHEMA
    rows = written.collect()
    assert sorted(r.id for r in rows) == sorted(f"n{n}" for n in range(20))
    assert len({r.entry for r in rows}) == 20
    failed = {r.id: r for r in rows if r.state == "failed"}
    assert sorted(failed) == sorted(f"n{n}" for n in range(0, 20, 5))
    assert failed["n5"].error_type == "ValueError" and failed["n5"].run_ms is not None

    # Any sink: foreachBatch. A fresh checkpoint with "latest" skips what the stream holds when
    # the query starts, and delivers what ends after that.
    seen: list[str] = []

    def start_latest() -> StreamingQuery:
        stream = (sources.readStream.format("panqueue-history").option("url", redis_url)
                  .option("queue", queue_name).option("startingOffsets", "latest").load())
        return (stream.writeStream.foreachBatch(
            lambda batch, _: seen.extend(r.id for r in batch.collect()))
            .option("checkpointLocation", str(tmp_path / "latest"))
            .start())

    def with_three_more(query: StreamingQuery) -> None:
        query.processAllAvailable()
        finish(redis_url, queue_name, range(20, 23))
        query.processAllAvailable()

    run_query(start_latest, with_three_more)
    assert sorted(seen) == ["n20", "n21", "n22"]


def test_a_partitioned_queue_is_read_and_streamed_partition_by_partition(
        sources: SparkSession, redis_url: str, queue_name: str, tmp_path: Path) -> None:
    registry = Registry()

    @registry.handler(queue_name, partitions=3)
    async def work(job: Job) -> None: ...

    with SyncQueueClient(redis_url) as client:
        client.queue(work).add(None, job_id="declares-3-partitions")
    rows = sources.createDataFrame([(f"row-{i}",) for i in range(60)], ["name"])
    (rows.write.format("panqueue").mode("append").option("url", redis_url)
     .option("queue", queue_name).option("id_column", "name").save())
    jobs = (sources.read.format("panqueue").option("url", redis_url)
            .option("queue", queue_name).load())
    assert jobs.rdd.getNumPartitions() == 3 * len(JobState)
    ids = sorted(["declares-3-partitions", *(f"name:row-{i}" for i in range(60))])
    assert sorted(r.id for r in jobs.where(F.col("state") == "waiting").collect()) == ids

    async def main() -> None:
        async with run_worker(registry, queue_name, redis_url, concurrency=8):
            await drain(redis_url, queue_name)

    anyio.run(main)
    seen: list[tuple[str, str]] = []

    def start() -> StreamingQuery:
        stream = (sources.readStream.format("panqueue-history").option("url", redis_url)
                  .option("queue", queue_name).load())
        return (stream.writeStream.foreachBatch(
            lambda batch, _: seen.extend((r.id, r.state) for r in batch.collect()))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True).start())

    run_query(start, until_done)
    assert sorted(seen) == [(job_id, "completed") for job_id in ids]


def test_a_key_prefix_reaches_every_function_and_source(
        sources: SparkSession, redis_url: str, queue_name: str, tmp_path: Path) -> None:
    finish(redis_url, queue_name, range(6), prefix="tenant")
    ids = [f"n{n}" for n in range(6)]
    # Read, by the functions and by the source, under the prefix and not beside it.
    assert read_jobs(sources, queue_name, url=redis_url).count() == 0
    assert sorted(r.id for r in read_jobs(sources, queue_name, url=redis_url,
                                          prefix="tenant").collect()) == ids
    reader = sources.read.format("panqueue").option("url", redis_url).option("queue", queue_name)
    assert reader.load().count() == 0
    assert sorted(r.id for r in reader.option("prefix", "tenant").load().collect()) == ids

    # Enqueued under it, by the function and by the source.
    rows = sources.createDataFrame([(n,) for n in range(10)], ["n"])
    enqueue_dataframe(rows, f"{queue_name}-f", url=redis_url, prefix="tenant", id_column="n")
    (rows.write.format("panqueue").mode("append").option("url", redis_url)
     .option("prefix", "tenant").option("queue", f"{queue_name}-s").option("id_column", "n")
     .save())
    with SyncQueueClient(redis_url, prefix="tenant") as tenant, \
            SyncQueueClient(redis_url) as plain:
        for queue in (f"{queue_name}-f", f"{queue_name}-s"):
            assert tenant.counts(queue)[JobState.WAITING] == 10
            assert plain.counts(queue)[JobState.WAITING] == 0

    # Its history, exported and streamed.
    assert export_history(sources, queue_name, url=redis_url, path=tmp_path / "history"
                          ).exported == 0
    assert export_history(sources, queue_name, url=redis_url, prefix="tenant",
                          path=tmp_path / "history").exported == 6
    seen: list[str] = []

    def start() -> StreamingQuery:
        stream = (sources.readStream.format("panqueue-history").option("url", redis_url)
                  .option("prefix", "tenant").option("queue", queue_name).load())
        return (stream.writeStream.foreachBatch(
            lambda batch, _: seen.extend(r.id for r in batch.collect()))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True).start())

    run_query(start, until_done)
    assert sorted(seen) == ids
    with pytest.raises(Exception, match="prefix 'a:b' may contain only"):
        reader.option("prefix", "a:b").load().collect()
