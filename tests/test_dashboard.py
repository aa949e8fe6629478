"""The web dashboard over HTTP, in-process (an httpx client on the ASGI app), against a real
Redis: paging, escaping, CSRF, read-only mode, the access
token, the actions, and the ``panqueue dashboard`` command's arguments."""

from __future__ import annotations

import contextlib
import functools
import html
import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import httpx
import pytest
import redis
from starlette.applications import Starlette
from starlette.routing import Mount

from panqueue import ConfigError, Event, Job, JobNotFound, JobState, Registry, SyncQueueClient
from panqueue._keys import QueueKeys
from panqueue._store.ops import setup_queue
from panqueue.dashboard import _reads, create_app
from panqueue.dashboard._reads import QueueNames, event_dict, progress
from panqueue.embedded import RedisServer
from panqueue.testing import run_worker
from tests.helpers import ROOT, free_port, panqueue_command, run_cli, subprocess_env, wait_until

PAYLOAD = "<script>window.__pwned = 1</script>"
DASH = "\u2013"  # the en dash of "jobs 1-50 of 120"


@pytest.fixture
def client(redis_url: str) -> Iterator[SyncQueueClient]:
    with SyncQueueClient(redis_url) as found:
        yield found


class Web:
    """A blocking httpx client on the ASGI app (its event loop runs in a portal thread),
    keeping cookies like a browser and never following redirects."""

    def __init__(self, app: Any, portal: anyio.from_thread.BlockingPortal) -> None:
        self.app = app
        self.portal = portal
        self.http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                      base_url="http://testserver", follow_redirects=False)
        self.cookies = self.http.cookies

    def get(self, url: str, **options: Any) -> httpx.Response:
        return self.portal.call(functools.partial(self.http.get, url, **options))

    def post(self, url: str, **options: Any) -> httpx.Response:
        """A POST as a browser sends a page's form: with the page's Origin."""
        headers = {"origin": "http://testserver", **options.pop("headers", {})}
        return self.portal.call(functools.partial(self.http.post, url, headers=headers,
                                                  **options))


@contextlib.contextmanager
def browser(app: Any, backend: str = "asyncio") -> Iterator[Web]:
    with anyio.from_thread.start_blocking_portal(backend) as portal:
        web = Web(app, portal)
        try:
            yield web
        finally:
            portal.call(web.http.aclose)


def csrf_of(page: httpx.Response) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
    assert found, "the page has no CSRF field"
    return found.group(1)


# --------------------------------------------------------------------------- paging (client)


def test_pages_of_a_state_are_slices_of_the_whole_order(client: SyncQueueClient,
                                                        queue_name: str) -> None:
    queue = client.queue(queue_name)
    for n in range(23):
        queue.add(n, priority=n % 3)
    whole = [j.id for j in client.list_jobs(queue_name, JobState.WAITING, limit=1000)]
    assert len(whole) == 23
    for limit in (1, 5, 10):
        for offset in range(0, 26, 3):
            page = client.list_jobs(queue_name, "waiting", limit=limit, offset=offset)
            assert [j.id for j in page] == whole[offset:offset + limit], (offset, limit)
    handles = queue.add_bulk(range(7))
    for handle in handles:
        client.cancel(queue_name, handle.id)
    newest_first = [j.id for j in client.list_jobs(queue_name, JobState.CANCELLED)]
    assert [j.id for j in client.list_jobs(queue_name, JobState.CANCELLED, limit=3,
                                           offset=5)] == newest_first[5:8]


def test_keyed_waiting_pages_follow_the_claim_turns_at_any_offset(client: SyncQueueClient,
                                                                  queue_name: str) -> None:
    """Offset counts into the claim's round robin over keys (one job per key in turn)."""
    queue = client.queue(queue_name, mode="keyed")
    lengths = {"a": 5, "b": 1, "c": 3, "d": 8, "e": 2}
    for n in range(max(lengths.values())):
        for key, length in lengths.items():
            if n < length:
                queue.add(f"{key}{n}", key=key)
    whole = client.list_jobs(queue_name, JobState.WAITING, limit=1000)
    assert len(whole) == sum(lengths.values())
    # The first turn takes one job of every key, in the claim's order.
    assert sorted(j.data for j in whole[:5]) == ["a0", "b0", "c0", "d0", "e0"]
    ids = [j.id for j in whole]
    for limit in (1, 2, 3, 7, 50):
        for offset in range(0, len(ids) + 2):
            page = client.list_jobs(queue_name, JobState.WAITING, limit=limit, offset=offset)
            assert [j.id for j in page] == ids[offset:offset + limit], (offset, limit)


