"""The distribution: ``python -m build`` makes an sdist and, from that sdist, a wheel; both pass
``twine check``, carry what panqueue needs at run time, and install into a fresh virtualenv
(no system site-packages, nothing from this checkout) where one job runs end to end.

The build runs once for the module (``--no-isolation``: hatchling comes from the dev extra,
so the build itself needs no download). The fresh virtualenv gets what the wheel's metadata
requires and nothing else, as a user's would, but from a wheelhouse kept in pytest's cache:
the package index is asked once for each set of requirements (the wheel's, and the build
backend an sdist install needs), later runs install offline (``--no-index``). The virtualenv
has no pip of its own: this interpreter's pip installs into it (``pip --python``).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tarfile
import venv
import zipfile
from pathlib import Path

import pytest

import panqueue

ROOT = Path(__file__).parent.parent
PACKAGE = ROOT / "panqueue"

SMOKE_APP = """\
from panqueue import Job, Registry

queues = Registry()


@queues.handler("smoke")
async def double(job: Job) -> int:
    return int(job.data["n"]) * 2
"""

SMOKE = """\
import subprocess
import sys
from pathlib import Path

import panqueue
from panqueue import SyncQueueClient

url, panqueue_command = sys.argv[1], sys.argv[2]
print("version", panqueue.__version__)
print("location", panqueue.__file__)
with SyncQueueClient(url) as client:
    handle = client.queue("smoke").add({"n": 21})
    subprocess.run([panqueue_command, "worker", "smoke_app:queues", "--burst", "--url", url],
                   check=True, timeout=60)
    print("state", handle.info().state.value)
    print("result", handle.result(timeout=10.0))
"""


def _run(*args: str | Path, cwd: Path = ROOT, timeout: float = 300) -> str:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PANQUEUE_URL", "VIRTUAL_ENV")}
    done = subprocess.run([str(a) for a in args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env=env)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _package_files() -> set[str]:
    """Every file under panqueue/ that belongs in the wheel (not bytecode caches)."""
    return {path.relative_to(ROOT).as_posix() for path in PACKAGE.rglob("*")
            if path.is_file() and "__pycache__" not in path.parts
            and path.suffix not in (".pyc", ".pyo")}


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    # Without --sdist/--wheel, build makes the sdist and then the wheel *from the sdist*: a
    # wheel here proves the sdist holds what a rebuild needs.
    _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", out, ROOT)
    [wheel] = out.glob("panqueue-*.whl")
    [sdist] = out.glob("panqueue-*.tar.gz")
    return {"wheel": wheel, "sdist": sdist}


def _requirements(wheel: Path) -> list[str]:
    """What installing ``wheel`` needs from an index: its Requires-Dist (without extras) and
    the build backend of its sdist."""
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(f"panqueue-{panqueue.__version__}.dist-info/METADATA").decode()
    needed = sorted(line.split(":", 1)[1].strip() for line in metadata.splitlines()
                    if line.startswith("Requires-Dist:") and "extra ==" not in line)
    return [*needed, "hatchling>=1.21"]


@pytest.fixture(scope="module")
def wheelhouse(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
               dist: dict[str, Path]) -> Path:
    """Wheels of everything the wheel requires, for this Python; from the package index only
    when pytest's cache has none for these requirements yet."""
    needed = _requirements(dist["wheel"])
    key = hashlib.sha256("\n".join([sys.version, *needed]).encode()).hexdigest()[:16]
    cache = getattr(request.config, "cache", None)
    house = (cache.mkdir(f"panqueue-wheelhouse-{key}") if cache is not None
             else tmp_path_factory.mktemp("wheelhouse"))
    if not (house / "complete").exists():
        _run(sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
             "--wheel-dir", house, *needed)
        (house / "complete").write_text("\n".join(needed))
    return house


def _pip_install(home: Path, wheelhouse: Path, *args: str | Path, cwd: Path) -> None:
    """Install into the virtualenv at ``home`` with this interpreter's pip, offline, from the
    wheelhouse only."""
    _run(sys.executable, "-m", "pip", "--python", home / "bin" / "python", "install", "--quiet",
         "--disable-pip-version-check", "--no-index", "--find-links", wheelhouse, *args,
         cwd=cwd)


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory, dist: dict[str, Path],
               wheelhouse: Path) -> Path:
    """A new virtualenv (no system site-packages) with the wheel and what it requires."""
    home = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=False, system_site_packages=False).create(home)
    _pip_install(home, wheelhouse, dist["wheel"], cwd=home)
    return home


