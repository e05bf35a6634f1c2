"""Docs that run: every ```python block of README.md and docs/api.md is executed.

The block marked ``<!-- docs-run: background -->`` (docs/api.md's producer) is started
first, as a server process of its own on a free loopback port (``P2PFSM_BIND``); every
other block then runs as a separate program against it (``P2PFSM_PEER``): a two-process
embedding with host memory, asyncio, a host-owned loop, metrics. The client blocks are
started together, once (each mostly waits on importing torch and NIXL), and every test
checks its own block's exit: it passes on 0 and shows the output otherwise. Every process
is waited for with a deadline and stopped by its PID.
"""

from __future__ import annotations

import importlib.util
import os
import re
import select
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/api.md")
BACKGROUND = "<!-- docs-run: background -->"
BLOCK_TIMEOUT = 120.0
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


def test_the_docs_have_runnable_blocks() -> None:
    found = blocks()
    assert sum(b.background for b in found) == 1, "exactly one producer block"
    assert {b.doc for b in found} == set(DOCS)
    assert len(found) >= 7, [b.name for b in found]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def producer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The docs' producer block, serving on a free port; yields its "host:port"."""
    (block,) = [b for b in blocks() if b.background]
    script = tmp_path_factory.mktemp("docs") / "producer.py"
    script.write_text(block.code, encoding="utf-8")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, str(script)], cwd=script.parent, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
        env=_env(P2PFSM_BIND=f"tcp://127.0.0.1:{port}", P2PFSM_SERVE_SECONDS="600"))
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        line = ""
        while "serving on" not in line:
            left = deadline - time.monotonic()
            assert left > 0 and proc.poll() is None, f"{block.name} did not start: {line!r}"
            if select.select([proc.stdout], [], [], left)[0]:
                line = proc.stdout.readline()
        yield line.split("serving on", 1)[1].strip()
    finally:
        proc.kill()
        proc.wait(timeout=10)


@dataclass(frozen=True)
class Ran:
    code: int | None
    out: str


@pytest.fixture(scope="module")
def runs(producer: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Ran]:
    """Every client block, started at once against the producer; its exit and output."""
    started: dict[str, subprocess.Popen[str]] = {}
    try:
        for block in (b for b in blocks() if not b.background):
            where = tmp_path_factory.mktemp("block")
            script = where / "block.py"
            script.write_text(block.code, encoding="utf-8")
            started[block.name] = subprocess.Popen(
                [sys.executable, str(script)], cwd=where, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True, env=_env(P2PFSM_PEER=producer))
        deadline = time.monotonic() + BLOCK_TIMEOUT
        ran: dict[str, Ran] = {}
        for name, proc in started.items():
            try:
                out, _ = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
                ran[name] = Ran(proc.returncode, out)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate(timeout=10)
                ran[name] = Ran(None, f"still running after {BLOCK_TIMEOUT:.0f} s\n{out}")
        return ran
    finally:
        for proc in started.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


@needs_data_plane
@pytest.mark.parametrize("block", [b for b in blocks() if not b.background],
                         ids=lambda b: b.name)
def test_doc_block_runs(block: Block, runs: dict[str, Ran]) -> None:
    ran = runs[block.name]
    assert ran.code == 0, f"{block.name} failed (exit {ran.code}):\n{ran.out}"
