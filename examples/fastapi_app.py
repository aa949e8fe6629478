"""A FastAPI service on panqueue: its lifespan opens one QueueClient for the whole process and
embeds a WorkerPool; one endpoint adds a job, another reads its state and result.

Serve it (the workers run inside the server process; PANQUEUE_EMBED_WORKERS=0 leaves them to
``panqueue worker fastapi_app:queues``):

    PANQUEUE_URL=redis://127.0.0.1:6379/0 uvicorn fastapi_app:app --app-dir examples \\
        --timeout-graceful-shutdown 10

    curl -X POST localhost:8000/thumbnails -H 'content-type: application/json' \\
        -d '{"image": "cat.jpg"}'
    curl localhost:8000/thumbnails/<id>

Run as a script, it calls its own endpoints in-process (httpx's ASGI transport, with the
lifespan entered as a server would) against $PANQUEUE_URL, or a private server without it:

    python examples/fastapi_app.py
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from panqueue import Job, JobNotFound, PanqueueError, QueueClient, Registry, WorkerPool

queues = Registry()


@queues.handler("thumbnails", concurrency=4)
async def make_thumbnail(job: Job) -> dict[str, Any]:
    await job.progress(10)  # started: the service's status endpoint shows it
    await anyio.sleep(job.data["work_seconds"])  # stands for the real work
    await job.progress(100)
    return {"thumbnail": f"{job.data['image']}.{job.data['size']}px.png"}


class ThumbnailRequest(BaseModel):
    image: str = Field(min_length=1, max_length=200)
    size: int = Field(default=128, ge=16, le=1024)
    work_seconds: float = Field(default=0.05, ge=0, le=60)


def create_app(url: str | None = None, *, embed_workers: bool = True,
               grace: float = 10.0) -> FastAPI:
    """The app. ``url``: default $PANQUEUE_URL. ``grace``: seconds the embedded workers get
    to finish running jobs when the server shuts down."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            # One client for the process: every request shares its connection pool.
            app.state.client = await stack.enter_async_context(QueueClient(url))
            await app.state.client.ping()  # fail at startup, not at the first request
            if embed_workers:
                # Leaving this block (the server's shutdown) stops claiming and lets running
                # jobs finish for up to `grace` seconds; jobs still running then go back to
                # waiting for another worker.
                await stack.enter_async_context(
                    WorkerPool(queues, url=app.state.client.url, grace=grace))
            yield

    app = FastAPI(title="thumbnails", lifespan=lifespan)

    @app.post("/thumbnails", status_code=202)
    async def add_thumbnail(body: ThumbnailRequest, request: Request) -> dict[str, str]:
        client: QueueClient = request.app.state.client
        job = await client.queue("thumbnails").add(body.model_dump())
        return {"id": job.id, "status_url": f"/thumbnails/{job.id}"}

    @app.get("/thumbnails/{job_id}")
    async def read_thumbnail(job_id: str, request: Request) -> dict[str, Any]:
        client: QueueClient = request.app.state.client
        try:
            info = await client.get_job("thumbnails", job_id)
        except JobNotFound:
            raise HTTPException(status_code=404, detail=f"no thumbnail job {job_id!r}"
                                ) from None
        error = None if info.error is None else f"{info.error.type}: {info.error.message}"
        return {"id": info.id, "state": info.state.value, "progress": info.progress,
                "result": info.result, "error": error}

    @app.get("/healthz")
    async def health(request: Request) -> JSONResponse:
        client: QueueClient = request.app.state.client
        try:
            with anyio.fail_after(2.0):
                await client.ping()
        except (PanqueueError, TimeoutError):
            return JSONResponse({"redis": "unreachable"}, status_code=503)
        return JSONResponse({"redis": "ok"})

    return app


app = create_app(embed_workers=os.environ.get("PANQUEUE_EMBED_WORKERS", "1") != "0")


async def exercise(url: str) -> None:
    """Call the endpoints in-process, the lifespan entered as a server would enter it."""
    import httpx

    service = create_app(url)
    async with service.router.lifespan_context(service):
        transport = httpx.ASGITransport(app=service)
        async with httpx.AsyncClient(transport=transport, base_url="http://service") as http:
            print(f"health: {(await http.get('/healthz')).json()}")
            added = (await http.post("/thumbnails", json={"image": "cat.jpg"})).json()
            print(f"POST /thumbnails -> 202, status at {added['status_url']}")
            while True:  # a client polls; the embedded workers run the job meanwhile
                status = (await http.get(added["status_url"])).json()
                if status["state"] in ("completed", "failed"):
                    break
                await anyio.sleep(0.02)
            print(f"GET {added['status_url']} -> {status['state']}: {status['result']}")
            bad = await http.post("/thumbnails", json={"image": ""})
            print(f"an empty image name -> {bad.status_code}")
            missing = await http.get("/thumbnails/no-such-job")
            print(f"an unknown id -> {missing.status_code}")
    print("lifespan ended: client closed, workers stopped")


if __name__ == "__main__":
    from panqueue.embedded import url_or_private_server

    with url_or_private_server() as server_url:
        anyio.run(exercise, server_url)
    print("done")
