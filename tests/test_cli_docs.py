"""docs/cli.md is generated from the command line's own help (scripts/gen_cli_docs.py): this
test fails when someone changes a command's help without regenerating the page, or edits the
page by hand."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import ROOT, subprocess_env


def test_docs_cli_md_is_what_the_generator_writes_from_the_help() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_cli_docs.py"), "--check"],
                          capture_output=True, text=True, timeout=60, env=subprocess_env(),
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
