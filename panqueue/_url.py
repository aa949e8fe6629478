"""Where the Redis URL comes from: an explicit argument, then PANQUEUE_URL, then localhost."""

from __future__ import annotations

import os

__all__ = ["DEFAULT_URL", "resolve_url"]

DEFAULT_URL = "redis://localhost:6379/0"


def resolve_url(url: str | None = None) -> str:
    return url or os.environ.get("PANQUEUE_URL") or DEFAULT_URL
