"""scripts/torture.py: worker processes under a minute of faults lose no job, complete none
twice, never run one job twice at once in one process, start no job of a flow before its
dependency, answer a second add under a dedup key with the key's job, fire each batch's
callback once, and do not die; a partitioned queue is redeployed with another partition count
mid-run, and a producer that learned the old count re-routes.

The checker is tested too: its overlap and journal logic on hand-made runs.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.bounds import LONG
from tests.helpers import ROOT, subprocess_env


def load_torture() -> ModuleType:
    spec = importlib.util.spec_from_file_location("torture", ROOT / "scripts" / "torture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["torture"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


torture = load_torture()


def run(job: str, worker: int, start: int, end: int | None, name: str) -> object:
    return torture.Run(name, job, 1, worker, worker, start, end, "ok" if end else "")


def test_overlaps_are_counted_per_worker_and_across_workers() -> None:
    by_job = {
        "same-worker": [run("same-worker", 1, 0, 10, "a1"), run("same-worker", 1, 5, 15, "a2")],
        "two-workers": [run("two-workers", 1, 0, 10, "b1"), run("two-workers", 2, 5, 15, "b2")],
        "one-after-the-other": [run("one-after-the-other", 1, 0, 10, "c1"),
                                run("one-after-the-other", 1, 10, 20, "c2")],
        "never-ended": [run("never-ended", 3, 0, None, "d1"), run("never-ended", 3, 50, 60, "d2")],
    }
    same, across = torture.find_overlaps(by_job)
    assert sorted((earlier.run, later.run) for earlier, later in same) == [
        ("a1", "a2"), ("d1", "d2")]
    assert across == 1


def test_journal_runs_without_an_end_end_when_their_worker_was_gone(tmp_path: Path) -> None:
    (tmp_path / "journal-100.log").write_text(
        "S r1 t-000001 1 100 100 1000\n"
        "E r1 2000 ok\n"
        "S r2 t-000002 1 100 100 1500\n")
    (tmp_path / "journal-101.log").write_text(  # a subprocess child of worker 100
        "S r3 t-000003 2 100 101 1600\n"
        "E r3 9000 Cancelled\n")
    runs = {r.run: r for r in torture.read_journals(tmp_path, {100: 5000})}
    assert (runs["r1"].end, runs["r1"].outcome) == (2000, "ok")
    assert (runs["r2"].end, runs["r2"].outcome) == (5000, "")
    assert (runs["r3"].worker, runs["r3"].pid, runs["r3"].outcome) == (100, 101, "Cancelled")


def test_a_flow_job_that_started_before_its_dependency_completed_is_counted() -> None:
    by_job = {
        "parent": [run("parent", 1, 0, 1000, "p1")],
        "child-after": [run("child-after", 2, 1500, 2000, "c1")],
        "child-before": [run("child-before", 2, 500, 2000, "c2")],
        # The dependency's first run was abandoned; its second ended ok at 3000.
        "parent-retried": [run("parent-retried", 1, 0, None, "p2"),
                           run("parent-retried", 1, 2000, 3000, "p3")],
        "child-early": [run("child-early", 2, 2500, 2600, "c3")],
        "child-never-ran": [],
    }
    flows = {"child-after": "parent", "child-before": "parent",
             "child-early": "parent-retried", "child-never-ran": "parent"}
    assert sorted(torture.flow_violations(flows, by_job)) == ["child-before", "child-early"]


# Every run: a minute, the shortest in which seed 1's chaos loop uses every kind of fault.
# With --long: the three minutes of docs/reliability.md (6 workers, 6,000 jobs, seed 11).
RUN = (["--workers", "6", "--jobs", "6000", "--seconds", "180", "--drain-seconds", "40",
        "--seed", "11"] if LONG else
       ["--workers", "4", "--jobs", "1500", "--seconds", "60", "--drain-seconds", "40",
        "--seed", "1"])
JOBS = int(RUN[RUN.index("--jobs") + 1])


@pytest.mark.timeout(420 if LONG else 200)
def test_a_minute_of_chaos_loses_no_job_and_completes_none_twice() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "torture.py"), *RUN],
        capture_output=True, text=True, timeout=410 if LONG else 190, cwd=ROOT,
        env=subprocess_env())
    report = f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr[-5000:]}"
    lines = proc.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("{"), report
    figures = json.loads(lines[-1])
    assert figures["added"] == JOBS, report
    assert figures["completed"] == JOBS, report
    zeros = {name: figures[name] for name in (
        "lost", "completed_twice", "overlapping_runs_same_worker", "completed_without_run",
        "events_missed_by_tail", "add_given_up", "workers_died",
        "flow_jobs_started_before_their_dependency", "dedup_mismatches",
        "batch_callbacks_missing_or_twice", "partition_count_changes_failed")}
    assert zeros == dict.fromkeys(zeros, 0), report
    assert proc.returncode == 0, report
    # The chaos did happen: every kind of fault, and faults that bit.
    assert set(figures["chaos_actions"]) == {
        "blackhole", "client_kill", "cut", "delay", "drop_replies", "kill_worker", "oom",
        "restart_redis"}, report
    assert figures["workers_killed"] >= 1 and figures["replies_dropped"] >= 1, report
    # The partitioned queue's flows and dedup keys were there to check.
    assert figures["flow_jobs"] >= 10 and figures["dedup_keys"] >= 10, report
    assert figures["batches"] >= 10, report
    # The partitioned queue changed its count mid-run (3 -> 4), and the producer's client that
    # had learned 3 partitions was refused by the new layout and re-routed its add.
    assert figures["partition_count_changes"] == 1, report
    assert figures["partition_counts"] == [3, 4], report
    assert figures["stale_layout_adds"] >= 1, report
    # Workers of both backends ran jobs through the faults, the server's CLIENT KILL included.
    assert figures["runs_by_backend"].get("asyncio", 0) >= 100, report
    assert figures["runs_by_backend"].get("trio", 0) >= 100, report
