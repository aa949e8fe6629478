"""Typed handlers: a handler of ``Job[Email]`` gives a ``Queue[Email]`` that ``mypy --strict``
checks at ``add()``, and a dataclass payload travels as a dict and reaches the handler rebuilt.

The typing half runs mypy (the one in this interpreter) on two small user modules in
tests/typing_cases: good.py must pass, bad.py must fail on exactly the lines it marks.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import anyio
import pytest

from panqueue import ConfigError, Job, JobState, QueueClient, Registry, Worker
from panqueue.testing import run_worker
from tests.typing_cases import typed_app

CASES = Path(__file__).parent / "typing_cases"
ROOT = Path(__file__).parent.parent
EXAMPLE = ROOT / "examples" / "typed_handlers.py"
# User code that must pass mypy --strict as it is.
GOOD = [CASES / "good.py", CASES / "typed_app.py", EXAMPLE]
_ERROR = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): error: .*\[(?P<code>[a-z-]+)\]$")
_MARK = re.compile(r"# error: (?P<code>[a-z-]+)\s*$")


@pytest.fixture(scope="module")
def mypy_run() -> tuple[int, str]:
    """One mypy --strict run over both cases. Its cache is kept between runs, one per Python
    (a cold run is 40-60 s of CPU, and the suite runs this on three Pythons at once): mypy
    checks every file's hash against it, so it answers for the files as they are now."""
    cache = ROOT / ".mypy_cache" / f"typing-cases-{sys.version_info[0]}.{sys.version_info[1]}"
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "--show-error-codes",
         "--cache-dir", str(cache), "--config-file", str(ROOT / "pyproject.toml"),
         *map(str, GOOD), str(CASES / "bad.py")],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr


def _errors(output: str, name: str) -> set[tuple[int, str]]:
    found = set()
    for line in output.splitlines():
        match = _ERROR.match(line)
        if match and Path(match["file"]).name == name:
            found.add((int(match["line"]), match["code"]))
    return found


def test_mypy_strict_accepts_typed_and_untyped_user_code(mypy_run: tuple[int, str]) -> None:
    _, output = mypy_run
    for path in GOOD:
        assert _errors(output, path.name) == set(), output
        assert path.name not in output, output  # no note or error of any kind either


def test_mypy_strict_reports_each_wrong_payload_at_its_line(mypy_run: tuple[int, str]) -> None:
    returncode, output = mypy_run
    marked = {(number, match["code"])
              for number, text in enumerate((CASES / "bad.py").read_text().splitlines(), 1)
              if (match := _MARK.search(text))}
    assert len(marked) >= 8  # the marks themselves were read
    assert returncode == 1, output
    assert _errors(output, "bad.py") == marked, output


# --------------------------------------------------------------------------- at run time


class Email(TypedDict):
    to: str
    subject: str


@dataclass
class Thumbnail:
    path: str
    width: int = 128


@dataclass
class Size:
    width: int


@dataclass
class Nested:
    size: Size


async def _run_until_finished(registry: Registry, queue: str, url: str,
                              produce: Any) -> list[Any]:
    """Run a worker of ``queue`` while ``produce(client)`` adds jobs and returns their handles;
    return each job's final info."""
    worker = Worker(registry, queue, url=url)
    infos = []
    async with anyio.create_task_group() as tg:
        await tg.start(worker.run)
        async with QueueClient(url) as client:
            for handle in await produce(client):
                try:
                    await handle.result(timeout=10.0)
                except Exception:
                    pass  # the info says how it ended
                infos.append(await handle.info())
        await worker.shutdown(grace=5.0)
    return infos


@pytest.mark.anyio
@pytest.mark.parametrize("executor", ["inline", "thread"])
async def test_dataclass_payload_is_stored_as_a_dict_and_rebuilt_for_the_handler(
        redis_url: str, queue_name: str, executor: str) -> None:
    queues = Registry()
    seen: list[Any] = []

    if executor == "inline":
        @queues.handler(queue_name)
        async def make(job: Job[Thumbnail]) -> int:
            seen.append(job.data)
            return job.data.width * 2
        handler: Any = make
    else:
        @queues.handler(queue_name, executor="thread")
        def make_sync(job: Job[Thumbnail]) -> int:
            seen.append(job.data)
            return job.data.width * 2
        handler = make_sync

    async def produce(client: QueueClient) -> list[Any]:
        thumbs = client.queue(handler)
        one = await thumbs.add(Thumbnail("a.png", width=64))
        stored = await one.info()
        assert stored.data == {"path": "a.png", "width": 64}  # stored as plain data
        [two] = await thumbs.add_bulk([Thumbnail("b.png")])
        return [one, two]

    infos = await _run_until_finished(queues, queue_name, redis_url, produce)
    assert [info.result for info in infos] == [128, 256]
    assert seen == [Thumbnail("a.png", 64), Thumbnail("b.png", 128)]
    assert all(type(value) is Thumbnail for value in seen)