def test_list_jobs_refuses_a_bad_offset(client: SyncQueueClient, queue_name: str) -> None:
    for offset in (-1, 1.5, True, "3"):
        with pytest.raises(ConfigError, match="offset must be an int >= 0"):
            client.list_jobs(queue_name, JobState.WAITING, offset=offset)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- pages


def test_overview_shows_every_queue_with_its_counts(redis_url: str,
                                                    client: SyncQueueClient) -> None:
    client.queue("mail").add_bulk([{"n": n} for n in range(4)])
    client.queue("mail").add({"later": True}, delay=600)
    client.queue("reports").add({})
    client.pause("reports")
    with browser(create_app(redis_url)) as web:
        page = web.get("/")
        assert page.status_code == 200
        rows = dict(re.findall(r'<tr data-queue="([^"]+)">(.*?)</tr>', page.text, re.S))
        assert set(rows) == {"mail", "reports"}
        assert 'data-field="waiting">4<' in rows["mail"]
        assert 'data-field="delayed">1<' in rows["mail"]
        assert 'data-field="paused">paused<' in rows["reports"]
        live = web.get("/api/overview").json()
        mail = next(q for q in live["queues"] if q["name"] == "mail")
        assert mail["counts"]["waiting"] == 4 and mail["counts"]["delayed"] == 1
        assert mail["lag_seconds"] is not None and mail["lag_seconds"] >= 0
        assert mail["cells"]["waiting"] == "4"


def test_the_queue_list_is_refreshed_in_the_background_not_scanned_per_page(
        client: SyncQueueClient) -> None:
    """A page never waits for the keyspace scan once the list exists: a stale list is served
    while a thread scans again, and the new queue shows on a later read."""
    client.queue("first").add({})
    names = QueueNames(client, ttl=0.0)
    assert names.get() == ["first"]
    client.queue("second").add({})
    assert names.get() == ["first"]  # served at once, the scan runs behind it
    wait_until(lambda: names.get() == ["first", "second"], 10, "the refreshed list")
    names.close()  # as the app does before closing the client: the last scan ends first


def test_a_closed_queue_list_starts_no_more_scans(client: SyncQueueClient) -> None:
    """Once the app shuts down (the list closed, then its client), a request still being served
    must not start a scan on the client being closed (a thread failing inside redis-py)."""
    client.queue("first").add({})
    names = QueueNames(client, ttl=0.0)
    assert names.get() == ["first"]
    names.close()
    assert names.get() == ["first"]  # the list it has, and no scan behind it
    assert names._refresher is None


def test_job_data_is_shown_as_text_everywhere(redis_url: str, client: SyncQueueClient,
                                              queue_name: str) -> None:
    """A payload holding markup comes back escaped on every page that shows it."""
    client.read_events(queue_name)  # asks for every event: the add's shows on the events page
    job = client.queue(queue_name).add({"html": PAYLOAD}, job_id=f"id-{PAYLOAD}")
    with browser(create_app(redis_url)) as web:
        pages = [web.get("/job", params={"q": queue_name, "id": job.id}),
                 web.get("/queue", params={"q": queue_name}),
                 web.get("/events", params={"q": queue_name}),
                 web.get("/job", params={"q": queue_name, "id": f"missing {PAYLOAD}"})]
        for page in pages:
            assert "<script>window" not in page.text, page.url
            assert "&lt;script&gt;window.__pwned = 1&lt;/script&gt;" in page.text, page.url
        assert pages[-1].status_code == 404
        events = web.get("/api/events", params={"q": queue_name, "after": "0-0"}).json()
        assert events["events"][0]["job_id"] == job.id  # JSON, read with textContent


def test_security_headers_forbid_inline_script_and_framing(redis_url: str) -> None:
    with browser(create_app(redis_url)) as web:
        page = web.get("/")
    csp = page.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert "frame-ancestors 'none'" in csp
    assert page.headers["x-frame-options"] == "DENY"
    # (same-origin, not no-referrer: the forms' POSTs must carry the dashboard's Origin)
    assert page.headers["referrer-policy"] == "same-origin"
    cookie = page.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie


