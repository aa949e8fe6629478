"""``add_bulk``'s fast path: its items share their options, so the first item's job is
validated in full and the others copy it with their own data (``ops.job_alike``), and the add
script gets each later item as its data and '' (its fields as the item's before). Each job so
added is exactly the job the general path makes and stores."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from panqueue import Backoff, Dedup, PayloadError, SyncQueueClient
from panqueue._keys import QueueKeys
from panqueue._producer import new_jobs
from panqueue._store.ops import add_call, new_job, parse_added
from panqueue._store.transport import SyncTransport


@dataclasses.dataclass
class Point:
    x: int
    y: int


ITEMS: list[Any] = [{}, {"n": 1}, None, [1, "two", 3.0], Point(1, 2), "x" * 300, "żółw", {}]

# Queue defaults: none; every one a producer may set; and ones that make the jobs wait later.
DEFAULTS: list[dict[str, Any]] = [
    {},
    {"priority": 5, "attempts": 3, "backoff": Backoff.exponential(2.0), "timeout": 30.0,
     "tags": ["tenant:42", "import"]},
    {"delay": 60.0, "expires": 3600.0, "priority": -2},
    {"expires": datetime.now(UTC) + timedelta(hours=1)},
]


@pytest.mark.parametrize("defaults", DEFAULTS, ids=["none", "waiting", "delayed", "deadline"])
def test_each_job_of_a_bulk_is_the_job_new_job_makes(defaults: dict[str, Any]) -> None:
    bulk = new_jobs(defaults, ITEMS)
    one_by_one = [new_job(defaults, dataclasses.asdict(item) if isinstance(item, Point) else item,
                          {}) for item in ITEMS]
    assert bulk == one_by_one
    assert [job.data for job in bulk] == [job.data for job in one_by_one]


def test_a_bad_item_after_the_first_is_named_and_nothing_is_made() -> None:
    with pytest.raises(PayloadError, match="item 2: "):
        new_jobs({"attempts": 2}, [{}, {}, {1, 2}])


def test_later_items_of_a_bulk_send_their_data_and_no_fields() -> None:
    jobs = new_jobs({"attempts": 3}, [{}, {"a": 1}, {}])
    args = add_call(QueueKeys("q"), jobs).args
    assert args[3::2] == tuple(job.data for job in jobs)
    first, *later = args[4::2]
    assert first and later == ["", ""]  # the first item's options are not the defaults
    assert add_call(QueueKeys("q"), new_jobs({}, [{}, {}])).args[4::2] == ("", "")


def _stored(r: redis.Redis, queue: str, job_id: str) -> dict[bytes, bytes]:
    """The job's hash, its times (enqueued at, deadline) only as present."""
    fields = r.hgetall(QueueKeys(queue).job(job_id))
    return {k: b"<time>" if k in (b"et", b"x") else v for k, v in fields.items()}


@pytest.mark.parametrize("defaults", DEFAULTS, ids=["none", "waiting", "delayed", "deadline"])
def test_a_bulk_stores_each_job_as_adding_it_alone_does(
        redis_url: str, redis_client: redis.Redis, queue_name: str,
        defaults: dict[str, Any]) -> None:
    with SyncQueueClient(redis_url) as client:
        bulk = client.queue(queue_name, **defaults).add_bulk(ITEMS)
        alone = [client.queue(queue_name + "-alone", **defaults).add(item) for item in ITEMS]
    assert len(bulk) == len(alone) == len(ITEMS)
    for b, a in zip(bulk, alone, strict=True):
        assert _stored(redis_client, queue_name, b.id) == _stored(
            redis_client, queue_name + "-alone", a.id)
        assert b.info().to_dict() | {"id": None, "queue": None, "enqueued_at": None,
                                     "run_at": None, "expires_at": None} == (
            a.info().to_dict() | {"id": None, "queue": None, "enqueued_at": None,
                                  "run_at": None, "expires_at": None})
    if not defaults:  # a plain job: its enqueue time, data and state, written at once
        assert set(_stored(redis_client, queue_name, bulk[0].id)) == {b"et", b"d", b"s"}



# Items of one add call whose options are those of the item before: the add script gets them
# as their data and '' and shares one table among them (add.lua), yet applies their options to
# each in turn. add_bulk sends only the queue's defaults so; one add call of several items with
# a dedup key or a key (a Spark partition's rows, say) sends these.
SHARED: list[tuple[dict[str, Any], str]] = [
    ({"dedup": Dedup("same", ttl=60)}, ""),
    ({"dedup": Dedup("same", ttl=60, strategy="replace")}, ""),
    ({"key": "tenant-1", "priority": 3}, "keyed"),
]


@pytest.mark.parametrize(("options", "mode"), SHARED, ids=["keep", "replace", "keyed"])
def test_items_sharing_a_dedup_key_or_a_key_in_one_call_end_as_added_one_by_one(
        redis_url: str, redis_client: redis.Redis, queue_name: str, options: dict[str, Any],
        mode: str) -> None:
    data: list[Any] = [{}, {"n": 1}, "x" * 300, None, {"n": 1}]
    together, alone = QueueKeys(queue_name), QueueKeys(queue_name + "-alone")
    jobs = [new_job({}, item, options) for item in data]
    transport = SyncTransport(redis_url)
    try:
        call = add_call(together, jobs, mode)
        assert call.args[4::2][1:] == ("",) * (len(jobs) - 1)  # the later items share fields
        bulk = parse_added(together, transport.execute(call))
        one_by_one = [parse_added(alone, transport.execute(add_call(alone, [job], mode)))[0]
                      for job in jobs]
    finally:
        transport.close()
    assert [created for _, created in bulk] == [created for _, created in one_by_one]
    assert len({i for i, _ in bulk}) == len({i for i, _ in one_by_one})
    for (b, _), (a, _) in zip(bulk, one_by_one, strict=True):
        assert _stored(redis_client, together.name, b) == _stored(redis_client, alone.name, a)
    # Each job that is left keeps the fields of its options (a dedup key, which its deletion
    # clears; its key and priority).
    fields = {"dedup": b"dd", "key": b"k", "priority": b"p"}
    left = [redis_client.hgetall(together.job(i)) for i, _ in bulk]
    assert any(left)
    for stored in filter(None, left):
        assert {fields[name] for name in options} <= set(stored)