@pytest.mark.anyio
async def test_dataclass_payload_is_rebuilt_in_a_subprocess_handler(redis_url: str) -> None:
    async with QueueClient(redis_url) as client, \
            run_worker(typed_app.queues, "typed-subprocess", redis_url):
        handle = await client.queue(typed_app.measure).add(typed_app.Rect(3, 4))
        result = await handle.result(timeout=20.0)
    assert result["type"] == "Rect" and result["area"] == 12
    assert result["pid"] != os.getpid()  # it ran in the child


@pytest.mark.anyio
async def test_data_that_does_not_fit_the_dataclass_fails_the_job_at_once(
        redis_url: str, queue_name: str) -> None:
    queues = Registry()
    calls: list[Any] = []

    @queues.handler(queue_name, attempts=3)
    async def make(job: Job[Thumbnail]) -> None:
        calls.append(job.data)

    async def produce(client: QueueClient) -> list[Any]:
        untyped = client.queue(queue_name)  # a string queue checks nothing
        return [await untyped.add({"path": "a.png", "colour": "red"}),
                await untyped.add(["a.png"])]

    wrong_key, not_an_object = await _run_until_finished(queues, queue_name, redis_url,
                                                         produce)
    assert calls == []
    for info in (wrong_key, not_an_object):
        assert info.state is JobState.FAILED
        assert info.attempts == 1  # the same data would not fit a second time
        assert info.error is not None and "does not fit Thumbnail" in info.error.message
    assert "colour" in wrong_key.error.message
    assert "got list" in not_an_object.error.message


@pytest.mark.anyio
async def test_typeddict_payload_reaches_the_handler_as_the_dict_it_is(
        redis_url: str, queue_name: str) -> None:
    queues = Registry()

    @queues.handler(queue_name)
    async def send(job: Job[Email]) -> str:
        assert type(job.data) is dict
        return f"{job.data['subject']} -> {job.data['to']}"

    async def produce(client: QueueClient) -> list[Any]:
        return [await client.queue(send).add({"to": "a@example.com", "subject": "hi"})]

    [info] = await _run_until_finished(queues, queue_name, redis_url, produce)
    assert info.result == "hi -> a@example.com"


def test_a_handler_called_directly_gets_the_job_it_is_given() -> None:
    queues = Registry()

    @queues.handler("direct", executor="thread")
    def make(job: Job[Thumbnail]) -> Any:
        return job.data

    job: Job[Any] = Job(id="1", queue="direct", data={"path": "a.png"}, attempt=1,
                        options=queues.get("direct").options.job, sink=None)
    assert make(job) == {"path": "a.png"}  # like the plain function: no conversion
    assert make.payload_type is Thumbnail
    assert make.import_path.endswith(":test_a_handler_called_directly_gets_the_job_it_is_given"
                                     ".<locals>.make")


def test_a_nested_dataclass_payload_is_refused_when_registered() -> None:
    queues = Registry()
    with pytest.raises(ConfigError, match=r"field 'size' of payload Nested is a dataclass "
                                          r"\(Size\)"):
        @queues.handler("nested")
        async def handle(job: Job[Nested]) -> None: ...
    assert "nested" not in queues


def test_unannotated_and_typeddict_handlers_run_the_function_itself() -> None:
    queues = Registry()

    async def plain(job: Job) -> None: ...

    async def typed(job: Job[Email]) -> None: ...

    assert queues.handler("plain")(plain).fn is plain
    assert queues.handler("typed")(typed).fn is typed
    assert queues.get("typed").payload_type is None


def test_typed_handlers_example_prints_the_stored_dict_and_the_rebuilt_results(
        redis_url: str) -> None:
    done = subprocess.run([sys.executable, str(EXAMPLE)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PANQUEUE_URL": redis_url}, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines == [
        "stored data of job 1: {'path': 'photos/cat.png', 'width': 256}",
        "welcome: welcome ada, you are on the team plan",
        "thumbnails: photos/cat.png -> photos/cat-256w.png",
        "thumbnails: photos/dog.jpg -> photos/dog-128w.jpg",
        "done",
    ]
