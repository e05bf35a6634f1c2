
"""Hostile peers against a vLLM 0.33.0 node: stock, on p2pfsm's sessions, and ``p2pfsm serve``.

The target is one process per scenario: ``python -m p2pfsm.tools.vllm_peer server`` from
``.venv-vllm`` (vLLM's real ``ZmqTransport`` and ``NixlTransport``, sessions built as its
tier manager builds them; ``--adapter`` runs :func:`p2pfsm.vllm.install`, ``--full``
``install(transport="p2pfsm")``: p2pfsm's control and data planes behind them), or
``p2pfsm serve``. The attacker is raw pyzmq in this process (``tests/hostile/wire.py``)
and, where a connect needs one, a real NIXL agent. After the attack the target must be
alive, must answer a new peer's connect (sent from ``127.0.0.3``, a host no scenario
attacks from), and its descriptors (``/proc/PID/fd``) and resident memory (``VmRSS``)
must be within a bound of what it had before the attack.

``python tests/interop/test_vllm_hostile.py`` (with ``P2PFSM_INTEROP=1``) runs every
scenario against every target and prints the table docs/explanation/vllm.md gives.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest
import zmq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: helpers, hostile
from helpers.polling import poll_until
from helpers.serve_process import ServeProcess
from hostile.wire import RawPeer, connect_msg, demo_key, fetch_msg, free_port, pack
from test_vllm_interop import (  # type: ignore[import-not-found]
    FP,
    START_TIMEOUT,
    PeerProcess,
    _opt_in,  # noqa: F401  (the suite's opt-in, autouse here too)
    vllm_argv,
)
from test_vllm_interop import pytestmark as _marks  # type: ignore[import-not-found]

from p2pfsm.tools.bench import procstat

pytestmark = _marks

KINDS = ("vllm", "sessions", "full", "serve")
"""Stock vLLM, vLLM with ``p2pfsm.vllm.install()``, with ``install(transport="p2pfsm")``
(the full install), and p2pfsm's own node."""
FD_BOUND = 64
"""Descriptors above the pre-attack count still counted as "back": the probe's own
dial-back, which waits out its handshake deadline, and what NIXL keeps per agent."""
FLOOD_FD_BOUND = 256
"""The same after the flood, for a node on vLLM's data plane (``vllm``, ``sessions``).
Every flood connect carries the same real NIXL agent, and vLLM's ``NixlTransport``
loads it for each registration the flood's sessions began and unloads it when they are
evicted; each load leaves UCX sockets behind (docs/explanation/vllm.md: +95 a minute later in a
``sessions`` run). A dial-back kept per identity would be over 1600 (two sockets each),
and vLLM's ZeroMQ context dies at 1023 sockets. The full install (p2pfsm's data plane
keeps one loaded agent for them all) and ``p2pfsm serve`` get ``FD_BOUND``."""
VLLM_DATA_PLANE = ("vllm", "sessions")
RSS_BOUND = 96 << 20
"""Resident bytes above the pre-attack RSS still counted as "back" (as tests/hostile)."""
ANSWER_S = 20.0
WINDOW_S = 3.0
"""How long the attacker watches for a dial-back that must not come (an observation
window, never a synchronisation)."""
FLOOD = 800
"""Never-handshaking identities: more dial-backs than vLLM's ZeroMQ context has sockets
for (1023, two per dial-back) within its handshake deadline (30 s)."""
SETTLE_S = 45.0
"""After the attacker closed everything, the target's descriptors must be back within
``FD_BOUND`` of the pre-attack count within this (vLLM's handshake deadline, 30 s, ends
a dial-back that never came up; some slack). After the flood stock vLLM is watched for
all of it: alive at its end, descriptors counted then."""
TARGET_NOFILE_ENV = "P2PFSM_HOSTILE_TARGET_NOFILE"
"""When set (e.g. 1024, a usual default), each target's soft descriptor limit is lowered
to it once the target is up: the flood then meets a limit as such a host would
(docs/explanation/reliability.md, the full install killed by the flood)."""
HUGE_BLOCKS = 2_000_000
"""A connect's num_blocks above the guard's default bound (2**20)."""
GARBAGE = 10 << 20


