"""A job's flow on its dashboard page, in headless Chromium (Debian's ``chromium``, as in
tests/test_dashboard_browser.py) against ``panqueue dashboard`` and a real Redis: the jobs it
depends on and those that depend on it, each with its state written, in layers, each a link to
its page; a removed dependency, the bound on the jobs drawn, ids that hold markup, and a
partitioned queue. The jobs' states are arranged with the store's scripts (no worker)."""

from __future__ import annotations

import contextlib
import zlib
from collections.abc import Callable, Iterator

import httpx
import pytest
from playwright.sync_api import Locator, Page, expect
from starlette.applications import Starlette
from starlette.routing import Mount

from panqueue import FlowJob, Job, Registry, SyncQueueClient
from panqueue._store.ops import read_flow
from panqueue.dashboard import create_app
from panqueue.dashboard._flow import draw
from tests import test_dashboard_browser as browser
from tests.store_fixtures import ScriptStore, open_store, run_first
from tests.test_dashboard import browser as in_process

# The fixtures of the dashboard's browser tests.
chromium = browser.chromium
page = browser.page
dashboard = browser.dashboard
client = browser.client

MARKUP = "<script>window.__pwned = 1</script>"


@pytest.fixture
def store(client: SyncQueueClient) -> Iterator[Callable[[str], ScriptStore]]:
    """The store's scripts on a queue of the test's server, by name."""
    with contextlib.ExitStack() as stack:
        yield lambda queue: stack.enter_context(open_store(client.url, queue, ScriptStore))



def node(page: Page, job_id: str) -> Locator:
    quoted = job_id.replace("\\", "\\\\").replace('"', '\\"')
    return page.locator(f'#job-flow .flow-node[data-job="{quoted}"]')


def left(page: Page, job_id: str) -> float:
    """Where a job's box starts, from the page's left."""
    box = node(page, job_id).bounding_box()
    assert box is not None, f"{job_id} is not drawn"
    return box["x"]


def job_page(base: str, queue: str, job_id: str) -> str:
    return str(httpx.URL(base + "/job", params={"q": queue, "id": job_id}))


def test_a_jobs_page_draws_its_flow_with_each_state_and_each_job_opens_its_page(
        page: Page, dashboard: Callable[..., str], client: SyncQueueClient,
        store: Callable[[str], ScriptStore]) -> None:
    queue = client.queue("flow-etl")
    extract = queue.add("extract", job_id="extract")
    queue.add("middle", job_id="middle", depends_on=[extract])
    queue.add("load", job_id="load", depends_on=["middle"])
    queue.add("doomed", job_id="doomed")
    queue.add("report", job_id="report", depends_on=["middle", "doomed"])
    queue.add("archive", job_id="archive", depends_on=["load"])
    assert run_first(store("flow-etl"), 2, fail=("doomed",)) == ["extract", "doomed"]

    base = dashboard()
    page.goto(job_page(base, "flow-etl", "middle"))
    expect(page.get_by_role("heading", name="Flow", exact=True)).to_be_visible()
    shown = {"extract": "completed", "middle": "waiting", "load": "blocked",
             "report": "failed", "archive": "blocked"}
    for job_id, state in shown.items():
        # The state is written in the box, not told by its colour alone.
        expect(node(page, job_id).locator(".flow-state")).to_have_text(state)
        expect(node(page, job_id).locator(".flow-id")).to_have_text(job_id)
    expect(page.locator("#job-flow .flow-node")).to_have_count(5)
    expect(page.locator("#job-flow .flow-edge")).to_have_count(4)
    expect(node(page, "middle")).to_have_attribute("aria-current", "page")
    # Dependencies left of the job, dependents right, a dependent's dependent further right.
    x = {job_id: left(page, job_id) for job_id in shown}
    assert x["extract"] < x["middle"] < x["load"] == x["report"] < x["archive"]
    # Its colour follows its state: a completed job's box is not a blocked one's.
    fills = {job_id: node(page, job_id).locator("rect").evaluate(
        "r => getComputedStyle(r).fill") for job_id in shown}
    assert len({fills["extract"], fills["load"], fills["report"], fills["middle"]}) == 4

    node(page, "load").click()
    expect(page.locator("#job-id")).to_have_text("load")
    expect(node(page, "load")).to_have_attribute("aria-current", "page")
    expect(node(page, "extract").locator(".flow-state")).to_have_text("completed")
    node(page, "extract").click()
    expect(page.locator("#job-id")).to_have_text("extract")
    # The same graph as JSON.
    flow = httpx.get(base + "/api/job/flow", params={"q": "flow-etl", "id": "middle"}).json()
    assert {n["id"]: n["state"] for n in flow["nodes"]} == shown
    assert {(e["dependency"], e["dependent"]) for e in flow["edges"]} == {
        ("extract", "middle"), ("middle", "load"), ("middle", "report"), ("load", "archive")}
    assert flow["hidden"] == 0 and flow["counted_all"] is True


