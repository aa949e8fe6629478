"""The dashboard's paper cuts, met as a person meets them, in headless Chromium (Debian's
``chromium``, as in tests/test_dashboard_browser.py) against ``panqueue dashboard`` and real
workers: every time in one format and in UTC, a list row's Retry that returns to that list, a
job's progress as a bar with its number, and a purge whose confirmation has a typo that keeps
the form."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from panqueue import JobState, SyncQueueClient
from tests import test_dashboard_browser as browser
from tests.helpers import wait_until

# The fixtures of the dashboard's browser tests.
chromium = browser.chromium
page = browser.page
dashboard = browser.dashboard
worker = browser.worker
client = browser.client

# How long a live part may take to show a change (it polls every 1 to 2 s; the machine may be
# busy).
LIVE_MS = browser.TIMEOUT_MS
# The one format of every time on the dashboard (docs/dashboard.md).
ONE_FORMAT = re.compile(r"\b(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3}) UTC\b")
# Anything else that reads as a time or a date: a clock, a date with slashes, AM/PM, ISO's T.
OTHER_TIME = re.compile(r"\b\d{1,2}:\d{2}(:\d{2})?\b|\b\d{1,2}/\d{1,2}/\d{2,4}\b|\b[AP]M\b"
                        r"|\d{4}-\d{2}-\d{2}T\d{2}")


@pytest.fixture
def far_page(chromium: Browser) -> Iterator[Page]:
    """A browser 14 hours ahead of UTC, so that a time written in its own zone shows."""
    context = chromium.new_context(timezone_id="Pacific/Kiritimati", locale="en-US")
    context.set_default_timeout(browser.TIMEOUT_MS)
    yield context.new_page()
    context.close()


def times_on(page: Page) -> list[datetime]:
    """Every time the page shows, each of which must be in the one format; as datetimes."""
    text = page.locator("main").inner_text()
    other = OTHER_TIME.search(ONE_FORMAT.sub("", text))
    assert other is None, f"{page.url} shows a time in another format: {other.group(0)!r}\n{text}"
    return [datetime.strptime(found, "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC)
            for found in ONE_FORMAT.findall(text)]


def about_now(when: datetime) -> bool:
    return abs(datetime.now(UTC) - when) < timedelta(minutes=2)


def test_every_time_is_in_one_format_and_in_utc(
        far_page: Page, dashboard: Callable[..., str], worker: Callable[[str], None],
        client: SyncQueueClient) -> None:
    page = far_page
    worker("dash-fail")
    worker("dash-echo")  # registers the schedule dash-nightly
    failed = client.queue("dash-fail").add({"n": 1}).id
    done = client.queue("dash-echo").add({"n": 2}).id
    later = client.queue("dash-echo").add({"n": 3}, delay=3600).id
    wait_until(lambda: client.get_job("dash-fail", failed).state is JobState.FAILED
               and client.get_job("dash-echo", done).state is JobState.COMPLETED
               and client.schedules("dash-echo"), 30, "the jobs to finish")
    base = dashboard()

    # The overview, once its live part has updated it.
    page.goto(base + "/")
    status = page.locator("#live-status")
    first = status.inner_text()
    expect(status).not_to_have_text(first, timeout=LIVE_MS)
    [updated] = times_on(page)
    assert about_now(updated), updated

    for path in ("/queue?q=dash-fail&state=failed", "/queue?q=dash-echo&state=completed",
                 f"/job?q=dash-fail&id={failed}", f"/job?q=dash-echo&id={done}"):
        page.goto(base + path)
        found = times_on(page)
        assert found and all(about_now(when) for when in found), (path, found)
    # A delayed job is due in an hour: its list's column and its page's explanation.
    for path in ("/queue?q=dash-echo&state=delayed", f"/job?q=dash-echo&id={later}"):
        page.goto(base + path)
        due = [when for when in times_on(page) if not about_now(when)]
        assert due and all(abs(when - datetime.now(UTC) - timedelta(hours=1))
                           < timedelta(minutes=2) for when in due), (path, due)
    page.goto(base + "/workers")
    expect(page.locator("#workers tbody tr")).to_have_count(2)
    assert all(about_now(when) for when in times_on(page))
    page.goto(base + "/schedules")
    expect(page.locator("#schedules")).to_contain_text("dash-nightly")
    assert times_on(page)

    # The events page, once its live part has added an event and said when it updated.
    page.goto(base + "/events?q=dash-echo")
    client.queue("dash-echo").add({"n": 4}, job_id="live-event")
    expect(page.locator("#events")).to_contain_text("live-event", timeout=LIVE_MS)
    expect(page.locator("#live-status")).to_contain_text("updated", timeout=LIVE_MS)
    assert all(about_now(when) for when in times_on(page))


def test_retry_on_a_list_row_returns_to_that_list_as_it_was(
        page: Page, dashboard: Callable[..., str], worker: Callable[[str], None],
        client: SyncQueueClient) -> None:
    """A filtered list (a tag and an error type) at its second page: the row's Retry returns
    to the page's whole address, filters included."""
    worker("dash-fail")
    ids = [client.queue("dash-fail").add({"n": n}, tags=["import"]).id for n in range(3)]
    other = client.queue("dash-fail").add({"n": 3}).id  # not tagged: not on the list
    wait_until(lambda: all(client.get_job("dash-fail", i).state is JobState.FAILED
                           for i in [*ids, other]), 30, "the jobs to fail")
    base = dashboard()
    listing = (base + "/queue?q=dash-fail&state=failed&tag=import&error_type=ValueError"
               "&offset=1&limit=1")
    page.goto(listing)
    row = page.locator("#jobs tbody tr")
    expect(row).to_have_count(1)
    job_id = row.get_attribute("data-job")
    assert job_id in ids
    row.locator('button[data-action="retry"]').click()
    # Back on the same list: the same state, filters and page, with the notice.
    expect(page).to_have_url(listing + "&done=retry&n=1")
    expect(page.locator('input[type="search"][name="tag"]')).to_have_value("import")
    expect(page.locator(".notice")).to_have_text("1 job(s) moved back to waiting.")
    expect(page.locator(".tabs a.current")).to_contain_text("failed")
    # It did run again (and failed again: its history holds both attempts).
    wait_until(lambda: len(client.get_job("dash-fail", job_id).history) == 2, 30,
               "the retried job to run again")
    assert len(client.get_job("dash-fail", other).history) == 1


