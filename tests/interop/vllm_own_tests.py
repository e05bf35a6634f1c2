"""vLLM's own P2P session and tier-manager tests, run against vLLM's sessions and p2pfsm's.

vLLM's source tree (a git checkout at the release's tag, or its unpacked sdist, which
ships ``tests/``) is given by ``P2PFSM_VLLM_SRC``; its tests are read from there and
never copied into this repository. Each run is ``.venv-vllm``'s Python running pytest
on ``test_sessions.py`` and ``test_manager.py`` of ``tests/v1/kv_offload/tiering/p2p``,
with pytest borrowed from this interpreter's environment (appended to ``sys.path``, so
every package ``.venv-vllm`` has wins) and, for the drop-in, ``p2pfsm.vllm.install()``
called before any test module is imported. Conftests above that folder are not loaded
(vLLM's top-level one needs packages the P2P tests do not).

``python tests/interop/vllm_own_tests.py [stock|dropin ...]`` prints the counts, those of
the tests that use only vLLM's public session surface (``public``: every test but the ones
that read vLLM's internals) and the failures. ``test_vllm_own_tests.py`` holds the drop-in
to :data:`DIFFERENCES`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = Path(os.environ.get("P2PFSM_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
SRC_ENV = "P2PFSM_VLLM_SRC"
TESTS = "tests/v1/kv_offload/tiering/p2p"
FILES = ("test_sessions.py", "test_manager.py")

_RUN = """
import sys
sys.path.append({pytest_dir!r})
if {dropin!r}:
    import p2pfsm.vllm
    p2pfsm.vllm.install()
import pytest
sys.exit(pytest.main({args!r}))
"""

# Why each vLLM test the drop-in fails does: its docs/explanation/vllm.md reason. "internals": the
# test reads or sets a private attribute of vLLM's session (its client and server
# roles, their tables, its clocks), which the adapter does not have.
PRIVATE = "internals"
ACK_FIRST = "connect_ack before the peer's connect"
FINGERPRINT = "config fingerprint (an empty one included)"
BLOCK_BOUND = "block index outside the peer's advertised blocks"
FAULT = "data-plane fault with writes in flight (no drain deadline)"
SERVING_RESET = "a cache reset while a fetched round is written"
FLUSH_SEND_FAILED = "the handshake's flush fails to send a fetch"

S, M = "test_sessions.py::", "test_manager.py::"
DIFFERENCES: dict[str, str] = {
    S + "TestConnectHandshake::test_connect_ack_makes_session_ready": ACK_FIRST,
    S + "TestConnectHandshake::test_messages_queued_before_ack_flush_on_ack": ACK_FIRST,
    S + "TestConnectHandshake::test_missing_fingerprint_allowed": FINGERPRINT,
    S + "TestServerLookupHandling::test_lookup_then_fetch_round_trip_emits_store_result":
        BLOCK_BOUND,
    S + "TestServerFlows::test_abort_drain_cancel_retry_is_paced": PRIVATE,
    S + "TestHandshakeDeadline::test_marks_dead_after_timeout": PRIVATE,
    S + "TestPeerFaultEscalation::test_fault_disconnects_after_drain_deadline": FAULT,
}
LOADED = "a real-time window of vLLM's test (5 s), which stock vLLM misses too under load"
UNDER_LOAD = frozenset({M + "TestBidirectionalManager::test_lookup_expiry_allows_zmq_reconnect"})
"""Tests that wait on the wall clock: their failure on a loaded machine is the load's (they
fail with vLLM's own sessions too); they are never stale when they pass."""
DISCONNECT = S + "TestDisconnect::"
BY_RELEASE: dict[str, dict[str, str]] = {
    "0.33.0": {},
    "0.34.0": {
        **{S + f"test_drain_stores_keeps_inflight_pins_until_transport_finishes[{w}]":
           SERVING_RESET for w in ("False", "True")},
        DISCONNECT + "test_dead_connection_does_not_flush_unsent_fetch[False]":
            FLUSH_SEND_FAILED,
    },
}
"""Differences of one release only, by the release's version (added to DIFFERENCES)."""


