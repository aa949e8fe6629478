"""Scripts called as Redis Functions (``panqueue/_store/library.py``): every script's library
loads, a server without it gets it on the first call, each call starts from its own state, a
user refused functions is served with EVALSHA, and a full server treats a call as it treats the
script sent with EVALSHA. Each transport: the sync one, and the event loop's (asyncio's; trio's
own sockets)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio
import anyio.to_thread
import pytest
import redis

from panqueue._keys import QueueKeys
from panqueue._store import loader
from panqueue._store.library import function_name, library_of
from panqueue._store.loader import SCRIPTS
from panqueue._store.ops import NewJob, add_call
from panqueue._store.ops.base import script_call
from panqueue._store.transport import (
    AsyncTransport,
    Request,
    ScriptCall,
    SyncTransport,
    open_async_transport,
)
from panqueue.embedded import RedisServer
from tests.helpers import command_calls, free_port

pytestmark = pytest.mark.anyio

PASSWORD = "functions-test-password"


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer(appendonly=False) as started:
        yield started


@pytest.fixture
def admin(server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(server.url)
    client.flushall()
    client.execute_command("FUNCTION", "FLUSH")
    client.config_resetstat()
    yield client
    client.close()


def _add(queue: str) -> Request:
    return add_call(QueueKeys(queue), [NewJob(None, b"\xc0")])


async def _on_each_transport(url: str, run: Callable[[Callable[[Request], Awaitable[Any]]],
                                                     Awaitable[None]]) -> list[bool]:
    """``run(execute)`` with a new sync transport, then with a new async one; returns whether
    each still calls functions afterwards."""
    sync = SyncTransport(url)
    try:
        await run(lambda request: anyio.to_thread.run_sync(sync.execute, request))
        used = [sync._functions.on]
    finally:
        sync.close()
    transport: AsyncTransport = open_async_transport(url)
    try:
        await run(transport.execute)
        used.append(transport._functions.on)  # type: ignore[attr-defined]
    finally:
        await transport.aclose()
    return used


def test_every_script_has_a_library_that_the_server_loads(admin: redis.Redis) -> None:
    for script in SCRIPTS:
        assert script.library is not None, script.name
        loaded = admin.execute_command("FUNCTION", "LOAD", "REPLACE", script.library)
        assert loaded.decode() == script.function
        # The body EVALSHA runs is the same script.
        assert admin.script_load(script.body) == script.sha


async def test_a_server_without_the_library_loads_it_at_the_first_call(
        anyio_backend: str, server: RedisServer, admin: redis.Redis, queue_name: str) -> None:
    async def run(execute: Callable[[Request], Awaitable[Any]]) -> None:
        admin.execute_command("FUNCTION", "FLUSH")  # a restart, or a new master
        await execute(_add(queue_name))
        await execute(_add(queue_name))

    assert await _on_each_transport(server.url, run) == [True, True]
    # Per transport: one FCALL refused, the library loaded, then two FCALLs that ran.
    assert command_calls(admin, "fcall") == 6
    assert command_calls(admin, "function|load") == 2
    assert command_calls(admin, "evalsha") == command_calls(admin, "eval") == 0
    assert admin.llen(QueueKeys(queue_name).wait_list) == 4


async def test_each_call_starts_from_its_own_keys_and_settings(
        anyio_backend: str, server: RedisServer, admin: redis.Redis, queue_name: str) -> None:
    """The library keeps the includes' state between calls (the key names made from KEYS[1],
    the cached meta hash): each call must set it afresh. Two queues, one of them paused,
    served alternately by the same library."""
    first, second = f"{queue_name}-a", f"{queue_name}-b"
    admin.hset(QueueKeys(second).meta, "paused", "1")

    async def run(execute: Callable[[Request], Awaitable[Any]]) -> None:
        for queue in (first, second, first, second):
            await execute(_add(queue))

    await _on_each_transport(server.url, run)
    assert admin.llen(QueueKeys(first).wait_list) == 4
    assert admin.llen(QueueKeys(second).wait_list) == 4
    # A claim sees each queue's own settings: the paused one gives nothing.
    transport = SyncTransport(server.url)
    try:
        for queue, expected in ((second, 0), (first, 2), (second, 0)):
            reply = await anyio.to_thread.run_sync(transport.execute, script_call(
                SCRIPTS.claim, QueueKeys(queue), "w:1:0", 30_000, 2))
            assert reply[0] == expected, (queue, reply)
    finally:
        transport.close()


@pytest.mark.parametrize("refused", ["-fcall", "-function|load"])
async def test_a_user_refused_functions_is_served_with_evalsha(
        anyio_backend: str, server: RedisServer, admin: redis.Redis, queue_name: str,
        refused: str) -> None:
    """A user without FCALL, or who may not load a library (a server before Redis 7 answers
    as the first does): the scripts go by EVALSHA, as before functions."""
    user = f"nofn{refused.replace('|', '').replace('-', '')}"
    admin.execute_command("ACL", "SETUSER", user, "reset", "on", f">{PASSWORD}", "~*", "&*",
                          "+@all", refused)
    url = server.url.replace("redis://", f"redis://{user}:{PASSWORD}@")

    async def run(execute: Callable[[Request], Awaitable[Any]]) -> None:
        await execute(_add(queue_name))
        await execute(_add(queue_name))

    try:
        assert await _on_each_transport(url, run) == [False, False]
    finally:
        admin.execute_command("ACL", "DELUSER", user)
    assert admin.llen(QueueKeys(queue_name).wait_list) == 4
    assert command_calls(admin, "evalsha") == 4


@pytest.mark.parametrize("loaded", [True, False], ids=["loaded", "not-loaded"])
async def test_a_full_server_runs_a_call_that_frees_memory_as_it_runs_the_script(
        anyio_backend: str, server: RedisServer, admin: redis.Redis, queue_name: str,
        loaded: bool) -> None:
    """Over maxmemory a function that may write is refused before it runs (and a library is
    not loaded), where a script sent with EVALSHA is refused only at its first command that may
    grow memory: removing a job (its first write a delete) works on a full server, as it
    always has, whether the server has the library or not."""
    if loaded:
        admin.execute_command("FUNCTION", "LOAD", SCRIPTS.remove.library)
    transport = SyncTransport(server.url)
    try:
        ids = [(await anyio.to_thread.run_sync(transport.execute, _add(queue_name)))[0]
               for _ in range(2)]
    finally:
        transport.close()
    policy = admin.config_get("maxmemory-policy")["maxmemory-policy"]
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", "1")
    removed = []
    try:
        async def run(execute: Callable[[Request], Awaitable[Any]]) -> None:
            job_id = ids[len(removed)]
            removed.append(await execute(script_call(SCRIPTS.remove, QueueKeys(queue_name),
                                                     job_id, "")))

        await _on_each_transport(server.url, run)
    finally:
        admin.config_set("maxmemory", "0")
        admin.config_set("maxmemory-policy", policy)
    assert admin.llen(QueueKeys(queue_name).wait_list) == 0


@pytest.mark.parametrize("loaded", [True, False], ids=["loaded", "not-loaded"])
async def test_a_replica_answers_a_call_that_only_reads_as_it_answers_the_script(
        anyio_backend: str, server: RedisServer, admin: redis.Redis, queue_name: str,
        loaded: bool) -> None:
    """A replica refuses a function that may write (and a library to load) before it runs,
    where it runs a script sent with EVALSHA up to its first write: explaining a job, which
    only reads, works on a replica as it always has."""
    if loaded:
        admin.execute_command("FUNCTION", "LOAD", SCRIPTS.explain.library)
    transport = SyncTransport(server.url)
    try:
        job_id = (await anyio.to_thread.run_sync(transport.execute, _add(queue_name)))[0]
    finally:
        transport.close()
    admin.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))  # nobody there
    answers: list[Any] = []
    try:
        async def run(execute: Callable[[Request], Awaitable[Any]]) -> None:
            answers.append(await execute(ScriptCall(SCRIPTS.explain,
                                                    (QueueKeys(queue_name).prefix,), (job_id,))))

        assert await _on_each_transport(server.url, run) == [True, True]
    finally:
        admin.execute_command("REPLICAOF", "NO", "ONE")
    assert len(answers) == 2 and answers[0] == answers[1] and answers[0]


def test_a_name_made_from_the_prefix_that_a_function_changes_is_set_at_every_call(
        admin: redis.Redis) -> None:
    """The names made from KEYS[1] alone are set again only when a call's prefix differs from
    the last call's; one that a function assigns too is state of the call, set at every call,
    so that each call starts as a script sent with EVALSHA does."""
    include = ("local P = KEYS[1]\n"
               "local K_KEPT = P .. 'kept'\n"
               "local K_CHANGED = P .. 'changed'\n"
               "local function change()\n"
               "  K_CHANGED = 'changed by the last call'\n"
               "end\n")
    own = "local seen = {K_KEPT, K_CHANGED}\nchange()\nreturn seen\n"
    name = "pq_test_prefix_changed"
    text = library_of([("s.lua", "-- s\n"), ("lib/a.lua", include), ("s.lua", own)], "s.lua",
                      name)
    assert text is not None
    admin.execute_command("FUNCTION", "LOAD", "REPLACE", text)
    for prefix in ("{q:a}:", "{q:a}:", "{q:b}:", "{q:b}:"):
        seen = admin.execute_command("FCALL", name, 1, prefix)
        assert seen == [f"{prefix}kept".encode(), f"{prefix}changed".encode()], (prefix, seen)


async def test_the_user_that_connections_md_names_calls_functions(
        anyio_backend: str, server: RedisServer, admin: redis.Redis, queue_name: str) -> None:
    """The ACL of docs/connections.md ("ACL users"): its ``+@scripting`` holds FCALL and
    FUNCTION LOAD, so that user's scripts go as functions, a library loaded when missing."""
    admin.execute_command(
        "ACL", "SETUSER", "app", "reset", "on", f">{PASSWORD}", "resetkeys", "~{q:*", "~{b:*",
        "resetchannels", "&{q:*", "-@all", "+@read", "+@write", "+@scripting", "+@pubsub",
        "+@connection", "+time", "+scan")
    url = server.url.replace("redis://", f"redis://app:{PASSWORD}@")

    async def run(execute: Callable[[Request], Awaitable[Any]]) -> None:
        admin.execute_command("FUNCTION", "FLUSH")
        await execute(_add(queue_name))

    try:
        assert await _on_each_transport(url, run) == [True, True]
    finally:
        admin.execute_command("ACL", "DELUSER", "app")
    assert command_calls(admin, "evalsha") == 0
    assert command_calls(admin, "function|load") == 2


def test_a_process_makes_a_library_only_when_a_server_lacks_it() -> None:
    """Making a script's library text takes milliseconds (the split of 60-odd KB of Lua); a
    process knows the function's name from the script alone (a CLI command, a worker's start
    pay nothing for it) and makes the text on the first call that finds the library missing."""
    script = loader._load("add")
    assert script.function == function_name(script.body)
    assert script._library is None
    assert script.library is not None and script._library is script.library
    assert script.library.startswith(f"#!lua name={script.function}\n")
