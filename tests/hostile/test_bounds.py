"""What one peer can make the server keep, spend or log, bounded: per-request memory
(tombstones), dial-backs, loaded NIXL agents, the cost of a connect, a line of the log.

Each scenario is the attack as a hostile peer runs it against the real ``serve``
process, with a legitimate peer fetching byte-exact in between, and the server's fds
and RSS read from /proc.
"""

from __future__ import annotations

import time
import urllib.request
from pathlib import Path

import pytest
import zmq
import zmq.utils.monitor
from helpers.polling import wait_for
from helpers.serve_process import ServeProcess

from p2pfsm.executor.node.peer_policy import RESTART_BURST, RESTART_PERIOD_S
from p2pfsm.executor.zmq.intake import DIAL_BACKS_PER_ID_S
from p2pfsm.executor.zmq.plane import ControlPlane, FrameIn
from p2pfsm.tools.bench import procstat

from .conftest import Hostile, legit_fetch
from .wire import BLOCK_LEN, SERVED_BLOCKS, RawPeer, connect_msg, free_port, pack

TERMINAL_ROUNDS = 3
TERMINAL_FETCHES = 6000
ID_LEN = 4000


def _terminal_fetch(rid: str) -> dict[str, object]:
    return {"type": "fetch", "kv_request_id": rid, "keys": [], "block_indexes": [],
            "round_seq": 0}


def test_terminal_fetches_leave_no_memory_behind_their_session(hostile: Hostile) -> None:
    """Three sessions one after the other, each 6,000 terminal fetches with 4,000-byte
    request ids (a peer-finished tombstone each, ~24 MB of ids), then a real fetch
    checked byte for byte, then a disconnect. A session keeps at most
    ``max_tombstones`` of them and an ended session none, so RSS after the third
    session is within one session's volume of RSS after the first (without the bounds
    each ended session kept all of its ids for the node's ``history``)."""
    volume = TERMINAL_FETCHES * ID_LEN
    after = []
    for r in range(TERMINAL_ROUNDS):
        peer, plane = hostile.ready()
        for i in range(TERMINAL_FETCHES):
            peer.send(_terminal_fetch(f"{r}-{i:06d}-".ljust(ID_LEN, "x")))
        # Frames of one connection are handled in order: once this fetch is served,
        # every terminal fetch before it was.
        peer.fetch_ok(plane, f"check-{r}", range(4), timeout=60.0)
        peer.send({"type": "disconnect"})
        legit_fetch(hostile.addr, host="127.0.0.2")
        after.append(hostile.server.rss())
    growth = after[-1] - after[0]
    assert growth < volume, ([a >> 20 for a in after], volume >> 20)
    hostile.react(f"RSS after each session {[a >> 20 for a in after]} MiB "
                  f"({TERMINAL_FETCHES} terminal fetches each)")
    hostile.verify()


BIG_CONNECTS = 20
BIG_BLOCKS = 1 << 20
CPU_PER_BIG_CONNECT_S = 0.03
"""What one connect announcing 2**20 blocks its agent did not register may cost the
server in CPU time, handshake, dial-back and refusal included (measured: building and
checking a descriptor per block cost 100-160 ms; checking the regions' spans first,
well under 1 ms)."""
LOG_LINE_MAX = 1000


def test_a_connect_of_a_million_blocks_costs_little_and_a_huge_layout_logs_little(
        hostile: Hostile) -> None:
    """A connect whose layout has 4,096 one-byte regions (it cannot pair with the
    server's plain region), then 20 (new identities) announcing 2**20 blocks of an
    agent that registered 64. Each is refused (the attacker gets a disconnect); the server
    spends little CPU time on the first kind, and no line of its log quotes the layout
    at length. A legitimate client is served byte-exact afterwards."""
    plane = hostile.agent()
    srv = hostile.server
    peer = hostile.peer()
    layout = [[plane.base_addr + r, BLOCK_LEN, 1] for r in range(BLOCK_LEN)]
    peer.send(connect_msg(peer.peer_id, plane.metadata, plane.base_addr, layout=layout))
    peer.expect("disconnect", 30.0)
    seen: list[str] = []

    def logged() -> bool:
        seen.extend(srv.new_log())
        return any(peer.peer_id in ln for ln in seen)

    wait_for(logged, 10.0, "the server logged the refused layout")
    before = procstat.cpu_s(srv.pid)
    for _ in range(BIG_CONNECTS):
        peer = hostile.peer()
        peer.send(connect_msg(peer.peer_id, plane.metadata, plane.base_addr,
                              num_blocks=BIG_BLOCKS))
        peer.expect("disconnect", 30.0)
    spent = procstat.cpu_s(srv.pid) - before
    legit_fetch(hostile.addr, host="127.0.0.2")
    longest = max(len(ln) for ln in seen)
    assert longest <= LOG_LINE_MAX, max(seen, key=len)[:200]
    assert spent < BIG_CONNECTS * CPU_PER_BIG_CONNECT_S, spent
    hostile.react(f"{BIG_CONNECTS} connects of 2**20 blocks refused in {spent:.2f} s of "
                  f"CPU; longest log line {longest} characters")
    hostile.verify()


