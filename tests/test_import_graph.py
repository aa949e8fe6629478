"""The package's import graph has no cycles.

Read from the source with ``ast``, not by importing: every import counts, at module level, inside
functions (a deferred import hides a cycle from the interpreter, not from the design) and under
``if TYPE_CHECKING:`` (two modules that name each other's types know each other). A module that
imports ``panqueue.a.b`` depends on ``panqueue.a.b`` alone, not on the package ``panqueue.a``
that Python runs first: otherwise every module of a package whose ``__init__`` gathers its
modules would be in a cycle with them. A shared piece goes down into a module that both import.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import panqueue
from tests.helpers import APPS, subprocess_env

ROOT = Path(panqueue.__file__).parent

# Cycles known to be on their way out, each with the change that removes it.
KNOWN_CYCLES: set[frozenset[str]] = set()


def _modules(root: Path) -> dict[str, Path]:
    """Every module of the package under ``root``, by dotted name (a package by its own)."""
    modules = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _imports(name: str, path: Path) -> list[str]:
    """What the module ``name`` imports, anywhere in it: the modules, or the names inside
    modules (``panqueue.errors.ConfigError``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found += [f"{base}.{alias.name}" for alias in node.names]
    return found


def _owner(target: str, modules: dict[str, Path]) -> str | None:
    """The package's module that ``target`` names (a name inside it: the module), or None."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def _graph(root: Path) -> dict[str, set[str]]:
    modules = _modules(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for target in _imports(name, path):
            owner = _owner(target, modules)
            if owner is not None and owner != name:
                graph[name].add(owner)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, with an
    explicit stack: no recursion limit to meet)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(frozenset(component))
    return found


def _describe(cycle: frozenset[str], graph: dict[str, set[str]]) -> str:
    return "; ".join(f"{name} -> {', '.join(sorted(graph[name] & cycle))}"
                     for name in sorted(cycle))


def test_the_cycle_finder_finds_a_cycle_through_a_deferred_and_a_type_checking_import(
        tmp_path: Path) -> None:
    """The check itself: a cycle that only a deferred import and one under TYPE_CHECKING
    make is found, and a module that imports a sibling of its package is not in a cycle with
    the package."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from pkg.sub.b import B\n")
    (package / "sub" / "__init__.py").write_text("from pkg.sub import b\n")
    (package / "sub" / "b.py").write_text("from pkg.sub.c import C\nB = 1\n")
    (package / "sub" / "c.py").write_text("C = 1\n")
    (package / "a.py").write_text("def f():\n    from pkg.d import D\n")
    (package / "d.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\nD = 1\n")
    graph = _graph(package)
    assert _cycles(graph) == [frozenset({"pkg.a", "pkg.d"})]


def test_no_module_of_the_package_is_in_an_import_cycle() -> None:
    graph = _graph(ROOT)
    cycles = [cycle for cycle in _cycles(graph) if cycle not in KNOWN_CYCLES]
    assert not cycles, "import cycles: " + " | ".join(_describe(c, graph) for c in cycles)



# What a process loads is most of its start (a command, a worker, a subprocess executor's child:
# the suite starts hundreds). Each kind of process, the modules it must not load.
_LOADS = '''
import json, sys
sys.path[:0] = [{apps!r}]
{code}
print(json.dumps(sorted(sys.modules)))
'''


def _loaded(code: str) -> set[str]:
    proc = subprocess.run(
        [sys.executable, "-c", _LOADS.format(apps=str(APPS), code=code)],
        capture_output=True, text=True, timeout=60, env=subprocess_env())
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout))


def _under(loaded: set[str], *packages: str) -> list[str]:
    return sorted(m for m in loaded if any(m == p or m.startswith(p + ".") for p in packages))


def test_import_panqueue_loads_no_module_until_a_name_is_used() -> None:
    loaded = _loaded("import panqueue")
    assert _under(loaded, "panqueue") == ["panqueue"]
    loaded = _loaded("import panqueue; panqueue.Worker")
    assert "panqueue._runtime.worker" in loaded
    # The public modules are attributes of the package, as when __init__ imported them.
    loaded = _loaded("import panqueue; panqueue.errors.Fail; panqueue.executors.Executor")
    assert {"panqueue.errors", "panqueue.executors"} <= loaded


def test_a_subprocess_executors_child_loads_neither_redis_nor_logging() -> None:
    """The child imports the application's handlers to run them: not the client, the store,
    redis-py or structlog (a handler's enqueue loads them on first use)."""
    loaded = _loaded("from panqueue.executors._child import main\nimport seccomp_app")
    assert "seccomp_app" in loaded
    assert _under(loaded, "redis", "structlog", "panqueue._store", "panqueue._runtime") == []


def test_a_command_that_reads_loads_neither_the_runtime_nor_logging() -> None:
    loaded = _loaded("from panqueue.cli import cli\ncli.get_command(None, 'jobs')")
    assert "panqueue.cli._jobs" in loaded
    assert _under(loaded, "structlog", "panqueue._runtime", "panqueue.executors",
                  "panqueue.cli._worker", "panqueue.dashboard") == []


def test_the_packages_lazy_names_agree_with_its_type_checking_imports() -> None:
    """``panqueue/__init__.py`` names each public name three times: in ``__all__``, in the
    table ``__getattr__`` imports from, and in the imports type checkers read. They agree."""
    tree = ast.parse((ROOT / "__init__.py").read_text())
    checked = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imported in node.body:
                assert isinstance(imported, ast.ImportFrom)
                checked |= {alias.name: imported.module for alias in imported.names}
    assert checked == panqueue._MODULES
    assert set(panqueue.__all__) == set(checked)
    for name in panqueue.__all__:
        assert getattr(panqueue, name) is not None
