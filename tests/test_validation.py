"""Argument checks: every option that takes an int, a number of seconds, a flag or one of a few
names refuses a wrong value with one ConfigError line naming the option and the value, and a
bool is never taken for a number (``True`` is an ``int`` to Python).

The checks are written once (panqueue/_check.py); these tests go through the public calls that
use them, so a call that stops checking, or checks with a message of its own, shows here."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from panqueue import (
    Backoff,
    Chunk,
    ConfigError,
    Dedup,
    JobState,
    Limits,
    Permissions,
    RateLimit,
    Registry,
    Retention,
)
from panqueue._check import check_flag, check_int, check_number, check_one_of, is_int, is_number
from panqueue._keys import QueueKeys
from panqueue._store import ops


def handler(**options: Any) -> Callable[[], object]:
    return lambda: Registry().handler("q", **options)


def listing(**options: Any) -> Callable[[], object]:
    # The listing op checks its arguments before its first round trip, at its first step.
    return lambda: next(ops.list_jobs(QueueKeys("q"), "waiting", **options))


LONE = "\ud800"  # a lone surrogate: JSON's "\\ud800" makes one, and UTF-8 has none

REFUSED: list[tuple[Callable[[], object], str]] = [
    # Registry.handler
    (handler(concurrency=0), "concurrency must be an int between 1 and 10000, got 0"),
    (handler(concurrency=True), "concurrency must be an int between 1 and 10000, got True"),
    (handler(max_stalls=-1), "max_stalls must be an int >= 0, got -1"),
    (handler(max_stalls=False), "max_stalls must be an int >= 0, got False"),
    (handler(max_snoozes=1.5), "max_snoozes must be an int >= 0 or None (no limit), got 1.5"),
    (handler(max_snoozes=True), "max_snoozes must be an int >= 0 or None (no limit), got True"),
    (handler(mode="both"), "mode for queue 'q' must be 'global' or 'keyed', got 'both'"),
    (handler(key_concurrency=0), "key_concurrency must be an int >= 1, got 0"),
    (handler(key_concurrency=True), "key_concurrency must be an int >= 1, got True"),
    (handler(max_jobs_per_child=0), "max_jobs_per_child must be an int >= 1, got 0"),
    (handler(max_jobs_per_child=True), "max_jobs_per_child must be an int >= 1, got True"),
    (handler(partitions=0), "partitions must be an int between 1 and 1024, got 0"),
    (handler(partitions=True), "partitions must be an int between 1 and 1024, got True"),
    (handler(attempts=0), "attempts must be an int between 1 and 1000000, got 0"),
    (handler(attempts=True), "attempts must be an int between 1 and 1000000, got True"),
    (handler(priority=True),
     "priority must be an int between -1000000 and 1000000, got True"),
    (handler(priority=2_000_000),
     "priority must be an int between -1000000 and 1000000, got 2000000"),
    (handler(delay=True), "delay must be a number of seconds, got True"),
    (handler(delay=-1), "delay must be >= 0, got -1"),
    (handler(lock_ttl="30"), "lock_ttl must be a number of seconds, got '30'"),
    (handler(lock_ttl=0), "lock_ttl must be > 0, got 0"),
    # The option types
    (lambda: Backoff("linear", 1.0), "backoff kind must be 'fixed' or 'exponential', got 'linear'"),
    (lambda: Backoff.fixed(1.0, jitter=1),  # type: ignore[arg-type]
     "backoff jitter must be a bool, got 1"),
    (lambda: Limits(memory_mb=0),
     f"Limits.memory_mb must be an int between 1 and {(2**63 - 1) >> 20}, got 0"),
    (lambda: Limits(open_files=True), "Limits.open_files must be an int >= 1, got True"),
    (lambda: Retention(completed=-2),
     "Retention.completed must be an int >= -1 (-1 keeps all), got -2"),
    (lambda: Retention(failed=True),
     "Retention.failed must be an int >= -1 (-1 keeps all), got True"),
    (lambda: Retention(history=-1),
     "Retention.history must be an int >= 0 (0 keeps no history), got -1"),
    (lambda: Retention(events=-1),
     "Retention.events must be an int >= 0 (0 keeps only the events of a job's end), got -1"),
    (lambda: Retention(completed_for=True),
     "Retention.completed_for must be a number of seconds, got True"),
    (lambda: RateLimit(max=0), "RateLimit.max must be an int >= 1, got 0"),
    (lambda: RateLimit(max=True), "RateLimit.max must be an int >= 1, got True"),
    (lambda: RateLimit(max=5, adaptive=1),  # type: ignore[arg-type]
     "RateLimit.adaptive must be a bool, got 1"),
    (lambda: Dedup("k", strategy="merge"),
     "Dedup.strategy must be 'keep', 'replace' or 'extend', got 'merge'"),
    (lambda: Chunk(size=True), "Chunk.size must be an int >= 1, got True"),
    (lambda: Permissions(listen=[True]),
     "Permissions.listen entries must be ports (ints from 1 to 65535), got True"),
    (lambda: Permissions(listen=[65536]),
     "Permissions.listen entries must be ports (ints from 1 to 65535), got 65536"),
    (lambda: Permissions(processes=True), "Permissions.processes must be an int >= 0, got True"),
    (lambda: Permissions(on_unsupported="ignore"),
     "Permissions.on_unsupported must be 'fail' or 'warn', got 'ignore'"),
    # Schedules
    (lambda: Registry().schedule("s", "q", every=60, misfire="never"),  # type: ignore[arg-type]
     "schedule 's': misfire must be 'skip', 'once' or 'all', got 'never'"),
    (lambda: Registry().schedule("s", "q", every=60, priority=True),
     "priority must be an int between -1000000 and 1000000, got True"),
    # An add's options (checked before anything is sent)
    (lambda: ops.new_job({}, None, {"expires": True}),
     "expires must be a number of seconds or a timezone-aware datetime, got True"),
    (lambda: ops.new_job({}, None, {"priority": 1.0}),
     "priority must be an int between -1000000 and 1000000, got 1.0"),
    (lambda: ops.new_job({}, None, {"attempts": False}),
     "attempts must be an int between 1 and 1000000, got False"),
    # Listing
    (listing(limit=0), "limit must be an int >= 1, got 0"),
    (listing(limit=True), "limit must be an int >= 1, got True"),
    (listing(offset=-1), "offset must be an int >= 0, got -1"),
    (listing(offset=False), "offset must be an int >= 0, got False"),
    # Ints too large for the server's numbers (or the worker's): each failed later, in the
    # worker or at every job, once accepted.
    (listing(limit=10**30), f"limit must be an int >= 1 (at most 2**53), got {10**30}"),
    (lambda: Retention(events=10**30),
     f"Retention.events must be an int >= 0 (at most 2**53) (0 keeps only the events of a "
     f"job's end), got {10**30}"),
    (lambda: Chunk(size=2**53 + 1), f"Chunk.size must be an int >= 1 (at most 2**53), got "
                                    f"{2**53 + 1}"),
    (handler(concurrency=10**30), f"concurrency must be an int between 1 and 10000, got "
                                  f"{10**30}"),
    (lambda: Limits(memory_mb=2**60),
     f"Limits.memory_mb must be an int between 1 and {(2**63 - 1) >> 20}, got {2**60}"),
    (lambda: Permissions(processes=10**30),
     f"Permissions.processes must be an int >= 0 (at most 2**53), got {10**30}"),
    # A flag that is not one: a truthy "no" turned per-key limits on.
    (lambda: RateLimit(5, per_key="no"),  # type: ignore[arg-type]
     "RateLimit.per_key must be a bool, got 'no'"),
    # An add's dependencies, and a flow's items.
    (lambda: ops.new_job({}, None, {"depends_on": 5}),
     "depends_on must be a list of job ids (printable str), got 5"),
    (lambda: ops.new_job({}, None, {"depends_on": [LONE]}),
     f"depends_on must be a list of job ids (printable str), got {[LONE]!r}"),
]


@pytest.mark.parametrize(("call", "message"), REFUSED, ids=[m for _, m in REFUSED])
def test_a_wrong_value_is_refused_in_one_line_naming_the_option(
        call: Callable[[], object], message: str) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(message)}$"):
        call()


def test_the_values_at_each_bound_are_taken() -> None:
    Registry().handler("q", concurrency=1, max_stalls=0, max_snoozes=0, key_concurrency=1,
                       partitions=1024, attempts=1_000_000, priority=-1_000_000,
                       max_jobs_per_child=1)
    assert Retention(completed=-1, failed=-1, history=0).history == 0
    assert Permissions(listen=[1, 65535], processes=0).listen == (1, 65535)
    assert Limits(memory_mb=1, cpu_seconds=1, open_files=1).memory_mb == 1
    assert RateLimit(max=1, adaptive=False).max == 1


# --------------------------------------------------------------------------- the checks alone


def test_an_int_check_refuses_bools_floats_and_strings_and_names_its_range() -> None:
    assert check_int(3, "n", low=1, high=3) == 3
    for wrong in (True, False, 2.0, "2", None):
        assert not is_int(wrong)
        with pytest.raises(ConfigError, match=r"^n must be an int between 1 and 3, got "):
            check_int(wrong, "n", low=1, high=3)
    with pytest.raises(ConfigError, match=r"^n must be an int <= 3, got 4$"):
        check_int(4, "n", high=3)
    with pytest.raises(ConfigError, match=r"^n must be an int, got 'x'$"):
        check_int("x", "n")


def test_a_number_check_takes_ints_and_floats_but_not_bools() -> None:
    assert check_number(2, "t") == 2
    assert check_number(float("nan"), "t") != 0  # the caller decides about NaN
    assert is_number(1.5) and is_number(-1)
    assert not is_number(True)
    with pytest.raises(ConfigError, match=r"^t must be a number of seconds, got True$"):
        check_number(True, "t")


def test_a_flag_is_true_or_false_and_nothing_that_merely_looks_like_one() -> None:
    assert check_flag(False, "f") is False
    for wrong in (1, 0, "yes", None):
        with pytest.raises(ConfigError, match=r"^f must be a bool, got "):
            check_flag(wrong, "f")


def test_a_choice_is_one_of_the_names_given() -> None:
    assert check_one_of("b", "c", ("a", "b")) == "b"
    with pytest.raises(ConfigError, match=r"^c must be 'a', got \['a'\]$"):
        check_one_of(["a"], "c", ("a",))


# --------------------------------------------------------------------------- through a client


def test_bad_input_of_the_client_is_one_error_naming_it_and_writes_nothing(
        redis_url: str, queue_name: str) -> None:
    """What each call refused with a TypeError, a UnicodeEncodeError, a ValueError or a
    command Redis refused, or took when it must not."""
    from panqueue import FlowJob, PayloadError, SyncQueueClient

    lone = LONE
    with SyncQueueClient(redis_url, max_payload_bytes=1000) as client:
        queue = client.queue(queue_name)
        for data, where in [(lone, "data"), ({"a": [1, "x" + lone]}, 'data["a"][1]'),
                            ({lone: 1}, "data: key")]:
            with pytest.raises(PayloadError, match=f"^{re.escape(where)}.*not valid UTF-8"):
                queue.add(data)
            with pytest.raises(PayloadError, match=f"^item 1: {re.escape(where)}"):
                queue.add_bulk([{"ok": 1}, data])
        target = queue.add(1, job_id="target")
        with pytest.raises(PayloadError, match="not valid UTF-8"):
            client.signal(queue_name, target.id, "go", {"x": lone})
        with pytest.raises(ConfigError, match=r"^flow item 1: depends_on must be a list"):
            queue.add_flow([FlowJob(1), FlowJob(2, depends_on=0)])  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=r"^flow item 1: depends_on must be a list"):
            queue.add_flow([FlowJob(1), FlowJob(2, options=None)])  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=r"^flow item 1: depends_on 2.5 is neither"):
            queue.add_flow([FlowJob(1), FlowJob(2, depends_on=[2.5])])  # type: ignore[list-item]
        with pytest.raises(ConfigError, match=r"^flow item 2: priority must be an int"):
            queue.add_flow([FlowJob(1), FlowJob(2), FlowJob(3, options={"priority": 1.5})])
        with pytest.raises(ConfigError, match=r"^window must be > 0, got nan"):
            client.timings(queue_name, window=float("nan"))
        # A str is a sequence of its characters: retry_failed(ids="ab") retried job "a".
        with pytest.raises(ConfigError, match=r"^retry_failed ids must be a list of job ids"):
            client.retry_failed(queue_name, "ab")  # type: ignore[arg-type]
        # A batch's callback data counts against max_payload_bytes, as any job's does.
        with pytest.raises(PayloadError, match=r"^on_complete's data is"):
            client.batch(on_complete=(queue_name, {"blob": "x" * 2000}))
        assert client.counts(queue_name)[JobState.WAITING] == 1  # the target alone
