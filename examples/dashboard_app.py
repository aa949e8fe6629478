"""The web dashboard mounted in an application's own ASGI app, exercised in-process.

    pip install 'panqueue[dashboard]'
    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/dashboard_app.py

``create_app`` returns a Starlette app: mount it under any prefix of your own server (here a
Starlette app; FastAPI's ``app.mount`` is the same call) and serve it with uvicorn, or run
``panqueue dashboard`` instead. This example drives it with httpx, without a server, so it
runs anywhere. Without PANQUEUE_URL it starts a private Redis-compatible server and stops it
at the end.
"""

from __future__ import annotations

import re

import anyio
import httpx
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from panqueue import QueueClient
from panqueue.dashboard import create_app
from panqueue.embedded import url_or_private_server


async def home(request: object) -> PlainTextResponse:
    return PlainTextResponse("the application's own page")


async def main(url: str) -> None:
    async with QueueClient(url) as client:
        emails = client.queue("emails")
        await emails.add_bulk([{"to": f"user{n}@example.com"} for n in range(3)])
        await emails.add({"to": "<script>alert('hi')</script>"})  # shown as text, never run

    # Your app, with the dashboard under /admin/queues, for those who hold the token.
    app = Starlette(routes=[
        Route("/", home),
        Mount("/admin/queues", create_app(url, token="change-me")),
    ])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as http:
        refused = await http.get("/admin/queues/api/overview")
        print(f"without the token: {refused.status_code}")

        http.headers["Authorization"] = "Bearer change-me"
        overview = (await http.get("/admin/queues/api/overview")).json()
        for queue in overview["queues"]:
            print(f"{queue['name']}: {queue['counts']['waiting']} waiting, "
                  f"lag {queue['cells']['lag']}")

        page = await http.get("/admin/queues/queue", params={"q": "emails"})
        range_text = re.search(r'id="page-range">\s*(.*?)\s*</p>', page.text, re.S)
        print(f"jobs page: {page.status_code}, {range_text.group(1) if range_text else '?'}")
        escaped = "&lt;script&gt;" in page.text and "<script>alert" not in page.text
        print(f"payload shown as text: {escaped}")

        # An action is a POST from a page of the dashboard (its Origin, which a browser sends)
        # carrying the page's CSRF token.
        token = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
        assert token is not None
        http.headers["Origin"] = "http://app"
        done = await http.post("/admin/queues/action", data={
            "csrf": token.group(1), "action": "pause", "queue": "emails"})
        print(f"pause: {done.status_code} -> {done.headers['location']}")
        no_token = await http.post("/admin/queues/action",
                                   data={"action": "resume", "queue": "emails"})
        print(f"resume without the CSRF token: {no_token.status_code}")

    async with QueueClient(url) as client:
        print(f"emails paused: {await client.is_paused('emails')}")


if __name__ == "__main__":
    with url_or_private_server() as redis_url:
        anyio.run(main, redis_url)
    print("done")
