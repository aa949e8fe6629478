"""The dashboard's bulk actions and worker controls: a list filtered by tag or error type, a
multi-select whose confirmation says how many jobs it will touch before anything changes,
actions by filter, the workers page's buttons, and all of it refused when read-only. The
browser test drives Debian's chromium (see tests/test_dashboard_browser.py)."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from panqueue import JobState, SyncQueueClient
from panqueue._job import ErrorInfo
from panqueue._store.ops import encode_error
from panqueue.dashboard import create_app
from tests.helpers import ROOT, subprocess_env, wait_until
from tests.store_fixtures import ScriptStore
from tests.test_dashboard import browser, csrf_of
from tests.test_dashboard_browser import chromium, dashboard, page  # noqa: F401 (fixtures)


@pytest.fixture
def client(redis_url: str) -> Iterator[SyncQueueClient]:
    with SyncQueueClient(redis_url) as found:
        yield found


def test_a_filtered_list_and_its_confirmation_count_before_anything_changes(
        redis_url: str, client: SyncQueueClient, queue_name: str) -> None:
    queue = client.queue(queue_name)
    mine = [queue.add({"n": n}, tags=["tenant:1"]).id for n in range(7)]
    others = [queue.add({"n": n}, tags=["tenant:2"]).id for n in range(3)]
    with browser(create_app(redis_url)) as web:
        listed = web.get("/queue", params={"q": queue_name, "tag": "tenant:1"})
        assert listed.status_code == 200
        shown = re.findall(r'name="id" value="([^"]+)"', listed.text)
        assert shown == mine
        confirm = web.get("/bulk", params={"q": queue_name, "state": "waiting",
                                           "tag": "tenant:1", "do": "cancel:all"})
        assert re.search(r'id="bulk-count">7<', confirm.text)
        assert client.counts(queue_name)[JobState.WAITING] == 10  # asking changed nothing
        token = csrf_of(confirm)
        done = web.post("/action", data={"csrf": token, "action": "bulk", "queue": queue_name,
                                         "state": "waiting", "tag": "tenant:1",
                                         "do": "cancel:all"})
        assert done.status_code == 303 and "n=7" in done.headers["location"]
        assert "7 job(s) cancelled." in web.get(done.headers["location"]).text
        selected = web.get("/bulk", params=[("q", queue_name), ("state", "waiting"),
                                            ("do", "remove:selected"), ("id", others[0]),
                                            ("id", others[1]), ("id", mine[0])])
        # mine[0] is cancelled now: only the two waiting ones are on this tab's selection.
        assert re.search(r'id="bulk-count">2<', selected.text)
        removed = web.post("/action", data={
            "csrf": token, "action": "bulk", "queue": queue_name, "state": "waiting",
            "do": "remove:selected", "id": [others[0], others[1], mine[0]]})
        assert "n=2" in removed.headers["location"]
    counts = client.counts(queue_name)
    assert counts[JobState.CANCELLED] == 7 and counts[JobState.WAITING] == 1


def test_read_only_refuses_bulk_actions_and_worker_controls(
        redis_url: str, client: SyncQueueClient, queue_name: str) -> None:
    job = client.queue(queue_name).add({}, tags=["t"])
    with browser(create_app(redis_url, read_only=True)) as web:
        page_ = web.get("/queue", params={"q": queue_name, "tag": "t"})
        assert 'id="bulk-form"' not in page_.text and 'form="bulk-form"' not in page_.text
        confirm = web.get("/bulk", params={"q": queue_name, "state": "waiting", "tag": "t",
                                           "do": "cancel:all"})
        assert "/action" not in confirm.text
        workers = web.get("/workers")
        assert "/action" not in workers.text
        signer = web.app.state.dashboard.signer
        sid = signer.session_of(web.cookies["panqueue_session"])
        fields: dict[str, Any] = {"csrf": signer.csrf_token(sid), "queue": queue_name}
        for form in ({"action": "bulk", "state": "waiting", "tag": "t", "do": "cancel:all"},
                     {"action": "control", "worker": "w", "command": "stop"}):
            assert web.post("/action", data={**fields, **form}).status_code == 403
    assert client.get_job(queue_name, job.id).state is JobState.WAITING


WORKER = textwrap.dedent("""
    import sys

    import anyio

    from panqueue import Job, Registry, Worker

    url, queue, name = sys.argv[1:4]
    registry = Registry()


    @registry.handler(queue)
    async def slow(job: Job[float]) -> None:
        await anyio.sleep(job.data)


    anyio.run(Worker(registry, queue, url=url, name=name, concurrency=1,
                     heartbeat_interval=0.5).run)
