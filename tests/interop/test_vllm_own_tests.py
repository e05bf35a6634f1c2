"""vLLM's own P2P session and tier-manager tests against the drop-in (``vllm_own_tests.py``).

Needs vLLM's source tree of the installed release in ``P2PFSM_VLLM_SRC`` (docs/explanation/vllm.md,
"vLLM's own tests"); skipped without it. Every test the drop-in fails must be one of the
documented differences of that release (or read vLLM's session internals), and every
documented difference of the release must still fail: a row that passes is stale.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from vllm_own_tests import (  # type: ignore[import-not-found]
    SRC_ENV,
    TESTS,
    VLLM_PYTHON,
    counts,
    differences,
    release_under_test,
    run,
    why,
)

SRC = Path(os.environ.get(SRC_ENV, "/nonexistent"))

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(not VLLM_PYTHON.is_file(), reason="no .venv-vllm"),
    pytest.mark.skipif(not (SRC / TESTS).is_dir(), reason=f"{SRC_ENV} names no vLLM tree"),
]


def test_dropin_fails_only_the_documented_differences() -> None:
    known = differences(release_under_test())
    seen = run(SRC, dropin=True)
    failed = {n: s for n, s in seen.items() if s not in ("passed", "skipped")}
    unexplained = {n: s for n, s in failed.items() if why(n, s, known) is None}
    assert not unexplained, unexplained
    stale = sorted(set(known) - set(failed))
    assert not stale, f"these now pass: drop their DIFFERENCES rows and docs: {stale}"
    tally = counts(seen)
    assert tally["test_sessions.py"][1] > 0 and tally["test_manager.py"][1] > 0
