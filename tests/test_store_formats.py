"""The store's formats, read in one place each: lock tokens (``_store/tokens.py``), the notify
channel's messages (``_store/notify.py``) and a claimed job's stored options and batch
(``_store/transitions.py``). What the scripts write is read back as typed values, and what is
not one of their forms is refused as such, not half-read."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from panqueue import Backoff, PayloadError
from panqueue._codec import encode
from panqueue._keys import QueueKeys
from panqueue._options import JobOptions
from panqueue._runtime.locks import Tokens
from panqueue._store import transitions
from panqueue._store.notify import CancelRequest, Handoff, WakeUp, parse_message
from panqueue._store.ops import NewJob, add_jobs, explain
from panqueue._store.ops.batches import batch_options
from panqueue._store.tokens import LockToken, lock_token, parse_lock_token
from panqueue._store.transitions import ClaimedJob, parse_claim
from panqueue._store.transport import SyncTransport

# ------------------------------------------------------------------------------ lock tokens


@pytest.mark.parametrize(("worker", "process", "n"), [
    ("w", "0123456789ab", 1), ("host:42:abc", "p", 7), ("", "p", 0), ("wörker", "p", 10**12)])
def test_a_lock_token_reads_back_as_its_parts(worker: str, process: str, n: int) -> None:
    assert parse_lock_token(lock_token(worker, process, n)) == LockToken(worker, process, n)


@pytest.mark.parametrize("token", [
    "", "w", "w:1", "w:p:", "w::1", "w:p:x", "w:p:-1", "w:p:1.5", "w:p: 1", "w:p:\u0661"])
def test_a_string_that_is_not_a_lock_token_is_refused(token: str) -> None:
    assert parse_lock_token(token) is None


def test_a_worker_knows_its_own_tokens_and_no_other() -> None:
    mine, other, same_name = Tokens("w:x"), Tokens("w"), Tokens("w:x")
    token = mine.new()
    assert mine.made_here(token) and mine.made_here(mine.new())
    assert not other.made_here(token)
    assert not same_name.made_here(token)  # another process under the same name
    assert not mine.made_here("w:x") and not mine.made_here("")


def test_explain_finds_the_worker_a_lock_token_names_before_its_beat_lists_the_job(
        redis_url: str, queue_name: str) -> None:
    keys = QueueKeys(queue_name)
    store = SyncTransport(redis_url)
    try:
        [(job_id, _)] = store.run(add_jobs(keys, [NewJob(None, encode(1))]))
        for name, pid in (("host", 6), ("host:7", 7), ("host:7:p", 8)):  # names that overlap
            store.run(transitions.heartbeat(keys, name, 30_000, host="h", pid=pid,
                                            queues=[queue_name], concurrency=1, running=[]))
        store.run(transitions.claim(keys, lock_token("host:7", "p", 1), 30_000, 1))
        why = store.run(explain(keys, job_id))
        assert why.detail.startswith("running on worker host:7 (pid 7 on h)")
    finally:
        store.close()


# ---------------------------------------------------------------------- notify messages


def claim_record(job_id: str, options: bytes = b"") -> list[Any]:
    """A claim reply's records, as the scripts send them (lua/lib/claim.lua)."""
    return [1, -1, job_id.encode(), encode({"n": 1}), 2, 1700000000000, options]


def test_the_notify_messages_read_as_typed_values() -> None:
    assert parse_message(b"w") == WakeUp()
    assert parse_message(b"c" + msgpack.packb([b"7", b"w:p:3"])) == CancelRequest("7", "w:p:3")
    assert parse_message(b"c:7") == CancelRequest("7", "")  # an earlier version's message
    handed = parse_message(b"h" + msgpack.packb([b"w:p:3", claim_record("9")]))
    assert isinstance(handed, Handoff) and handed.token == "w:p:3"
    [job] = handed.jobs
    assert (job.id, job.token, job.attempt, job.enqueued_at_ms, job.options) == (
        "9", "w:p:3", 2, 1700000000000, {})


@pytest.mark.parametrize("message", [
    b"", b"x", b"W", b"wake", b"c", b"h",
    b"c" + msgpack.packb([b"7"]),  # one item, not two
    b"c" + msgpack.packb([7, b"t"]),  # an id that is not a string
    b"c" + msgpack.packb({b"id": b"7"}),
    b"c\xc1", b"h\xc1", b"c" + msgpack.packb([b"7", b"t"])[:-1],  # not msgpack, cut short
    b"h" + msgpack.packb([b"t", [2, -1, b"9", b"d", 1, 0, b""]]),  # fewer records than counted
    b"h" + msgpack.packb([b"t", [1, -1, b"9", b"d", b"one", 0, b""]]),  # an attempt not a number
    b"h" + msgpack.packb([b"t", 5]),
])
def test_a_message_that_is_none_of_the_forms_is_ignored(message: bytes) -> None:
    assert parse_message(message) is None


# ------------------------------------------------------------------- claimed jobs, typed


def claimed(options: bytes) -> ClaimedJob:
    [job], _ = parse_claim(claim_record("9", options), 0, "w:p:1")
    return job


def test_a_claimed_job_comes_with_its_options_read_and_its_batch_named() -> None:
    plain = claimed(encode({"attempts": 4, "timeout": 2.5}))
    assert (plain.options, plain.batch, plain.unreadable) == (
        {"attempts": 4, "timeout": 2.5}, "", "")
    assert plain.job_options(JobOptions(attempts=1, backoff=Backoff.fixed(3))) == JobOptions(
        attempts=4, backoff=Backoff.fixed(3), timeout=2.5)
    member = claimed(batch_options("b-1", encode({"attempts": 4})))
    assert (member.options["attempts"], member.batch) == (4, "b-1")
    assert claimed(batch_options("b-1")).batch == "b-1"
    none = claimed(b"")
    assert (none.options, none.batch) == ({}, "")
    assert none.job_options(JobOptions(attempts=3)) == JobOptions(attempts=3)


def test_batch_membership_is_the_batch_option_not_its_bytes_anywhere() -> None:
    """A value that holds the bytes of the key (a trace header, say) names no batch."""
    assert claimed(encode({"trace": {"tracestate": "batch"}})).batch == ""
    assert claimed(encode({"batch": 5})).batch == ""


@pytest.mark.parametrize(("blob", "problem"), [
    (b"\xc1", "not msgpack (FormatError)"),
    (encode({"a": 1})[:-1], "not msgpack"),
    (encode({"a": 1}) + b"\x00", "not msgpack"),
    (b"\xc7\x01\x05a", "extension type 5"),
    (encode([1, 2]), "not a map (list)"),
    (encode("attempts"), "not a map (str)"),
    (encode({"attempts": "many"}), "invalid literal"),
    (encode({"backoff": [1]}), "not enough values"),
])
def test_unreadable_stored_options_fail_the_attempt_with_what_is_wrong(
        blob: bytes, problem: str) -> None:
    job = claimed(blob)
    assert job.batch == ""
    with pytest.raises(PayloadError, match=r"^the job's stored options cannot be read: ") as bad:
        job.job_options(JobOptions())
    assert problem in str(bad.value)
