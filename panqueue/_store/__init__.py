"""Storage: the Lua scripts, the Redis transport, and the operations built on them."""
