"""A dataclass-payload handler in the subprocess executor (the child imports it by name)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from panqueue import Job, Registry

queues = Registry()


@dataclass
class Rect:
    width: int
    height: int

    def area(self) -> int:
        return self.width * self.height


@queues.handler("typed-subprocess", executor="subprocess")
def measure(job: Job[Rect]) -> dict[str, Any]:
    return {"type": type(job.data).__name__, "area": job.data.area(), "pid": os.getpid()}
