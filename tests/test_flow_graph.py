"""A job's flow read back from a real Redis (``_store/ops/flow.py``, ``lua/flow.lua``): its
dependencies and dependents, transitively, with their states, also once the dependencies have
completed and their live edges are gone; a removed job, a bounded graph, the records deleted
with their jobs, and a partitioned queue, whose flows live in one partition."""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import pytest
import redis

from panqueue import FlowJob, Job, Registry, SyncQueueClient
from panqueue._keys import partition_keys
from panqueue._store.ops.flow import FLOW_LOOK, FLOW_NODES, Flow, read_flow
from tests.store_fixtures import ScriptStore, run_first


@pytest.fixture
def client(redis_url: str) -> Iterator[SyncQueueClient]:
    with SyncQueueClient(redis_url) as found:
        yield found


def flow_of(client: SyncQueueClient, queue: str, job_id: str, most: int = FLOW_NODES,
            look: int = FLOW_LOOK) -> Flow:
    """The flow of a job, read as the dashboard reads it (in the job's partition)."""
    return client.producer.run(client.producer.on_job(queue, job_id, read_flow, most, look))


def states(flow: Flow) -> dict[str, str]:
    """Each shown job's state ("removed": no longer there)."""
    return {node.id: node.state.value if node.state else "removed" for node in flow.nodes}


def depths(flow: Flow) -> dict[str, int]:
    return {node.id: node.depth for node in flow.nodes}





def test_a_flow_shows_dependencies_and_dependents_transitively_with_their_states(
        client: SyncQueueClient, store: ScriptStore, queue_name: str) -> None:
    queue = client.queue(queue_name)
    extract = queue.add("extract", job_id="extract")
    middle = queue.add("middle", job_id="middle", depends_on=[extract])
    after = queue.add("after", job_id="after", depends_on=[middle])
    doomed = queue.add("doomed", job_id="doomed")
    queue.add("joined", job_id="joined", depends_on=[middle, doomed])
    queue.add("last", job_id="last", depends_on=[after])
    assert run_first(store, 2, fail=("doomed",)) == ["extract", "doomed"]

    flow = flow_of(client, queue_name, "middle")
    # extract completed: its edge to middle is gone from the live sets, not from the flow.
    assert states(flow) == {"middle": "waiting", "extract": "completed", "after": "blocked",
                            "joined": "failed", "last": "blocked"}
    assert depths(flow) == {"middle": 0, "extract": -1, "after": 1, "joined": 1, "last": 2}
    assert set(flow.edges) == {("extract", "middle"), ("middle", "after"),
                               ("middle", "joined"), ("after", "last")}
    assert flow.nodes[0].id == "middle" and flow.hidden == 0 and flow.counted_all
    # doomed is a dependency of a dependent, in neither cone of middle; its own flow has it.
    assert states(flow_of(client, queue_name, "doomed")) == {
        "doomed": "failed", "joined": "failed"}


def test_a_finished_flow_keeps_its_whole_graph(client: SyncQueueClient, store: ScriptStore,
                                              queue_name: str) -> None:
    first, second, third = client.queue(queue_name).add_chain(["a", "b", "c"])
    for _ in range(3):
        run_first(store, 1)
    flow = flow_of(client, queue_name, second.id)
    assert states(flow) == {first.id: "completed", second.id: "completed",
                            third.id: "completed"}
    assert set(flow.edges) == {(first.id, second.id), (second.id, third.id)}


def test_a_job_alone_has_an_empty_flow(client: SyncQueueClient, queue_name: str) -> None:
    alone = client.queue(queue_name).add("alone")
    flow = flow_of(client, queue_name, alone.id)
    assert flow.empty and [n.id for n in flow.nodes] == [alone.id] and flow.edges == ()


def test_a_removed_dependency_shows_as_removed_and_a_later_job_with_its_id_is_not_it(
        client: SyncQueueClient, store: ScriptStore, queue_name: str) -> None:
    queue = client.queue(queue_name)
    setup = queue.add("setup", job_id="setup")
    main = queue.add("main", job_id="main", depends_on=[setup])
    run_first(store, 1)
    client.remove(queue_name, setup.id)
    flow = flow_of(client, queue_name, main.id)
    assert states(flow) == {"main": "waiting", "setup": "removed"}
    assert set(flow.edges) == {("setup", "main")}
    # A new job takes the id: it was added after main, so it is not main's dependency.
    queue.add("another setup", job_id="setup")
    assert states(flow_of(client, queue_name, main.id)) == {"main": "waiting",
                                                            "setup": "removed"}
    assert flow_of(client, queue_name, "setup").empty