def test_jobs_page_pages_through_a_state(redis_url: str, client: SyncQueueClient,
                                         queue_name: str) -> None:
    client.queue(queue_name).add_bulk([{"n": n} for n in range(120)])
    with browser(create_app(redis_url)) as web:
        first = web.get("/queue", params={"q": queue_name, "state": "waiting"})
        assert f"jobs 1{DASH}50 of 120" in first.text
        assert first.text.count("<tr data-job=") == 50
        last = web.get("/queue", params={"q": queue_name, "state": "waiting", "offset": 100})
        assert f"jobs 101{DASH}120 of 120" in last.text
        shown = re.findall(r'<tr data-job="([^"]+)"', last.text)
        expected = [j.id for j in client.list_jobs(queue_name, "waiting", limit=20,
                                                   offset=100)]
        assert shown == expected
        assert 'rel="next"' not in last.text and 'rel="prev"' in last.text
        for bad in ({"offset": "-1"}, {"offset": "x"}, {"limit": "0"}, {"limit": "501"},
                    {"state": "dead"}):
            refused = web.get("/queue", params={"q": queue_name, **bad})
            assert refused.status_code == 400, bad
            problem = re.search(r'id="problem">(.*?)</p>', refused.text)
            assert problem and "\n" not in problem.group(1), bad


def test_search_by_id_opens_the_job_or_says_it_is_not_there(
        redis_url: str, client: SyncQueueClient, queue_name: str) -> None:
    client.queue(queue_name).add({"n": 1}, job_id="order-42")
    with browser(create_app(redis_url)) as web:
        found = web.get("/job", params={"q": queue_name, "id": "order-42"})
        assert found.status_code == 200 and 'id="job-id">order-42<' in found.text
        missing = web.get("/job", params={"q": queue_name, "id": "order-43"})
        assert missing.status_code == 404
        assert "job &#39;order-43&#39; not found" in missing.text


def test_an_unreachable_redis_is_a_503_page_with_one_line() -> None:
    with browser(create_app("redis://127.0.0.1:1/0")) as web:
        page = web.get("/")
        assert page.status_code == 503
        problem = re.search(r'id="problem">(.*?)</p>', page.text)
        assert problem and problem.group(1).startswith("cannot reach Redis at redis://127.0.0.1:1")
        live = web.get("/api/overview")
        assert live.status_code == 503 and "cannot reach Redis" in live.json()["error"]


# --------------------------------------------------------------------------- actions


def test_an_action_without_the_sessions_csrf_token_is_refused(
        redis_url: str, client: SyncQueueClient, queue_name: str) -> None:
    client.queue(queue_name).add({})
    app = create_app(redis_url)
    with browser(app) as web, browser(app) as other:
        token = csrf_of(web.get("/"))
        other_token = csrf_of(other.get("/"))
        form = {"action": "pause", "queue": queue_name}
        assert web.post("/action", data=form).status_code == 403
        assert web.post("/action", data={**form, "csrf": "0" * 64}).status_code == 403
        # Another session's token is worth nothing in this one.
        assert web.post("/action", data={**form, "csrf": other_token}).status_code == 403
        assert not client.is_paused(queue_name)
        done = web.post("/action", data={**form, "csrf": token})
        assert done.status_code == 303
        assert client.is_paused(queue_name)


def test_the_app_serves_pages_and_actions_under_trio(redis_url: str, client: SyncQueueClient,
                                                     queue_name: str) -> None:
    job = client.queue(queue_name).add({"n": 1})
    with browser(create_app(redis_url), backend="trio") as web:
        page = web.get("/job", params={"q": queue_name, "id": job.id})
        assert page.status_code == 200 and 'id="job-state">waiting<' in page.text
        done = web.post("/action", data={"csrf": csrf_of(page), "action": "cancel",
                                         "queue": queue_name, "job_id": job.id})
        assert done.status_code == 303
    assert client.get_job(queue_name, job.id).state is JobState.CANCELLED


