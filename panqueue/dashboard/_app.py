"""The dashboard's routes: server-rendered pages (Jinja2, autoescaped), JSON endpoints for the
live parts and for the whole of a job's parts (its page shows a bounded preview of each), and
the actions, each a POST checked for its CSRF token.

Every route reads and acts through one :class:`~panqueue.SyncQueueClient` (thread-safe and
pooled); Starlette runs the sync endpoints in its thread pool, so the app works the same under
asyncio and trio servers. Queue names and job ids travel in query strings and form fields,
never in paths, so any name (slashes included) round-trips.

Longer than our usual 400 lines: it is the route table, one method per route or action, and
reads best whole; the sessions, tokens and headers live in ``_security.py``, the reads in
``_reads.py``.

Longer than 400 lines: every route and guarded action of the dashboard, so that the security
checks (Host, Origin, CSRF, read-only) sit beside each action they guard; the reads are in
``_reads.py``, the checks' machinery in ``_security.py``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from panqueue import (
    ConfigError,
    ConnectionError,
    JobNotFound,
    JobState,
    PanqueueError,
    SyncQueueClient,
)
from panqueue._listing import columns
from panqueue._store.ops import Flow, events_written, read_flow
from panqueue._store.ops import partitions as parted
from panqueue._store.transport import redact_url
from panqueue.dashboard._flow import NODE_HEIGHT, NODE_WIDTH, draw
from panqueue.dashboard._reads import (
    QueueNames,
    Rates,
    age,
    bounded,
    bounded_json,
    bounded_steps,
    live_workers,
    overview,
    pretty_json,
    preview,
    progress,
    recent_events,
    timestamp,
)
from panqueue.dashboard._security import (
    AUTH_COOKIE,
    LOGIN_MAX_AGE,
    SESSION_COOKIE,
    Guard,
    Signer,
    cookie_header,
    host_names,
    route_path,
)

__all__ = ["build_app"]

HERE = Path(__file__).resolve().parent
PAGE_SIZE = 50
MAX_PAGE_SIZE = 500
MAX_OFFSET = 2**53  # past any real queue, and still an integer Redis takes
# A position in a queue's events: one stream id, or on a partitioned queue one per partition,
# joined by commas (read_events; at most 1,024 partitions).
_STREAM_ID = re.compile(r"\d{1,20}-\d{1,20}(?:,\d{1,20}-\d{1,20}){0,1023}")
# What a finished action says on the page it returns to ("done" query parameter).
_DONE = {
    "pause": "Queue paused.",
    "resume": "Queue resumed.",
    "retry": "{n} job(s) moved back to waiting.",
    "retry_all": "{n} failed job(s) moved back to waiting.",
    "cancel": "Job cancelled (it was {was}).",
    "remove": "Job removed.",
    "purge": "{n} job(s) deleted.",
    "bulk_cancel": "{n} job(s) cancelled.",
    "bulk_retry": "{n} job(s) moved back to waiting.",
    "bulk_remove": "{n} job(s) removed.",
    "control": "Command sent: the worker applies it at its next heartbeat.",
}
_NOTICE_PARAMS = frozenset({"done", "n", "was"})
ACTIONS = ("pause", "resume", "retry", "retry_all", "cancel", "remove", "purge", "bulk",
           "control")
# What a bulk action over a list does, the states it can change, and its button's verb.
_BULK = {
    "cancel": ((JobState.WAITING, JobState.DELAYED, JobState.BLOCKED, JobState.ACTIVE),
               "Cancel"),
    "retry": ((JobState.FAILED,), "Retry"),
    "remove": (tuple(s for s in JobState if s is not JobState.ACTIVE), "Remove"),
}
_CONTROL = ("stop", "pause", "resume")


class BadRequest(Exception):
    """A request the dashboard cannot serve as asked: 400 with one line."""


class Dashboard:
    """The app's state: the client, the rate windows, the templates and the signer."""

    def __init__(self, url: str | None, read_only: bool, token: str | None,
                 prefix: str | None = None) -> None:
        self.client = SyncQueueClient(url, prefix=prefix)
        self.read_only = read_only
        self.signer = Signer(token)
        self.rates = Rates(self.client)
        self.queue_names = QueueNames(self.client)
        self.templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True,
            undefined=jinja2.StrictUndefined)
        self.templates.filters.update(age=age, timestamp=timestamp, pretty=pretty_json,
                                      preview=preview, progress=progress)

    # ------------------------------------------------------------------ rendering

    def link(self, request: Request, path: str, **params: Any) -> str:
        """A URL of the app (under the prefix it is mounted at), with query parameters."""
        query = urlencode({k: v for k, v in params.items() if v is not None}, doseq=True)
        root: str = request.scope.get("root_path", "")
        return root + path + (f"?{query}" if query else "")

    def render(self, request: Request, template: str, status: int = 200,
               **context: Any) -> HTMLResponse:
        sid = request.state.session
        done = request.query_params.get("done")
        notice = None
        if done in _DONE:
            # Only a count and a state name come from the URL: a crafted link cannot put
            # words of its own on the page.
            n = request.query_params.get("n", "")
            was = request.query_params.get("was", "")
            notice = _DONE[done].format(
                n=n if n.isascii() and n.isdigit() else "?",
                was=was if was in {s.value for s in JobState} else "?")
        page = self.templates.get_template(template).render(
            base=request.scope.get("root_path", ""),
            link=lambda path, **params: self.link(request, path, **params),
            csrf=self.signer.csrf_token(sid),
            read_only=self.read_only,
            login=self.signer.token is not None,
            # Which server, only to those who may see it (not on an anonymous login page).
            server=redact_url(self.client.url) if request.state.authenticated else "",
            notice=notice,
            here=_here(request),
            states=list(JobState),
            **context)
        return HTMLResponse(page, status_code=status)

    def problem(self, request: Request, status: int, message: str) -> HTMLResponse:
        return self.render(request, "problem.html", status=status, message=message)

    # ------------------------------------------------------------------ pages

    def index(self, request: Request) -> Response:
        snap = overview(self.client, self.queue_names, self.rates)
        return self.render(request, "overview.html", overview=snap)

    def queue(self, request: Request) -> Response:
        params = request.query_params
        name = _required(params, "q")
        state = _state(params.get("state", JobState.WAITING.value))
        offset = _int(params, "offset", 0, 0, MAX_OFFSET)
        limit = _int(params, "limit", PAGE_SIZE, 1, MAX_PAGE_SIZE)
        tag = params.get("tag") or None
        error_type = params.get("error_type") or None
        counts = self.client.counts(name)
        jobs = self.client.list_jobs(name, state, tag=tag, error_type=error_type, limit=limit,
                                     offset=offset)
        filtered = tag is not None or error_type is not None
        # A filtered list's size is not known without reading it all: it pages on as long as
        # a page comes back full.
        total = counts[state] if not filtered else offset + len(jobs) + (
            1 if len(jobs) == limit else 0)
        last = max(0, (total - 1) // limit * limit)
        bulk = [(do, verb) for do, (states, verb) in _BULK.items() if state in states
                and (error_type is None or do == "retry")]
        return self.render(
            request, "queue.html", queue=name, state=state, counts=counts, jobs=jobs,
            offset=offset, limit=limit, total=total, last_offset=last,
            paused=self.client.is_paused(name), columns=columns(state), now=datetime.now(UTC),
            tag=tag, error_type=error_type, filtered=filtered, bulk=bulk)

    def job(self, request: Request) -> Response:
        name = _required(request.query_params, "q")
        job_id = _required(request.query_params, "id")
        job = self.client.get_job(name, job_id)
        try:
            why = self.client.explain(name, job_id, tool="dashboard")
        except JobNotFound:
            why = None
        columns = list(dict.fromkeys(key for entry in job.history for key in entry))
        # Each value bounded (_reads.PREVIEW_CHARS), the whole one a link away (api_job_raw).
        shown = {"data": bounded_json(job.data), "result": bounded_json(job.result),
                 "progress": progress(job.progress), "options": bounded_json(job.options),
                 "logs": bounded("\n".join(job.logs)),
                 "traceback": bounded(job.error.traceback if job.error is not None
                                      and job.error.traceback else ""),
                 "error": bounded(job.error.message if job.error is not None else "")}
        history = [{column: bounded(str(value)).text for column, value in entry.items()}
                   for entry in job.history]
        steps = bounded_steps(job.steps)
        flow = self._flow(name, job_id)
        return self.render(request, "job.html", queue=name, job=job, explanation=why,
                           history_columns=columns, history=history, shown=shown, steps=steps,
                           steps_cut=any(result.cut for _, result in steps),
                           flow=None if flow is None or flow.empty else draw(flow),
                           node_width=NODE_WIDTH, node_height=NODE_HEIGHT)

    def _flow(self, queue: str, job_id: str) -> Flow | None:
        """The job's flow (bounded: ``ops.FLOW_NODES``), read in its partition; None once
        the job is gone."""
        try:
            return self.client.producer.run(self.client.producer.on_job(queue, job_id,
                                                                        read_flow))
        except JobNotFound:
            return None

    def workers(self, request: Request) -> Response:
        return self.render(request, "workers.html",
                           workers=live_workers(self.client, self.queue_names.get()))

    def schedules(self, request: Request) -> Response:
        found = [s for q in self.queue_names.get() for s in self.client.schedules(q)]
        return self.render(request, "schedules.html", schedules=found)

    def events(self, request: Request) -> Response:
        name = _required(request.query_params, "q")
        events, position, watched = recent_events(self.client, name, None)
        producer = self.client.producer
        written = producer.run(producer.on_all(name, events_written))
        return self.render(request, "events.html", queue=name, events=list(reversed(events)),
                           position=position, written=written, watched=watched)

    def bulk_form(self, request: Request) -> Response:
        """The confirmation of a bulk action over a list: how many jobs it will touch, read
        now, and the form that does it (the selected jobs, or every job the filter picks)."""
        params = request.query_params
        name = _required(params, "q")
        state = _state(_required(params, "state"))
        do, scope = _bulk_choice(_required(params, "do"))
        tag = params.get("tag") or None
        error_type = params.get("error_type") or None
        states, verb = _BULK[do]
        if state not in states:
            raise BadRequest(f"{do} does not apply to {state.value} jobs")
        ids = [i for i in params.getlist("id") if i][:MAX_PAGE_SIZE]
        if scope == "selected":
            if not ids:
                raise BadRequest("no job is selected: tick the jobs first")
            ids = self._still_in(name, ids, state)
            n = len(ids)
        else:
            ids = []
            if error_type is not None and do != "retry":
                raise BadRequest("only retry takes an error type filter")
            n = self.client.producer.run(self.client.producer.on_all(
                name, parted.all_count_matching, [state], tag, error_type))
        return self.render(request, "bulk.html", queue=name, state=state, do=do, verb=verb,
                           scope=scope, tag=tag, error_type=error_type, ids=ids, n=n)

    def _still_in(self, queue: str, ids: list[str], state: JobState) -> list[str]:
        """The jobs of ``ids`` still in ``state``, the list's tab (a selected job that has
        moved on since the page was drawn is left alone)."""
        jobs = self.client.producer.run(self.client.producer.on_all(
            queue, parted.all_read_jobs, ids))
        return [job.id for job in jobs if job.state is state]

    def purge_form(self, request: Request) -> Response:
        return self._purge_page(request, _required(request.query_params, "q"))

    def _purge_page(self, request: Request, name: str, status: int = 200, typed: str = "",
                    ticked: Iterable[str] = (), error: str | None = None) -> HTMLResponse:
        return self.render(request, "purge.html", status=status, queue=name,
                           counts=self.client.counts(name), typed=typed, ticked=set(ticked),
                           error=error)

    # ------------------------------------------------------------------ live parts (JSON)

    def api_overview(self, request: Request) -> Response:
        return JSONResponse(overview(self.client, self.queue_names, self.rates).to_dict())

    def api_events(self, request: Request) -> Response:
        name = _required(request.query_params, "q")
        after = request.query_params.get("after")
        if after is not None and not _STREAM_ID.fullmatch(after):
            raise BadRequest(f"after must be an event position such as 1700000000000-0 (one "
                             f"per partition, comma-separated), got {after!r}")
        events, position, _ = recent_events(self.client, name, after)
        return JSONResponse({"events": events, "position": position,
                             "updated": timestamp(datetime.now(UTC))})

    def api_job(self, request: Request) -> Response:
        name = _required(request.query_params, "q")
        job = self.client.get_job(name, _required(request.query_params, "id"))
        shown = progress(job.progress)
        return JSONResponse({"state": job.state.value, "attempts": job.attempts,
                             "progress": shown.text.text, "percent": shown.percent})

    def api_job_flow(self, request: Request) -> Response:
        """The job's flow as its page draws it: the jobs, their states, depths and edges."""
        name = _required(request.query_params, "q")
        job_id = _required(request.query_params, "id")
        flow = self._flow(name, job_id)
        if flow is None:
            raise JobNotFound(name, job_id)
        return JSONResponse(draw(flow).to_dict())

    def api_job_raw(self, request: Request) -> Response:
        """One part of a job, whole, as JSON: what its page shows only the start of."""
        name = _required(request.query_params, "q")
        job = self.client.get_job(name, _required(request.query_params, "id"))
        part = request.query_params.get("part", "")
        values: dict[str, Any] = {
            "data": job.data, "result": job.result, "progress": job.progress,
            "options": job.options, "logs": job.logs,
            "error": job.error.to_wire() if job.error is not None else None,
            "steps": job.to_dict()["steps"]}
        if part not in values:
            raise BadRequest(f"part must be one of {', '.join(values)}, got {part!r}")
        return JSONResponse(values[part])

    # ------------------------------------------------------------------ login

    def login_form(self, request: Request) -> Response:
        if self.signer.token is None:
            return RedirectResponse(self.link(request, "/"), status_code=303)
        return self.render(request, "login.html", next=_local(request.query_params.get("next")),
                           failed=False)

    async def login(self, request: Request) -> Response:
        if self.signer.token is None:
            return RedirectResponse(self.link(request, "/"), status_code=303)
        form = await request.form()
        target = _local(_field(form, "next"))
        if not self.signer.csrf_ok(request.state.session, _field(form, "csrf")):
            return self.problem(request, 403, "the form's CSRF token is missing or stale: "
                                              "reload the login page and try again")
        if not self.signer.token_ok(_field(form, "token")):
            return self.render(request, "login.html", status=401, next=target, failed=True)
        # A fresh session on login: an id planted before it is worth nothing after.
        sid, session_cookie = self.signer.new_session()
        response = RedirectResponse(self.link(request, target or "/"), status_code=303)
        response.raw_headers += [
            (b"set-cookie", cookie_header(request.scope, SESSION_COOKIE, session_cookie)),
            (b"set-cookie", cookie_header(request.scope, AUTH_COOKIE,
                                          self.signer.login_cookie(sid),
                                          max_age=LOGIN_MAX_AGE)),
        ]
        return response

    async def logout(self, request: Request) -> Response:
        form = await request.form()
        if not self.signer.csrf_ok(request.state.session, _field(form, "csrf")):
            return self.problem(request, 403, "the form's CSRF token is missing or stale")
        # Ended here, not only in this browser; and the next login gets a session of its own.
        self.signer.end(request.state.session)
        _, session_cookie = self.signer.new_session()
        response = RedirectResponse(self.link(request, "/login"), status_code=303)
        response.raw_headers += [
            (b"set-cookie", cookie_header(request.scope, AUTH_COOKIE, "", max_age=0)),
            (b"set-cookie", cookie_header(request.scope, SESSION_COOKIE, session_cookie))]
        return response

    # ------------------------------------------------------------------ actions

    async def action(self, request: Request) -> Response:
        """POST /action: ``action``, ``queue`` and ``csrf`` (and ``job_id``, ``confirm``,
        ``state`` where the action needs them). 403 when read-only or the token is wrong."""
        if self.read_only:
            return self.problem(request, 403, "this dashboard is read-only: actions are "
                                              "refused")
        form = await request.form()
        if not self.signer.csrf_ok(request.state.session, _field(form, "csrf")):
            return self.problem(request, 403, "the form's CSRF token is missing or stale: "
                                              "reload the page and try again")
        action = _field(form, "action")
        if action not in ACTIONS:
            raise BadRequest(f"unknown action {action!r} (one of: {', '.join(ACTIONS)})")
        name = _field(form, "queue")
        if action == "control":
            return await run_in_threadpool(lambda: self._control(request, form))
        if not name:
            raise BadRequest("the form names no queue")
        job_id = _field(form, "job_id")
        if action in ("retry", "cancel", "remove") and not job_id:
            raise BadRequest(f"{action} needs a job_id")
        def run() -> Response:
            return self._act(request, form, action, name, job_id)

        return await run_in_threadpool(run)

    def _act(self, request: Request, form: FormData, action: str, name: str,
             job_id: str | None) -> Response:
        client = self.client
        states = [str(s) for s in form.getlist("state")]
        if action == "purge" and (typed := _field(form, "confirm") or "") != name:
            # A typo keeps the form, with what was typed and the states ticked: one line says
            # why, and nothing is deleted.
            said = f"{_quoted(typed)} is not the queue's name" if typed else \
                "The queue's name is missing"
            return self._purge_page(
                request, name, status=400, typed=typed, ticked=states,
                error=f"{said}: type {_quoted(name)} exactly to purge it. Nothing was deleted.")
        if action == "bulk":
            return self._bulk(request, form, name)
        details: dict[str, Any] = {}
        # Where the browser goes back to: the page the button was on when it says (``next``:
        # a list's row keeps its state, filter and page), else the action's own page.
        where = self.link(request, "/job", q=name, id=job_id)
        if action in ("pause", "resume"):
            (client.pause if action == "pause" else client.resume)(name)
            where = self.link(request, "/")
        elif action == "retry_all":
            details["n"] = client.retry_failed(name)
            where = self.link(request, "/queue", q=name, state="failed")
        elif action == "purge":
            details["n"] = client.purge(name, states or None)
            where = self.link(request, "/queue", q=name)
        elif action == "retry":
            assert job_id is not None
            details["n"] = client.retry_failed(name, [job_id])
        elif action == "cancel":
            assert job_id is not None
            details["was"] = client.cancel(name, job_id).value
        else:
            assert job_id is not None
            if not client.remove(name, job_id):
                raise JobNotFound(name, job_id)
            # The job is gone, so back to its queue.
            where = self.link(request, "/queue", q=name,
                              state=_field(form, "return_state") or None)
        target = _local(_field(form, "next"))
        return _done(self.link(request, target) if target else where, action, **details)

    def _bulk(self, request: Request, form: FormData, name: str) -> Response:
        """A confirmed bulk action: on the jobs selected, or on every job the filter picks
        (counted again as it runs: the notice says how many changed)."""
        client = self.client
        state = _state(_field(form, "state") or "")
        do, scope = _bulk_choice(_field(form, "do") or "")
        tag = _field(form, "tag") or None
        error_type = _field(form, "error_type") or None
        ids = [str(i) for i in form.getlist("id") if i][:MAX_PAGE_SIZE]
        if scope == "selected":
            ids = self._still_in(name, ids, state)
            if do == "retry":
                n = client.retry_failed(name, ids) if ids else 0
            elif do == "cancel":
                n = sum(1 for i in ids if self._cancelled(name, i))
            else:
                n = sum(1 for i in ids if self._removed(name, i))
        elif do == "retry":
            n = (client.retry_failed(name, tag=tag, error_type=error_type)
                 if tag is not None or error_type is not None else client.retry_failed(name))
        elif error_type is not None:
            raise BadRequest("only retry takes an error type filter")
        elif do == "cancel":
            n = client.cancel_jobs(name, tag=tag, state=state)
        else:
            n = client.remove_jobs(name, tag=tag, state=state)
        back = self.link(request, "/queue", q=name, state=state.value, tag=tag,
                         error_type=error_type)
        return _done(back, f"bulk_{do}", n=n)

    def _cancelled(self, queue: str, job_id: str) -> bool:
        try:
            return not self.client.cancel(queue, job_id).is_final
        except JobNotFound:
            return False

    def _removed(self, queue: str, job_id: str) -> bool:
        try:
            return self.client.remove(queue, job_id)
        except PanqueueError:  # active (cancel it first) or gone
            return False

    def _control(self, request: Request, form: FormData) -> Response:
        """A command for a live worker (``client.control``), from the workers page."""
        worker = _field(form, "worker")
        if not worker:
            raise BadRequest("the form names no worker")
        command = _field(form, "command")
        if command == "concurrency":
            raw = _field(form, "concurrency") or ""
            if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
                raise BadRequest(f"concurrency must be a whole number >= 1, got {raw!r}")
            self.client.control(worker, concurrency=int(raw))
        elif command in _CONTROL:
            self.client.control(worker, command)
        else:
            raise BadRequest(f"unknown worker command {command!r} (one of: "
                             f"{', '.join(_CONTROL)}, concurrency)")
        return _done(self.link(request, "/workers"), "control")

    # ------------------------------------------------------------------ errors

    def on_error(self, request: Request, exc: Exception) -> Response:
        if isinstance(exc, HTTPException):
            return self.problem(request, exc.status_code, str(exc.detail))
        if isinstance(exc, BadRequest | ConfigError):
            status = 400
        elif isinstance(exc, JobNotFound):
            status = 404
        elif isinstance(exc, ConnectionError):
            status = 503
        else:
            status = 409
        wants_json = route_path(request.scope).startswith("/api/")
        if wants_json:
            return JSONResponse({"error": str(exc)}, status_code=status)
        return self.problem(request, status, str(exc))


def _here(request: Request) -> str:
    """The page's path and query inside the app, without an earlier action's notice."""
    kept = [(k, v) for k, v in request.query_params.multi_items() if k not in _NOTICE_PARAMS]
    query = urlencode(kept)
    return route_path(request.scope) + (f"?{query}" if query else "")


def _done(where: str, action: str, **details: Any) -> Response:
    query = urlencode({"done": action, **{k: str(v) for k, v in details.items()}})
    return RedirectResponse(where + ("&" if "?" in where else "?") + query, status_code=303)


def _quoted(text: str) -> str:
    return f"\u201c{text}\u201d"


def _field(form: FormData, name: str) -> str | None:
    value = form.get(name)
    return value if isinstance(value, str) else None


def _local(target: str | None) -> str | None:
    """``target`` if it is a path inside the app (no scheme, no host): redirects never leave."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return None
    return target


def _required(params: Mapping[str, str], name: str) -> str:
    value = params.get(name)
    if not value:
        raise BadRequest(f"the query parameter {name!r} is missing")
    return value


def _state(value: str) -> JobState:
    try:
        return JobState(value)
    except ValueError:
        raise BadRequest(f"unknown job state {value!r} (one of: "
                         f"{', '.join(s.value for s in JobState)})") from None


def _bulk_choice(value: str) -> tuple[str, str]:
    """A bulk button's value, ``<action>:<scope>`` (cancel, retry, remove; selected, all)."""
    do, _, scope = value.partition(":")
    if do not in _BULK or scope not in ("selected", "all"):
        raise BadRequest(f"unknown bulk action {value!r} (cancel, retry or remove, on the "
                         "selected jobs or all that match)")
    return do, scope


def _int(params: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    raw = params.get(name)
    if raw is None or raw == "":
        return default
    bounds = f">= {low}" if high == MAX_OFFSET else f"between {low} and {high}"
    if not (raw.isascii() and raw.isdigit()) or not low <= int(raw) <= high:
        raise BadRequest(f"{name} must be an integer {bounds}, got {raw!r}")
    return int(raw)


def build_app(url: str | None, read_only: bool, token: str | None,
              allowed_hosts: Iterable[str] | None = None, prefix: str | None = None
              ) -> Starlette:
    """The dashboard's ASGI app (see :func:`panqueue.dashboard.create_app`)."""
    if token is not None and (not isinstance(token, str) or not token.strip()):
        raise ConfigError("token must be a non-empty string (or None for no token)")
    try:
        hosts = host_names(allowed_hosts or ())
    except ValueError as exc:
        raise ConfigError(f"allowed_hosts: {exc}") from None
    board = Dashboard(url, read_only, token, prefix)
    routes = [
        Route("/", board.index),
        Route("/queue", board.queue),
        Route("/job", board.job),
        Route("/workers", board.workers),
        Route("/schedules", board.schedules),
        Route("/events", board.events),
        Route("/purge", board.purge_form),
        Route("/bulk", board.bulk_form),
        Route("/api/overview", board.api_overview),
        Route("/api/events", board.api_events),
        Route("/api/job", board.api_job),
        Route("/api/job/raw", board.api_job_raw),
        Route("/api/job/flow", board.api_job_flow),
        Route("/login", board.login_form, methods=["GET"]),
        Route("/login", board.login, methods=["POST"]),
        Route("/logout", board.logout, methods=["POST"]),
        Route("/action", board.action, methods=["POST"]),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    handlers: dict[Any, Any] = {exc: board.on_error for exc in (
        BadRequest, PanqueueError, HTTPException)}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Run by a server that serves the app itself (``panqueue dashboard``); a mounted app's
        # client is closed with the process.
        yield
        board.queue_names.close()
        board.client.close()

    app = Starlette(routes=routes, exception_handlers=handlers, lifespan=lifespan)
    app.add_middleware(Guard, signer=board.signer, allowed_hosts=hosts)
    app.state.dashboard = board
    return app
