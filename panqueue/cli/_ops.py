"""Operations commands: info, workers, explain, purge, check. What a person on call asks:
what is queued and how late, who is serving it, why a job is where it is, and is it all up."""

from __future__ import annotations

import dataclasses
import json
import time
from datetime import datetime
from typing import Any

import click

from panqueue import Explanation, JobState, SyncQueueClient, WorkerInfo, WorkerProcess
from panqueue._lag import lag_seconds
from panqueue.cli._common import (
    FLOAT_POSITIVE,
    RuntimeFailure,
    UsageFailure,
    client_for,
    print_json,
    require_queue,
    url_option,
)

__all__ = ["check", "explain", "info", "purge", "workers"]

_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
_COUNTED = [JobState.WAITING, JobState.DELAYED, JobState.ACTIVE, JobState.FAILED]

def _worker_dict(w: WorkerInfo | WorkerProcess) -> dict[str, Any]:
    """A worker (or a worker process, with its workers per queue) as JSON-ready values."""
    blocked = w.loop_blocked_since
    fields = {f.name: getattr(w, f.name) for f in dataclasses.fields(w)}
    if isinstance(w, WorkerProcess):
        fields["workers"] = [_worker_dict(one) for one in w.workers]
    return {**fields, "started_at": w.started_at.isoformat(),
            "heartbeat_at": w.heartbeat_at.isoformat(),
            "loop_blocked_since": None if blocked is None else blocked.isoformat()}


def _process_line(p: WorkerProcess) -> str:
    """One worker process in a line: name, host:pid, its queues, its jobs over its slots."""
    shown = ", ".join(p.running[:5]) + (f", +{len(p.running) - 5} more"
                                        if len(p.running) > 5 else "")
    return (f"{p.name}\t{p.host}:{p.pid}\t{','.join(p.queues)}\t"
            f"running {len(p.running)}/{p.concurrency}" + (f" ({shown})" if shown else "")
            + f"\tbeat {p.heartbeat_at.isoformat()}"
            + ("\tpaused" if p.paused else "")
            + ("" if p.loop_blocked_since is None else
               f"\tevent loop blocked since {p.loop_blocked_since.isoformat()}"))


def _snapshot(client: SyncQueueClient) -> dict[str, Any]:
    queues = {}
    for queue in client.queues():
        counts = client.counts(queue)
        queues[queue] = {**{s.value: counts[s] for s in _COUNTED},
                         "paused": client.is_paused(queue),
                         "lag_seconds": lag_seconds(client, queue)}
    return {"queues": queues,
            "workers": [_worker_dict(p) for p in client.worker_processes()]}


def _print_snapshot(snap: dict[str, Any]) -> None:
    queues = snap["queues"]
    if not queues:
        click.echo("no queues")
    else:
        width = max(5, *(len(q) for q in queues))
        click.echo(f"{'queue':<{width}}  " + "  ".join(f"{s.value:>9}" for s in _COUNTED)
                   + "        lag")
        for name, row in queues.items():
            lag = "-" if row["lag_seconds"] is None else f"{row['lag_seconds']:.1f} s"
            click.echo(f"{name:<{width}}  " + "  ".join(f"{row[s.value]:>9}" for s in _COUNTED)
                       + f"  {lag:>9}" + ("  (paused)" if row["paused"] else ""))
    click.echo(f"{len(snap['workers'])} live worker process(es)")
    for w in snap["workers"]:
        click.echo(f"  {w['name']}\t{w['host']}:{w['pid']}\t{','.join(w['queues'])}\t"
                   f"running {len(w['running'])}/{w['concurrency']}")


@click.command()
@click.option("--interval", type=FLOAT_POSITIVE, default=None, metavar="SECONDS",
              help="Print again every SECONDS until Ctrl-C (> 0).")
@url_option
@_JSON
def info(interval: float | None, url: str, as_json: bool) -> None:
    """Every queue (counts, lag) and the live workers.

    Lag is the age of the oldest job among the next 100 to be claimed. Workers are listed one
    line per process, with every queue it serves (as `panqueue workers`). --json prints
    {"queues": {queue: {state: count, "paused", "lag_seconds"}}, "workers": [...]} (one object
    per worker process, its per-queue entries under "workers"), one object per line with
    --interval.
    """
    with client_for(url) as client:
        while True:
            snap = _snapshot(client)
            if as_json and interval is None:
                print_json(snap)
            elif as_json:
                click.echo(json.dumps(snap, default=str))  # one object per line
            else:
                _print_snapshot(snap)
            if interval is None:
                return
            time.sleep(interval)
            if not as_json:
                click.echo()


@click.command()
@click.argument("queue", required=False)
@url_option
@_JSON
@click.option("--stop", "stop_name", metavar="NAME", default=None,
              help="Tell worker NAME to stop (as on SIGTERM: running jobs finish first).")
@click.option("--pause", "pause_name", metavar="NAME", default=None,
              help="Tell worker NAME to claim nothing until --resume (running jobs go on).")
@click.option("--resume", "resume_name", metavar="NAME", default=None,
              help="Tell a paused worker NAME to claim again.")
@click.option("--concurrency", "concurrency", metavar="NAME=N", default=None,
              help="Tell worker NAME to run up to N jobs at once.")