def release_under_test() -> str:
    """The version of the vLLM that ``VLLM_PYTHON`` imports (its package metadata)."""
    done = subprocess.run([str(VLLM_PYTHON), "-c", "from importlib import metadata; "
                           "print(metadata.version('vllm'))"],
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip().split("+", 1)[0]


def differences(version: str) -> dict[str, str]:
    """Every documented difference of ``version``: the common ones and its own."""
    if version not in BY_RELEASE:
        raise KeyError(f"no DIFFERENCES for vLLM {version}: add a BY_RELEASE entry")
    return {**DIFFERENCES, **BY_RELEASE[version]}


PRIVATE_NAMES = ("_client", "_server", "ServerRoleView", "submitted_at")
"""A failure whose error names one of these reads vLLM's session internals (its roles,
the adapter's stand-in for its server role, a transfer record's clock)."""


def run(src: Path, dropin: bool, files: tuple[str, ...] = FILES) -> dict[str, str]:
    """Every test of ``files`` by name (``file::Class::test``): ``"passed"``,
    ``"skipped"``, or the failure's message."""
    with tempfile.TemporaryDirectory(prefix="p2pfsm-vllm-own-") as tmp:
        report = Path(tmp) / "report.xml"
        args = ["-q", "-p", "no:cacheprovider", f"--confcutdir={TESTS}", "--tb=line",
                f"--junitxml={report}", *[f"{TESTS}/{f}" for f in files]]
        code = _RUN.format(pytest_dir=str(Path(pytest.__file__).parents[1]), dropin=dropin,
                           args=args)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
        done = subprocess.run([str(VLLM_PYTHON), "-c", code], cwd=src, env=env,
                              capture_output=True, text=True, timeout=900)
        if not report.is_file():
            raise RuntimeError(f"pytest wrote no report: {done.stdout[-3000:]}"
                               f"{done.stderr[-3000:]}")
        return outcomes(report)


def outcomes(report: Path) -> dict[str, str]:
    """The JUnit report's test cases by ``file::Class::test``."""
    seen: dict[str, str] = {}
    for case in ET.parse(report).iter("testcase"):
        parts = case.get("classname", "").split(".")
        at = next(i for i, p in enumerate(parts) if p.startswith("test_"))
        name = "::".join([parts[at] + ".py", *parts[at + 1:], case.get("name", "")])
        status = "passed"
        for tag in ("failure", "error"):
            bad = case.find(tag)
            if bad is not None:
                status = (bad.get("message") or tag).splitlines()[0][:300]
        if case.find("skipped") is not None:
            status = "skipped"
        seen[name] = status
    return seen


def why(name: str, status: str, known: dict[str, str] = DIFFERENCES) -> str | None:
    """The documented reason the drop-in fails ``name`` (``known``: the release's
    differences), or None (a regression)."""
    if name in known:
        return known[name]
    if name in UNDER_LOAD:
        return LOADED
    if any(p in status for p in PRIVATE_NAMES):
        return PRIVATE
    return None


def counts(seen: dict[str, str]) -> dict[str, list[int]]:
    """Per file: [passed, total]."""
    out: dict[str, list[int]] = {}
    for name, status in seen.items():
        tally = out.setdefault(name.partition("::")[0], [0, 0])
        tally[0] += status == "passed"
        tally[1] += 1
    return out


def public_counts(seen: dict[str, str], known: dict[str, str] = DIFFERENCES
                  ) -> dict[str, list[int]]:
    """Per file: [passed, total] of the tests that use only vLLM's public session
    surface (every test but those that fail reading its internals, :data:`PRIVATE`);
    the public ones that fail are documented differences or regressions."""
    public = {n: s for n, s in seen.items()
              if s in ("passed", "skipped") or why(n, s, known) != PRIVATE}
    return counts(public)


def main() -> None:
    src = Path(os.environ[SRC_ENV])
    known = differences(release_under_test())
    for kind in sys.argv[1:] or ["stock", "dropin"]:
        seen = run(src, kind == "dropin")
        failed = {n: s for n, s in seen.items() if s not in ("passed", "skipped")}
        print(json.dumps({"kind": kind, "counts": counts(seen),
                          "public": public_counts(seen, known),
                          "failed": {n: why(n, s, known) or s for n, s in sorted(failed.items())}},
                         indent=1))


if __name__ == "__main__":
    main()
