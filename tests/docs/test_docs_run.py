"""Docs that run: every ```python block of README.md, the tutorial and the how-to pages
that embed a node is executed.

A block marked ``<!-- docs-run: background -->`` is a producer: it is started first, as a
server process of its own on a free loopback port (``P2PFSM_BIND``), and every other block
of its page runs as a separate program against it (``P2PFSM_PEER``); the blocks of a page
without a producer run against docs/howto/engine.md's (the demo block model). The client
blocks are started together, once (each mostly waits on importing torch and NIXL), and
every test checks its own block's exit: it passes on 0 and shows the output otherwise.
Every process is waited for with a deadline and stopped by its PID.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/tutorial.md", "docs/howto/engine.md", "docs/howto/engine-example.md",
        "docs/howto/concurrency.md", "docs/howto/observe.md")
DEFAULT_PRODUCER = "docs/howto/engine.md"
NOT_RUN = {
    "docs/howto/vllm.md": "p2pfsm.vllm.install() needs vLLM 0.33.0 or 0.34.0: tests/interop "
                          "runs it",
    "docs/explanation/vllm-guard.md": "the full install needs vLLM: tests/interop runs it",
}
"""Pages whose Python blocks this test does not run, and why."""
BACKGROUND = "<!-- docs-run: background -->"
BLOCK_TIMEOUT = 300.0
_FENCE = re.compile(r"(?P<marker><!-- docs-run: background -->\n)?```python\n(?P<code>.*?)```",
                    re.DOTALL)

needs_data_plane = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None
    or (importlib.util.find_spec("nixl") is None and importlib.util.find_spec("nixl_cu12") is None),
    reason="the examples move blocks: torch and NIXL are needed (.ci/install.sh)")


@dataclass(frozen=True)
class Block:
    doc: str
    line: int
    code: str
    background: bool

    @property
    def name(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks() -> list[Block]:
    found: list[Block] = []
    for doc in DOCS:
        text = (ROOT / doc).read_text(encoding="utf-8")
        for m in _FENCE.finditer(text):
            line = text.count("\n", 0, m.start("code")) + 1
            found.append(Block(doc, line, m.group("code"), m.group("marker") is not None))
    return found


def producer_of(doc: str) -> str:
    """The page whose producer block serves ``doc``'s client blocks."""
    return doc if any(b.background for b in blocks() if b.doc == doc) else DEFAULT_PRODUCER


def test_the_docs_have_runnable_blocks() -> None:
    found = blocks()
    for doc in DOCS:
        assert sum(b.background for b in found if b.doc == doc) <= 1, f"{doc}: one producer"
    assert any(b.background for b in found if b.doc == DEFAULT_PRODUCER)
    assert any(b.background for b in found if b.doc == "docs/tutorial.md")
    assert {b.doc for b in found} == set(DOCS)
    assert len(found) >= 9, [b.name for b in found]


def test_every_python_block_under_docs_is_run_or_says_why_not() -> None:
    with_python = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md")
                   if "_build" not in p.parts and "```python" in p.read_text(encoding="utf-8")}
    assert with_python <= set(DOCS) | set(NOT_RUN), sorted(with_python - set(DOCS))


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def _start_producer(block: Block, where: Path) -> tuple[subprocess.Popen[str], str]:
    """Start ``block`` as a server process; it and its "host:port" once it serves."""
    script = where / "producer.py"
    script.write_text(block.code, encoding="utf-8")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(script)], cwd=where, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
        env=_env(P2PFSM_BIND=f"tcp://127.0.0.1:{port}", P2PFSM_SERVE_SECONDS="600"))
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    line = ""
    while "serving on" not in line:
        left = deadline - time.monotonic()
        if left <= 0 or proc.poll() is not None:
            proc.kill()
            proc.wait(timeout=10)
            raise AssertionError(f"{block.name} did not start: {line!r}")
        if select.select([proc.stdout], [], [], left)[0]:
            line = proc.stdout.readline()
    return proc, line.split("serving on", 1)[1].strip()


@pytest.fixture(scope="module")
def producers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Every page's producer block, serving on a free port: "host:port" by page."""
    started: list[subprocess.Popen[str]] = []
    served: dict[str, str] = {}
    try:
        for block in (b for b in blocks() if b.background):
            proc, address = _start_producer(block, tmp_path_factory.mktemp("docs"))
            started.append(proc)
            served[block.doc] = address
        yield served
    finally:
        for proc in started:
            proc.kill()
            proc.wait(timeout=10)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """Kill a block's process group (its process group id is its PID): a block that
    starts processes of its own (multiprocessing) leaves none behind holding its pipe."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


@dataclass(frozen=True)
class Ran:
    code: int | None
    out: str


@pytest.fixture(scope="module")
def runs(producers: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Ran]:
    """Every client block, started at once against the producer; its exit and output."""
    started: dict[str, subprocess.Popen[str]] = {}
    try:
        for block in (b for b in blocks() if not b.background):
            where = tmp_path_factory.mktemp("block")
            script = where / "block.py"
            script.write_text(block.code, encoding="utf-8")
            started[block.name] = subprocess.Popen(
                [sys.executable, str(script)], cwd=where, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True, start_new_session=True,
                env=_env(P2PFSM_PEER=producers[producer_of(block.doc)]))
        deadline = time.monotonic() + BLOCK_TIMEOUT
        ran: dict[str, Ran] = {}
        for name, proc in started.items():
            try:
                out, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
                ran[name] = Ran(proc.returncode, out)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                out, _ = proc.communicate(timeout=10)
                ran[name] = Ran(None, f"still running after {BLOCK_TIMEOUT:.0f} s\n{out}")
        return ran
    finally:
        for proc in started.values():
            _kill_group(proc)
            proc.wait(timeout=10)


@needs_data_plane
@pytest.mark.parametrize("block", [b for b in blocks() if not b.background],
                         ids=lambda b: b.name)
def test_doc_block_runs(block: Block, runs: dict[str, Ran]) -> None:
    ran = runs[block.name]
    assert ran.code == 0, f"{block.name} failed (exit {ran.code}):\n{ran.out}"
