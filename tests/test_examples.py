"""Every examples/*.py runs to completion against the test session's private server.

Examples are found by glob, so a new example is tested without touching this file: it must exit
0 and print ``done`` as its last line. The examples listed in EXPECTED must also print the lines
that show what they teach.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, subprocess_env

# Files starting with "_" are helper modules of the examples, not examples.
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.py") if not p.name.startswith("_"))

EXPECTED: dict[str, list[str]] = {
    "durable_signup.py": [
        "state delayed, waiting for 'verified', steps ['create-account']",
        "explain: signal",
        "welcome sent to ada@example.com (verified at 2026-11-27T10:00Z)",
        "steps ['create-account', 'welcome']; attempts used: 1",
        "accounts created: 1, mails sent: 1",
        "signal to a finished job kept: False",
    ],
    "batches.py": [
        "album holiday: 3 photos in the batch, closed=True",
        "album holiday publish: 3 of 3 photos resized, 0 failed",
        "album holiday report: 3 of 3 photos resized, 0 failed",
        "album party report: 1 of 2 photos resized, 1 failed",
        "album party: pending=0 completed=1 failed=1",
    ],
    "partitioned_queue.py": [
        "re-adding job event-0 found it: created=False",
        "counts over all partitions: waiting=60",
        "60 jobs completed, first result 't0:0'",
        "counts over all partitions: completed=60",
    ],
    "permissions.py": [
        "panqueue check-permissions _permission_handlers:queues: enforced",
        "beach.jpg: 128x96 thumbnail beach-thumb.png, uploaded as beach-thumb.png",
        "tower.png: 43x128 thumbnail tower-thumb.png, uploaded as tower-thumb.png",
        "the upload server received 3 thumbnails: ['beach-thumb.png', 'square-thumb.png', "
        "'tower-thumb.png']",
        "read the upload server's private key: failed: PermissionError: ",
        "connect to the worker's Redis: failed: PermissionError: ",
        "the worker keeps serving: beach.jpg again, uploaded as beach-thumb.png",
        "worker stopped: 4 completed, 2 failed",
    ],
    "quickstart.py": [
        "added 3 jobs",
        "job 1: hello, ada",
        "job 3: hello, linus",
        "is completed, progress 100, logs ['greeting ada']",
        "worker stopped after 3 jobs",
    ],
    "sentry_errors.py": [
        "globex: sent to globex",
        "acme: failed: ConnectionError",
        "sentry warning: ConnectionError: mail server refused the connection "
        "(queue=invoice-mail attempt=1 final=False)",
        "sentry error: ConnectionError: mail server refused the connection "
        "(queue=invoice-mail attempt=2 final=True)",
    ],
    "shared_redis.py": [
        "billing sees ['tasks']: 2 waiting",
        "search sees ['tasks']: 1 waiting",
        "refused: the job's data is 100,018 bytes encoded, over the limit of 64,000 bytes "
        "(max_payload_bytes)",
        "billing's worker ran [{'charged': 5}, {'charged': 7}]",
        "search's job still waits: 1 waiting",
    ],
    "sync_producer.py": [
        "added 50 invoice jobs in one call",
        "job_id 'order-C-7' added twice: created=[True, False]",
        "is delayed",
        "result: {'invoice': 'A-1', 'total': 12.0}",
        "batch results: total 1530.00",
        "reminder result: 'reminded ada@example.com'",
        "invoices completed: 52, waiting: 0",
        "worker pool stopped",
    ],
    "retries.py": [
        "flaky: completed: charged on attempt 3",
        "rate-limited: completed: charged on attempt 2",
        "invalid: failed: Fail",
        "state=failed attempts=1 failure_reason=explicit_fail",
        "state=failed attempts=2 failure_reason=max_attempts_exceeded",
        "history: attempt 2 ValueError: unexpected currency 'XXX'",
        "state=failed attempts=1 failure_reason=timeout",
        "broken: the traceback is kept",
        "outage: retry_failed moved 1 job back to waiting",
        "outage: completed: charged on attempt 1",
    ],
    "bulk_operations.py": [
        "tenant:7 has 4 waiting jobs, tags ['tenant:7']",
        "cancelled for tenant:7: 5",
        "running it again cancels 0",
        "failed with TimeoutError: rows [0, 3, 6]",
        "retried 3 timed-out jobs",
        "now completed=7, failed=1",
        "importer-1 now runs up to 4 jobs at once",
        "importer-1 stopped on request",
        "removed tenant:7's cancelled jobs: 5",
    ],
    "queue_admin.py": [
        "while paused: waiting=6",
        "(it was waiting)",
        "run order: urgent-1 > urgent-2 > weekly > monthly > low",
        "while it was active: it ended cancelled",
        "counts: completed=5, cancelled=2",
        "reading it now raises JobNotFound",
    ],
    "executor_thread.py": [
        "worker started (executor thread, concurrency 4)",
        "all 8 thumbnails done: {'image': 'photo-1.jpg', 'size': '128x128'}",
        "at most 4 handlers ran at once",
        "job 1: completed, progress 100, log 'resizing photo-1.jpg'",
        "worker stopped after 8 jobs",
    ],
    "executor_subprocess.py": [
        "handler _executor_handlers:build_report",
        "sees REPORT_LOCALE='en_GB' and EXAMPLE_API_TOKEN=None",
        "report: 40 rows, progress 100, in the same child",
        "huge: failed: MemoryError: child exceeded memory limit 256 MB",
        "spin: failed: ChildCrashed: child exceeded CPU limit 2 s (SIGXCPU)",
        "after the failures: 3 rows in a fresh child (new pid)",
        "worker stopped: 3 completed, 2 failed",
    ],
    "executor_inline.py": [
        "fast: looked up ada",
        "slow: failed after 2 attempts, failure_reason=timeout, error JobTimeout",
        "export: completed during shutdown with {'batches': ",
        "'complete': False}, log ['stopping early after ",
        "workers stopped",
    ],
    "schedules.py": [
        "2 workers started on queue 'maintenance'",
        "tick 1: job schedule:heartbeat:",
        "tick 3: job schedule:heartbeat:",
        "tick time is a whole second: True",
        "each tick ran once: True",
        "schedule 'heartbeat': every 1.0 s, data {'check': 'disk'}",
        "schedule 'nightly-report': cron '0 3 * * *' (Europe/Paris), next run at 03:00 "
        "Europe/Paris",
        "removed schedule 'heartbeat': True",
        "schedules left: []",
    ],
    "job_control.py": [
        "event progress  job 1 {'progress': 25}",
        "progress 100",
        "logs: ['rendered page 1 of 4', 'rendered page 2 of 4', 'rendered page 3 of 4', "
        "'rendered page 4 of 4']",
        "cancel() while the job was active: result() raised JobFailed, state cancelled",
        ": cancelled, failure_reason=cancelled, attempts=1, stopped at ",
        "events: added > active > progress (4x) > completed",
        "events: added > active > progress",
        "> cancelled",
        "after 5 more jobs: completed=3, cancelled=1",
        "was trimmed by retention: info() raises JobNotFound",
        "next event is 'added' for job ",
        "(the first ping: True)",
        "thumbnails events: completed (3x)",
    ],
    "adaptive_rate_limit.py": [
        "added 48 jobs for 2 tenants, 2 workers, limit 20/s per tenant",
        "completed 48 of 48 jobs, each once (queue counts: completed=48)",
        "attempt numbers seen by the handler: [1] (429s use no attempt)",
        "acme: ",
        "globex: ",
    ],
    "chunk_handler.py": [
        "120 rows loaded by inserts of [50, 50, 20] rows",
        "first result: {'row': 0}, last result: {'row': 119}",
        "bad row: {'row': 120} on attempt 2",
        "its first attempt: negative qty for sku-x",
        "a lone row ran once the chunk's 0.2 s wait was over: True",
    ],
    "keyed_rate_limit.py": [
        "added 9 jobs: 6 for acme first, then 3 for globex",
        "first six starts: 3 acme, 3 globex (round robin between the tenants)",
        "most jobs running at once per tenant: acme 1, globex 1",
        "most starts in any 1.0 s window: 4 (limit 4)",
    ],
    "workflows.py": [
        "chain states before a worker runs: ['waiting', 'blocked', 'blocked']",
        "chain ran in order: extract > transform > load",
        "tree: download-a and download-b before merge before publish",
        "merge: completed, result 'merge ok'",
        "parse: failed, failure_reason=explicit_fail, error Fail",
        "index: failed, failure_reason=dependency_failed, error DependencyFailed: dependency "
        "parse-",
        "report: failed, failure_reason=dependency_failed, error DependencyFailed",
        "index and report never ran: True",
        "depends on a completed job: waiting",
        "depends on a failed job: failed, dependency_failed",
        "depends on an unknown id: ConfigError: ",
        "counts: completed=7, failed=4, waiting=1, blocked=0",
    ],
    "dedup.py": [
        "created=False, data {'report': 1, 'version': 1}",
        "still job 2 (same: True)",
        "the key expired: new job 3, created=True",
        "was deleted, job 6 replaces it (created=True)",
        "which depended on the replaced job: failed, dependency_failed",
        "keep after the job was removed: new job 7, created=True",
        "added beside it (created=True)",
        "both ran: ['report 4 v1', 'report 4 v2']",
        "job_id: second add returned 'report-5', created=False",
        "job_id data unchanged: {'report': 5, 'version': 1}",
    ],
    "testing_handlers.py": [
        "[asyncio] result: {'total': 12.5}",
        "[asyncio] refused: failed, Fail: negative amount in [5.0, -1.0]",
        "[asyncio] drained: completed=21, failed=1",
        "[asyncio] worker stopped: 21 completed, 1 failed",
        "[trio] result: {'total': 12.5}",
        "[trio] drained: completed=21, failed=1",
        "[trio] worker stopped: 21 completed, 1 failed",
    ],
    "fault_proxy.py": [
        "cut: add raised panqueue.ConnectionError",
        "restored: waiting jobs 2",
        "blackhole: PING timed out after its 0.5 s socket timeout",
        "restored: PING -> True",
        "lost reply: INCR raised ConnectionError",
        "yet the server ran it: example:visits = 1",
        "replies dropped 1",
    ],
    "operations.py": [
        "before a worker: no live worker serves queue 'exports'",
        "worker export-worker-1: queues ['exports'], concurrency 1, running ['1']",
        "job 1 is active (running): running on worker export-worker-1",
        "process export-worker-1: queues ['exports'], running 1/1",
        "job 2 is waiting (queued): waiting behind 0 jobs",
        "all of them taken, by job 1 (running for",
        "slots held by: [('1', 'export-worker-1')]",
        "(retry of attempt: None)",
        "job 3 is delayed (delayed): delayed until",
        "job 4 is blocked (blocked): blocked on job 2 (waiting)",
        "after a clean stop, workers: []",
        "purged 1 delayed job; counts: {'completed': 3}",
        "purged 3 more; queue still exists: False",
    ],
    "from_celery.py": [
        "send_welcome.enqueue -> job 1 in queue 'emails'",
        "welcome mail sent to ada on attempt 2",
        "countdown: job welcome-bob is delayed; enqueued twice, created=[True, False]",
        "revoke: welcome-bob was delayed, now cancelled",
        "its result raises JobFailed: ended cancelled",
        "group: ['beach-128.jpg', 'tower-128.jpg', 'garden-128.jpg']",
        "emails: completed=1 cancelled=1; outbox ['ada']",
    ],
    "spark_datasource.py": [
        "written twice, enqueued once: 100 jobs",
        "without mode('append'): refused (Append)",
        "history streamed: 100 records",
        "streamed again: 100 records",
        "failed: 14 jobs",
        "  ValueError: 14",
        "finished in the last hour: 100 jobs",
    ],
    "spark_enqueue.py": [
        "first run: added=200, existing=0",
        "second run: added=0, existing=200",
        "without id_column: added=5; warning: enqueue_dataframe without id_column",
        "read_jobs: 205 jobs",
        "  delayed: 50",
        "  waiting: 155",
        'job customer_id:7: state=waiting, data={"customer_id": 7, "email": '
        '"user7@example.com", "signed_up": "2026-01-08", "delay_s": null}',
    ],
}


# The examples that start a JVM (PySpark) take about 16 s alone, and 60-160 s while the suite's
# other workers hold both cores (spark_datasource.py, which writes, reads and streams, went past
# 240 s once with ten workers): they run one after another in one Python process (one JVM, which
# each example's spark.stop() leaves running for the next: PySpark keeps its gateway), with a
# longer guard against a hang. Each example's output is checked as the others'.
JVM_EXAMPLES = {"spark_enqueue.py", "history_export.py", "spark_datasource.py"}
JVM_TIMEOUT = 600

# Runs each file of argv as __main__, in turn, each one's stdout after a line MARK + its name;
# an example that raises prints its traceback and MARK + "failed", and the next one runs.
MARK = "--- panqueue example: "
RUN_IN_ONE = f"""
import os, runpy, sys, traceback
for path in sys.argv[1:]:
    print({MARK!r} + path, flush=True)
    sys.path[0] = os.path.dirname(path)  # as for python examples/NAME.py
    try:
        runpy.run_path(path, run_name="__main__")
    except SystemExit as exit:
        if exit.code not in (None, 0):
            print({MARK!r} + "failed: exit " + str(exit.code), flush=True)
    except BaseException:
        traceback.print_exc(file=sys.stdout)
        print({MARK!r} + "failed", flush=True)
    sys.stdout.flush()
