"""Redis memory per waiting job, panqueue against BullMQ (``--memory`` only; not part of the
full run; the BullMQ row needs node and an installed bullmq).

Both sides fill an emptied server with N waiting jobs whose data is the object
``{"p": "x" * 100}`` (a 100-character string under one key): panqueue stores it as msgpack,
105 bytes; BullMQ as JSON, 108 bytes (the table prints the stored length of each).

* panqueue: one job on another queue first (it loads the scripts and opens the connection,
  costs paid once per server), FLUSHALL, ``used_memory`` from ``INFO memory``, N jobs with
  ``SyncQueueClient.add_bulk``, 1000 per call, ``used_memory`` again.
* BullMQ: FLUSHALL, then ``node scripts/benchmarks/memory_bullmq.js PORT N`` does the same with
  ``Queue.addBulk`` (its own warm-up job, FLUSHALL, 1000 per call) and prints the two readings.
  bullmq is found through ``BULLMQ_PACKAGE_JSON`` (a package.json beside a ``node_modules``
  holding bullmq and ioredis), by default ``../shared/bench/peers/node/package.json`` from the
  repository root. Without node or bullmq the row says why it is missing.

bytes/job = (after - before) / N. Then, from ``MEMORY USAGE key SAMPLES 0`` (exact, no
``DEBUG``), what a waiting job is made of: its hash (the mean over 100 jobs spread over the N),
its entry in the wait structures (panqueue: a list for the default priority and a sorted set
for the others, both counted; BullMQ: a list), and the events stream,
which both cap at about 10,000 entries, so its share per job shrinks as N grows: the figure
is also given without it. "other" is the rest: mostly the keyspace's hash table (a pointer per
slot, the table a power of two) and allocator rounding that MEMORY USAGE does not see.

The 100-byte value is longer than ``hash-max-listpack-value`` (64). BullMQ's job hash is
therefore a hash table, whose size depends on the server's random hash seed (a table left
half-way through an incremental resize keeps both arrays): the same job hash measures 568 or
600 bytes on different server starts, so a single run's BullMQ figures can move by about 32
bytes a job. Run it more than once. panqueue stores data of 65 to 512 bytes in parts of at
most 64 bytes (lua/lib/job_data.lua), so its job hash is one listpack, whose size does not
depend on the seed.

N is 100,000 (``--quick``: 10,000).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from benchmarks.common import BATCH, SCRIPTS, Bench, log, print_table
from panqueue import JobState, SyncQueueClient
from panqueue._keys import QueueKeys

QUEUE = "bench-memory"
PAYLOAD = {"p": "x" * 100}
SAMPLES = 100
BULLMQ_SCRIPT = SCRIPTS / "benchmarks" / "memory_bullmq.js"
# ../shared/bench/peers/node/package.json from the repository root, unless BULLMQ_PACKAGE_JSON.
BULLMQ_DEFAULT = SCRIPTS.parent.parent / "shared" / "bench" / "peers" / "node" / "package.json"


def run(bench: Bench, quick: bool) -> dict[str, Any]:
    n = 10_000 if quick else 100_000
    log(f"memory: {n:,} waiting jobs on panqueue")
    figures: dict[str, Any] = {"jobs": n, "data": 'the object {"p": "x" * 100}',
                               "panqueue": fill_panqueue(bench, n)}
    log(f"memory: {n:,} waiting jobs on BullMQ")
    figures["bullmq"] = fill_bullmq(bench, n)
    bench.redis.flushall()
    return figures


def used_memory(bench: Bench) -> int:
    return int(bench.redis.info("memory")["used_memory"])


def fill_panqueue(bench: Bench, n: int) -> dict[str, Any]:
    keys = QueueKeys(QUEUE)
    every = max(1, n // SAMPLES)
    sample: list[str] = []
    with SyncQueueClient(bench.url) as client:
        client.queue(QUEUE + "-warmup").add(PAYLOAD)
        bench.redis.flushall()
        queue = client.queue(QUEUE)
        before = used_memory(bench)
        for first in range(0, n, BATCH):
            handles = queue.add_bulk([PAYLOAD] * min(BATCH, n - first))
            sample += [h.id for i, h in enumerate(handles, first) if i % every == 0]
        after = used_memory(bench)
        waiting = client.counts(QUEUE)[JobState.WAITING]
    if waiting != n:
        raise RuntimeError(f"panqueue: {waiting} jobs waiting after adding {n}")
    return split(bench, n, before, after, [keys.job(i) for i in sample], "d",
                 [keys.wait_list, keys.wait], keys.events)


def fill_bullmq(bench: Bench, n: int) -> dict[str, Any]:
    """BullMQ's figures, or ``{"unavailable": reason}``."""
    node = shutil.which("node")
    package_json = Path(os.environ.get("BULLMQ_PACKAGE_JSON", BULLMQ_DEFAULT))
    if node is None:
        return {"unavailable": "node is not on PATH"}
    if not (package_json.parent / "node_modules" / "bullmq").is_dir():
        return {"unavailable": f"no node_modules/bullmq beside {package_json} "
                               "(set BULLMQ_PACKAGE_JSON)"}
    bench.redis.flushall()
    port = urlsplit(bench.url).port
    env = dict(os.environ, BULLMQ_PACKAGE_JSON=str(package_json.resolve()))
    try:
        done = subprocess.run([node, str(BULLMQ_SCRIPT), str(port), str(n)], env=env,
                              capture_output=True, text=True, timeout=600, check=False)
    except subprocess.TimeoutExpired:
        return {"unavailable": f"{BULLMQ_SCRIPT.name} did not finish in 600 s"}
    if done.returncode != 0:
        # Node ends an uncaught error's report with its own version: name the error instead.
        lines = done.stderr.strip().splitlines() or ["no output"]
        reason = next((line.strip() for line in lines if "Error" in line), lines[-1])
        return {"unavailable": f"{BULLMQ_SCRIPT.name} exited with {done.returncode}: {reason}"}
    out = json.loads(done.stdout)
    if out["waiting"] != n:
        raise RuntimeError(f"BullMQ: {out['waiting']} jobs waiting after adding {n}")
    version = json.loads((package_json.parent / "node_modules" / "bullmq" /
                          "package.json").read_text())["version"]
    node_version = subprocess.run([node, "--version"], capture_output=True, text=True,
                                  check=False).stdout.strip()
    return {"version": f"bullmq {version} on node {node_version}",
            **split(bench, n, out["used_memory_before"], out["used_memory_after"],
                    out["sample_job_keys"], "data", [out["wait_key"]], out["events_key"])}