def test_actions_cancel_remove_pause_resume_and_purge(redis_url: str, client: SyncQueueClient,
                                                      queue_name: str) -> None:
    queue = client.queue(queue_name)
    doomed, kept, gone = (queue.add({"n": n}) for n in range(3))
    with browser(create_app(redis_url)) as web:
        token = csrf_of(web.get("/"))

        def act(action: str, **fields: Any) -> httpx.Response:
            return web.post("/action", data={"csrf": token, "action": action,
                                             "queue": queue_name, **fields})

        cancelled = act("cancel", job_id=doomed.id)
        assert cancelled.status_code == 303
        assert "done=cancel" in cancelled.headers["location"]
        assert client.get_job(queue_name, doomed.id).state is JobState.CANCELLED
        assert act("remove", job_id=gone.id).status_code == 303
        assert client.list_jobs(queue_name, "waiting") == [client.get_job(queue_name, kept.id)]
        assert act("pause", next="/queue?q=x").headers["location"].startswith("/queue?q=x&")
        assert client.is_paused(queue_name)
        # A redirect target outside the app is ignored.
        assert act("resume", next="//evil.example/").headers["location"].startswith("/?")
        assert not client.is_paused(queue_name)
        refused = act("purge", confirm="<b>not</b> the name", state="waiting")
        assert refused.status_code == 400
        # The form again, as it was filled (escaped), with one line saying why.
        assert 'id="purge-form"' in refused.text
        assert 'value="&lt;b&gt;not&lt;/b&gt; the name"' in refused.text
        assert 'value="waiting" checked' in refused.text
        assert refused.text.count('role="alert"') == 1
        assert "<b>not</b>" not in refused.text
        unconfirmed = act("purge")
        assert unconfirmed.status_code == 400
        assert "The queue&#39;s name is missing" in unconfirmed.text
        assert client.counts(queue_name)[JobState.WAITING] == 1
        purged = act("purge", confirm=queue_name, state="waiting")
        assert purged.status_code == 303 and "n=1" in purged.headers["location"]
        assert client.counts(queue_name)[JobState.WAITING] == 0
        assert client.counts(queue_name)[JobState.CANCELLED] == 1
        page = web.get(purged.headers["location"])
        assert "1 job(s) deleted." in page.text
        # The notice takes only a count and a state from the URL, nothing else.
        # (The probe is the crafted words, not a bare "555": a random CSRF token may hold that.)
        crafted = web.get("/", params={"done": "cancel", "was": "hacked, call 555"})
        assert "Job cancelled (it was ?)." in crafted.text
        assert "hacked" not in crafted.text and "call 555" not in crafted.text
        assert act("explode").status_code == 400
        assert act("cancel").status_code == 400  # no job_id


def test_read_only_mode_offers_no_action_and_refuses_every_post(
        redis_url: str, client: SyncQueueClient, queue_name: str) -> None:
    job = client.queue(queue_name).add({})
    with browser(create_app(redis_url, read_only=True)) as web:
        pages = [web.get("/"), web.get("/queue", params={"q": queue_name}),
                 web.get("/job", params={"q": queue_name, "id": job.id}),
                 web.get("/purge", params={"q": queue_name})]
        for page in pages:
            assert page.status_code == 200
            assert "/action" not in page.text, page.url
        token = re.search(r'name="csrf" value="([0-9a-f]+)"', pages[0].text)
        assert token is None  # not even a form to take one from: the session's token is
        # still valid, so take it the way a page would have carried it.
        signer = web.app.state.dashboard.signer
        sid = signer.session_of(web.cookies["panqueue_session"])
        for action in ("pause", "cancel", "remove", "purge", "retry_all"):
            refused = web.post("/action", data={"csrf": signer.csrf_token(sid),
                                                "action": action, "queue": queue_name,
                                                "job_id": job.id, "confirm": queue_name})
            assert refused.status_code == 403, action
    assert not client.is_paused(queue_name)
    assert client.get_job(queue_name, job.id).state is JobState.WAITING