def test_a_job_without_dependencies_or_dependents_has_no_flow_section(
        page: Page, dashboard: Callable[..., str], client: SyncQueueClient) -> None:
    alone = client.queue("flow-alone").add("alone")
    page.goto(job_page(dashboard(), "flow-alone", alone.id))
    expect(page.locator("#job-id")).to_have_text(alone.id)
    expect(page.get_by_role("heading", name="Flow", exact=True)).to_have_count(0)
    expect(page.locator("#job-flow")).to_have_count(0)


def test_a_removed_dependency_shows_as_removed_without_a_link(
        page: Page, dashboard: Callable[..., str], client: SyncQueueClient,
        store: Callable[[str], ScriptStore]) -> None:
    queue = client.queue("flow-removed")
    setup = queue.add("setup", job_id="setup")
    queue.add("main", job_id="main", depends_on=[setup])
    run_first(store("flow-removed"), 1)
    client.remove("flow-removed", "setup")
    page.goto(job_page(dashboard(), "flow-removed", "main"))
    expect(node(page, "setup").locator(".flow-state")).to_have_text("removed")
    # Its page would be a 404: the box is no link.
    assert node(page, "setup").evaluate("n => [n.tagName, n.hasAttribute('href')]") == [
        "g", False]
    expect(node(page, "main").locator(".flow-state")).to_have_text("waiting")


def test_a_large_flow_draws_the_nearest_jobs_and_says_how_many_more(
        page: Page, dashboard: Callable[..., str], client: SyncQueueClient) -> None:
    root, *_ = client.queue("flow-wide").add_flow(
        [FlowJob("root"), *(FlowJob(n, depends_on=(0,)) for n in range(250))])
    page.goto(job_page(dashboard(), "flow-wide", root.id))
    expect(page.locator("#job-flow .flow-node")).to_have_count(200)
    expect(page.locator("#job-flow-more")).to_have_text(
        "51 more not shown: the 200 jobs nearest to this one are.")


def test_ids_and_queue_names_with_markup_are_drawn_as_text(
        page: Page, dashboard: Callable[..., str], client: SyncQueueClient) -> None:
    name = f"flow {MARKUP}"
    queue = client.queue(name)
    upstream = queue.add("up", job_id=f"up {MARKUP}")
    middle = queue.add("middle", job_id=f"mid {MARKUP}", depends_on=[upstream])
    queue.add("down", job_id='down "><svg onload=alert(1)>', depends_on=[middle])
    base = dashboard()
    raw = httpx.get(base + "/job", params={"q": name, "id": middle.id}).text
    assert "<script>window" not in raw and "<svg onload" not in raw
    page.goto(job_page(base, name, middle.id))
    expect(page.locator("#job-flow .flow-node")).to_have_count(3)
    expect(page.locator("#job-flow").locator("xpath=preceding-sibling::p[1]")).to_contain_text(
        f"The jobs of {name} that this job depends on")
    # Long ids are cut in the box; the whole id is its title, as text.
    titles = page.locator("#job-flow .flow-node > title").all_text_contents()
    assert sorted(titles) == sorted([f"up {MARKUP}: waiting", f"mid {MARKUP}: blocked",
                                     'down "><svg onload=alert(1)>: blocked'])
    assert page.evaluate("() => window.__pwned") is None
    node(page, 'down "><svg onload=alert(1)>').click()
    expect(page.locator("#job-id")).to_have_text('down "><svg onload=alert(1)>')
    assert page.evaluate("() => window.__pwned") is None


