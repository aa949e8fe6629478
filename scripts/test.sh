#!/usr/bin/env bash
# Install into .venv and run the whole suite: ruff, mypy --strict, pytest (asyncio and trio).
# Extra arguments go to pytest (for example: scripts/test.sh -k lifecycle -x).
set -euo pipefail
source "$(dirname "$0")/_venv.sh" "dev,trio,hiredis,embedded,spark"
echo "== ruff"
.venv/bin/ruff check .
echo "== mypy --strict panqueue"
.venv/bin/mypy --strict panqueue
echo "== pytest"
.venv/bin/pytest "$@"
