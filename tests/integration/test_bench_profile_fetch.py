"""The in-process instruction count of ``profile_fetch``: its measured process and the
arithmetic over callgrind's per-thread files.

The callgrind runs themselves take minutes; here the measured process runs natively
(real ZeroMQ and NIXL on loopback) and the totals are read from written files.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from p2pfsm.tools.bench import profile_fetch
from tests.helpers.callgrind_files import write_thread_file
from tests.helpers.requires import needs_nixl_and_torch


def test_thread_totals_by_callgrind_thread_number(tmp_path: Path) -> None:
    out = tmp_path / "cg.out"
    for thread, total in ((1, 1_000), (2, 700), (3, 30), (4, 5)):
        write_thread_file(out, thread, total)
    assert profile_fetch._thread_totals(out) == {1: 1_000, 2: 700, 3: 30, 4: 5}


def test_thread_totals_need_both_nodes_threads(tmp_path: Path) -> None:
    out = tmp_path / "cg.out"
    write_thread_file(out, 1, 1_000)
    with pytest.raises(RuntimeError, match="both nodes"):
        profile_fetch._thread_totals(out)


def test_without_valgrind_the_count_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    with pytest.raises(RuntimeError, match="apt-get install valgrind"):
        profile_fetch.count_instructions(1, 0, 1, 4096)


@pytest.mark.slow  # two nodes, their NIXL agents and six fetches: seconds
def test_count_worker_fetches_and_verifies_by_hand_off(capsys: pytest.CaptureFixture[str]) -> None:
    needs_nixl_and_torch()
    profile_fetch.count_worker(fetches=3, warmup=3, blocks=2, block_len=4096)
    line = capsys.readouterr().out.strip()
    assert line.startswith("steps per fetch: producer "), line
    producer = float(line.split("producer ")[1].split(",")[0])
    consumer = float(line.split("consumer ")[1])
    assert producer >= 1 and consumer >= 2  # a step to serve; one to send, one to finish