"""


def run_example(path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                          timeout=90, cwd=ROOT, env=subprocess_env(**env))


def run_in_one_process(paths: list[Path],
                       **env: str) -> dict[str, subprocess.CompletedProcess[str]]:
    """Run ``paths`` one after another in one child process; each one's result as if it had run
    alone: its own stdout, exit status 1 if it raised, the shared stderr."""
    proc = subprocess.run([sys.executable, "-c", RUN_IN_ONE, *map(str, paths)],
                          capture_output=True, text=True, timeout=JVM_TIMEOUT, cwd=ROOT,
                          env=subprocess_env(**env))
    outputs: dict[str, list[str]] = {}
    lines: list[str] = []
    for line in proc.stdout.splitlines(keepends=True):
        if line.startswith(MARK) and line[len(MARK):].strip() in map(str, paths):
            lines = outputs.setdefault(Path(line[len(MARK):].strip()).name, [])
        else:
            lines.append(line)
    results = {}
    for name in [path.name for path in paths]:
        out = outputs.get(name, [])
        # Not started, or the last one started when the process died: it failed.
        failed = (name not in outputs or any(line.startswith(MARK) for line in out)
                  or (proc.returncode != 0 and name == list(outputs)[-1]))
        results[name] = subprocess.CompletedProcess(proc.args, 1 if failed else 0,
                                                    "".join(out), proc.stderr)
    return results


_jvm_runs: dict[str, subprocess.CompletedProcess[str] | BaseException] = {}


def run_jvm_example(path: Path, url: str) -> subprocess.CompletedProcess[str]:
    """The JVM examples' results: the first one asked for runs them all, in one process."""
    if not _jvm_runs:
        paths = [p for p in EXAMPLES if p.name in JVM_EXAMPLES]
        try:
            _jvm_runs.update(run_in_one_process(paths, PANQUEUE_URL=url))
        except Exception as exc:  # a hang: every JVM example fails with it, none runs again
            _jvm_runs.update(dict.fromkeys(JVM_EXAMPLES, exc))
    result = _jvm_runs[path.name]
    if isinstance(result, BaseException):
        raise result
    return result