def test_a_request_without_the_token_is_refused(redis_url: str) -> None:
    app = create_app(redis_url, token="s3cret-token")
    with browser(app) as web:
        page = web.get("/queue", params={"q": "x"})
        assert page.status_code == 303
        assert page.headers["location"] == "/login?next=%2Fqueue%3Fq%3Dx"
        assert web.get("/api/overview").status_code == 401
        assert web.post("/action", data={"action": "pause", "queue": "x"}).status_code == 401
        wrong = web.get("/", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 303
        assert web.get("/api/overview",
                       headers={"Authorization": "Bearer s3cret-token"}).status_code == 200
        # The login form: a wrong token is refused, the right one sets the login cookie.
        form = web.get("/login", params={"next": "/queue?q=x"})
        assert form.status_code == 200
        assert "127.0.0.1" not in form.text  # which server: not for anonymous eyes
        refused = web.post("/login", data={"csrf": csrf_of(form), "token": "nope",
                                           "next": "/queue?q=x"})
        assert refused.status_code == 401
        assert web.post("/login", data={"token": "s3cret-token"}).status_code == 403  # no CSRF
        done = web.post("/login", data={"csrf": csrf_of(form), "token": "s3cret-token",
                                        "next": "/queue?q=x"})
        assert done.status_code == 303 and done.headers["location"] == "/queue?q=x"
        assert "HttpOnly" in done.headers["set-cookie"]
        assert "Max-Age=43200" in done.headers["set-cookie"]  # a login lasts 12 hours
        assert web.get("/").status_code == 200
        # A copy of the cookies taken before the logout (a shared machine, a proxy's log) logs
        # in no more after it: logging out ends the session here, not only in the browser.
        copied = "; ".join(f"{name}={web.cookies[name]}"
                           for name in ("panqueue_session", "panqueue_auth"))
        web.post("/logout", data={"csrf": csrf_of(web.get("/"))})
        assert web.get("/").status_code == 303
    with browser(app) as other:
        assert other.get("/", headers={"cookie": copied}).status_code == 303
    with pytest.raises(ConfigError, match="token must be a non-empty string"):
        create_app(redis_url, token=" ")


def test_the_app_mounts_under_a_prefix(redis_url: str, client: SyncQueueClient,
                                       queue_name: str) -> None:
    client.queue(queue_name).add({})
    outer = Starlette(routes=[Mount("/admin/jobs", create_app(redis_url))])
    with browser(outer) as web:
        page = web.get("/admin/jobs/")
        assert page.status_code == 200
        assert f'href="/admin/jobs/queue?q={queue_name}"' in page.text
        assert 'src="/admin/jobs/static/dashboard.js"' in page.text
        assert "Path=/admin/jobs" in page.headers["set-cookie"]
        assert web.get("/admin/jobs/static/dashboard.js").status_code == 200
        token = csrf_of(page)
        done = web.post("/admin/jobs/action", data={"csrf": token, "action": "pause",
                                                    "queue": queue_name})
        assert done.status_code == 303 and done.headers["location"].startswith("/admin/jobs/?")
    assert client.is_paused(queue_name)


def test_events_page_and_its_live_endpoint(redis_url: str, client: SyncQueueClient,
                                           queue_name: str) -> None:
    unread = client.queue(queue_name).add({"n": 0})
    with browser(create_app(redis_url)) as web:
        # Nobody read the queue's events: its add wrote none, and the page says why.
        page = web.get("/events", params={"q": queue_name})
        assert page.status_code == 200 and 'id="unread-until-now"' in page.text
        assert ">added<" not in page.text and unread.id
        # The page asked for every event: the next add writes its own.
        job = client.queue(queue_name).add({"n": 1})
        page = web.get("/events", params={"q": queue_name})
        assert page.status_code == 200 and ">added<" in page.text
        assert 'id="unread-until-now"' not in page.text
        position = re.search(r'data-position="([0-9-]+)"', page.text)
        assert position
        client.cancel(queue_name, job.id)
        live = web.get("/api/events", params={"q": queue_name, "after": position.group(1)})
        assert [e["type"] for e in live.json()["events"]] == ["cancelled"]
        bad = web.get("/api/events", params={"q": queue_name, "after": "x; DROP"})
        assert bad.status_code == 400 and "event position" in bad.json()["error"]


def test_the_live_events_of_a_partitioned_queue_follow_every_partition(
        redis_url: str, client: SyncQueueClient, queue_name: str) -> None:
    """A partitioned queue's position is one stream id per partition, comma-separated: the
    page hands it to the live endpoint, which takes it."""
    registry = Registry()

    @registry.handler(queue_name, partitions=3)
    def work(job: Job[int]) -> None: ...

    queue = client.queue(work)
    queue.add(0)
    with browser(create_app(redis_url)) as web:
        page = web.get("/events", params={"q": queue_name})
        position = re.search(r'data-position="([0-9,-]+)"', page.text)
        assert position and position.group(1).count(",") == 2, page.text
        added = [queue.add(n) for n in range(1, 7)]
        live = web.get("/api/events", params={"q": queue_name, "after": position.group(1)})
        assert live.status_code == 200, live.text
        assert sorted(e["job_id"] for e in live.json()["events"]) == sorted(h.id for h in added)


def test_the_events_page_says_when_its_queue_keeps_only_the_ends_of_jobs(
        redis_url: str, client: SyncQueueClient, queue_name: str) -> None:
    job = client.queue(queue_name).add({"n": 1})
    with browser(create_app(redis_url)) as web:
        assert 'id="endings-only"' not in web.get("/events", params={"q": queue_name}).text
        # Set up as a worker of a handler with Retention(events=0) sets it up.
        client._run(setup_queue(QueueKeys(queue_name), "global", 1, 0, 0, False, keep_events=0))
        client.cancel(queue_name, job.id)
        page = web.get("/events", params={"q": queue_name})
        assert 'id="endings-only"' in page.text and ">cancelled<" in page.text
        assert 'id="unread-until-now"' not in page.text


def test_times_and_progress_are_written_as_the_pages_show_them() -> None:
    # A rate_limited event's end (ms in the stream) in the one format, as its time is.
    event = event_dict(Event("1764243000000-0", "rate_limited", "q", "7",
                             {"attempt": 1, "until": "1764243060250"}))
    assert event["time"] == "2025-11-27 11:30:00.000 UTC"
    assert json.loads(event["fields"]) == {"attempt": 1, "until": "2025-11-27 11:31:00.250 UTC"}
    # A percentage (0 to 100) is a bar with its number; anything else is its value as text.
    shown = {repr(value): (found.percent, found.text.text) for value in
             (0, 50, 72.5, 33.333, 100, 0.5, 150, -1, True, "50", {"of": 9}, None)
             for found in [progress(value)]}
    assert shown == {"0": (0.0, "0%"), "50": (50.0, "50%"), "72.5": (72.5, "72.5%"),
                     "33.333": (33.333, "33.3%"), "100": (100.0, "100%"),
                     "0.5": (0.5, "0.5%"), "150": (None, "150"), "-1": (None, "-1"),
                     "True": (None, "true"), "'50'": (None, '"50"'),
                     "{'of': 9}": (None, '{\n  "of": 9\n}'), "None": (None, "-")}


def test_rates_workers_and_schedules_come_from_a_real_worker(
        redis_url: str, client: SyncQueueClient, tmp_path: Path,
        redis_client: redis.Redis) -> None:
    worker = subprocess.Popen(panqueue_command("worker", "dashboard_app:queues", "-q",
                                               "dash-echo", "--url", redis_url),
                              stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=subprocess_env(), cwd=ROOT)
    try:
        client.queue("dash-echo").add({})  # the queue exists before the first read
        with browser(create_app(redis_url)) as web:
            def rate() -> Any:
                found = web.get("/api/overview").json()["queues"]
                return next(q["completed_per_s"] for q in found if q["name"] == "dash-echo")

            assert rate() is None  # the first read only marks where the stream was
            client.queue("dash-echo").add_bulk([{"n": n} for n in range(20)])
            wait_until(lambda: (rate() or 0) > 0, 15, "a completion rate above zero",
                       interval=0.2)
            # Counting ends of jobs, which are always written, asks for no other event.
            assert not redis_client.exists(QueueKeys("dash-echo").events_read)
            workers = web.get("/workers")
            assert re.search(rf"<td class=\"num\">{worker.pid}</td>", workers.text)
            schedules = web.get("/schedules")
            assert "<td>dash-nightly</td>" in schedules.text
            assert "&#34;report&#34;:&#34;nightly&#34;" in schedules.text
    finally:
        worker.kill()
        worker.wait()


# --------------------------------------------------------------------------- the command


def _one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_dashboard_command_refuses_bad_arguments_in_one_line(redis_url: str) -> None:
    for args, words in ((["--port", "70000"], "--port"),
                        (["--token", ""], "--token is empty"),
                        (["--host", "no such host.invalid"], "--host")):
        done = run_cli("dashboard", "--url", redis_url, *args)
        assert done.returncode == 2, (args, done.stderr)
        assert words in _one_line(done)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli("dashboard", "--url", redis_url, "--port", str(port))
    assert done.returncode == 1
    assert f"cannot serve the dashboard on 127.0.0.1:{port}" in _one_line(done)


def test_dashboard_command_names_the_extra_when_it_is_missing() -> None:
    code = ("import sys; sys.modules['uvicorn'] = None; from panqueue.cli import main; "
            "sys.exit(main(['dashboard']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, env=subprocess_env(), cwd=ROOT)
    assert done.returncode == 2
    assert "pip install 'panqueue[dashboard]'" in _one_line(done)


def test_the_example_mounts_the_dashboard_and_acts_through_it(redis_url: str) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "dashboard_app.py")],
                          capture_output=True, text=True, timeout=60,
                          env=subprocess_env(PANQUEUE_URL=redis_url), cwd=ROOT)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    for expected in ("without the token: 401", "emails: 4 waiting, lag ",
                     f"jobs page: 200, jobs 1{DASH}4 of 4", "payload shown as text: True",
                     "pause: 303 -> /admin/queues/?done=pause",
                     "resume without the CSRF token: 403", "emails paused: True"):
        assert any(line.startswith(expected) for line in lines), (expected, lines)
    assert lines[-1] == "done"