def test_build_names_both_artifacts_after_the_one_version(dist: dict[str, Path]) -> None:
    version = panqueue.__version__
    assert dist["wheel"].name == f"panqueue-{version}-py3-none-any.whl"
    assert dist["sdist"].name == f"panqueue-{version}.tar.gz"


def test_wheel_carries_every_lua_script_py_typed_and_package_data(
        dist: dict[str, Path]) -> None:
    with zipfile.ZipFile(dist["wheel"]) as wheel:
        names = set(wheel.namelist())
        metadata = wheel.read(f"panqueue-{panqueue.__version__}.dist-info/METADATA").decode()
    lua = {name for name in _package_files() if name.endswith(".lua")}
    assert len(lua) >= 20 and any("/lib/" in name for name in lua)  # the includes too
    assert "panqueue/py.typed" in names
    missing = _package_files() - names
    assert not missing, f"in panqueue/ but not in the wheel: {sorted(missing)}"
    assert not [name for name in names if not name.startswith(("panqueue/", "panqueue-"))]
    assert f"panqueue-{panqueue.__version__}.dist-info/licenses/LICENSE" in names
    for line in ("Requires-Python: >=3.11", "License-Expression: MIT",
                 "Classifier: Programming Language :: Python :: 3.11",
                 "Classifier: Programming Language :: Python :: 3.12",
                 "Classifier: Programming Language :: Python :: 3.13",
                 "Classifier: Typing :: Typed"):
        assert line in metadata.splitlines(), line


def test_sdist_carries_what_a_rebuild_needs(dist: dict[str, Path]) -> None:
    prefix = f"panqueue-{panqueue.__version__}/"
    with tarfile.open(dist["sdist"]) as sdist:
        names = {name.removeprefix(prefix) for name in sdist.getnames()}
    for needed in ("pyproject.toml", "README.md", "LICENSE", "CHANGELOG.md", "PKG-INFO",
                   "panqueue/py.typed", "tests/conftest.py", "docs/typing.md",
                   "examples/typed_handlers.py"):
        assert needed in names, needed
    assert _package_files() <= names
    # Nothing from outside the project's own directories (virtualenvs, caches, build output).
    strays = [name for name in names if "/" in name and name.split("/")[0] not in
              ("panqueue", "tests", "docs", "examples", "scripts")]
    assert not strays, strays[:10]
    assert not [name for name in names if "__pycache__" in name or ".venv" in name]


def test_twine_check_passes_on_both_artifacts(dist: dict[str, Path]) -> None:
    output = _run(sys.executable, "-m", "twine", "check", "--strict", dist["wheel"],
                  dist["sdist"])
    assert output.count("PASSED") == 2, output


def test_wheel_in_a_fresh_venv_runs_a_job_end_to_end(
        fresh_venv: Path, redis_url: str, tmp_path: Path) -> None:
    (tmp_path / "smoke_app.py").write_text(SMOKE_APP)
    (tmp_path / "smoke.py").write_text(SMOKE)
    output = _run(fresh_venv / "bin" / "python", tmp_path / "smoke.py", redis_url,
                  fresh_venv / "bin" / "panqueue", cwd=tmp_path, timeout=120)
    lines = dict(line.split(" ", 1) for line in output.splitlines())
    assert lines["version"] == panqueue.__version__
    assert lines["location"].startswith(str(fresh_venv))  # the installed copy, not this tree
    assert lines["state"] == "completed"
    assert lines["result"] == "42"
    version = _run(fresh_venv / "bin" / "panqueue", "--version", cwd=tmp_path)
    assert version.strip() == f"panqueue {panqueue.__version__}"


def test_sdist_installs_into_the_fresh_venv_and_imports(
        fresh_venv: Path, dist: dict[str, Path], wheelhouse: Path, tmp_path: Path) -> None:
    python = fresh_venv / "bin" / "python"
    # Built in pip's isolated build environment, whose hatchling comes from the wheelhouse.
    _pip_install(fresh_venv, wheelhouse, "--force-reinstall", "--no-deps", dist["sdist"],
                 cwd=tmp_path)
    output = _run(python, "-c",
                  "import pathlib, panqueue, panqueue._store.loader as loader; "
                  "print(panqueue.__version__, panqueue.__file__, "
                  "len(list(pathlib.Path(loader.__file__).parent.glob('lua/*.lua'))))",
                  cwd=tmp_path)
    version, location, scripts = output.split()
    assert version == panqueue.__version__
    assert location.startswith(str(fresh_venv))
    assert int(scripts) >= 15