def check_output(path: Path, proc: subprocess.CompletedProcess[str]) -> list[str]:
    assert proc.returncode == 0, (
        f"{path.name} exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n"
        f"{proc.stderr}")
    lines = proc.stdout.splitlines()
    assert lines and lines[-1] == "done", f"{path.name} must print 'done' last:\n{proc.stdout}"
    for expected in EXPECTED.get(path.name, []):
        assert expected in proc.stdout, f"{path.name}: missing {expected!r} in:\n{proc.stdout}"
    return lines


def test_examples_are_found() -> None:
    assert {p.name for p in EXAMPLES} >= set(EXPECTED)


@pytest.mark.parametrize("path", [
    pytest.param(p, id=p.name,
                 marks=[pytest.mark.timeout(JVM_TIMEOUT + 60)] if p.name in JVM_EXAMPLES else [])
    for p in EXAMPLES])
def test_example_runs_against_the_url_in_panqueue_url(path: Path, redis_url: str) -> None:
    if path.name in JVM_EXAMPLES:
        proc = run_jvm_example(path, redis_url)
    else:
        proc = run_example(path, PANQUEUE_URL=redis_url)
    check_output(path, proc)
    assert "started a private" not in proc.stdout + proc.stderr


def test_example_starts_its_own_server_without_panqueue_url() -> None:
    path = ROOT / "examples" / "quickstart.py"
    proc = run_example(path)  # subprocess_env() drops an inherited PANQUEUE_URL
    lines = check_output(path, proc)
    assert lines[0].startswith("started a private server on redis://127.0.0.1:")