def _listening_addresses(port: int) -> set[str]:
    """The IPv4 addresses a socket listens on at ``port`` (from /proc/net/tcp)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, _, hex_port = local.partition(":")
        if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
            found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found


def test_dashboard_command_listens_on_loopback_and_exits_0_on_sigterm(
        redis_url: str, tmp_path: Path) -> None:
    port = free_port()
    err = tmp_path / "dashboard.err"
    with err.open("wb") as log:
        process = subprocess.Popen(panqueue_command("dashboard", "--url", redis_url, "--port",
                                                    str(port)),
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                   env=subprocess_env(), cwd=ROOT)
    try:
        wait_until(lambda: _listening_addresses(port), 20, "the dashboard to listen")
        assert _listening_addresses(port) == {"127.0.0.1"}
        page = httpx.get(f"http://127.0.0.1:{port}/", timeout=10)
        assert page.status_code == 200 and "<h1>Queues</h1>" in page.text
        process.terminate()
        assert process.wait(15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert err.read_text().splitlines() == [f"serving the dashboard on http://127.0.0.1:{port}/"]


# --------------------------------------------------------------------------- Host and Origin


@pytest.fixture(scope="module")
def served(panqueue_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[str]:
    """``panqueue dashboard`` on a loopback port, also answering to the name ``dash.example``
    (``--allowed-host``, as behind a reverse proxy); yields its port, as text."""
    port = free_port()
    log = tmp_path_factory.mktemp("dashboard") / "err"
    with log.open("wb") as err:
        process = subprocess.Popen(
            panqueue_command("dashboard", "--url", panqueue_server.url, "--port", str(port),
                             "--allowed-host", "dash.example"),
            stdin=subprocess.DEVNULL, stdout=err, stderr=err, env=subprocess_env(), cwd=ROOT)
    try:
        wait_until(lambda: _listening_addresses(port), 20, "the dashboard to listen")
        yield str(port)
    finally:
        process.kill()
        process.wait()


def _over_http(port: str, host: str) -> httpx.Client:
    """A client of the dashboard on loopback that names ``host`` in its Host header, as a
    browser does for the name in its address bar (after a DNS rebinding: the attacker's)."""
    return httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"host": host},
                        timeout=10, follow_redirects=False)


