"""Callgrind's per-thread output files, written by hand: what a benchmark's reader of
them is tested against without a minutes-long valgrind run."""

from __future__ import annotations

from pathlib import Path


def write_thread_file(out: Path, thread: int, total: int) -> None:
    """The file callgrind writes for ``thread`` of a run told ``--callgrind-out-file=out``
    with ``--separate-threads=yes``, holding ``total`` instructions."""
    path = out.parent / f"{out.name}-{thread:02d}"
    path.write_text(f"# callgrind format\nversion: 1\nthread: {thread}\nevents: Ir\n"
                    f"fn=(1) main\n0 {total}\ntotals: {total}\n")
