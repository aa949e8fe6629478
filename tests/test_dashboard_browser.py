"""The dashboard in a real browser: headless Chromium (Debian's ``chromium``) driven by
Playwright, against ``panqueue dashboard`` served by its own process, real workers and a real
Redis. One browser for the module, a fresh context (no cookies) per test."""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from panqueue import Job, JobState, QueueClient, Registry, SyncQueueClient, Worker
from tests.helpers import ROOT, free_port, panqueue_command, subprocess_env, wait_until

CHROMIUM = "/usr/bin/chromium"
TIMEOUT_MS = 20_000


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: the dashboard's browser tests need Debian's "
                    f"chromium package (apt-get install chromium)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                             args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture
def page(chromium: Browser) -> Iterator[Page]:
    context = chromium.new_context()
    context.set_default_timeout(TIMEOUT_MS)
    yield context.new_page()
    context.close()


@pytest.fixture
def dashboard(redis_url: str, tmp_path: Path) -> Iterator[Callable[..., str]]:
    """Start ``panqueue dashboard ARGS`` on a free loopback port; returns its base URL."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*args: str) -> str:
        port = free_port()
        log = (tmp_path / f"dashboard-{len(started)}.err").open("wb")
        process = subprocess.Popen(
            panqueue_command("dashboard", "--url", redis_url, "--port", str(port), *args),
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=subprocess_env(), cwd=ROOT)
        started.append(process)
        base = f"http://127.0.0.1:{port}"

        def answers() -> bool:
            assert process.poll() is None, (tmp_path / log.name).read_text()
            with contextlib.suppress(httpx.TransportError):
                return httpx.get(base + "/static/dashboard.css", timeout=1).status_code == 200
            return False

        wait_until(answers, 20, "the dashboard to answer", interval=0.05)
        return base

    yield start
    for process in started:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def worker(redis_url: str, tmp_path: Path) -> Iterator[Callable[[str], None]]:
    """Start ``panqueue worker dashboard_app:queues -q QUEUE``; killed at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(queue: str) -> None:
        with (tmp_path / "worker.err").open("ab") as log:
            started.append(subprocess.Popen(
                panqueue_command("worker", "dashboard_app:queues", "-q", queue, "--url",
                                 redis_url),
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=subprocess_env(),
                cwd=ROOT))

    yield start
    for process in started:
        process.kill()
        process.wait()


@pytest.fixture
def client(redis_url: str) -> Iterator[SyncQueueClient]:
    with SyncQueueClient(redis_url) as found:
        yield found


def _cell(page: Page, queue: str, field: str) -> object:
    return page.locator(f'tr[data-queue="{queue}"] [data-field="{field}"]')


def test_overview_shows_the_right_counts_and_follows_them_live(
        page: Page, dashboard: Callable[..., str], client: SyncQueueClient) -> None:
    client.queue("mail").add_bulk([{"n": n} for n in range(3)])
    client.queue("mail").add({"later": True}, delay=600)
    client.queue("reports").add({})
    client.pause("reports")
    page.goto(dashboard() + "/")
    expect(_cell(page, "mail", "waiting")).to_have_text("3")
    expect(_cell(page, "mail", "delayed")).to_have_text("1")
    expect(_cell(page, "reports", "waiting")).to_have_text("1")
    expect(_cell(page, "reports", "paused")).to_have_text("paused")
    expect(page.locator('tr[data-queue="reports"] button[data-action="resume"]')).to_be_visible()
    expect(page.locator('tr[data-queue="reports"] button[data-action="pause"]')).to_be_hidden()
    # Live: the page follows Redis without a reload.
    client.queue("mail").add_bulk([{"n": n} for n in range(4)])
    client.resume("reports")
    expect(_cell(page, "mail", "waiting")).to_have_text("7")
    expect(_cell(page, "reports", "paused")).to_have_text("running")
    expect(page.locator('tr[data-queue="reports"] button[data-action="pause"]')).to_be_visible()
    expect(page.locator('tr[data-queue="reports"] button[data-action="resume"]')).to_be_hidden()