def test_a_request_naming_another_host_is_refused_so_dns_rebinding_reads_nothing(
        served: str, client: SyncQueueClient, queue_name: str) -> None:
    """A page of evil.example whose name now resolves to 127.0.0.1 is, to the browser, on the
    dashboard's origin: its requests carry ``Host: evil.example:PORT``. None gets an answer;
    the names of the address served (and localhost, on loopback) do."""
    job = client.queue(queue_name).add({"secret": "s3"})
    for path in ("/", f"/job?q={queue_name}&id={job.id}",
                 f"/api/job?q={queue_name}&id={job.id}", "/api/overview", "/static/dashboard.js"):
        with _over_http(served, f"evil.example:{served}") as http:
            refused = http.get(path)
        assert refused.status_code == 421, path
        assert "s3" not in refused.text and queue_name not in refused.text
        assert refused.text.startswith(
            f"this dashboard does not serve the host 'evil.example:{served}' (it serves "
            f"127.0.0.1:{served} and localhost:{served}; "), refused.text
    for host in (f"127.0.0.1:{served}", f"localhost:{served}", f"LOCALHOST:{served}",
                 "dash.example", f"dash.example:{served}"):
        with _over_http(served, host) as http:
            page = http.get(f"/job?q={queue_name}&id={job.id}")
        assert page.status_code == 200, host
        assert "s3" in page.text
    for host in ("127.0.0.1", f"127.0.0.2:{served}", f"localhost:{int(served) + 1}",
                 f"evil.example:{served}@127.0.0.1", "", "[::1"):
        with _over_http(served, host) as http:
            assert http.get("/").status_code == 421, host


def test_an_action_from_another_origin_is_refused(served: str, client: SyncQueueClient,
                                                  queue_name: str) -> None:
    """A POST must come from a page of the dashboard: its Origin (or, without one, its Referer)
    names the host it was sent to. Refused (403) otherwise, even with the session's CSRF token,
    and nothing is done."""
    job = client.queue(queue_name).add({})
    with _over_http(served, f"127.0.0.1:{served}") as http:
        token = csrf_of(http.get("/"))
        form = {"csrf": token, "action": "remove", "queue": queue_name, "job_id": job.id}
        for headers in ({"origin": f"http://evil.example:{served}"}, {"origin": "null"},
                        {"origin": f"http://localhost:{served}"}, {},
                        {"referer": f"http://evil.example:{served}/"}):
            refused = http.post("/action", data=form, headers=headers)
            assert refused.status_code == 403, headers
            assert refused.text.startswith("an action must come from a page of this "
                                           "dashboard"), refused.text
        assert client.get_job(queue_name, job.id).state is JobState.WAITING
        done = http.post("/action", data=form, headers={"origin": f"http://127.0.0.1:{served}"})
        assert done.status_code == 303
        with pytest.raises(JobNotFound):
            client.get_job(queue_name, job.id)
        other = client.queue(queue_name).add({})
        done = http.post("/action", data={**form, "job_id": other.id},
                         headers={"referer": f"http://127.0.0.1:{served}/queue?q=x"})
        assert done.status_code == 303
        with pytest.raises(JobNotFound):
            client.get_job(queue_name, other.id)
    with _over_http(served, "dash.example") as http:  # behind a TLS proxy, say
        token = csrf_of(http.get("/"))
        done = http.post("/action", headers={"origin": "https://dash.example"},
                         data={"csrf": token, "action": "pause", "queue": queue_name})
        assert done.status_code == 303
    assert client.is_paused(queue_name)


