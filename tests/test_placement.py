"""Where a partitioned queue's partitions land in the cluster's slot space (panqueue/_keys.py
partition_tags): spread over the masters as evenly as the count allows, for any queue name. Pure:
a cluster's evenly split slot ranges are computed here the way `redis-cli --cluster create`
splits them, and each partition's slot from its hash tag (CRC16, as Redis computes it)."""

from __future__ import annotations

import binascii
import bisect
import random
import string

import pytest

from panqueue._keys import (
    LEGACY_PLACEMENT,
    SPREAD_PLACEMENT,
    _partition_tags,
    partition_keys,
    partition_tags,
)

SLOTS = 16384



def _master_starts(masters: int) -> list[int]:
    """The first slot of each master of an evenly split cluster, as redis-cli assigns them: a
    float32 cursor advanced by 16384 / masters, each range ending at lround(cursor + step - 1)."""
    step = SLOTS / masters
    starts, first, cursor = [], 0, 0.0
    for i in range(masters):
        starts.append(first)
        last = round(cursor + step - 1)
        if i == masters - 1:
            last = SLOTS - 1
        first, cursor = last + 1, cursor + step
    return starts


def _per_master(name: str, count: int, starts: list[int]) -> list[int]:
    """How many of the queue's partitions each master (starting at ``starts``) holds."""
    held = [0] * len(starts)
    for tag in partition_tags(name, count):
        slot = binascii.crc_hqx(tag.encode(), 0) % SLOTS
        held[bisect.bisect_right(starts, slot) - 1] += 1
    return held


def _names(n: int) -> list[str]:
    chooser = random.Random(23)
    alphabet = string.ascii_letters + string.digits + ":-_."
    return ["".join(chooser.choices(alphabet, k=chooser.randint(1, 24))) for _ in range(n)]


@pytest.mark.parametrize("masters", range(3, 17))
def test_partitions_spread_over_every_master_for_any_name(masters: int) -> None:
    """partitions=M on M evenly split masters: one partition on each, for every one of a
    thousand names; a multiple of M puts as many on each; any other count puts floor or ceil
    of count / M on each (as evenly as the count allows)."""
    names, starts = _names(1000), _master_starts(masters)
    for count in sorted({masters - 1, masters, masters + 1, 2 * masters, 3 * masters - 1}):
        low, high = count // masters, -(-count // masters)
        for name in names:
            held = _per_master(name, count, starts)
            assert low <= min(held) and max(held) <= high, (name, count, held)


def test_placement_is_a_pure_function_of_name_and_count() -> None:
    """Partition 0 keeps the plain tag; the tags are distinct, the same on every call, and
    distinct from the "#i" tags of queues declared before placement, which keep theirs."""
    for name in _names(50):
        tags = partition_tags(name, 12)
        assert tags[0] == f"q:{name}"
        assert len(set(tags)) == 12
        # Not only the cache's answer:
        assert _partition_tags.__wrapped__("", name, 12, SPREAD_PLACEMENT) == tags
        legacy = partition_tags(name, 12, LEGACY_PLACEMENT)
        assert legacy == (f"q:{name}", *(f"q:{name}#{i}" for i in range(1, 12)))
        assert not set(tags[1:]) & set(legacy)
        assert [k.prefix for k in partition_keys(name, 12)] == ["{" + t + "}:" for t in tags]
    assert partition_tags("solo", 1) == ("q:solo",)
