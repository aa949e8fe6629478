"""Screenshots of the web dashboard for docs/dashboard.md, from a demo state.

    .venv/bin/python scripts/dashboard_screenshots.py [--out docs/img]

Starts a private Redis server, two worker processes (``panqueue worker
dashboard_screenshots:queues``) on a few demo queues with a schedule, a producer that keeps
adding jobs (so the rates move), and the dashboard on a free loopback port; then headless
Chromium (Debian's ``chromium``, driven by Playwright) saves ``dashboard-overview.png``,
``dashboard-jobs.png``, ``dashboard-job-failed.png``, ``dashboard-flow.png`` (a job's flow) and
``dashboard-workers.png``. Everything it started is stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from panqueue import FlowJob, Job, JobState, Registry, SyncQueueClient
from panqueue.embedded import RedisServer

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CHROMIUM = "/usr/bin/chromium"

queues = Registry()


class DeliveryError(Exception):
    """The demo's mail server refusing a recipient."""


@queues.handler("emails", concurrency=4)
async def send_email(job: Job) -> dict[str, Any]:
    await job.log(f"connecting to smtp for {job.data['to']}")
    await job.progress(50)
    await anyio.sleep(random.uniform(0.05, 0.3))
    if job.data["to"].endswith("@invalid.example"):
        raise DeliveryError(f"550 mailbox unavailable: {job.data['to']}")
    await job.progress(100)
    return {"sent": job.data["to"]}


@queues.handler("reports", concurrency=1)
async def build_report(job: Job) -> str:
    await anyio.sleep(0.2)
    return f"report {job.data.get('name', 'nightly')}"


@queues.handler("thumbnails", concurrency=2)
async def thumbnail(job: Job) -> None:
    await anyio.sleep(0.1)


queues.schedule("nightly-report", "reports", cron="0 3 * * *", data={"name": "nightly"})
queues.schedule("hourly-digest", "emails", every=3600.0, data={"to": "digest@example.com"})


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


def start_worker(url: str, *queue_names: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), str(ROOT)]))
    args = [sys.executable, "-m", "panqueue", "worker", "dashboard_screenshots:queues",
            "--url", url, "--log-level", "warning"]
    for name in queue_names:
        args += ["-q", name]
    # The demo's failures are logged by the worker: not news here.
    return subprocess.Popen(args, env=env, cwd=ROOT, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def demo_state(client: SyncQueueClient) -> None:
    emails = client.queue("emails", attempts=2)
    emails.add_bulk([{"to": f"customer{n}@example.com", "template": "welcome"}
                     for n in range(40)])
    for n in range(3):
        emails.add({"to": f"old{n}@invalid.example", "template": "renewal"},
                   job_id=f"renewal-{n}")
    # A flow whose jobs end in every state: the flow graph's screenshot.
    emails.add_flow([
        FlowJob({"to": "orders@example.com", "template": "export"}, job_id="export-orders"),
        FlowJob({"to": "warehouse@example.com"}, depends_on=[0], job_id="ship-warehouse"),
        FlowJob({"to": "bounce@invalid.example"}, depends_on=[0], job_id="notify-bounce"),
        FlowJob({"to": "finance@example.com"}, depends_on=[1, 2], job_id="invoice-finance"),
        FlowJob({"to": "later@example.com"}, depends_on=[1], job_id="remind-later",
                options={"delay": 3600}),
        FlowJob({"to": "summary@example.com"}, depends_on=[4], job_id="summary-weekly"),
    ])
    client.queue("reports").add({"name": "quarterly"}, delay=3600)
    client.pause("thumbnails")
    client.queue("thumbnails").add_bulk([{"image": f"img/{n}.jpg"} for n in range(25)])


def produce(url: str, stop: threading.Event) -> None:
    """Keep the emails queue busy so the overview's rates have something to show."""
    with SyncQueueClient(url) as client:
        emails = client.queue("emails")
        n = 0
        while not stop.wait(0.1):
            emails.add_bulk([{"to": f"live{n + i}@example.com"} for i in range(3)])
            n += 3


def screenshots(base: str, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                             args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        page.goto(base + "/")
        # Wait for the live updates to measure a rate (the page's CSP forbids evaluated
        # script, so the page is read from here).
        rate = page.locator('tr[data-queue="emails"] [data-field="completed_per_s"]')
        deadline = time.monotonic() + 20
        while rate.text_content() == "-" and time.monotonic() < deadline:
            page.wait_for_timeout(200)
        page.wait_for_timeout(4000)
        page.screenshot(path=str(out / "dashboard-overview.png"))
        page.goto(base + "/queue?q=emails&state=completed")
        page.screenshot(path=str(out / "dashboard-jobs.png"))
        page.goto(base + "/job?q=emails&id=renewal-0")
        page.screenshot(path=str(out / "dashboard-job-failed.png"), full_page=True)
        page.goto(base + "/job?q=emails&id=ship-warehouse")
        page.locator("#job-flow").screenshot(path=str(out / "dashboard-flow.png"))
        page.goto(base + "/workers")
        page.screenshot(path=str(out / "dashboard-workers.png"))
        browser.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--out", default=str(ROOT / "docs" / "img"),
                        help="directory for the PNG files (default: docs/img)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    processes: list[subprocess.Popen[bytes]] = []
    stop = threading.Event()
    with RedisServer(appendonly=False) as server, SyncQueueClient(server.url) as client:
        try:
            demo_state(client)
            processes.append(start_worker(server.url, "emails", "reports"))
            processes.append(start_worker(server.url, "emails", "thumbnails"))
            wait(lambda: len(client.workers()) == 4, 30, "the workers of four queue slots")
            wait(lambda: client.counts("emails")[JobState.FAILED] == 5, 60,
                 "the demo's failed jobs")
            producer = threading.Thread(target=produce, args=(server.url, stop), daemon=True)
            producer.start()
            port = free_port()
            processes.append(subprocess.Popen(
                [sys.executable, "-m", "panqueue", "dashboard", "--url", server.url, "--port",
                 str(port)], cwd=ROOT, stdin=subprocess.DEVNULL))
            base = f"http://127.0.0.1:{port}"

            def answers() -> bool:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                        return True
                except OSError:
                    return False

            wait(answers, 30, "the dashboard")
            screenshots(base, out)
        finally:
            stop.set()
            for process in processes:
                process.terminate()
            for process in processes:
                process.wait(30)
    for name in ("overview", "jobs", "job-failed", "flow", "workers"):
        print(out / f"dashboard-{name}.png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