def split(bench: Bench, n: int, before: int, after: int, sample_job_keys: list[str],
          data_field: str, wait_keys: list[str], events_key: str) -> dict[str, Any]:
    """What the N waiting jobs cost, whole and by part (bytes; per job where it says so).
    The plain client only reads the server's accounting of the keys (MEMORY USAGE, lengths)."""
    r = bench.redis
    job_bytes = [r.memory_usage(key, samples=0) for key in sample_job_keys]
    if None in job_bytes:
        raise RuntimeError(f"a sampled job key is missing: {sample_job_keys[:3]}...")
    first = sample_job_keys[0]
    events = r.memory_usage(events_key, samples=0) or 0
    per_job = (after - before) / n
    job_hash = sum(job_bytes) / len(job_bytes)
    data_fields = [data_field, *(f"d{i}" for i in range(1, 8))] if data_field == "d" else [
        data_field]
    wait = sum(r.memory_usage(key, samples=0) or 0 for key in wait_keys) / n
    return {
        "used_memory_before": before,
        "used_memory_after": after,
        "bytes_per_job": per_job,
        "bytes_per_job_without_events": (after - before - events) / n,
        "job_hash_bytes": job_hash,
        "job_hash_encoding": r.object("encoding", first).decode(),
        "job_hash_fields": r.hlen(first),
        # panqueue keeps data of 65 to 512 bytes in parts "d", "d1", ... (lua/lib/job_data.lua)
        "data_bytes": sum(r.hstrlen(first, name) for name in data_fields),
        "wait_bytes_per_job": wait,
        "wait_encoding": " + ".join(r.object("encoding", key).decode() for key in wait_keys
                                    if r.exists(key)),
        "events_bytes": events,
        "events_bytes_per_job": events / n,
        "events_entries": r.xlen(events_key),
        "other_bytes_per_job": (after - before - events) / n - job_hash - wait,
    }


def report(figures: dict[str, Any]) -> None:
    pq, bull = figures["panqueue"], figures["bullmq"]
    n = figures["jobs"]
    print()
    print(f"memory: Redis used_memory per waiting job, {n:,} jobs, data {figures['data']} "
          f"(panqueue: msgpack, {pq['data_bytes']} bytes"
          + ("" if "unavailable" in bull else f"; BullMQ: JSON, {bull['data_bytes']} bytes")
          + ")")
    rows_spec = [
        ("bytes per job, used_memory after - before", "bytes_per_job"),
        ("  without the events stream", "bytes_per_job_without_events"),
        ("  events stream / N", "events_bytes_per_job"),
        ("  job hash (MEMORY USAGE, mean of 100)", "job_hash_bytes"),
        ("  wait list and set (panqueue) / wait list (BullMQ)", "wait_bytes_per_job"),
        ("  other (keyspace table, rounding)", "other_bytes_per_job"),
    ]
    rows = []
    for name, field in rows_spec:
        if "unavailable" in bull:
            rows.append([name, f"{pq[field]:,.1f}", "-", "-"])
        else:
            ratio = f"{pq[field] / bull[field]:.2f}" if bull[field] > 0 else "-"
            rows.append([name, f"{pq[field]:,.1f}", f"{bull[field]:,.1f}", ratio])
    print_table(["bytes", "panqueue", "BullMQ", "panqueue / BullMQ"], rows,
                [False, True, True, True])
    print(f"panqueue: job hash {pq['job_hash_encoding']} ({pq['job_hash_fields']} fields), "
          f"wait {pq['wait_encoding']}, events stream {pq['events_entries']:,} entries "
          f"= {pq['events_bytes']:,} bytes")
    if "unavailable" in bull:
        print(f"BullMQ: unavailable: {bull['unavailable']}")
    else:
        print(f"BullMQ:   job hash {bull['job_hash_encoding']} ({bull['job_hash_fields']} "
              f"fields), wait {bull['wait_encoding']}, events stream "
              f"{bull['events_entries']:,} entries = {bull['events_bytes']:,} bytes "
              f"({bull['version']})")