@dataclass
class Outcome:
    """What one scenario did to one target."""

    alive: bool = True
    answers: bool = True
    dialled_back: bool | None = None
    peak_fds_delta: int = 0
    fds_delta: int = 0
    rss_delta_mib: float = 0.0
    fd_bound: int = FD_BOUND

    @property
    def survived(self) -> bool:
        return (self.alive and self.answers and not self.dialled_back
                and self.fds_delta <= self.fd_bound and self.rss_delta_mib * (1 << 20) <= RSS_BOUND)

    def cell(self) -> str:
        if not self.alive:
            return "crash"
        if self.survived:
            return "ok"
        bad = []
        if not self.answers:
            bad.append("deaf")
        if self.dialled_back:
            bad.append("dial-back")
        if self.fds_delta > self.fd_bound:
            bad.append(f"+{self.fds_delta} fds")
        if self.rss_delta_mib * (1 << 20) > RSS_BOUND:
            bad.append(f"+{self.rss_delta_mib:.0f} MiB")
        return ", ".join(bad)


class Target:
    """One target process: its address, pid, and the fingerprint its connect carries."""

    def __init__(self, kind: str, log_dir: Path) -> None:
        self.kind = kind
        self.serve: ServeProcess | None = None
        self.peer: PeerProcess | None = None
        if kind == "serve":
            self.serve = ServeProcess(log_dir / f"serve-{uuid.uuid4().hex[:8]}.log", 16, 4096,
                                      ("--connect-timeout", "2"), START_TIMEOUT)
            self.addr, self.pid, self.fingerprint = self.serve.addr, self.serve.pid, ""
        else:
            extra = {"vllm": [], "sessions": ["--adapter"], "full": ["--full"]}[kind]
            self.peer = PeerProcess(vllm_argv("server", "--blocks", "16", "--max-seconds",
                                              "300", *extra), f"target-{kind}")
            ready = self.peer.record("ready", START_TIMEOUT)
            self.addr, self.pid, self.fingerprint = ready["peer_id"], self.peer.proc.pid, FP
        limit = os.environ.get(TARGET_NOFILE_ENV, "").strip()
        if limit:
            _soft, hard = resource.prlimit(self.pid, resource.RLIMIT_NOFILE)
            resource.prlimit(self.pid, resource.RLIMIT_NOFILE, (int(limit), hard))

    def alive(self) -> bool:
        proc = self.serve.proc if self.serve is not None else self.peer.proc  # type: ignore[union-attr]
        return proc.poll() is None

    def fds(self) -> int:
        return procstat.fds(self.pid)

    def rss(self) -> int:
        return procstat.rss(self.pid)

    def tail(self) -> str:
        if self.peer is not None:
            return self.peer.tail()
        assert self.serve is not None
        return self.serve.log_path.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.serve is not None:
            self.serve.stop()
        if self.peer is not None:
            self.peer.cleanup()


class Attack:
    """The attacker's side of one scenario: a context, and everything to close."""

    def __init__(self, target: Target) -> None:
        self.target = target
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.ctx.set(zmq.MAX_SOCKETS, 4096)
        self.closers: list[Callable[[], None]] = []

    def peer(self, **kwargs: Any) -> RawPeer:
        p = RawPeer(self.ctx, self.target.addr, **kwargs)
        self.closers.append(p.close)
        return p

    def agent(self) -> Any:
        """A real NIXL agent: metadata and a base address a connect can carry."""
        from p2pfsm.executor.nixl.plane import DataPlane

        plane = DataPlane(f"hostile-{uuid.uuid4().hex[:12]}", 16, 4096)
        self.closers.append(plane.close)
        return plane

    def connect(self, peer_id: str, agent: Any, **override: Any) -> dict[str, Any]:
        return connect_msg(peer_id, agent.metadata, agent.base_addr,
                           config_fingerprint=self.target.fingerprint, **override)

    def answers(self, agent: Any) -> bool:
        """A new peer on 127.0.0.3 sends a connect: does the target send its own?"""
        router = self.ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        port = router.bind_to_random_port("tcp://127.0.0.3")
        ident = f"127.0.0.3:{port}"
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.IDENTITY, ident.encode())
        dealer.connect(f"tcp://127.0.0.3:0;{self.target.addr}")
        self.closers += [router.close, dealer.close]
        dealer.send(pack(self.connect(ident, agent)))
        if not router.poll(int(ANSWER_S * 1000)):
            return False
        reply = router.recv_multipart()[-1]
        return b"connect" in reply

    def close(self) -> None:
        if self.ctx.closed:
            return
        while self.closers:
            self.closers.pop()()
        self.ctx.destroy(linger=0)


