"""The store's formats, read in one place each: lock tokens (``_store/tokens.py``). What the
store writes is read back as typed values, and what is not one of its forms is refused as such,
not half-read."""

from __future__ import annotations

import pytest

from panqueue._codec import encode
from panqueue._keys import QueueKeys
from panqueue._runtime.locks import Tokens
from panqueue._store import transitions
from panqueue._store.ops import NewJob, add_jobs, explain
from panqueue._store.tokens import LockToken, lock_token, parse_lock_token
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
