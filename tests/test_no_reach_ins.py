"""The producing side and the edges use each other's public surface only (docs/architecture.md):
no module imports another's private name or touches a private attribute of an object not its
own, and the client modules import one way, deferred imports included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "panqueue"

# The clients, what they hand out, and the edges that produce or read through them.
CHECKED = ["_client.py", "_queue.py", "_batch.py", "_producer.py", "spark.py", "spark_sources.py",
           "_tui.py", "_lag.py", "_ends.py", "_listing.py", "_demo.py", "_health.py", "metrics.py",
           "testing.py", "cli", "dashboard", "django"]


def _files() -> list[Path]:
    found: list[Path] = []
    for name in CHECKED:
        path = PACKAGE / name
        found += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return found


def _is_module(package: str, name: str) -> bool:
    """Whether ``package.name`` is a module or package (``from panqueue import _tracing``)."""
    base = PACKAGE.parent.joinpath(*package.split("."), name)
    return base.with_suffix(".py").exists() or base.is_dir()


def _reach_ins(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("panqueue"):
            assert node.module is not None
            found += [f"line {node.lineno}: imports {node.module}.{alias.name}"
                      for alias in node.names
                      if alias.name.startswith("_") and not alias.name.startswith("__")
                      and not _is_module(node.module, alias.name)]
        elif (isinstance(node, ast.Attribute) and node.attr.startswith("_")
              and not node.attr.startswith("__")
              and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


@pytest.mark.parametrize("path", _files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_private_name_of_another_module_is_used(path: Path) -> None:
    assert _reach_ins(path) == []


def _imported(path: Path) -> set[str]:
    """Every panqueue module ``path`` imports, at the top or deferred."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("panqueue"):
            assert node.module is not None
            names.add(node.module)
            names |= {f"{node.module}.{a.name}" for a in node.names
                      if _is_module(node.module, a.name)}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name.startswith("panqueue")}
    return names


@pytest.mark.parametrize(("module", "above"), [
    ("_batch", {"panqueue._client", "panqueue._queue"}),
    ("_queue", {"panqueue._client", "panqueue._batch"}),
    ("_producer", {"panqueue._client", "panqueue._queue", "panqueue._batch"}),
])
def test_the_client_modules_import_one_way(module: str, above: set[str]) -> None:
    """``_client`` → ``_queue``, ``_batch`` → ``_producer``: nothing imports back up."""
    assert _imported(PACKAGE / f"{module}.py") & above == set()