def workers(queue: str | None, url: str, as_json: bool, stop_name: str | None,
            pause_name: str | None, resume_name: str | None, concurrency: str | None) -> None:
    """The live worker processes (of QUEUE, or of every queue), or a command for one of them.

    From their heartbeats and the locks of the jobs they run, one line per process, whatever
    number of queues it serves: name, host:pid, its queues, the jobs it runs over its slots
    (on all its queues), its last beat and "paused" when it is. A worker that was killed is
    shown with the jobs it held until its entry expires (three heartbeats). --json prints one
    object per process, with its per-queue entries under "workers".

    --stop, --pause, --resume and --concurrency send a command (client.control) that the
    worker applies at its next heartbeat. NAME is a process's name as its line shows it: each
    queue it serves gets the command (--concurrency sets each one's). A NAME with no live
    worker exits 1.
    """
    commands = []
    for name, command in ((stop_name, "stop"), (pause_name, "pause"),
                          (resume_name, "resume")):
        if name is not None:
            if not name.strip():
                raise UsageFailure(f"--{command} needs a worker's NAME, got {name!r}")
            commands.append((name, command))
    if concurrency is not None:
        name, _, value = concurrency.rpartition("=")
        # isdigit() takes digits int() refuses ('²'): ASCII ones only.
        if not name.strip() or not (value.isascii() and value.isdigit()) or int(value) < 1:
            raise UsageFailure(f"--concurrency takes NAME=N with N a whole number >= 1, got "
                               f"{concurrency!r}")
        commands.append((name, f"concurrency={value}"))
    if len(commands) > 1:
        raise UsageFailure("give one of --stop, --pause, --resume, --concurrency at a time")
    if commands:
        [(name, command)] = commands
        with client_for(url) as client:
            if command.startswith("concurrency="):
                client.control(name, concurrency=int(command.partition("=")[2]))
            else:
                client.control(name, command)
        click.echo(f"{name}: {command.replace('=', ' ')} sent (applied at its next heartbeat)")
        return
    with client_for(url) as client:
        if queue:
            require_queue(client, queue)
        found = client.worker_processes(queue)
    if as_json:
        print_json([_worker_dict(p) for p in found])
    elif not found:
        click.echo("no live workers")
    else:
        for p in found:
            click.echo(_process_line(p))


def _explanation_dict(found: Explanation) -> dict[str, Any]:
    """An explanation as JSON-ready values: the reason and its sentence, and the facts it names
    (the jobs that hold the slots, when a delayed job is due, the retry it waits for)."""
    def iso(when: datetime | None) -> str | None:
        return None if when is None else when.isoformat()

    return {
        "state": found.state.value, "reason": found.reason, "detail": found.detail,
        "action": found.action, "due_at": iso(found.due_at), "retry_of": found.retry_of,
        "max_attempts": found.max_attempts,
        "error": None if found.error is None else found.error.to_wire(),
        "holders": [{"job_id": h.job_id, "worker": h.worker, "started_at": iso(h.started_at),
                     "running_for": h.running_for} for h in found.holders],
    }


@click.command()
@click.argument("queue")
@click.argument("job_id", metavar="ID")
@url_option
@_JSON
def explain(queue: str, job_id: str, url: str, as_json: bool) -> None:
    """Why job ID is in its state: paused, delayed until when, snoozed by its handler until
    when, blocked on which dependency, rate limited (by the queue's limit or a handler's
    RateLimited), its key busy, queued behind how many jobs (every slot taken: which jobs hold
    them, on which worker, for how long), a retry waiting out its backoff (attempt n of m, the
    error, when it is due), no live worker, running on which worker, finished, or expired (not
    started by its deadline). A hint names the command to type (`panqueue resume QUEUE`,
    `panqueue dlq QUEUE --retry ID`). --json adds the facts: holders, due_at, retry_of, error.
    An unknown ID exits 1."""
    with client_for(url) as client:
        found = client.explain(queue, job_id, tool="cli")  # hints name the command to type
    if as_json:
        print_json(_explanation_dict(found))
    else:
        click.echo(f"{job_id}: {found.state.value} ({found.reason}): {found.detail}")


@click.command()
@click.argument("queue")
@click.option("--state", "states", multiple=True, metavar="STATE",
              type=click.Choice([s.value for s in JobState]),
              help="Delete only the jobs in this state (repeatable; default: every state but "
                   "active, and the queue's settings when no worker serves it).")
@click.option("--yes", is_flag=True, help="Confirm: purging cannot be undone.")
@url_option
def purge(queue: str, states: tuple[str, ...], yes: bool, url: str) -> None:
    """Delete the jobs of QUEUE (in the --state states), and print how many.

    Active jobs are deleted only with --state active (their workers then lose their locks).
    Without --yes nothing is deleted and the command exits 2.
    """
    if not yes:
        raise UsageFailure(f"purging {queue!r} cannot be undone: add --yes to confirm")
    with client_for(url) as client:
        require_queue(client, queue)
        deleted = client.purge(queue, list(states) or None)
    click.echo(f"{queue}: {deleted} job(s) deleted")


@click.command()
@click.argument("queues", nargs=-1, metavar="[QUEUE]...")
@url_option
def check(queues: tuple[str, ...], url: str) -> None:
    """Exit 0 when Redis answers and a live worker serves each QUEUE, else 1 with one line.

    For health checks and deploy scripts: prints `ok` on success. A worker an operator paused
    (`panqueue workers --pause NAME`) serves nothing until resumed.
    """
    with client_for(url) as client:
        live = {q: client.workers(q) for q in queues}
    unserved = [q for q, workers in live.items() if not workers]
    if unserved:
        raise RuntimeFailure(f"no live worker serves {', '.join(repr(q) for q in unserved)}")
    held = [q for q, workers in live.items() if all(w.paused for w in workers)]
    if held:
        raise RuntimeFailure(f"every live worker of {', '.join(repr(q) for q in held)} is paused "
                             "by an operator (panqueue workers --resume NAME)")
    click.echo("ok")
