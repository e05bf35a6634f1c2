"""No source file of p2pfsm over ``LIMIT`` lines, and none of the runtime an engine
imports (:mod:`p2pfsm.layers`) over ``RUNTIME_LIMIT``: modules of one job, each file
named for it.

``BEING_SPLIT`` lists the files another change is splitting now; an entry whose file
is back under the limit (or gone) fails too, so the list only ever shrinks.
"""

from __future__ import annotations

from pathlib import Path

import p2pfsm
from p2pfsm.layers import side_of

ROOT = Path(p2pfsm.__file__).parent
LIMIT = 600
RUNTIME_LIMIT = 500

BEING_SPLIT: frozenset[str] = frozenset()


def line_counts(root: Path = ROOT) -> dict[str, int]:
    """``p2pfsm/...py`` -> its number of lines, for every Python file under ``root``."""
    return {path.relative_to(root.parent).as_posix(): len(path.read_text().splitlines())
            for path in sorted(root.rglob("*.py"))}


def limit_of(name: str) -> int:
    """``RUNTIME_LIMIT`` for a file of the runtime, ``LIMIT`` for any other."""
    module = name.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    return RUNTIME_LIMIT if side_of(module) == "runtime" else LIMIT


def over_limit(counts: dict[str, int], allowed: frozenset[str] = BEING_SPLIT) -> dict[str, int]:
    """The files over their limit that are not allowed to be."""
    return {name: n for name, n in counts.items()
            if n > limit_of(name) and name not in allowed}


def test_the_check_finds_a_long_file() -> None:
    counts = {"p2pfsm/tools/cli.py": LIMIT + 1, "p2pfsm/tools/verify/tlc.py": LIMIT,
              "p2pfsm/tools/diagrams.py": 900}
    assert over_limit(counts, frozenset({"p2pfsm/tools/diagrams.py"})) == {
        "p2pfsm/tools/cli.py": LIMIT + 1}
    assert over_limit(counts, frozenset()) == {"p2pfsm/tools/cli.py": LIMIT + 1,
                                                "p2pfsm/tools/diagrams.py": 900}


def test_the_runtime_is_held_to_the_smaller_limit() -> None:
    counts = {"p2pfsm/session/core.py": RUNTIME_LIMIT + 1,
              "p2pfsm/executor/node/__init__.py": RUNTIME_LIMIT + 1,
              "p2pfsm/executor/zmq/plane.py": RUNTIME_LIMIT,
              "p2pfsm/tools/verify/replay.py": RUNTIME_LIMIT + 1}
    assert over_limit(counts, frozenset()) == {"p2pfsm/session/core.py": RUNTIME_LIMIT + 1,
                                               "p2pfsm/executor/node/__init__.py":
                                                   RUNTIME_LIMIT + 1}


def test_no_module_is_over_the_limit() -> None:
    counts = line_counts()
    assert "p2pfsm/executor/zmq/plane.py" in counts  # it reads the package
    assert over_limit(counts) == {}


def test_the_allow_list_names_only_files_still_over_the_limit() -> None:
    counts = line_counts()
    stale = sorted(name for name in BEING_SPLIT if counts.get(name, 0) <= LIMIT)
    assert stale == [], f"split already: take {stale} off BEING_SPLIT"