def test_allowed_hosts_must_be_host_names(redis_url: str) -> None:
    for bad in ("", "http://dash.example", "dash.example/admin", "dash example", "a:b:c"):
        with pytest.raises(ConfigError, match="allowed_hosts"):
            create_app(redis_url, allowed_hosts=[bad])
    done = run_cli("dashboard", "--url", redis_url, "--allowed-host", "http://x")
    assert done.returncode == 2
    assert "--allowed-host" in _one_line(done)


def test_a_dashboard_with_a_prefix_shows_that_applications_queues_only(
        redis_url: str, client: SyncQueueClient) -> None:
    client.queue("bare-mail").add({"n": 1})
    with SyncQueueClient(redis_url, prefix="dash") as prefixed:
        job = prefixed.queue("dash-mail").add({"n": 2})
    with browser(create_app(redis_url, prefix="dash")) as web:
        rows = re.findall(r'<tr data-queue="([^"]+)">', web.get("/").text)
        assert rows == ["dash-mail"]
        page = web.get(f"/job?q=dash-mail&id={job.id}")
        assert page.status_code == 200 and '"n": 2' in html.unescape(page.text)
    with browser(create_app(redis_url)) as web:
        assert re.findall(r'<tr data-queue="([^"]+)">', web.get("/").text) == ["bare-mail"]


@pytest.mark.parametrize("count_after", [2, 1])
def test_the_overviews_rates_start_again_after_the_queues_partition_count_changed(
        redis_url: str, client: SyncQueueClient, queue_name: str,
        monkeypatch: pytest.MonkeyPatch, count_after: int) -> None:
    """The documented change of a partition count (drain, purge, deploy the new count) while a
    dashboard runs: its rates held the old count's event position, which the queue refuses
    now; they count again from the change, and the overview keeps serving."""
    monkeypatch.setattr(_reads, "_RATE_MIN_INTERVAL", 0.0)
    before, after = Registry(), Registry()

    @before.handler(queue_name, partitions=3)
    def work(job: Job[int]) -> None: ...

    @after.handler(queue_name, partitions=count_after)
    def work_again(job: Job[int]) -> None: ...

    client.queue(work).add(1)
    with browser(create_app(redis_url)) as web:
        assert web.get("/").status_code == 200  # the rates' first read: 3 partitions' position
        client.purge(queue_name)

        async def redeploy() -> None:
            async with run_worker(after, queue_name, redis_url):
                pass  # the worker lays the queue out again

        anyio.run(redeploy)
        client.queue(work_again).add(2)
        assert web.get("/").status_code == 200
        assert web.get("/api/overview").status_code == 200
        assert web.get("/").status_code == 200  # and the rates count on from there


def test_the_live_events_page_follows_on_after_the_queues_partition_count_changed(
        redis_url: str, client: SyncQueueClient, queue_name: str) -> None:
    """A page of live events open across the documented change of a partition count: the
    position it holds names the old count's streams, which the queue refuses now. The page's
    updates failed until it was reloaded; they now go on from the end of the new streams."""
    before, after = Registry(), Registry()

    @before.handler(queue_name, partitions=3)
    def work(job: Job[int]) -> None: ...

    @after.handler(queue_name, partitions=1)
    def work_again(job: Job[int]) -> None: ...

    client.queue(work).add(1)
    with browser(create_app(redis_url)) as web:
        position = web.get("/api/events", params={"q": queue_name}).json()["position"]
        assert position.count(",") == 2
        client.purge(queue_name)

        async def redeploy() -> None:
            async with run_worker(after, queue_name, redis_url):
                pass  # the worker lays the queue out again

        anyio.run(redeploy)
        reply = web.get("/api/events", params={"q": queue_name, "after": position})
        assert reply.status_code == 200, reply.text
        position = reply.json()["position"]
        assert "," not in position
        added = client.queue(work_again).add(2)
        reply = web.get("/api/events", params={"q": queue_name, "after": position})
        assert [(e["type"], e["job_id"]) for e in reply.json()["events"]] == [("added", added.id)]
