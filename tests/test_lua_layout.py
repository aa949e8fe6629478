"""The Lua side held against the Python side: the status codes of lib/status.lua against
:class:`Status`, the key layout of lib/layout.lua against :class:`QueueKeys`; and the loader that
assembles each script from its includes."""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import pytest
import redis

from panqueue._keys import BatchKeys, QueueKeys
from panqueue._store.loader import SCRIPTS, ScriptSourceError, assemble
from panqueue._store.status import Status

LUA = Path(str(resources.files("panqueue._store") / "lua"))
LIB = LUA / "lib"

# Keys the scripts may use without a QueueKeys name: keyed mode's ready set, running counts and
# rate-limited keys, and the rate-limit window.
LUA_ONLY_KEYS = {"k:ready", "k:active", "k:limited"}
# Per-job and per-name keys the scripts may build without a QueueKeys method.
LUA_ONLY_KEY_FUNCTIONS = {"logs_key", "key_list", "deps_key", "dedup_key", "fence_key",
                          "req_key"}


def layout_text() -> str:
    """lib/layout.lua and the include it pastes with a job's keys (lib/job_keys.lua)."""
    return (LIB / "layout.lua").read_text() + (LIB / "job_keys.lua").read_text()


def lua_constants(text: str) -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(r"^local (\w+) = (-?\d+)\b", text, re.M)}


def lua_keys(text: str) -> dict[str, str]:
    """``local K_WAIT = P .. 'wait'`` -> {"K_WAIT": "wait"}."""
    return {m[1]: m[2] for m in re.finditer(r"^local (K_\w+) = P \.\. '([^']*)'$", text, re.M)}


def lua_key_functions(text: str) -> dict[str, tuple[str, str]]:
    """``local function job_key(id) return P .. 'job:' .. id end`` -> {"job_key": ("job:", "")}:
    what goes before and after the argument."""
    pattern = (r"^local function (\w+)\((\w+)\)\n\s+return P \.\. '([^']*)' \.\. \2"
               r"(?: \.\. '([^']*)')?\nend$")
    return {m[1]: (m[3], m[4] or "") for m in re.finditer(pattern, text, re.M)}


def includes(text: str) -> list[str]:
    return re.findall(r"^--!include (\S+)$", text, re.M)


def python_keys() -> dict[str, str]:
    """QueueKeys' key attributes -> suffix after the queue prefix."""
    keys = QueueKeys("x")
    found = {}
    for attr in QueueKeys.__slots__:
        value = getattr(keys, attr)
        if attr != "prefix" and isinstance(value, str) and value.startswith(keys.prefix):
            found[attr] = value[len(keys.prefix):]
    return found


# --------------------------------------------------------------------------- Python vs Lua


def test_lua_status_constants_are_exactly_the_status_enum() -> None:
    constants = lua_constants((LIB / "status.lua").read_text())
    assert constants == {status.name: status.value for status in Status}


def test_every_python_key_has_the_same_name_in_lua() -> None:
    lua = lua_keys((LIB / "layout.lua").read_text())
    assert python_keys(), "no keys found on QueueKeys"
    for attr, suffix in python_keys().items():
        assert lua.get(f"K_{attr.upper()}") == suffix, f"QueueKeys.{attr} is {suffix!r}"


def test_every_lua_key_is_a_python_key_or_known_to_be_the_scripts_own() -> None:
    python = set(python_keys().values())
    lua = lua_keys((LIB / "layout.lua").read_text())
    assert set(lua.values()) - python <= LUA_ONLY_KEYS
    assert len(set(lua.values())) == len(lua), "two Lua names for one key"


def test_per_job_and_per_name_keys_match() -> None:
    """Each QueueKeys method (job, schedule, ...) has a Lua function that builds the same key:
    ``job`` -> ``job_key(id)``, ``key_list`` -> ``key_list(key)``."""
    keys = QueueKeys("x")
    lua = lua_key_functions(layout_text())
    methods = [m for m in dir(QueueKeys) if not m.startswith("_") and callable(getattr(keys, m))]
    assert {"job", "schedule"} <= set(methods)
    matched = set()
    for method in methods:
        name = method if method in lua else f"{method}_key"
        assert name in lua, f"QueueKeys.{method} has no Lua counterpart in lib/layout.lua"
        before, after = lua[name]
        assert keys.prefix + before + "ID" + after == getattr(keys, method)("ID"), method
        matched.add(name)
    assert set(lua) - matched <= LUA_ONLY_KEY_FUNCTIONS


