"""The history stream: one record per finished job (``record_history`` in lua/lib/records.lua),
read by exports through one consumer group, so a record stays pending until the export that
read it acknowledges it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from panqueue._keys import QueueKeys
from panqueue._store.ops.events import stream_entries
from panqueue._store.transport import Batch, Command, Op
from panqueue.errors import PanqueueError

__all__ = ["EXPORT_CONSUMER", "EXPORT_GROUP", "HISTORY_FIELDS", "HistoryBatch", "HistoryRecord",
           "acknowledge_history", "open_history_export", "read_history"]

# The consumer group of exports, and the one consumer name every export run reads as: a re-run
# finds the batch a failed run had read among that consumer's pending entries.
EXPORT_GROUP = "export"
EXPORT_CONSUMER = "export"
# The fields of a record, in the order record_history writes them.
HISTORY_FIELDS = ("id", "state", "attempts", "enqueued", "started", "finished", "reason",
                  "error_type", "error_message", "worker")


@dataclass(frozen=True, slots=True)
class HistoryRecord:
    """One finished job as the history stream holds it (times in ms, server clock)."""

    entry: str  # the stream entry id
    id: str
    state: str
    attempts: int
    enqueued_ms: int | None
    started_ms: int | None
    finished_ms: int
    reason: str | None
    error_type: str | None
    error_message: str | None
    worker: str | None


@dataclass(frozen=True, slots=True)
class HistoryBatch:
    """Entries read for one export batch. ``entries`` lists every stream id to acknowledge,
    including those trimmed from the stream after they were read (``trimmed``: no record);
    ``skipped`` counts records trimmed before any export read them."""

    entries: list[str]
    records: list[HistoryRecord]
    pending: bool  # re-read after an export that did not acknowledge them
    trimmed: int
    skipped: int

    @property
    def name(self) -> str:
        """Stable for the same entries: the first and last stream id."""
        return f"{self.entries[0]}_{self.entries[-1]}" if self.entries else ""


def _text(value: bytes | None) -> str | None:
    return value.decode() if value else None


def _ms(value: bytes | None) -> int | None:
    return int(value) if value else None


def parse_record(entry: bytes, fields: dict[bytes, bytes]) -> HistoryRecord:
    return HistoryRecord(
        entry.decode(), fields[b"id"].decode(), fields[b"state"].decode(),
        int(fields.get(b"attempts") or 0), _ms(fields.get(b"enqueued")),
        _ms(fields.get(b"started")), int(fields[b"finished"]), _text(fields.get(b"reason")),
        _text(fields.get(b"error_type")), _text(fields.get(b"error_message")),
        _text(fields.get(b"worker")))


def open_history_export(keys: QueueKeys) -> Op[None]:
    """Create the export's consumer group (and the stream) if they do not exist: the first
    export reads every record the stream still holds."""
    try:
        yield Command(("XGROUP", "CREATE", keys.history, EXPORT_GROUP, "0", "MKSTREAM"))
    except PanqueueError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def _group_read(info: Any) -> int | None:
    """The export group's read counter from an XINFO GROUPS reply (None: not known)."""
    for group in info:
        pairs = group.items() if isinstance(group, dict) else zip(group[::2], group[1::2],
                                                                  strict=True)
        group = {key.decode() if isinstance(key, bytes) else key: value for key, value in pairs}
        if group.get("name") in (EXPORT_GROUP, EXPORT_GROUP.encode()):
            read = group.get("entries-read")
            if read is None and group.get("last-delivered-id") in (b"0-0", "0-0"):
                return 0
            return None if read is None else int(read)
    return None


def read_history(keys: QueueKeys, count: int) -> Op[HistoryBatch]:
    """The next batch: every entry still pending for the export consumer (a batch an earlier
    export read and did not acknowledge), else up to ``count`` new ones. An empty batch: all
    exported."""
    entries: list[str] = []
    records: list[HistoryRecord] = []
    trimmed = 0
    after = "0"
    while True:  # the pending entries, all of them: the batch must be the one read before
        reply = yield Command(("XREADGROUP", "GROUP", EXPORT_GROUP, EXPORT_CONSUMER, "COUNT",
                               count, "STREAMS", keys.history, after))
        found = stream_entries(reply)
        if not found:
            break
        for entry, fields in found:
            entries.append(entry.decode())
            if fields:
                records.append(parse_record(entry, fields))
            else:
                trimmed += 1  # trimmed from the stream (MAXLEN) since it was read
        after = entries[-1]
    if entries:
        return HistoryBatch(entries, records, True, trimmed, 0)
    before, reply, now = yield Batch((
        Command(("XINFO", "GROUPS", keys.history)),
        Command(("XREADGROUP", "GROUP", EXPORT_GROUP, EXPORT_CONSUMER, "COUNT", count,
                 "STREAMS", keys.history, ">")),
        Command(("XINFO", "GROUPS", keys.history))), route=keys.history)
    for entry, fields in stream_entries(reply):
        entries.append(entry.decode())
        if fields is not None:  # (always, for an entry delivered now rather than before)
            records.append(parse_record(entry, fields))
    # The group's read counter moves past entries trimmed before they were delivered.
    read_before, read_now = _group_read(before), _group_read(now)
    skipped = (0 if read_before is None or read_now is None
               else max(0, read_now - read_before - len(entries)))
    return HistoryBatch(entries, records, False, 0, skipped)


def acknowledge_history(keys: QueueKeys, entries: list[str]) -> Op[int]:
    """Acknowledge exported entries: no export reads them again."""
    if not entries:
        return 0
    reply = yield Command(("XACK", keys.history, EXPORT_GROUP, *entries))
    return int(reply)
