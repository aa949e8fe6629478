"""The dashboard's lists and hints in a real browser (headless Debian chromium, as in
tests/test_dashboard_browser.py): each state's list shows the column that matters for it, the
workers page shows one row per worker process, and a job's explanation points at the
dashboard's own button, never at a Python call."""

from __future__ import annotations

from collections.abc import Callable

from playwright.sync_api import Page, expect

from panqueue import JobState, SyncQueueClient
from tests import test_dashboard_browser as browser
from tests import test_operator_views as views
from tests.helpers import WorkerProcess, wait_until

# The fixtures of the dashboard's browser tests and of the operator views' worker processes.
chromium = browser.chromium
page = browser.page
dashboard = browser.dashboard
client = browser.client
start_ops_worker = views.start_ops_worker
running = views.running


def cell(page: Page, job_id: str, column: str) -> object:
    return page.locator(f'tr[data-job="{job_id}"] td[data-column="{column}"]')


def test_each_states_list_shows_its_columns(
        page: Page, dashboard: Callable[..., str], client: SyncQueueClient,
        start_ops_worker: Callable[..., WorkerProcess]) -> None:
    start_ops_worker("-q", "ops-flaky", "-q", "ops-one", "-q", "ops-fail", "--url",
                     client.url)
    retried = client.queue("ops-flaky").add("x").id
    later = client.queue("ops-flaky").add("later", delay=3600).id
    held = client.queue("ops-one").add("held").id
    failed = client.queue("ops-fail").add("bad").id
    wait_until(lambda: client.get_job("ops-flaky", retried).state is JobState.DELAYED
               and running(client, "ops-one", held)
               and client.get_job("ops-fail", failed).state is JobState.FAILED, timeout=30)
    [worker] = client.workers("ops-one")
    base = dashboard()

    page.goto(base + "/queue?q=ops-flaky&state=delayed")
    expect(cell(page, retried, "why")).to_have_text("retry 2 of 3 after ConnectionError")
    expect(cell(page, later, "why")).to_have_text("delayed by the producer")
    expect(cell(page, retried, "due")).to_contain_text(" UTC")

    page.goto(base + "/queue?q=ops-one&state=active")
    expect(cell(page, held, "worker")).to_have_text(worker.name)
    expect(cell(page, held, "running for")).to_contain_text(" s")
    expect(cell(page, held, "started")).to_contain_text(" UTC")

    page.goto(base + "/queue?q=ops-fail&state=failed")
    expect(cell(page, failed, "reason")).to_have_text("max_attempts_exceeded")
    expect(cell(page, failed, "error type")).to_have_text("ValueError")

    page.goto(base + "/workers")
    expect(page.locator("#workers tbody tr")).to_have_count(1)
    expect(page.locator("#workers tbody tr")).to_contain_text("ops-fail, ops-flaky, ops-one")


def test_a_paused_jobs_explanation_points_at_the_resume_button(
        page: Page, dashboard: Callable[..., str], client: SyncQueueClient) -> None:
    job_id = client.queue("ops-paused").add("x").id
    client.pause("ops-paused")
    page.goto(dashboard() + f"/job?q=ops-paused&id={job_id}")
    explanation = page.locator("#job-live .explain")
    expect(explanation).to_contain_text("the Resume button below")
    expect(explanation).not_to_contain_text("client.")
    page.locator('button[data-action="resume"]').click()
    expect(page.locator(".notice")).to_be_visible()
    assert not client.is_paused("ops-paused")
