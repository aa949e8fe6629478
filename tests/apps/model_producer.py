"""Producer processes for tests/test_model.py to kill between the steps of an operation.

This process imports panqueue once and then reads one operation per line on stdin (JSON). It
runs each in a child process of its own, forked (this process holds no connection and runs no
thread, so a fork is safe and takes milliseconds instead of an interpreter's start), and
answers the line with the child's pid. The child opens its own client on the URL it is given
(a FaultProxy's), does the operation, retrying it after a broken connection as a producer does
until it is answered, and exits without a word; the test SIGKILLs it meanwhile, while the
proxy keeps it from getting past one step. A line ``reap PID`` waits for that child and
answers ``reaped``; end of input ends this process.

Operations: ``{"op": "add", "url", "queue", "data", "job_id", "depends_on"}`` adds one job;
``{"op": "flow", "url", "queue", "items": [{"data", "job_id", "depends_on"}, ...]}`` adds a
flow (``depends_on``: indexes of earlier items); ``{"op": "close", "url", "batch"}`` closes a
batch (which fires it when every job ended).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from panqueue import ConnectionError, FlowJob, SyncBatch, SyncQueueClient


def run(order: dict[str, Any]) -> None:
    with SyncQueueClient(order["url"]) as client:
        while True:
            try:
                if order["op"] == "add":
                    client.queue(order["queue"]).add(order["data"], job_id=order["job_id"],
                                                     depends_on=order["depends_on"])
                elif order["op"] == "flow":
                    client.queue(order["queue"]).add_flow([FlowJob(
                        item["data"], depends_on=item["depends_on"], job_id=item["job_id"])
                        for item in order["items"]])
                else:
                    SyncBatch(client, order["batch"]).close()
                return
            except ConnectionError:  # the connection broke (the reply was lost): again
                time.sleep(0.01)


def main() -> None:
    for line in sys.stdin:
        if line.startswith("reap "):
            os.waitpid(int(line.split()[1]), 0)
            print("reaped", flush=True)
            continue
        order = json.loads(line)
        pid = os.fork()
        if pid == 0:
            try:
                run(order)
            finally:
                os._exit(0)
        print(pid, flush=True)


if __name__ == "__main__":
    main()
