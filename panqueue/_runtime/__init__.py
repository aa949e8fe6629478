"""The worker runtime, split by role: the coordinator (worker), the claim loop (claimer), one
attempt (attempt), recording outcomes (recorder), locks (locks, watchdog), wake-ups (wakeups) and
upkeep (upkeep)."""