def _ident_no_colon(a: Attack, agent: Any) -> bool | None:
    a.peer(identity=b"no-colon-here", bind=False).send(a.connect("no-colon-here", agent))
    return None


def _ident_not_utf8(a: Attack, agent: Any) -> bool | None:
    a.peer(identity=b"\xff\xfe:5000", bind=False).send(a.connect("127.0.0.1:5000", agent))
    return None


def _ident_bad_port(a: Attack, agent: Any) -> bool | None:
    a.peer(identity=b"127.0.0.1:http", bind=False).send(a.connect("127.0.0.1:http", agent))
    return None


def _fetch_before_connect(a: Attack, agent: Any) -> bool | None:
    p = a.peer()
    p.send(fetch_msg("hostile-early", [demo_key(0)], [0]))
    return bool(p.types_within(WINDOW_S))


def _garbage_10mib(a: Attack, agent: Any) -> bool | None:
    p = a.peer()
    p.send_raw(pack(os.urandom(GARBAGE)))
    return bool(p.types_within(WINDOW_S))


def _never_handshake(a: Attack, agent: Any) -> bool | None:
    used: set[int] = set()
    for _ in range(FLOOD * 2):
        if len(used) == FLOOD:
            break
        port = free_port()  # a port nobody listens on: the dial-back never comes up
        if port in used:
            continue
        used.add(port)
        ident = f"127.0.0.1:{port}"
        p = RawPeer(a.ctx, a.target.addr, identity=ident.encode(), bind=False)
        p.dealer.setsockopt(zmq.LINGER, 2000)  # closed at once, its frame still goes out
        p.send(a.connect(ident, agent))
        p.dealer.close()
    return None


def _huge_num_blocks(a: Attack, agent: Any) -> bool | None:
    p = a.peer()
    p.send(a.connect(p.peer_id, agent, num_blocks=HUGE_BLOCKS))
    seen = p.types_within(WINDOW_S)
    if "connect" in seen and "disconnect" not in seen:  # accepted: finish the handshake,
        p.send({"type": "connect_ack", "peer_id": p.peer_id})  # so that it registers us
        # Its connect_ack (it took us), or its disconnect (refused after all): the checks
        # then say what either cost.
        deadline = time.monotonic() + 60.0
        while (left := deadline - time.monotonic()) > 0:
            msg = p.recv(left)
            if msg is None or msg.get("type") in ("connect_ack", "disconnect"):
                break
    return None  # a node may take a big peer (p2pfsm serve does): what it costs counts


SCENARIOS: dict[str, Callable[[Attack, Any], bool | None]] = {
    "identity without a colon": _ident_no_colon,
    "identity not UTF-8": _ident_not_utf8,
    "identity with a non-numeric port": _ident_bad_port,
    "fetch before connect": _fetch_before_connect,
    "10 MiB garbage frame": _garbage_10mib,
    f"{FLOOD} never-handshaking identities": _never_handshake,
    f"connect with num_blocks={HUGE_BLOCKS}": _huge_num_blocks,
}


