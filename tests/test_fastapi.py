"""examples/fastapi_app.py as a service: in-process through httpx's ASGI transport (with the
lifespan entered as a server enters it), and as a real uvicorn server on loopback that is sent
SIGTERM while a job runs."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from panqueue import JobState, QueueClient, SyncQueueClient
from tests.helpers import ROOT, async_wait_until, free_port, subprocess_env, wait_until

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

EXAMPLE = ROOT / "examples" / "fastapi_app.py"


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fastapi_app_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def _state(http: Any, job_id: str) -> dict[str, Any]:
    response = await http.get(f"/thumbnails/{job_id}")
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


@pytest.mark.anyio
async def test_endpoint_adds_a_job_the_embedded_workers_run_it_and_the_result_reads_back(
        example: ModuleType, redis_url: str) -> None:
    service = example.create_app(redis_url)
    async with service.router.lifespan_context(service):
        transport = httpx.ASGITransport(app=service)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            assert (await http.get("/healthz")).json() == {"redis": "ok"}
            added = await http.post("/thumbnails", json={"image": "cat.jpg", "size": 64})
            assert added.status_code == 202
            job_id = added.json()["id"]

            async def completed() -> bool:
                return (await _state(http, job_id))["state"] == "completed"

            await async_wait_until(completed, what="the job to complete")
            assert await _state(http, job_id) == {
                "id": job_id, "state": "completed", "progress": 100,
                "result": {"thumbnail": "cat.jpg.64px.png"}, "error": None}
            assert (await http.post("/thumbnails", json={"image": ""})).status_code == 422
            assert (await http.get("/thumbnails/nope")).status_code == 404
            async with QueueClient(redis_url) as client:
                assert len(await client.workers("thumbnails")) == 1  # the embedded pool
    async with QueueClient(redis_url) as client:
        assert await client.workers("thumbnails") == []  # stopped cleanly with the lifespan


@pytest.mark.anyio
async def test_lifespan_exit_lets_the_running_job_finish(example: ModuleType,
                                                         redis_url: str) -> None:
    service = example.create_app(redis_url, grace=10.0)
    async with QueueClient(redis_url) as client:
        async with service.router.lifespan_context(service):
            transport = httpx.ASGITransport(app=service)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                added = await http.post("/thumbnails",
                                        json={"image": "big.jpg", "work_seconds": 0.5})
                job_id = added.json()["id"]

                # The handler has begun (its first progress report): ACTIVE alone may mean a
                # job handed to the idle worker whose message has not reached it yet, which a
                # stopping worker gives back to waiting instead of starting.
                async def running() -> bool:
                    return (await _state(http, job_id))["progress"] == 10

                await async_wait_until(running, what="the job to start")
        # The lifespan has ended: the job it was running finished instead of being dropped.
        info = await client.get_job("thumbnails", job_id)
        assert info.state is JobState.COMPLETED
        assert info.result == {"thumbnail": "big.jpg.128px.png"}


@pytest.mark.anyio
async def test_service_without_embedded_workers_leaves_jobs_waiting(example: ModuleType,
                                                                    redis_url: str) -> None:
    service = example.create_app(redis_url, embed_workers=False)
    async with service.router.lifespan_context(service):
        transport = httpx.ASGITransport(app=service)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            job_id = (await http.post("/thumbnails", json={"image": "a.jpg"})).json()["id"]
            assert (await _state(http, job_id))["state"] == "waiting"
            async with QueueClient(redis_url) as client:
                assert await client.workers("thumbnails") == []


@pytest.fixture
def uvicorn_server(redis_url: str, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes],
                                                                      str]]:
    pytest.importorskip("uvicorn")
    port = free_port()
    with (tmp_path / "uvicorn.err").open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "fastapi_app:app", "--app-dir", "examples",
             "--host", "127.0.0.1", "--port", str(port), "--timeout-graceful-shutdown", "5"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT,
            env=subprocess_env(PANQUEUE_URL=redis_url))
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if process.poll() is not None:
            raise AssertionError((tmp_path / "uvicorn.err").read_text())
        try:
            return httpx.get(f"{base}/healthz", timeout=1.0).status_code == 200
        except httpx.TransportError:
            return False

    try:
        wait_until(ready, timeout=20, what="uvicorn to serve")
        yield process, base
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_uvicorn_serves_the_app_and_its_shutdown_drains_the_embedded_workers(
        uvicorn_server: tuple[subprocess.Popen[bytes], str], redis_url: str) -> None:
    process, base = uvicorn_server
    with httpx.Client(base_url=base, timeout=5.0) as http:
        quick = http.post("/thumbnails", json={"image": "a.jpg"}).json()["id"]
        wait_until(lambda: http.get(f"/thumbnails/{quick}").json()["state"] == "completed",
                   what="the job to complete")
        assert http.get(f"/thumbnails/{quick}").json()["result"] == {
            "thumbnail": "a.jpg.128px.png"}
        slow = http.post("/thumbnails", json={"image": "b.jpg", "work_seconds": 1.0}).json()["id"]
        wait_until(lambda: http.get(f"/thumbnails/{slow}").json()["state"] == "active",
                   what="the slow job to start")
    process.send_signal(signal.SIGTERM)
    # uvicorn shuts down (HTTP first, then the lifespan), then re-raises the signal it caught.
    assert process.wait(timeout=20) in (0, -signal.SIGTERM)
    with SyncQueueClient(redis_url) as client:
        info = client.get_job("thumbnails", slow)
        assert info.state is JobState.COMPLETED, info
        assert client.workers("thumbnails") == []
