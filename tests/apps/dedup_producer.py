"""A producer process for the concurrent dedup test: adds the same dedup key many times."""

import sys

from panqueue import Dedup, SyncQueueClient

url, queue, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
with SyncQueueClient(url) as client:
    handle = client.queue(queue)
    created = sum(handle.add({"n": n}, dedup=Dedup("same-thing", ttl=60)).created
                  for n in range(count))
print(created)