def test_a_removed_dependent_leaves_the_flow_and_its_record(
        client: SyncQueueClient, queue_name: str, redis_client: redis.Redis) -> None:
    queue = client.queue(queue_name)
    root = queue.add("root")
    kept, dropped = queue.add("kept", depends_on=[root]), queue.add("dropped", depends_on=[root])
    client.remove(queue_name, dropped.id)
    assert states(flow_of(client, queue_name, root.id)) == {root.id: "waiting",
                                                            kept.id: "blocked"}
    assert redis_client.smembers(client.producer.run(
        client.producer.partitions(queue_name))[0].flow(root.id)) == {kept.id.encode()}


def test_the_records_of_a_flow_go_with_its_jobs(client: SyncQueueClient, store: ScriptStore,
                                                queue_name: str,
                                                redis_client: redis.Redis) -> None:
    queue = client.queue(queue_name)
    handles = queue.add_chain(range(5))
    for n in range(3):
        queue.add({"n": n}, depends_on=[handles[2]])
    run_first(store, 2)
    keys = store.keys
    assert redis_client.exists(keys.flow(handles[0].id))
    client.purge(queue_name)
    for left in ("job:*", "flow:*", "deps:*", "needs:*"):
        assert list(redis_client.scan_iter(keys.prefix + left)) == [], left


def test_a_flow_is_bounded_and_counts_the_jobs_it_does_not_show(
        client: SyncQueueClient, queue_name: str) -> None:
    queue = client.queue(queue_name)
    root, *_ = queue.add_flow([FlowJob("root"),
                               *(FlowJob(n, depends_on=(0,)) for n in range(250))])
    flow = flow_of(client, queue_name, root.id)
    assert len(flow.nodes) == 200 and flow.hidden == 51 and flow.counted_all
    assert len(flow.edges) == 199
    small = flow_of(client, queue_name, root.id, most=10, look=50)
    assert len(small.nodes) == 10 and small.hidden == 40 and not small.counted_all


def test_a_long_chain_shows_the_nearest_jobs_on_both_sides(
        client: SyncQueueClient, queue_name: str) -> None:
    handles = client.queue(queue_name).add_chain(range(41))
    middle = handles[20]
    flow = flow_of(client, queue_name, middle.id, most=11, look=100)
    assert sorted(depths(flow).values()) == list(range(-5, 6))
    assert flow.hidden == 30 and flow.counted_all


N = 3


def _id_in(partition: int, prefix: str) -> str:
    """A custom job id that routes to ``partition`` (by its CRC-32)."""
    return next(f"{prefix}-{i}" for i in range(1000)
                if zlib.crc32(f"{prefix}-{i}".encode()) % N == partition)


def test_a_partitioned_queues_flow_is_read_in_the_partition_of_its_jobs(
        client: SyncQueueClient, queue_name: str, redis_client: redis.Redis) -> None:
    registry = Registry()

    @registry.handler(queue_name, partitions=N)
    async def work(job: Job[str]) -> None: ...

    queue = client.queue(work)
    root = queue.add("root", job_id=_id_in(1, "root"))
    # Routed by its id to partition 2, placed with its dependency in partition 1.
    child = queue.add("child", job_id=_id_in(2, "child"), depends_on=[root])
    grandchild = queue.add("grandchild", depends_on=[child])
    parts = partition_keys(queue_name, N)
    assert [p.partition for p in parts if redis_client.exists(p.job(child.id))] == [1]
    for job_id in (root.id, child.id, grandchild.id):
        flow = flow_of(client, queue_name, job_id)
        assert states(flow) == {root.id: "waiting", child.id: "blocked",
                                grandchild.id: "blocked"}, job_id
        assert set(flow.edges) == {(root.id, child.id), (child.id, grandchild.id)}


def test_jobs_stored_before_flows_were_recorded_show_their_live_edges(
        client: SyncQueueClient, store: ScriptStore, redis_client: redis.Redis,
        queue_name: str) -> None:
    first, second, third = client.queue(queue_name).add_chain(["a", "b", "c"])
    for job in (first, second, third):  # as a job added before dp and flow:<id> were written
        redis_client.hdel(store.keys.job(job.id), "dp")
        redis_client.delete(store.keys.flow(job.id))
    flow = flow_of(client, queue_name, second.id)
    assert states(flow) == {first.id: "waiting", second.id: "blocked", third.id: "blocked"}
    assert set(flow.edges) == {(first.id, second.id), (second.id, third.id)}
