"""docs/cli.md is generated from the command line's own help (scripts/gen_cli_docs.py): this
test fails when someone changes a command's help without regenerating the page, or edits the
page by hand."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT, subprocess_env


def test_docs_cli_md_is_what_the_generator_writes_from_the_help() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_cli_docs.py"), "--check"],
                          capture_output=True, text=True, timeout=60, env=subprocess_env(),
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr


def _shell_lines(page: str) -> list[str]:
    """The lines of the ```sh blocks of ``page``, in order, comments dropped."""
    lines: list[str] = []
    inside = False
    for line in (ROOT / "docs" / page).read_text().splitlines():
        if line.startswith("```"):
            inside = line.strip() == "```sh" if not inside else False
            continue
        if inside and line.split("#", 1)[0].strip():
            lines.append(line.split("#", 1)[0].strip())
    return lines


def test_getting_started_activates_the_environment_before_it_runs_panqueue(
        tmp_path: Path) -> None:
    """A reader who types the page's commands in order has `panqueue` on PATH by the time
    the page runs it (``panqueue server``): the environment is activated first, and the line
    that does it works in a fresh shell."""
    lines = _shell_lines("getting-started.md")
    first = next(i for i, line in enumerate(lines) if line.startswith("panqueue "))
    activations = [line for line in lines[:first] if line.endswith(".venv/bin/activate")]
    assert activations, lines[:first + 1]
    # The line as the page writes it, in a directory whose .venv is this one.
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    env = {k: v for k, v in subprocess_env().items() if k not in ("VIRTUAL_ENV",)}
    env["PATH"] = "/usr/bin:/bin"
    done = subprocess.run(["bash", "-c", f"{activations[0]} && panqueue --version"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("panqueue ")


def test_the_command_group_names_every_command_its_modules_define() -> None:
    """The group imports a command's module only when it runs (panqueue.cli._COMMANDS): a
    command defined in a module but missing from that table would vanish from the CLI."""
    import importlib

    import click

    from panqueue.cli import _COMMANDS, cli

    defined = {}
    for path in sorted((ROOT / "panqueue" / "cli").glob("_[!_]*.py")):
        module = importlib.import_module(f"panqueue.cli.{path.stem}")
        for value in vars(module).values():
            if isinstance(value, click.Command) and value.callback is not None \
                    and value.callback.__module__ == module.__name__:
                defined[value.name] = path.stem
    assert defined == _COMMANDS
    with click.Context(cli) as ctx:
        assert {name: cli.get_command(ctx, name) for name in cli.list_commands(ctx)} == {
            name: getattr(importlib.import_module(f"panqueue.cli.{module}"),
                          name.replace("-", "_")) for name, module in defined.items()}