N = 3


def test_a_partitioned_queues_flow_is_drawn_from_the_jobs_partition(
        page: Page, dashboard: Callable[..., str], client: SyncQueueClient) -> None:
    registry = Registry()

    @registry.handler("flow-parts", partitions=N)
    async def work(job: Job[str]) -> None: ...

    queue = client.queue(work)
    # A custom id that routes to partition 2, placed with its dependency in partition 1.
    root = queue.add("root", job_id=next(f"root-{i}" for i in range(1000)
                                         if zlib.crc32(f"root-{i}".encode()) % N == 1))
    child = queue.add("child", job_id=next(f"child-{i}" for i in range(1000)
                                           if zlib.crc32(f"child-{i}".encode()) % N == 2),
                      depends_on=[root])
    base = dashboard()
    page.goto(job_page(base, "flow-parts", child.id))
    expect(node(page, root.id).locator(".flow-state")).to_have_text("waiting")
    expect(node(page, child.id).locator(".flow-state")).to_have_text("blocked")
    node(page, root.id).click()
    expect(page.locator("#job-id")).to_have_text(root.id)
    expect(node(page, child.id).locator(".flow-state")).to_have_text("blocked")


def test_the_flow_keeps_the_dashboards_guards_and_its_mount_path(
        redis_url: str, client: SyncQueueClient) -> None:
    """In-process: the JSON wants the token like every page, answers only its own host, and
    under a mount path each box links under it."""
    queue = client.queue("flow-guards")
    queue.add("a", job_id="first")
    queue.add("b", job_id="second", depends_on=["first"])
    params = {"q": "flow-guards", "id": "second"}
    token = {"Authorization": "Bearer s3cret-token"}
    app = create_app(redis_url, token="s3cret-token", allowed_hosts=["testserver"])
    with in_process(app) as web:
        assert web.get("/api/job/flow", params=params).status_code == 401
        assert web.get("/job", params=params).status_code == 303  # to the login form
        assert web.get("/api/job/flow", params=params,
                       headers={**token, "host": "rebound.example"}).status_code == 421
        flow = web.get("/api/job/flow", params=params, headers=token).json()
        assert [(n["id"], n["state"]) for n in flow["nodes"]] == [("second", "blocked"),
                                                                  ("first", "waiting")]
        missing = web.get("/api/job/flow", params={"q": "flow-guards", "id": "gone"},
                          headers=token)
        assert missing.status_code == 404
    outer = Starlette(routes=[Mount("/admin/jobs", create_app(redis_url))])
    with in_process(outer) as web:
        page = web.get("/admin/jobs/job", params=params).text
    assert 'href="/admin/jobs/job?q=flow-guards&amp;id=first"' in page


def test_a_dependency_of_a_dependency_is_drawn_left_of_it_even_at_the_same_depth(
        client: SyncQueueClient) -> None:
    """top depends on base and on mid, mid on base: both are one edge from top, yet base is
    drawn left of mid, so that every arrow points right."""
    queue = client.queue("flow-diamond")
    queue.add("base", job_id="base")
    queue.add("mid", job_id="mid", depends_on=["base"])
    queue.add("top", job_id="top", depends_on=["base", "mid"])
    queue.add("after", job_id="after", depends_on=["top", "mid"])
    flow = client.producer.run(client.producer.on_job("flow-diamond", "after", read_flow))
    assert {n.id: n.depth for n in flow.nodes} == {"after": 0, "top": -1, "mid": -1,
                                                  "base": -2}
    drawing = draw(flow)
    x = {n.id: n.x for n in drawing.nodes}
    assert x["base"] < x["mid"] < x["top"] < x["after"]
    for edge in drawing.edges:
        assert x[edge.dependency] < x[edge.dependent], edge
