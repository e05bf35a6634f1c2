"""The callgrind figure's arithmetic: per-thread totals, the N / 2N difference, the ratio.

The real two-process run under valgrind takes minutes: it is marked ``slow``
(``python -m pytest -q -m slow tests/unit/test_bench_instructions.py``).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from p2pfsm.tools.bench import instructions
from p2pfsm.tools.bench.instructions import Count, format_counts
from tests.helpers.callgrind_files import write_thread_file


def test_totals_split_the_driving_thread_from_the_others(tmp_path: Path) -> None:
    out = tmp_path / "cg.out"
    write_thread_file(out, 1, 1_000)
    write_thread_file(out, 2, 70)
    write_thread_file(out, 3, 30)
    assert instructions._totals(out) == (1_000, 100)


def test_totals_without_counts_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="no callgrind counts"):
        instructions._totals(tmp_path / "cg.out")


def test_measure_is_the_difference_of_n_and_2n_over_n(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    runs: list[tuple[str, int]] = []

    def one(side: str, count: int, warmup: int, block_len: int,
            work: Path) -> tuple[int, int]:
        runs.append((side, count))
        start = {"producer": 5_000, "raw producer": 900}[side]
        per = {"producer": 300, "raw producer": 100}[side]
        return start + per * count, 40 + 7 * count

    monkeypatch.setattr(instructions, "_one", one)
    monkeypatch.setattr(shutil, "which", lambda _name: "/usr/bin/valgrind")
    got = instructions.measure(fetches=10, sides=("producer", "raw producer"))
    assert runs == [("producer", 10), ("producer", 20), ("raw producer", 10),
                    ("raw producer", 20)]
    assert got == [Count("producer", 300.0, 7.0), Count("raw producer", 100.0, 7.0)]
    table = format_counts(got)
    assert "3.00x" in table.splitlines()[1]
    assert table.splitlines()[2].rstrip().endswith("7")  # no ratio for the raw row itself


def test_without_valgrind_measure_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    with pytest.raises(RuntimeError, match="apt-get install valgrind"):
        instructions.measure(fetches=1)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind")
def test_real_run_counts_instructions_on_both_sides() -> None:
    pytest.importorskip("nixl")
    got = instructions.measure(fetches=5, warmup=2, sides=("producer", "raw producer"))
    by = {c.side: c for c in got}
    # Serving a fetch through the machines costs more than the raw job beneath it.
    assert by["producer"].main > by["raw producer"].main > 0
