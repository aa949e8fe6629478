"""Durable jobs: a signup flow written as one handler that sleeps and waits without a slot.

The handler creates the account in a step (it runs once, whatever happens later: its result is
stored with the job), sleeps (the job is DELAYED and holds no worker slot; the handler then runs
again from the top and the step returns its stored result instead of running again), and waits
for the user to verify their address: client.signal(queue, id, "verified", payload) sends the
payload, and job.wait_for("verified") returns it. A signal sent before the handler waits is
kept, so nothing is lost to a race. The welcome mail is a second step.

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/durable_signup.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

from datetime import timedelta

import anyio

from panqueue import Job, JobState, QueueClient, Registry, Worker, configure_logging
from panqueue.embedded import url_or_private_server

queues = Registry()
accounts: list[str] = []  # the outside world: each account created
mails: list[str] = []


def create_account(email: str) -> dict[str, str]:
    accounts.append(email)
    return {"user": f"u{len(accounts)}", "email": email}


async def send_welcome(user: dict[str, str], verified: dict[str, str]) -> str:
    mails.append(user["email"])
    return f"welcome sent to {user['email']} (verified at {verified['at']})"


@queues.handler("signup", attempts=3)
async def signup(job: Job) -> str:
    user = await job.step("create-account", create_account, job.data["email"])
    await job.sleep(timedelta(seconds=0.3))  # e.g. a day before the first reminder
    verified = await job.wait_for("verified", timeout=timedelta(days=7))
    return await job.step("welcome", send_welcome, user, verified)


async def main(url: str) -> None:
    worker = Worker(queues, "signup", url=url)
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        async with QueueClient(url) as client:
            job = await client.queue("signup").add({"email": "ada@example.com"})
            while (info := await job.info()).waiting_for is None:
                await anyio.sleep(0.05)
            print(f"state {info.state.value}, waiting for {info.waiting_for!r}, "
                  f"steps {list(info.steps)}")
            why = await client.explain("signup", job.id)
            print(f"explain: {why.reason}")
            assert info.state is JobState.DELAYED
            await client.signal("signup", job.id, "verified", {"at": "2026-11-27T10:00Z"})
            print(await job.result(timeout=10.0))
            info = await job.info()
            print(f"steps {list(info.steps)}; attempts used: {info.attempts}")
            print(f"accounts created: {len(accounts)}, mails sent: {len(mails)}")
            print(f"signal to a finished job kept: "
                  f"{await client.signal('signup', job.id, 'verified', {})}")
        await worker.shutdown(grace=5.0)


if __name__ == "__main__":
    configure_logging(level="error")
    with url_or_private_server() as server_url:
        anyio.run(main, server_url)
    print("done")
