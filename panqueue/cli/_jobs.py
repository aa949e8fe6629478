"""Commands on jobs and queues: enqueue, stats, job, jobs, cancel, remove, dlq, pause,
resume, schedules. Each opens one client, does one thing through its public methods, prints.

Longer than 400 lines: ten short commands, each a click function over one client call, with
their help texts (docs/cli.md is made from them).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import click

from panqueue._client import SyncQueueClient
from panqueue._job import JobInfo, JobState
from panqueue._listing import columns, delayed_because, timestamp
from panqueue.cli._common import (
    EXIT_ERROR,
    POSITIVE_INT,
    RuntimeFailure,
    UsageFailure,
    client_for,
    parse_json,
    print_error,
    print_json,
    require_queue,
    url_option,
)
from panqueue.errors import JobNotFound

__all__ = ["cancel", "dlq", "enqueue", "job", "jobs", "pause", "remove", "resume",
           "schedules", "signal", "stats"]

_STATES = [s.value for s in JobState]
_TABLE_STATES = [JobState.WAITING, JobState.DELAYED, JobState.BLOCKED, JobState.ACTIVE,
                 JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED]
_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
_TAG = click.option("--tag", default=None, metavar="TAG", help="Only the jobs added with TAG.")


@click.command()
@click.argument("queue")
@click.argument("data", metavar="JSON")
@url_option
@click.option("--delay", type=float, default=None, metavar="SECONDS",
              help="Seconds before the job may run.")
@click.option("--priority", type=int, default=None,
              help="Higher runs first (-1,000,000 to 1,000,000; default 0).")
@click.option("--job-id", default=None, metavar="ID",
              help="A custom id, not all digits (adding it twice is a no-op).")
@click.option("--tag", "tags", multiple=True, metavar="TAG",
              help="A tag to find the job by (repeat for more, up to 16).")
def enqueue(queue: str, data: str, url: str, delay: float | None, priority: int | None,
            job_id: str | None, tags: tuple[str, ...]) -> None:
    """Add one job whose data is the JSON value JSON, and print its id.

    \b
    $ panqueue enqueue emails '{"to": "ada@example.com"}' --priority 5
    2
    """
    value = parse_json(data, "the job data")
    with client_for(url) as client:
        handle = client.queue(queue).add(value, delay=delay, priority=priority, job_id=job_id,
                                         tags=list(tags) or None)
    click.echo(handle.id)


@click.command()
@click.argument("queue", required=False)
@url_option
@_JSON
def stats(queue: str | None, url: str, as_json: bool) -> None:
    """Job counts per state, for QUEUE or every queue in the database.

    --json prints {queue: {state: count, ..., "paused": bool}}. A named queue that has never
    been used exits 2.
    """
    with client_for(url) as client:
        if queue:
            require_queue(client, queue)
        names = [queue] if queue else client.queues()
        rows = [(name, client.counts(name), client.is_paused(name)) for name in names]
    if as_json:
        print_json({q: {**{s.value: n for s, n in c.items()}, "paused": p} for q, c, p in rows})
        return
    if not rows:
        click.echo("no queues")
        return
    width = max(5, *(len(q) for q, _, _ in rows))
    click.echo(f"{'queue':<{width}}  " + "  ".join(f"{s.value:>9}" for s in _TABLE_STATES))
    for name, counts, paused in rows:
        line = f"{name:<{width}}  " + "  ".join(f"{counts[s]:>9}" for s in _TABLE_STATES)
        click.echo(line + ("  (paused)" if paused else ""))


@click.command()
@click.argument("queue")
@click.argument("job_id", metavar="ID")
@url_option
@_JSON
def job(queue: str, job_id: str, url: str, as_json: bool) -> None:
    """Print one job: its state, times, data, result, error with its traceback as Python
    prints it, a durable job's steps (each with when it was stored) and the signal it waits
    for or the time it sleeps until, attempt history and log lines (each with its time and
    attempt).

    --json prints the fields instead: id, queue, state, data, attempts, priority, progress,
    logs (the newest 1000 lines), result, error (type, message, traceback), failure_reason,
    history, options, enqueued_at, started_at, finished_at, expires_at and run_at (when a
    delayed job is due; ISO 8601, UTC), worker (the worker running an active job), for a job
    waiting to run again after a failed attempt retry_of (that attempt) and max_attempts,
    log_lines (each line's at, attempt and message), tags (those it was added with), and for a
    durable job steps (name, result, at) and, while it is delayed, waiting_for (the signal it
    waits for) or sleeping_until. An unknown ID exits 1.
    """
    with client_for(url) as client:
        info = client.get_job(queue, job_id)
    if as_json:
        print_json(info.to_dict())
    else:
        click.echo(_human(info))


def _value(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def _human(info: JobInfo) -> str:
    """``panqueue job``'s text: one field a line, then the error with its traceback as
    written (not a JSON string), the history and the log lines."""
    state = info.state.value + (f" ({info.failure_reason})" if info.failure_reason else "")
    rows = [("job", f"{info.id} in {info.queue}"), ("state", state),
            ("attempts", str(info.attempts)), ("priority", str(info.priority)),
            ("enqueued", timestamp(info.enqueued_at)), ("started", timestamp(info.started_at)),
            ("finished", timestamp(info.finished_at))]
    if info.expires_at is not None:
        rows.append(("expires", timestamp(info.expires_at)))
    if info.run_at is not None:
        rows.append(("due", timestamp(info.run_at)))
    if info.retry_of is not None:
        rows.append(("retry", delayed_because(info)))
    if info.worker is not None:
        rows.append(("worker", info.worker))
    if info.waiting_for is not None:
        rows.append(("waits for", f"signal {info.waiting_for}"))
    if info.sleeping_until is not None:
        rows.append(("sleeps", f"until {timestamp(info.sleeping_until)}"))
    rows.append(("data", _value(info.data)))
    if info.progress is not None:
        rows.append(("progress", _value(info.progress)))
    if info.result is not None or info.state == JobState.COMPLETED:
        rows.append(("result", _value(info.result)))
    out = [f"{name + ':':<10} {text}" for name, text in rows]
    if info.error is not None:
        out += ["", f"error: {info.error.type}: {info.error.message}"]
        if info.error.traceback:
            out.append(info.error.traceback.rstrip())
    if info.steps:
        out += ["", "steps:"]
        for name, result in info.steps.items():
            out.append(f"  {timestamp(info.steps_at.get(name))}  {name}  {_value(result)}")
    if info.history:
        out += ["", "history:"]
        for entry in info.history:
            text = f"{entry.get('type', '')}: {entry.get('message', '')}".strip(": ")
            took = entry.get("duration_ms")
            out.append(f"  attempt {entry.get('attempt', '?')}  {text}"
                       + (f"  ({took / 1000:g} s)" if isinstance(took, int | float) else ""))
    if info.log_lines:
        out += ["", "logs:"]
        for line in info.log_lines:
            attempt = "" if line.attempt is None else f"attempt {line.attempt}  "
            at = "" if line.at is None else timestamp(line.at) + "  "
            out.append(f"  {at}{attempt}{line.message}")
    return "\n".join(out)


def _table(state: JobState, found: list[JobInfo]) -> list[str]:
    """A heading line and one line per job: its id, then the columns that matter for the
    state (panqueue/_listing.py), separated by tabs."""
    shown = columns(state)
    now = datetime.now(UTC)
    lines = ["\t".join(("id", *(column.heading for column in shown)))]
    for info in found:
        lines.append("\t".join((info.id, *(column.cell(info, now) for column in shown))))
    return lines


@click.command()
@click.argument("queue")
@click.option("--state", type=click.Choice(_STATES), default=JobState.WAITING.value,
              show_default=True, help="List the jobs in this state.")
@click.option("--limit", type=POSITIVE_INT, default=100, show_default=True,
              help="List at most N jobs.", metavar="N")
@_TAG
@click.option("--error-type", default=None, metavar="TYPE",
              help="Only the jobs whose last error is of type TYPE (TimeoutError).")
@url_option
@_JSON
def jobs(queue: str, state: str, limit: int, tag: str | None, error_type: str | None, url: str,
         as_json: bool) -> None:
    """List the jobs of QUEUE in one state (client.list_jobs): claim order for waiting, due
    time for delayed, newest first for the finished states.

    A heading line, then one line per job (tab-separated) with its id and what matters for
    the state: delayed, when it is due and why (retry n of m after which error, snoozed by its
    handler, sleeping until when or waiting for which signal, delayed by the producer);
    active, when it started, for how long it has run and on which worker; failed, its failure
    reason, error type and message; completed, how long it took; waiting, for how long it has
    waited. --json prints the jobs as `panqueue job --json` does. --tag and --error-type
    filter on the server; with --tag the jobs come in the order they were added (finished
    states newest first).
    """
    with client_for(url) as client:
        require_queue(client, queue)
        found = client.list_jobs(queue, state, tag=tag, error_type=error_type, limit=limit)
    if as_json:
        print_json([info.to_dict() for info in found])
    elif not found:
        click.echo(f"no {state} jobs in {queue!r}")
    else:
        for line in _table(JobState(state), found):
            click.echo(line)


_UNFINISHED = [JobState.WAITING.value, JobState.DELAYED.value, JobState.BLOCKED.value,
               JobState.ACTIVE.value]


@click.command()
@click.argument("queue")
@click.argument("job_id", metavar="[ID]", required=False)
@_TAG
@click.option("--state", type=click.Choice(_UNFINISHED), default=None,
              help="With --tag, or alone: cancel every job in this state.")
@url_option
def cancel(queue: str, job_id: str | None, tag: str | None, state: str | None,
           url: str) -> None:
    """Cancel job ID of QUEUE, or every job that --tag and --state pick: it will not run; a
    running job is stopped by its worker.

    Prints `ID: cancelled (was STATE)`. A job that already finished (completed, failed or
    cancelled) is left as it is and exits 1, saying so; an unknown ID exits 1. With --tag or
    --state, prints how many jobs were cancelled (finished ones are left as they are, so
    running it again cancels only what is left).
    """
    if _by_filter(url, queue, job_id, tag, "cancel",
                  lambda c: f"{c.cancel_jobs(queue, tag=tag, state=state)} job(s) cancelled in "
                            f"{queue!r}", state):
        return
    assert job_id is not None  # _by_filter acts unless an ID was given
    with client_for(url) as client:
        was = client.cancel(queue, job_id)
    if was.is_final:
        # The store leaves a finished job unchanged: "cancelled" would tell the operator that
        # something stopped when nothing did.
        raise RuntimeFailure(f"job {job_id!r} in queue {queue!r} already {was.value}: "
                             "nothing was cancelled")
    if was is JobState.ACTIVE:
        click.echo(f"{job_id}: cancel requested (running; its worker stops it)")
    else:
        click.echo(f"{job_id}: cancelled (was {was.value})")


@click.command()
@click.argument("queue")
@click.argument("job_id", metavar="ID")
@click.argument("name")
@click.argument("payload", metavar="[JSON]", required=False)
@url_option
def signal(queue: str, job_id: str, name: str, payload: str | None, url: str) -> None:
    """Send durable job ID of QUEUE the signal NAME, with the JSON value JSON (default null):
    its `job.wait_for(NAME)` returns it (client.signal).

    Prints `ID: signal NAME sent`. The signal is kept until the job waits for it, and a job
    waiting for it now is woken. A job that already finished exits 1 (nothing is kept); an
    unknown ID exits 1; invalid JSON exits 2.

    \b
    $ panqueue signal onboarding 42 verified '{"by": "ann"}'
    42: signal verified sent
    """
    value: Any = None
    if payload is not None:
        value = parse_json(payload, "the signal's payload")
    with client_for(url) as client:
        if not client.signal(queue, job_id, name, value):
            raise RuntimeFailure(f"job {job_id!r} in queue {queue!r} already finished: the "
                                 "signal was not kept")
    click.echo(f"{job_id}: signal {name} sent")


@click.command()
@click.argument("queue")
@click.argument("job_id", metavar="[ID]", required=False)
@_TAG
@click.option("--state", type=click.Choice([s for s in _STATES if s != "active"]),
              default=None, help="With --tag, or alone: remove every job in this state.")
@url_option
def remove(queue: str, job_id: str | None, tag: str | None, state: str | None,
           url: str) -> None:
    """Delete job ID of QUEUE and its record from Redis, or every job that --tag and --state
    pick (and prints how many).

    A running job is refused (cancel it first); an unknown ID exits 1.
    """
    if _by_filter(url, queue, job_id, tag, "remove",
                  lambda c: f"{c.remove_jobs(queue, tag=tag, state=state)} job(s) removed from "
                            f"{queue!r}", state):
        return
    assert job_id is not None  # _by_filter acts unless an ID was given
    with client_for(url) as client:
        if not client.remove(queue, job_id):
            raise RuntimeFailure(f"job {job_id!r} not found in queue {queue!r}")
    click.echo(f"{job_id}: removed")


@click.command()
@click.argument("queue")
@click.option("--retry", "retry", is_flag=True,
              help="Move failed jobs (the IDs given, else all) back to waiting.")
@click.argument("ids", metavar="[ID]...", nargs=-1)
@click.option("--limit", type=POSITIVE_INT, default=100, show_default=True, metavar="N",
              help="List at most N jobs.")
@_TAG
@click.option("--error-type", default=None, metavar="TYPE",
              help="Only the failed jobs whose last error is of type TYPE (TimeoutError).")
@url_option
@_JSON
def dlq(queue: str, retry: bool, ids: tuple[str, ...], limit: int, tag: str | None,
        error_type: str | None, url: str, as_json: bool) -> None:
    """The dead-letter set (FAILED jobs) of QUEUE: the newest --limit, printed oldest first.

    Each line shows id, failure reason, attempts and last error. --json prints a list of
    {id, reason, error, attempts, finished_at}. --retry moves the failed jobs given by ID
    (all of them without IDs) back to waiting with a fresh set of attempts, and prints how
    many moved. A given ID that is unknown or not failed is named with its state on stderr and
    the command exits 1 (the failed ones among the IDs still move). --tag and --error-type
    pick the failed jobs to list, or with --retry to move back (every one they pick; running
    it again moves only those that failed since).
    """
    if ids and not retry:
        raise UsageFailure("job IDs are only taken with --retry")
    filtered = tag is not None or error_type is not None
    if ids and filtered:
        raise UsageFailure("give job IDs or --tag / --error-type, not both")
    with client_for(url) as client:
        require_queue(client, queue)
        if retry and filtered:
            moved = client.retry_failed(queue, tag=tag, error_type=error_type)
            click.echo(f"{moved} job(s) moved back to waiting")
            return
        if retry:
            _retry(client, queue, ids)
            return
        failed = client.list_jobs(queue, JobState.FAILED, tag=tag, error_type=error_type,
                                  limit=limit)
    entries: list[dict[str, Any]] = [{
        "id": info.id,
        "reason": info.failure_reason,
        "error": None if info.error is None else f"{info.error.type}: {info.error.message}",
        "attempts": info.attempts,
        "finished_at": None if info.finished_at is None else info.finished_at.isoformat(),
    } for info in reversed(failed)]
    if as_json:
        print_json(entries)
    elif not entries:
        click.echo(f"dead-letter set of {queue!r} is empty")
    else:
        for e in entries:
            click.echo(f"{e['id']}\t{e['reason']}\t{e['attempts']} attempt(s)\t{e['error']}")


def _retry(client: SyncQueueClient, queue: str, ids: tuple[str, ...]) -> None:
    """``dlq --retry``: move the failed jobs back and name each given ID that was not moved.

    The retry script only counts what it moved, so the states are read first: an ID that is
    unknown or not failed is reported instead of being counted silently as "0 moved"; and
    after, one that stayed failed (a dependency that cannot complete) with the reason the
    script recorded."""
    if not ids:
        click.echo(f"{client.retry_failed(queue, None)} job(s) moved back to waiting")
        return
    refused: list[str] = []
    chosen: list[str] = []
    for job_id in dict.fromkeys(ids):  # each ID once, in the order given
        try:
            state = client.get_job(queue, job_id).state
        except JobNotFound:
            refused.append(f"job {job_id!r} not retried: not found in queue {queue!r}")
            continue
        if state is JobState.FAILED:
            chosen.append(job_id)
        else:
            refused.append(f"job {job_id!r} not retried: it is {state.value}, not failed")
    if chosen:
        moved = client.retry_failed(queue, chosen)
        click.echo(f"{moved} job(s) moved back to waiting")
        if moved < len(chosen):  # a job whose dependency cannot complete stays failed
            for job_id in chosen:
                try:
                    info = client.get_job(queue, job_id)
                except JobNotFound:
                    continue
                if info.state is JobState.FAILED:
                    why = info.error.message if info.error is not None else "it stays failed"
                    refused.append(f"job {job_id!r} not retried: {why}")
    if refused:
        for line in refused:
            print_error(line)
        raise click.exceptions.Exit(EXIT_ERROR)


@click.command()
@click.argument("queue")
@url_option
def pause(queue: str, url: str) -> None:
    """Stop every worker from claiming jobs of QUEUE.

    Adds still queue and running jobs finish. A queue never used exits 2.
    """
    with client_for(url) as client:
        require_queue(client, queue)
        client.pause(queue)
    click.echo(f"{queue}: paused")


@click.command()
@click.argument("queue")
@url_option
def resume(queue: str, url: str) -> None:
    """Let workers claim jobs of a paused QUEUE again, and wake idle ones."""
    with client_for(url) as client:
        require_queue(client, queue)
        client.resume(queue)
    click.echo(f"{queue}: resumed")


@click.command()
@click.argument("queue", required=False)
@url_option
@click.option("--remove", "remove_name", metavar="NAME", default=None,
              help="Delete schedule NAME of QUEUE from Redis.")
@_JSON
def schedules(queue: str | None, url: str, remove_name: str | None, as_json: bool) -> None:
    """List schedules (repeatable and cron jobs) with their next runs, or remove one.

    Each line shows queue, name, timetable, time zone and next run. A worker whose registry
    still defines a removed schedule registers it again when it starts.
    """
    with client_for(url) as client:
        if remove_name:
            if not queue:
                raise UsageFailure("--remove needs the QUEUE the schedule belongs to")
            if not client.remove_schedule(queue, remove_name):
                raise UsageFailure(f"no schedule {remove_name!r} in queue {queue!r}")
            click.echo(f"schedule {remove_name!r} removed from {queue!r}")
            return
        if queue:
            require_queue(client, queue)
        names = [queue] if queue else client.queues()
        found = [info for name in names for info in client.schedules(name)]
    if as_json:
        print_json([{"name": i.name, "queue": i.queue, "next_run": i.next_run.isoformat(),
                     **i.definition} for i in found])
    elif not found:
        click.echo("no schedules")
    else:
        for i in found:
            when = i.definition.get("cron") or f"every {i.definition.get('every')} s"
            click.echo(f"{i.queue}\t{i.name}\t{when} ({i.definition.get('tz')})\t"
                       f"next {i.next_run.isoformat()}")


def _by_filter(url: str, queue: str, job_id: str | None, tag: str | None, verb: str,
               act: Callable[[SyncQueueClient], str], state: str | None) -> bool:
    """``cancel`` and ``remove`` of every job that --tag and --state pick: without a job ID,
    run ``act`` (which says how many it changed), print its line and return True; with an ID
    (and neither option), return False for the command to act on that job."""
    if job_id is not None and (tag is not None or state is not None):
        raise UsageFailure("give a job ID or --tag / --state, not both")
    if job_id is not None:
        return False
    if tag is None and state is None:
        raise UsageFailure(f"give a job ID, or --tag / --state to {verb} every job they pick")
    with client_for(url) as client:
        require_queue(client, queue)
        click.echo(act(client))
    return True