def test_keys_are_derived_only_in_layout_lua() -> None:
    """No other Lua file spells a key: they use layout.lua's names, a job's keys in
    job_keys.lua, which layout.lua pastes."""
    assert "job_keys.lua" in includes((LIB / "layout.lua").read_text())
    for path in [*LUA.glob("*.lua"), *LIB.glob("*.lua")]:
        if path.name in ("layout.lua", "job_keys.lua"):
            continue
        assert not re.search(r"\bP \.\.", path.read_text()), f"{path.name} builds a key"


def test_batch_keys_have_the_same_names_in_lua_and_only_batch_layout_builds_them() -> None:
    text = (LIB / "batch_layout.lua").read_text()
    lua = {m[1]: m[2] for m in re.finditer(r"^local (K_\w+) = B \.\. '([^']*)'$", text, re.M)}
    keys = BatchKeys("x")
    python = {f"K_{attr.upper()}": getattr(keys, attr)[len(keys.prefix):]
              for attr in BatchKeys.__slots__ if attr not in ("id", "prefix")}
    assert python == lua
    for path in [*LUA.glob("*.lua"), *LIB.glob("*.lua")]:
        if path.name != "batch_layout.lua":
            assert not re.search(r"\bB \.\.", path.read_text()), f"{path.name} builds a key"


# --------------------------------------------------------------------------- the files


def test_every_script_file_is_loaded_and_every_loaded_script_has_a_file() -> None:
    assert {p.stem for p in LUA.glob("*.lua")} == {s.name for s in SCRIPTS}


def test_every_script_has_a_header_with_keys_argv_and_returns() -> None:
    for path in LUA.glob("*.lua"):
        lines = [x for x in path.read_text().splitlines() if not x.startswith("#!")]
        assert lines[0].startswith(f"-- {path.stem}: "), path.name
        header = "\n".join(x for x in lines if x.startswith("-- "))
        assert "KEYS[1]" in header and "Returns" in header, path.name


def test_every_include_has_a_header_naming_what_it_needs() -> None:
    used = {name for p in LUA.glob("*.lua") for name in includes(p.read_text())}
    for path in LIB.glob("*.lua"):
        text = path.read_text()
        assert text.startswith(f"-- lib/{path.name}: "), path.name
        needs = re.search(r"^-- Needs: (.*)$", text, re.M)
        assert needs, f"{path.name} does not say what it needs"
        named = set(re.findall(r"\b(\w+\.lua)\b", needs[1]))
        assert named == set(includes(text)), f"{path.name}: header and includes differ"
        assert path.name in used or any(
            path.name in includes(p.read_text()) for p in LIB.glob("*.lua")), path.name


def test_every_script_compiles(redis_client: redis.Redis) -> None:
    for script in SCRIPTS:
        assert redis_client.script_load(script.body) == script.sha, script.name


# --------------------------------------------------------------------------- the loader


def reader(files: dict[str, str]) -> Callable[[str], str]:
    def read(path: str) -> str:
        try:
            return files[path]
        except KeyError:
            raise FileNotFoundError(path) from None
    return read


def test_includes_are_pasted_in_order_depth_first_each_once() -> None:
    files = {
        "s.lua": "#!lua flags=allow-oom\n-- s\n--!include b.lua\n--!include a.lua\nbody",
        "lib/a.lua": "-- a\n--!include base.lua\na",
        "lib/b.lua": "-- b\n--!include base.lua\n--!include a.lua\nb",
        "lib/base.lua": "base",
    }
    assert assemble("s", reader(files)).splitlines() == [
        "#!lua flags=allow-oom", "-- s", "-- b", "base", "-- a", "a", "b", "body"]


def test_an_unknown_include_fails_loudly() -> None:
    files = {"s.lua": "--!include nope.lua\n", "lib/a.lua": ""}
    with pytest.raises(ScriptSourceError, match=r"s\.lua includes lib/nope\.lua"):
        assemble("s", reader(files))


def test_an_include_cycle_fails_loudly() -> None:
    files = {"s.lua": "--!include a.lua\n", "lib/a.lua": "--!include b.lua\n",
             "lib/b.lua": "--!include a.lua\n"}
    with pytest.raises(ScriptSourceError, match="include cycle"):
        assemble("s", reader(files))


def test_a_shebang_is_only_allowed_on_a_scripts_first_line() -> None:
    with pytest.raises(ScriptSourceError, match="shebang"):
        assemble("s", reader({"s.lua": "-- s\n#!lua flags=allow-oom\n"}))
    with pytest.raises(ScriptSourceError, match="shebang"):
        assemble("s", reader({"s.lua": "--!include a.lua\n", "lib/a.lua": "#!lua\n"}))


def test_the_allow_oom_scripts_keep_their_flags_on_the_first_line() -> None:
    for script in (SCRIPTS.extend, SCRIPTS.release):
        assert script.body.startswith("#!lua flags=allow-oom\n"), script.name
