#!/usr/bin/env bash
# Install into .venv, start a private Redis-compatible server (unless --url is given), enqueue
# jobs, run worker processes with visible progress, print a summary, stop what was started.
set -euo pipefail
source "$(dirname "$0")/_venv.sh" "embedded,hiredis,trio"
exec .venv/bin/panqueue demo "$@"