def test_a_failed_jobs_page_shows_its_traceback_and_retry_runs_it_again(
        page: Page, dashboard: Callable[..., str], worker: Callable[[str], None],
        client: SyncQueueClient, tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    job = client.queue("dash-flaky").add({"flag": str(flag), "n": 7}, job_id="flaky-1")
    worker("dash-flaky")
    wait_until(lambda: client.get_job("dash-flaky", job.id).state is JobState.FAILED, 20,
               "the job to fail")
    page.goto(dashboard() + "/queue?q=dash-flaky&state=failed")
    page.get_by_role("link", name="flaky-1").click()
    traceback = page.locator("#job-traceback")
    expect(traceback).to_contain_text("Traceback (most recent call last)")
    expect(traceback).to_contain_text('raise RuntimeError("the flag file is missing")')
    expect(traceback).to_contain_text("RuntimeError: the flag file is missing")
    expect(page.locator("#job-history")).to_contain_text("RuntimeError")
    expect(page.locator("#job-logs")).to_contain_text("checking the flag file")
    flag.touch()
    page.locator('button[data-action="retry"]').click()
    expect(page.locator(".notice")).to_contain_text("1 job(s) moved back to waiting")
    # The job page follows the job's state until it is final.
    expect(page.locator("#job-state")).to_have_text("completed")
    expect(page.locator("#job-result")).to_contain_text('"ran": 7')
    assert client.get_job("dash-flaky", job.id).state is JobState.COMPLETED


def test_read_only_mode_has_no_working_action(
        page: Page, dashboard: Callable[..., str], client: SyncQueueClient) -> None:
    job = client.queue("mail").add({"n": 1})
    base = dashboard("--read-only")
    for path in ("/", "/queue?q=mail", f"/job?q=mail&id={job.id}", "/purge?q=mail"):
        page.goto(base + path)
        expect(page.locator("header .server")).to_contain_text("read-only")
        assert page.locator("button[data-action], form[action$='/action']").count() == 0, path
    # Nothing to press; a POST made by hand is refused too.
    status = page.evaluate("""async () => {
        const form = new URLSearchParams({action: "pause", queue: "mail"});
        const response = await fetch("/action", {method: "POST", body: form});
        return response.status;
    }""")
    assert status == 403
    assert not client.is_paused("mail")
    assert client.get_job("mail", job.id).state is JobState.WAITING


def test_a_script_payload_shows_as_text_and_never_runs(
        page: Page, dashboard: Callable[..., str], client: SyncQueueClient) -> None:
    payload = ('<script>window.__pwned = 1; document.title = "pwned"</script>'
               '<img src=x onerror="window.__pwned = 2">')
    job = client.queue("mail").add({"note": payload}, job_id="<b>bold-id</b>")
    base = dashboard()
    page.goto(base + "/events?q=mail")
    # An event that arrives while the page is open goes through the live code.
    client.queue("mail").add({"note": payload}, job_id="<i>live</i>")
    expect(page.locator("#events")).to_contain_text("<i>live</i>")
    for path in ("/queue?q=mail", "/job?q=mail&id=%3Cb%3Ebold-id%3C%2Fb%3E"):
        page.goto(base + path)
        expect(page.locator("main")).to_contain_text("<b>bold-id</b>")
        assert page.evaluate("window.__pwned") is None, path
        assert page.title() != "pwned"
        assert page.locator("main b, main img, main script").count() == 0, path
    expect(page.locator("#job-data")).to_contain_text('<script>window.__pwned = 1;')
    assert client.get_job("mail", job.id).data == {"note": payload}


def test_a_request_without_the_token_is_refused(
        page: Page, dashboard: Callable[..., str], client: SyncQueueClient) -> None:
    client.queue("mail").add({})
    base = dashboard("--token", "t0ken-for-tests")
    assert httpx.get(base + "/api/overview").status_code == 401
    page.goto(base + "/queue?q=mail")
    expect(page).to_have_url(base + "/login?next=%2Fqueue%3Fq%3Dmail")
    assert page.locator("#queues, #jobs").count() == 0
    page.get_by_label("Token").fill("wrong")
    page.get_by_role("button", name="Log in").click()
    expect(page.locator(".problem")).to_contain_text("not the dashboard's token")
    page.get_by_label("Token").fill("t0ken-for-tests")
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(base + "/queue?q=mail")
    expect(page.locator("#page-range")).to_contain_text("of 1")
    bearer = httpx.get(base + "/api/overview",
                       headers={"Authorization": "Bearer t0ken-for-tests"})
    assert bearer.status_code == 200


def _finish_huge_job(redis_url: str) -> str:
    """Run one job of queue ``dash-huge`` whose data, result and logs are each far over the
    page's bound (a worker with no payload bound); returns its id."""
    registry = Registry()

    @registry.handler("dash-huge")
    async def huge(job: Job) -> Any:
        for n in range(60):
            await job.log(f"line {n} " + "l" * 1_000)
        return {"out": "r" * 3_000_000}

    async def run() -> str:
        worker = Worker(registry, "dash-huge", url=redis_url, poll_interval=0.1,
                        max_payload_bytes=None)
        async with QueueClient(redis_url, max_payload_bytes=None) as client, \
                anyio.create_task_group() as tg:
            handle = await client.queue("dash-huge").add({"blob": "x" * 20_000_000})
            await tg.start(worker.run)
            await handle.result(timeout=60)
            await worker.shutdown()
        return handle.id

    # In a thread of its own: Playwright's sync API holds an event loop in this one.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(anyio.run, run).result()


def test_a_job_of_many_megabytes_shows_a_bounded_preview_and_links_the_raw_json(
        page: Page, dashboard: Callable[..., str], redis_url: str) -> None:
    job_id = _finish_huge_job(redis_url)
    base = dashboard()
    url = f"{base}/job?q=dash-huge&id={job_id}"
    html = httpx.get(url, timeout=60)
    assert html.status_code == 200
    assert len(html.content) < 200_000, len(html.content)  # not 23 MB
    page.goto(url)
    expect(page.locator("#job-state")).to_have_text("completed")
    expect(page.locator("#job-data")).to_contain_text('"blob": "xxxxxxxx')
    expect(page.locator("#job-data-cut")).to_contain_text("of 20,000,016 characters")
    expect(page.locator("#job-result-cut")).to_contain_text("of 3,000,015 characters")
    expect(page.locator("#job-logs")).to_contain_text("line 0 lll")
    expect(page.locator("#job-logs-cut")).to_be_visible()
    # The whole of each, a click away, as raw JSON.
    for part, whole in (("data", {"blob": "x" * 20_000_000}),
                        ("result", {"out": "r" * 3_000_000})):
        href = page.locator(f"#job-{part}-cut a").get_attribute("href")
        assert href is not None
        raw = httpx.get(base + href, timeout=60)
        assert raw.headers["content-type"].startswith("application/json")
        assert raw.json() == whole
    page.locator("#job-logs-cut a").click()
    lines = json.loads(page.locator("body").inner_text())
    assert len(lines) == 60 and lines[59].startswith("line 59 ")