def test_progress_is_a_bar_with_its_number_and_other_values_are_text(
        page: Page, dashboard: Callable[..., str], worker: Callable[[str], None],
        client: SyncQueueClient, tmp_path: Path) -> None:
    def add(job_id: str, *steps: object) -> None:
        home = tmp_path / job_id
        home.mkdir()
        client.queue("dash-progress").add({"steps": list(steps), "dir": str(home)},
                                          job_id=job_id)

    def go(job_id: str, step: int) -> None:
        (tmp_path / job_id / f"go-{step}").touch()

    add("percent", 40, 72.5)
    add("rows", {"rows": 3, "of": 9})
    add("html", "<b>half</b>")
    worker("dash-progress")
    wait_until(lambda: all(client.get_job("dash-progress", i).progress is not None
                           for i in ("percent", "rows", "html")), 30, "the jobs' progress")
    base = dashboard()

    # The active list: a bar where the progress is a percentage, the value elsewhere.
    page.goto(base + "/queue?q=dash-progress&state=active")
    cell = page.locator('tr[data-job="percent"] td[data-column="progress"]')
    expect(cell.locator("progress")).to_be_visible()
    expect(cell.locator("progress")).to_have_js_property("value", 40)
    expect(cell).to_have_text("40%")
    rows = page.locator('tr[data-job="rows"] td[data-column="progress"]')
    expect(rows.locator("progress")).to_be_hidden()
    expect(rows).to_contain_text('"rows": 3')
    html = page.locator('tr[data-job="html"] td[data-column="progress"]')
    expect(html).to_have_text('"<b>half</b>"')
    assert page.locator("main b").count() == 0

    # The job's page follows it live, bar and number.
    page.goto(base + "/job?q=dash-progress&id=percent")
    bar = page.locator("#job-progress-bar")
    expect(bar).to_be_visible()
    expect(bar).to_have_js_property("value", 40)
    expect(page.locator("#job-progress")).to_have_text("40%")
    go("percent", 0)
    expect(page.locator("#job-progress")).to_have_text("72.5%", timeout=LIVE_MS)
    expect(bar).to_have_js_property("value", 72.5)
    go("percent", 1)
    expect(page.locator("#job-state")).to_have_text("completed", timeout=LIVE_MS)
    expect(page.locator("#job-progress-bar")).to_have_js_property("value", 72.5)

    page.goto(base + "/job?q=dash-progress&id=rows")
    expect(page.locator("#job-progress-bar")).to_be_hidden()
    expect(page.locator("#job-progress")).to_contain_text('"of": 9')
    for job_id in ("rows", "html"):
        go(job_id, 0)


def test_a_purge_confirmation_with_a_typo_keeps_the_form_and_deletes_nothing(
        page: Page, dashboard: Callable[..., str], client: SyncQueueClient) -> None:
    client.queue("dash-purge").add_bulk([{"n": n} for n in range(3)])
    client.queue("dash-purge").add({"n": 3}, delay=3600)
    base = dashboard()
    page.goto(base + "/purge?q=dash-purge")
    waiting = page.locator('input[name="state"][value="waiting"]')
    waiting.check()
    confirm = page.get_by_label("Type the queue's name to confirm")
    confirm.fill("<i>dash-prge</i>")
    page.locator('button[data-action="purge"]').click()

    # The same form, as it was filled, with one line saying what is wrong.
    expect(page.locator("#purge-form")).to_be_visible()
    expect(confirm).to_have_value("<i>dash-prge</i>")
    expect(waiting).to_be_checked()
    expect(page.locator('input[name="state"][value="delayed"]')).not_to_be_checked()
    alert = page.get_by_role("alert")
    expect(alert).to_have_count(1)
    expect(alert).to_have_text("\u201c<i>dash-prge</i>\u201d is not the queue's name: type "
                               "\u201cdash-purge\u201d exactly to purge it. Nothing was deleted.")
    assert page.locator("main i").count() == 0
    assert client.counts("dash-purge")[JobState.WAITING] == 3

    confirm.fill("dash-purge")
    page.locator('button[data-action="purge"]').click()
    expect(page.locator(".notice")).to_have_text("3 job(s) deleted.")
    counts = client.counts("dash-purge")
    assert counts[JobState.WAITING] == 0 and counts[JobState.DELAYED] == 1
