"""Job dependencies: a chain, a flow tree with a join, and a failing dependency.

A job added with ``depends_on=[ids]`` (or as part of ``add_flow`` / ``add_chain``) is BLOCKED
until every job it depends on has completed; the script that completes the last of them moves
it to WAITING. If a dependency fails (or is cancelled or removed), every job that depends on it,
directly or through others, fails at once with ``failure_reason="dependency_failed"``.

    PANQUEUE_URL=redis://127.0.0.1:6390/0 python examples/workflows.py

Without PANQUEUE_URL the example starts a private Redis-compatible server and stops it at the end.
"""

from __future__ import annotations

import contextlib
import uuid

import anyio

from panqueue import (
    Fail,
    FlowJob,
    Job,
    JobFailed,
    JobState,
    QueueClient,
    Registry,
    Worker,
    configure_logging,
)
from panqueue.embedded import url_or_private_server

# A fresh queue name per run, so that re-running against the same server starts clean.
QUEUE = f"pipeline-{uuid.uuid4().hex[:6]}"

queues = Registry()
ran: list[str] = []


@queues.handler(QUEUE, concurrency=4)
async def step(job: Job) -> str:
    """Each job's data names its step; "fail" steps fail without retry."""
    name = job.data["step"]
    await anyio.sleep(0.02)
    if job.data.get("fail"):
        raise Fail(f"{name}: source file is corrupt")
    ran.append(name)
    return f"{name} ok"


async def main(url: str) -> None:
    worker = Worker(queues, QUEUE, url=url)
    async with QueueClient(url) as client:
        queue = client.queue(QUEUE)

        # 1. A chain: each job depends on the one before. Added while no worker runs, so the
        #    states show what is blocked.
        chain = await queue.add_chain([{"step": "extract"}, {"step": "transform"},
                                       {"step": "load"}])
        states = [(await h.info()).state.value for h in chain]
        print(f"chain ids: {[h.id for h in chain]} (flow:<random>:<index>)")
        print(f"chain states before a worker runs: {states}")

        # 2. A flow tree with a join: two downloads run in parallel, "merge" waits for both,
        #    "publish" waits for "merge". depends_on names earlier items by index.
        tree = await queue.add_flow([
            FlowJob({"step": "download-a"}),
            FlowJob({"step": "download-b"}),
            FlowJob({"step": "merge"}, depends_on=[0, 1]),
            FlowJob({"step": "publish"}, depends_on=[2], options={"priority": 5}),
        ])

        # 3. A failing dependency: "parse" fails, so "index" (which depends on it) and
        #    "report" (which depends on "index") fail too, without running.
        parse = await queue.add({"step": "parse", "fail": True}, job_id=f"parse-{QUEUE}")
        index = await queue.add({"step": "index"}, depends_on=[parse.id])
        report = await queue.add({"step": "report"}, depends_on=[index.id])

        async with anyio.create_task_group() as tg:
            await tg.start(worker.run)
            for handle in (*chain, *tree):
                await handle.result(timeout=10.0)
            for handle in (parse, index, report):
                with contextlib.suppress(JobFailed):
                    await handle.result(timeout=10.0)
            await worker.shutdown(grace=5.0)

        chain_order = [name for name in ran if name in ("extract", "transform", "load")]
        print(f"chain ran in order: {' > '.join(chain_order)}")
        tree_order = [name for name in ran
                      if name in ("download-a", "download-b", "merge", "publish")]
        print(f"tree: {' and '.join(sorted(tree_order[:2]))} before {tree_order[2]} before "
              f"{tree_order[3]}")
        merge = await tree[2].info()
        print(f"merge: {merge.state.value}, result {merge.result!r}")

        for handle in (parse, index, report):
            info = await handle.info()
            error = info.error
            print(f"{info.data['step']}: {info.state.value}, failure_reason="
                  f"{info.failure_reason}, error {error.type if error else None}: "
                  f"{error.message if error else ''}")
        print(f"index and report never ran: {'index' not in ran and 'report' not in ran}")

        # Depending on a job that already completed is satisfied at once; on one that
        # already failed, the new job fails at once; on an unknown id, add() is refused.
        late = await queue.add({"step": "late"}, depends_on=[chain[-1].id])
        print(f"depends on a completed job: {(await late.info()).state.value}")
        doomed = await queue.add({"step": "doomed"}, depends_on=[parse.id])
        info = await doomed.info()
        print(f"depends on a failed job: {info.state.value}, {info.failure_reason}")
        try:
            await queue.add({"step": "orphan"}, depends_on=["no-such-job"])
        except Exception as exc:  # ConfigError
            print(f"depends on an unknown id: {type(exc).__name__}: {exc}")
        counts = await client.counts(QUEUE)
        print(f"counts: completed={counts[JobState.COMPLETED]}, failed={counts[JobState.FAILED]}, "
              f"waiting={counts[JobState.WAITING]}, blocked={counts[JobState.BLOCKED]}")


if __name__ == "__main__":
    configure_logging(level="warning")
    with url_or_private_server() as url:
        anyio.run(main, url)
    print("done")