def run_scenario(name: str, kind: str, log_dir: Path) -> tuple[Outcome, str]:
    """One fresh target of ``kind``, attacked by scenario ``name``; its outcome and log."""
    target = Target(kind, log_dir)
    attack = Attack(target)
    try:
        agent = attack.agent()
        fds0, rss0 = target.fds(), target.rss()
        flood_on_vllm_data = SCENARIOS[name] is _never_handshake and kind in VLLM_DATA_PLANE
        out = Outcome(fd_bound=FLOOD_FD_BOUND if flood_on_vllm_data else FD_BOUND)
        out.dialled_back = SCENARIOS[name](attack, agent)
        if target.alive():
            out.peak_fds_delta = target.fds() - fds0
        out.answers = target.alive() and attack.answers(agent)
        attack.close()
        # After a flood stock vLLM may still be working through queued connects with its
        # descriptors low: it is watched for the whole window (an observation window, as
        # types_within), not only until its count is under the bound. A guarded target
        # drops past its pending budget at the door, so nothing is queued for later.
        watch = SCENARIOS[name] is _never_handshake and kind == "vllm"
        poll_until(lambda: not target.alive() or (
                       not watch and target.fds() <= fds0 + out.fd_bound),
                   bool, SETTLE_S, "the target's fds settled", interval=0.2,
                   at_deadline="last")
        out.alive = target.alive()
        if out.alive:
            out.fds_delta = target.fds() - fds0
            out.rss_delta_mib = round((target.rss() - rss0) / (1 << 20), 1)
        return out, target.tail()
    finally:
        attack.close()
        target.stop()


@pytest.fixture
def log_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path


STOCK_FAILS = {
    # vLLM 0.33.0 as it ships; if one of these changes, vLLM fixed it: update the table.
    "identity without a colon": lambda o: not o.alive,
    "identity not UTF-8": lambda o: not o.alive,
    "identity with a non-numeric port": lambda o: not o.alive,
    "fetch before connect": lambda o: bool(o.dialled_back),
    "10 MiB garbage frame": lambda o: bool(o.dialled_back),
    # The flood is not listed: it ended a stock node in 4 of 6 runs, depending on how fast
    # it worked through the connects (docs/explanation/vllm.md).
    f"connect with num_blocks={HUGE_BLOCKS}": lambda o: o.rss_delta_mib * (1 << 20) > RSS_BOUND,
}


CI_KINDS = ("sessions", "full", "serve")
"""The two installs and ``p2pfsm serve`` run in CI's interop stage; stock vLLM (its
failures are recorded findings, and its flood runs are long) is the ``slow`` row:
``pytest -m "interop and slow" tests/interop/test_vllm_hostile.py``."""


@pytest.mark.parametrize("kind", [k if k in CI_KINDS else pytest.param(k, marks=pytest.mark.slow)
                                  for k in KINDS])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_hostile_peer(name: str, kind: str, log_dir: Path) -> None:
    """The adapter's node survives what ``p2pfsm serve`` survives; stock vLLM does not."""
    out, tail = run_scenario(name, kind, log_dir)
    print(f"\n{name} x {kind}: {out.cell()} {asdict(out)}")
    if kind == "vllm":
        expect = STOCK_FAILS.get(name)
        if expect is not None:
            assert expect(out), (asdict(out), tail)
        return
    assert out.survived, (asdict(out), tail)


def main() -> None:
    """Every scenario against every target: one JSON line each, then the table."""
    import tempfile

    kinds = sys.argv[1].split(",") if len(sys.argv) > 1 else list(KINDS)
    rows: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory() as d:
        for name in SCENARIOS:
            for kind in kinds:
                out, _ = run_scenario(name, kind, Path(d))
                rows.setdefault(name, {})[kind] = out.cell()
                print(json.dumps({"scenario": name, "kind": kind, **asdict(out)}), flush=True)
    print("| scenario | " + " | ".join(kinds) + " |")
    print("|---" * (len(kinds) + 1) + "|")
    for name, cells in rows.items():
        print(f"| {name} | " + " | ".join(cells.get(k, "") for k in kinds) + " |")


if __name__ == "__main__":
    main()