""")


def test_workers_page_buttons_pause_resize_and_stop_a_worker(
        page: Page, dashboard: Callable[..., str], client: SyncQueueClient,  # noqa: F811
        redis_url: str, queue_name: str, tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    name = f"dash-{queue_name}"
    process = subprocess.Popen([sys.executable, str(script), redis_url, queue_name, name],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               env=subprocess_env(), cwd=ROOT)
    try:
        wait_until(lambda: bool(client.workers(queue_name)), 20, "the worker to beat")
        client.queue(queue_name).add_bulk([0.3] * 100)
        page.goto(dashboard() + "/workers")
        row = page.locator(f'tr[data-worker="{name}"]')
        row.get_by_label(f"concurrency of {name}").fill("3")
        row.locator('button[data-action="control-concurrency"]').click()
        expect(page.locator(".notice")).to_contain_text("next heartbeat")
        wait_until(lambda: client.counts(queue_name)[JobState.ACTIVE] == 3, 5,
                   "three jobs at once")
        page.locator(f'tr[data-worker="{name}"] button[data-action="control-pause"]').click()
        wait_until(lambda: [w.paused for w in client.workers(queue_name)] == [True], 5,
                   "the worker to report itself paused")
        page.goto(page.url.split("?")[0])
        expect(page.locator(f'tr[data-worker="{name}"]')).to_contain_text("paused")
        page.locator(f'tr[data-worker="{name}"] button[data-action="control-stop"]').click()
        process.wait(timeout=15)
        assert process.returncode == 0
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def test_multi_select_in_chromium_confirms_the_count_then_retries(
        page: Page, dashboard: Callable[..., str], client: SyncQueueClient,  # noqa: F811
        store: ScriptStore) -> None:
    """Tick two failed jobs, ask to retry them: the confirmation names 2 and nothing moves
    until it is confirmed; a filter by error type then retries every job of that type after
    a confirmation naming how many."""
    queue_name = store.keys.name
    for n in range(6):
        _fail(store, "TimeoutError" if n % 2 else "ValueError")
    base = dashboard()
    page.goto(f"{base}/queue?q={queue_name}&state=failed")
    boxes = page.locator('input[type="checkbox"][name="id"]')
    expect(boxes).to_have_count(6)
    boxes.nth(0).check()
    boxes.nth(1).check()
    page.locator('button[data-bulk="retry:selected"]').click()
    expect(page.locator("#bulk-count")).to_have_text("2")
    assert client.counts(queue_name)[JobState.FAILED] == 6
    page.locator('button[data-action="bulk"]').click()
    expect(page.locator(".notice")).to_contain_text("2 job(s) moved back to waiting")
    assert client.counts(queue_name)[JobState.FAILED] == 4
    page.goto(f"{base}/queue?q={queue_name}&state=failed")
    page.get_by_label("error type").fill("TimeoutError")
    page.get_by_role("button", name="Filter").click()
    expect(page.locator("#page-range")).to_contain_text("matching")
    wanted = len(client.list_jobs(queue_name, "failed", error_type="TimeoutError"))
    assert wanted >= 1
    page.locator('button[data-bulk="retry:all"]').click()
    expect(page.locator("#bulk-count")).to_have_text(str(wanted))
    page.locator('button[data-action="bulk"]').click()
    expect(page.locator(".notice")).to_contain_text(f"{wanted} job(s) moved back to waiting")
    left = client.list_jobs(queue_name, "failed")
    assert left and all(j.error is not None and j.error.type == "ValueError" for j in left)
    # The header's box selects every job of the page (the page's script).
    page.goto(f"{base}/queue?q={queue_name}&state=failed")
    page.locator("#select-all").check()
    expect(page.locator('input[name="id"]:checked')).to_have_count(len(left))


def _fail(store: ScriptStore, error_type: str) -> str:
    """A job of the store's queue that failed for good with ``error_type``, as a worker
    fails it (claimed under a token, then failed with its last attempt)."""
    job_id = store.add_one()
    token = uuid.uuid4().hex
    assert store.claim(token) == [job_id]
    store.fail(job_id, token, error=encode_error(ErrorInfo(error_type, "it broke")))
    return job_id