RESENT_CONNECTS = 1000
RESEND_EVERY_S = 0.004


def _metrics(port: int) -> dict[str, float]:
    """The serve process's Prometheus counters, by name."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("p2pfsm_") and " " in line:
            name, _, value = line.partition(" ")
            out[name.partition("{")[0]] = float(value)
    return out


def test_a_connect_resent_in_a_loop_is_dialled_back_at_a_bounded_rate(
        hostile: Hostile, tmp_path: Path) -> None:
    """One identity naming a port nobody listens on sends its connect 1,000 times, one
    every 4 ms (4 s or more), to a server of its own (with metrics): each dial-back is
    refused at once, so without a bound every copy was dialled back (a DEALER, a
    refusal, a session that dies, a WARNING line) and the server's sessions died by the
    hundred. The server dials the identity back at most twice a second (a burst of
    two), drops the other copies at the door (counted), logs a few lines, and serves a
    legitimate client byte-exact afterwards."""
    port = free_port()
    srv = ServeProcess(tmp_path / "serve.log", SERVED_BLOCKS, BLOCK_LEN,
                       ("--connect-timeout", "2", "--metrics", f"127.0.0.1:{port}"))
    hostile.on_close(srv.stop)
    plane = hostile.agent()
    ident = f"127.0.0.1:{free_port()}"
    peer = RawPeer(hostile.ctx, srv.addr, identity=ident.encode(), bind=False)
    hostile.on_close(peer.close)
    frame = pack(connect_msg(ident, plane.metadata, plane.base_addr))
    started = time.monotonic()
    for _ in range(RESENT_CONNECTS):
        peer.send_raw(frame)
        time.sleep(RESEND_EVERY_S)  # the attacker's pace: copies keep coming after refusals
    legit_fetch(srv.addr, host="127.0.0.2")
    # However many copies the server has read by now, it read them since ``started``.
    counts = _metrics(port)
    elapsed = time.monotonic() - started
    deaths = counts.get("p2pfsm_deaths_total", 0) - 1  # the legitimate client's close
    with open(srv.log_path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    assert deaths <= DIAL_BACKS_PER_ID_S * (elapsed + 1) + 2, (deaths, elapsed, counts)
    assert len(lines) < 100, lines[:20]
    hostile.react(f"{RESENT_CONNECTS} copies of one connect in {elapsed:.1f} s: {deaths:.0f} "
                  f"dial-backs, {len(lines)} log lines")
    hostile.verify()


RENAMED_RESTARTS = 12


def test_restarts_with_renamed_agents_cost_a_bounded_number_of_descriptors(
        hostile: Hostile) -> None:
    """One identity restarts 12 times in a row, each time as a new incarnation with a
    NIXL agent of a new name (all kept alive): each agent the server loads costs it a
    descriptor for as long as that agent lives. The server opens a new session for a
    few restarts at once and then one per ``RESTART_PERIOD_S`` (the others' connects
    are dropped), and unloads the agent a restart replaced; its descriptors grow by at
    most the restarts it served. A legitimate client is served byte-exact after."""
    srv = hostile.server
    first = hostile.agent()
    peer = hostile.peer()
    peer.handshake(first.metadata, first.base_addr, incarnation=999)
    base = srv.steady_fds()
    started = time.monotonic()
    served = 0
    for i in range(RENAMED_RESTARTS):
        agent = hostile.agent()
        peer.send(connect_msg(peer.peer_id, agent.metadata, agent.base_addr,
                              incarnation=1000 + i))
        for kind in peer.types_within(0.5):  # an observation window, no synchronisation
            if kind == "connect":  # the server opened a session for this restart
                served += 1
                peer.send({"type": "connect_ack", "peer_id": peer.peer_id})
    served += peer.types_within(1.0).count("connect")
    elapsed = time.monotonic() - started
    grown = srv.steady_fds() - base
    allowed = RESTART_BURST + elapsed / RESTART_PERIOD_S + 1
    assert served <= allowed, (served, elapsed)
    assert grown <= allowed + 2, (grown, served)
    legit_fetch(hostile.addr, host="127.0.0.2")
    hostile.react(f"{RENAMED_RESTARTS} restarts with renamed agents in {elapsed:.1f} s: "
                  f"{served} served, fds +{grown}")
    hostile.verify()


def _disconnects(monitor: zmq.Socket[bytes], seconds: float) -> int:
    """``EVENT_DISCONNECTED`` a socket monitor reports within ``seconds`` (an
    observation window)."""
    count = 0
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if monitor.poll(int(left * 1000) + 1):
            event = zmq.utils.monitor.recv_monitor_message(monitor)
            count += event["event"] == zmq.EVENT_DISCONNECTED
    return count


def test_a_peer_without_heartbeats_keeps_an_idle_connection() -> None:
    """A ZeroMQ peer that sets no heartbeats of its own (another implementation, a test
    tool) connects to a control plane PINGing every 100 ms (its ROUTER every 600 ms),
    sends a frame and idles 3 s. It hears from us only at our ROUTER's PINGs, so the TTL
    they carry must outlast their interval: a TTL of the timeout (500 ms) made its
    libzmq drop the connection 500 ms after each PING (at 37 s with the defaults).
    Its connection stays up and its next frame comes on the same one."""
    server = ControlPlane("tcp://127.0.0.1:0", heartbeat_ivl_ms=100, heartbeat_timeout_ms=500,
                          heartbeat_ttl_ms=500)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.IDENTITY, b"127.0.0.1:9")
        dealer.setsockopt(zmq.LINGER, 0)
        monitor = dealer.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        dealer.connect(f"tcp://{server.local_id}")
        dealer.send(b"hello")
        seen: list[FrameIn] = []
        wait_for(lambda: bool(seen.extend(e for e in server.poll(50) if isinstance(e, FrameIn))
                              or seen), 20.0, "the first frame")
        drops = 0
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:  # keep our side's heartbeats turning
            server.poll(100)
            drops += _disconnects(monitor, 0.05)
        dealer.send(b"again")
        wait_for(lambda: bool(seen.extend(e for e in server.poll(50) if isinstance(e, FrameIn))
                              or len(seen) > 1), 20.0, "the second frame")
        assert drops == 0, drops
        assert seen[0].conn == seen[1].conn >= 0, seen
        dealer.disable_monitor()
        monitor.close(0)
        dealer.close(0)
    finally:
        ctx.destroy(linger=0)
        server.close()


@pytest.mark.slow
def test_a_raw_peer_without_heartbeats_keeps_its_session_past_37_s(hostile: Hostile) -> None:
    """The full-scale version against ``serve``'s defaults (PINGs every 5 s, its ROUTER
    every 30 s, timeout 7 s): a raw peer (no heartbeats of its own) handshakes, idles
    45 s and fetches byte-exact on the same session, never told to disconnect (it used
    to be dropped at 37 s and its session closed)."""
    peer, plane = hostile.ready()
    peer.fetch_ok(plane, "before-idle", range(2))
    assert peer.types_within(45.0) == []  # the idle stretch: nothing from the server
    peer.fetch_ok(plane, "after-idle", range(4))
    kinds = [m.get("type") for m in peer.seen]
    assert "disconnect" not in kinds and kinds.count("connect") == 1, kinds
    hostile.react("a peer without heartbeats idled 45 s and fetched on")
    hostile.verify()


if __name__ == "__main__":  # pragma: no cover
    pytest.main([__file__])
