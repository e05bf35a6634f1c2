"""Interop with vLLM: every protocol flow, in both directions, every byte verified.

The vLLM side is the package ``p2pfsm/tools/vllm_peer/`` (``python -m
p2pfsm.tools.vllm_peer``), run by a separate venv (``.venv-vllm``: 0.33.0, from
``bash .ci/install-vllm.sh``;
``P2PFSM_VLLM_PYTHON`` names another, e.g. ``.venv-vllm-0.34/bin/python`` from
``bash .ci/install-vllm.sh 0.34.0``), in its own process: vLLM's
own ``P2PSession``, ZMQ control transport and NIXL data transport. The p2pfsm side is a
:class:`~p2pfsm.executor.node.Node` driven from this process (and, for one smoke test per
direction, the ``p2pfsm serve`` / ``p2pfsm fetch`` CLI). Both derive keys and block
contents from ``p2pfsm.demo_blocks``, so each receiver checks every byte it was sent.

Flows (each in both directions):

* ``pd_happy``: PD fetch of blocks the server holds: one transfer_done(true).
* ``pd_demand``: the server holds 4 and 5 back and stores them ~1 s after the fetch; the
  round waits for them and ends with one transfer_done(true).
* ``pd_abort``: a fetch names block 9999, which is never stored; the client's load
  timeout (3 s; vLLM's module constant patched, as the captures' harness did) sends
  abort_fetch, the server answers abort_ack, the load fails; blocks 0-3 did land.
* ``pd_finish``: the server's host finishes the request 1 s after the fetch while 9999
  is missing: transfer_done(false) long before any load timeout.
* ``sym_lookup``: lookup, then fetch of the hits (a HIT_PENDING key that turns into a
  hit when the vLLM server is the producer), then finish.
* ``sym_nohit``: lookup with no hits; finish sends the terminal empty fetch.

Every process started here is stopped in a ``finally`` (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PEER_MODULE = "p2pfsm.tools.vllm_peer"
VLLM_PYTHON = Path(os.environ.get("P2PFSM_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))


def _vllm_release() -> str | None:
    """The vLLM version of the peer venv (None without one)."""
    if not VLLM_PYTHON.is_file():
        return None
    done = subprocess.run([str(VLLM_PYTHON), "-c", "from importlib.metadata import version; "
                           "print(version('vllm'))"], capture_output=True, text=True, timeout=120)
    return done.stdout.strip().split("+", 1)[0] or None


VLLM_RELEASE = _vllm_release()
"""The release the suite runs against: where an outcome differs by release, the tests
expect that release's."""

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(
        not VLLM_PYTHON.is_file(),
        reason=f"no vLLM peer venv at {VLLM_PYTHON}: run `bash .ci/install-vllm.sh`",
    ),
    pytest.mark.skipif(
        importlib.util.find_spec("nixl") is None and importlib.util.find_spec("nixl_cu12") is None,
        reason="NIXL is not installed in this venv (.ci/install.sh installs it)",
    ),
]


from p2pfsm.demo_blocks import demo_block, demo_key  # noqa: E402
from p2pfsm.executor.node import LookupAnswer, Node, NodeConfig, fingerprint  # noqa: E402
from p2pfsm.session import (  # noqa: E402
    FetchArrived,
    LoadResult,
    LookupRequest,
    LookupResult,
    StoreResult,
    Timeouts,
)
from p2pfsm.tools.demo.host import DemoServer  # noqa: E402

MARK = "P2PINTEROP "
BLOCK_LEN = 4096
SERVER_BLOCKS = 16
MISSING = 9999
CONFIG = {"model": "p2pfsm/interop-demo", "dtype": "bfloat16", "block_size": 16,
          "num_kv_heads": 8, "head_size": 128}
FP = fingerprint(CONFIG)
CONFIG_JSON = json.dumps(CONFIG)
START_TIMEOUT = 90.0  # importing vLLM takes 3-10 s on a busy 2-core box


def skip_unless_asked(config: pytest.Config) -> None:
    """Skip unless the run asked for interop (``-m interop``, or P2PFSM_INTEROP=1). A
    module-scoped fixture that starts processes calls it first: it is set up before any
    function-scoped opt-in could skip its tests."""
    asked = "interop" in (config.getoption("markexpr", "") or "")
    if not asked and os.environ.get("P2PFSM_INTEROP") != "1":
        pytest.skip("vLLM interop runs only with `-m interop` (or P2PFSM_INTEROP=1)")


@pytest.fixture(autouse=True)
def _opt_in(request: pytest.FixtureRequest) -> None:
    """The suite takes minutes and two processes per test: it runs only when asked for
    (``-m interop``, or P2PFSM_INTEROP=1), so a plain ``pytest`` keeps its speed."""
    skip_unless_asked(request.config)


# --------------------------------------------------------------------------- processes


class PeerProcess:
    """A process whose marked stdout lines are JSON objects; always stopped by stop()."""

    def __init__(self, argv: list[str], name: str) -> None:
        self.name = name
        self.dir = tempfile.TemporaryDirectory(prefix=f"p2pfsm-interop-{name}-")
        self.out_path = Path(self.dir.name) / "stdout"
        self.err_path = Path(self.dir.name) / "stderr"
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        with open(self.out_path, "wb") as out, open(self.err_path, "wb") as err:
            self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL, env=env)

    def lines(self) -> list[str]:
        """The complete lines written so far (a last one still being written is left
        for the next read)."""
        text = self.out_path.read_text(errors="replace")
        return text[:text.rfind("\n") + 1].splitlines()

    def records(self, kind: str | None = None) -> list[dict[str, Any]]:
        out = []
        for line in self.lines():
            if line.startswith(MARK):
                rec = json.loads(line[len(MARK):])
                if kind is None or rec.get("kind") == kind:
                    out.append(rec)
        return out

    def tail(self) -> str:
        err = self.err_path.read_text(errors="replace")[-3000:]
        out = "\n".join(self.lines()[-20:])[-3000:]
        return f"--- {self.name} stdout (tail)\n{out}\n--- {self.name} stderr (tail)\n{err}"

    def wait_for(self, found: Callable[[], Any], what: str, timeout: float,
                 pump: Callable[[], None] | None = None) -> Any:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            value = found()
            if value:
                return value
            if self.proc.poll() is not None:
                value = found()
                if value:
                    return value
                raise AssertionError(f"{self.name} exited ({self.proc.returncode}) before "
                                     f"{what}\n{self.tail()}")
            if pump is not None:
                pump()
            else:
                # Its output is a file: wait on the process, which returns early if it ends.
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.proc.wait(timeout=0.05)
        raise AssertionError(f"{self.name}: no {what} within {timeout:.0f} s\n{self.tail()}")

    def record(self, kind: str, timeout: float,
               pump: Callable[[], None] | None = None) -> dict[str, Any]:
        recs = self.wait_for(lambda: self.records(kind), f"{kind!r} line", timeout, pump)
        return recs[-1]  # type: ignore[no-any-return]

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM, wait, then SIGKILL; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return int(self.proc.returncode)

    def cleanup(self) -> None:
        self.stop()
        self.dir.cleanup()


@pytest.fixture
def procs() -> Iterator[list[PeerProcess]]:
    """Every process a test starts goes here; all of them are stopped afterwards."""
    started: list[PeerProcess] = []
    try:
        yield started
    finally:
        for p in started:
            p.cleanup()


def vllm_argv(role: str, *args: str) -> list[str]:
    return [str(VLLM_PYTHON), "-m", PEER_MODULE, role, "--block-len", str(BLOCK_LEN),
            "--config-json", CONFIG_JSON, *args]


def start_vllm_server(procs: list[PeerProcess], *args: str) -> tuple[PeerProcess, str]:
    server = PeerProcess(vllm_argv("server", "--blocks", str(SERVER_BLOCKS), *args),
                         "vllm-server")
    procs.append(server)
    ready = server.record("ready", START_TIMEOUT)
    assert ready["fingerprint"] == FP, "vLLM computes the config fingerprint differently"
    return server, str(ready["peer_id"])


def stop_vllm_server(server: PeerProcess) -> dict[str, Any]:
    rc = server.stop()
    assert rc == 0, f"vLLM server exited {rc}\n{server.tail()}"
    return server.record("summary", 1.0)


def is_echo(peer: dict[str, Any]) -> bool:
    """A session whose only inbound frame is a ``disconnect``: the echo of a clean end.

    A clean end races inside vLLM's transport: where ZeroMQ's monitor is seen first, the
    session is reaped before the peer's ``disconnect`` frame is read, and that frame then
    opens a second, empty session for the same peer id (stock sessions and the adapter's
    alike)."""
    return {f["type"] for f in peer["frames"] if f["dir"] == "in"} == {"disconnect"}


def frames_of(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The vLLM server's frames with its one peer (an echo of its end left out)."""
    peers = [p for p in summary["peers"] if not is_echo(p)]
    assert len(peers) == 1, f"expected one peer session, got {summary['peers']}"
    frames: list[dict[str, Any]] = peers[0]["frames"]
    return frames


def types(frames: list[dict[str, Any]], way: str) -> list[str]:
    return [f["type"] for f in frames if f["dir"] == way]


def only(frames: list[dict[str, Any]], way: str, kind: str) -> dict[str, Any]:
    matches = [f for f in frames if f["dir"] == way and f["type"] == kind]
    assert len(matches) == 1, f"expected one {way} {kind}, got {matches} in {frames}"
    return matches[0]


def blocks_text(blocks: list[int]) -> str:
    return ",".join(str(b) for b in blocks)


# ---------------------------------------------------------- p2pfsm side (Node, in-process)


def new_node(num_blocks: int, **timeouts: float) -> Node:
    return Node(NodeConfig(bind="tcp://127.0.0.1:0", num_blocks=num_blocks,
                           block_len=BLOCK_LEN, model_config=CONFIG,
                           timeouts=Timeouts(**timeouts)))


def region_block(node: Node, index: int) -> bytes:
    return bytes(node.region[index].numpy())


def check_node(node: Node) -> None:
    assert list(node.violations) == [], f"p2pfsm saw protocol violations: {node.violations}"


@dataclass
class ClientRun:
    """What the p2pfsm client did against a vLLM server."""

    load: LoadResult | None = None
    lookup: LookupResult | None = None
    chosen: list[int] = field(default_factory=list)
    landed: list[int] = field(default_factory=list)
    seconds: float = 0.0
    session_state: str = ""


def p2pfsm_client(peer_id: str, blocks: list[int], mode: str, *, load: float = 30.0,
                  abort_ack: float = 10.0) -> ClientRun:
    """Fetch ``blocks`` from ``peer_id`` with a Node; report everything, verify bytes."""
    return p2pfsm_client_runs(peer_id, blocks, mode, 1, load=load, abort_ack=abort_ack)[0]


def p2pfsm_client_runs(peer_id: str, blocks: list[int], mode: str, repeat: int, *,
                       load: float = 30.0, abort_ack: float = 10.0,
                       request_id: str = "p2pfsm-interop-0") -> list[ClientRun]:
    """The flow ``repeat`` times, one after another, under the same request id."""
    runs: list[ClientRun] = []
    node = new_node(len(blocks), load=load, abort_ack=abort_ack)
    try:
        session = node.connect(peer_id)
        node.run_until(lambda: session.ready or not session.alive, 60)
        assert session.ready, f"handshake with vLLM failed: {node.deaths.get(peer_id)}"
        for _ in range(repeat):
            node.region.zero_()  # each run's bytes are verified on their own
            runs.append(one_client_run(node, peer_id, blocks, mode, request_id,
                                       load + 3 * abort_ack + 10))
            runs[-1].session_state = session.state
        check_node(node)
    finally:
        node.close()
    return runs


def one_client_run(node: Node, peer_id: str, blocks: list[int], mode: str, request_id: str,
                   limit: float) -> ClientRun:
    run = ClientRun()
    keys = [demo_key(b) for b in blocks]
    t0 = time.monotonic()
    chosen = list(blocks)
    if mode == "sym":
        lookup = node.lookup(peer_id, request_id, keys)
        assert node.run_until(lookup.done, 40), "vLLM never answered the lookup"
        run.lookup = lookup.result()
        assert run.lookup.keys == tuple(keys)
        chosen = [b for b, hit in zip(blocks, run.lookup.hits, strict=True) if hit]
    run.chosen = chosen
    if chosen:
        fut = node.fetch(peer_id, request_id, [demo_key(b) for b in chosen],
                         list(range(len(chosen))))
        assert node.run_until(fut.done, limit), "no load result"
        run.load = fut.result()
    run.seconds = time.monotonic() - t0
    if mode == "sym":
        node.finish(peer_id, request_id)
    node.run_until(lambda: False, 0.3)  # let the last frames out (and vLLM's in)
    run.landed = [b for i, b in enumerate(chosen)
                  if region_block(node, i) == demo_block(b, BLOCK_LEN)]
    return run


# ------------------------------------------------ p2pfsm side as the server (in-process)


class P2pfsmServer:
    """A Node holding demo blocks 0..N-1 at their own index, with the flows' host options.

    ``hold_back`` blocks are stored (written and offered) only ``late_after`` s after a
    fetch names them; ``finish_after`` finishes each fetched request that long after its
    fetch. Lookups are answered with the stored keys; a fetch of a request that had a
    lookup is served from the lookup's pins (no second supply), as vLLM's manager does.
    With ``parts`` the node answers lookups in parts (``answer_lookups_in_parts``) and a
    lookup's ``hold_back`` keys are pending, found (stored and pinned) ``late_after`` s
    later.
    """

    def __init__(self, *, hold_back: tuple[int, ...] = (), late_after: float = 1.0,
                 finish_after: float | None = None, parts: bool = False) -> None:
        self.node = Node(NodeConfig(bind="tcp://127.0.0.1:0", num_blocks=SERVER_BLOCKS,
                                    block_len=BLOCK_LEN, model_config=CONFIG,
                                    answer_lookups_in_parts=parts),
                         on_lookup=self._on_lookup, on_fetch=self._on_fetch)
        self.parts = parts
        self._resolve_due: list[tuple[float, str, int, list[bytes]]] = []
        self.index = {demo_key(i): i for i in range(SERVER_BLOCKS)}
        self.late = {demo_key(i) for i in hold_back}
        self.stored = {k for k in self.index if k not in self.late}
        for key in self.stored:
            self._write(self.index[key])
        self.late_after = late_after
        self.finish_after = finish_after
        self.looked_up: set[tuple[str, str]] = set()
        self.fetches: list[FetchArrived] = []
        self.lookups: list[LookupRequest] = []
        self.supplies: list[tuple[list[int], Future[StoreResult]]] = []
        self.finished: list[str] = []
        self._due: list[tuple[float, str, str, str, list[bytes]]] = []

    @property
    def peer_id(self) -> str:
        return self.node.local_id

    def _write(self, i: int) -> None:
        import torch

        data = bytearray(demo_block(i, BLOCK_LEN))
        self.node.region[i] = torch.frombuffer(data, dtype=torch.uint8)

    def _supply(self, peer: str, kv: str, keys: list[bytes]) -> None:
        idxs = [self.index[k] for k in keys]
        self.supplies.append((idxs, self.node.supply(peer, kv, keys, idxs)))

    def _on_fetch(self, peer: str, fetch: FetchArrived) -> None:
        self.fetches.append(fetch)
        if (peer, fetch.kv_request_id) in self.looked_up:
            return  # served from the lookup's pins
        now = time.monotonic()
        held = [k for k in fetch.keys if k in self.stored]
        if held:
            self._supply(peer, fetch.kv_request_id, held)
        waiting = [k for k in fetch.keys if k in self.late]
        if waiting:
            self._due.append((now + self.late_after, "supply", peer, fetch.kv_request_id,
                              waiting))
        if self.finish_after is not None:
            self._due.append((now + self.finish_after, "finish", peer, fetch.kv_request_id, []))

    def _on_lookup(self, peer: str, req: LookupRequest) -> LookupAnswer:
        self.lookups.append(req)
        self.looked_up.add((peer, req.kv_request_id))
        hits = {k: self.index[k] for k in req.keys if k in self.stored}
        if not self.parts:
            return hits, frozenset()
        later = [k for k in req.keys if k in self.late]
        if later:
            self._resolve_due.append((time.monotonic() + self.late_after, peer, req.token,
                                      later))
        return hits, frozenset(later)

    def _tick(self) -> None:
        now = time.monotonic()
        found = [d for d in self._resolve_due if d[0] <= now]
        self._resolve_due = [d for d in self._resolve_due if d[0] > now]
        for _, peer, token, keys in found:
            for key in keys:
                self._write(self.index[key])
                self.stored.add(key)
            pins = self.node.resolve_lookup(peer, token, {k: self.index[k] for k in keys})
            assert pins is not None
            self.supplies.append(([self.index[k] for k in keys], pins))
        due = [d for d in self._due if d[0] <= now]
        self._due = [d for d in self._due if d[0] > now]
        for _, what, peer, kv, keys in due:
            if what == "supply":
                for key in keys:
                    self._write(self.index[key])
                    self.stored.add(key)
                self._supply(peer, kv, keys)
            else:
                self.node.finish(peer, kv)
                self.finished.append(kv)

    def pump(self) -> None:
        self.node.step(0.01)
        self._tick()

    def close(self) -> None:
        self.node.close()


class DemoHost(P2pfsmServer):
    """p2pfsm's own demo host (the one behind ``p2pfsm serve``), with its supplies recorded."""

    def __init__(self) -> None:
        self.demo = DemoServer(NodeConfig(bind="tcp://127.0.0.1:0", num_blocks=SERVER_BLOCKS,
                                          block_len=BLOCK_LEN, model_config=CONFIG))
        self.node = self.demo.node
        self.supplies = []
        self.finished = []
        self._due = []
        self._resolve_due = []
        supply = self.node.supply

        def recording_supply(peer: str, kv: str, keys: Any, idxs: Any) -> Future[StoreResult]:
            fut = supply(peer, kv, keys, idxs)
            self.supplies.append((list(idxs), fut))
            return fut

        self.node.supply = recording_supply  # type: ignore[method-assign]


@dataclass
class ServerSnapshot:
    """The p2pfsm server's state once the vLLM client's flow is over, before it leaves."""

    open_counts: list[dict[str, int]]
    states: list[str]
    stores: list[bool | None]


def snapshot(server: P2pfsmServer) -> ServerSnapshot:
    sessions = list(server.node.sessions.values())
    return ServerSnapshot(
        open_counts=[s.open_counts() for s in sessions],
        states=[s.state for s in sessions],
        stores=[fut.result(0).success if fut.done() else None for _, fut in server.supplies],
    )


def vllm_client(procs: list[PeerProcess], server: P2pfsmServer, *args: str,
                timeout: float = 120.0) -> tuple[dict[str, Any], ServerSnapshot]:
    """Run the vLLM peer's client against ``server`` (pumping it meanwhile).

    Returns the client's result and the server's state when the client said its flow was
    done (its session still open).
    """
    client = PeerProcess(vllm_argv("client", "--connect", server.peer_id, "--linger", "0.3",
                                   *args), "vllm-client")
    procs.append(client)
    client.record("done", timeout, pump=server.pump)
    state = snapshot(server)
    result = client.record("result", 30, pump=server.pump)
    end = time.monotonic() + 15
    while client.proc.poll() is None and time.monotonic() < end:
        server.pump()
    assert client.proc.poll() is not None, f"vLLM client did not exit\n{client.tail()}"
    # vLLM's disconnect: let the server see it.
    server.node.run_until(lambda: not any(s.alive for s in server.node.sessions.values()), 5)
    result["_rc"] = client.proc.returncode
    result["_tail"] = client.tail()
    return result, state


@pytest.fixture
def p2pfsm_server() -> Iterator[Callable[..., P2pfsmServer]]:
    """Makes p2pfsm servers: the demo host by default, a P2pfsmServer given options."""
    made: list[P2pfsmServer] = []

    def make(**options: Any) -> P2pfsmServer:
        s = P2pfsmServer(**options) if options else DemoHost()
        made.append(s)
        return s

    try:
        yield make
    finally:
        for s in made:
            s.close()




# ============================================ direction 1: p2pfsm client -> vLLM server


def test_pd_happy_p2pfsm_client_vllm_server(procs: list[PeerProcess]) -> None:
    server, peer = start_vllm_server(procs)
    blocks = list(range(8))
    run = p2pfsm_client(peer, blocks, "pd")
    summary = stop_vllm_server(server)
    assert run.load is not None and run.load.success and run.load.released
    assert run.landed == blocks  # every byte of every block
    frames = frames_of(summary)
    assert only(frames, "in", "fetch")["nkeys"] == 8
    assert only(frames, "out", "transfer_done")["success"] is True
    assert only(frames, "in", "connect")["config_fingerprint"] == FP
    assert "abort_fetch" not in types(frames, "in")
    assert summary["stores"] == [{"job_id": 1, "success": True}]
    assert summary["peers"][0]["reason"] == "peer disconnected"


def test_a_per_layer_node_and_a_vllm_server_refuse_each_other(
        procs: list[PeerProcess]) -> None:
    """vLLM 0.33.0 knows one plain region: a node registered as two regions (K and V
    apart) ends the session at the handshake, naming the layout, and no fetch is sent."""
    import torch

    server, peer = start_vllm_server(procs)
    halves = [torch.zeros((8, BLOCK_LEN // 2), dtype=torch.uint8) for _ in range(2)]
    node = Node(NodeConfig(bind="tcp://127.0.0.1:0", num_blocks=8, block_len=BLOCK_LEN,
                           model_config=CONFIG, memory=halves))
    try:
        session = node.connect(peer)
        node.run_until(lambda: not session.alive, 30.0)
        death = node.deaths[peer]
        assert death.mismatch is not None and death.mismatch.field == "layout", death
        assert "no layout field" in str(death.mismatch), death
    finally:
        node.close()
    summary = stop_vllm_server(server)
    for p in summary["peers"]:
        assert "fetch" not in types(p["frames"], "in"), p
    assert summary["stores"] == []


def test_pd_demand_p2pfsm_client_vllm_server(procs: list[PeerProcess]) -> None:
    server, peer = start_vllm_server(procs, "--hold-back", "4,5", "--late-after", "1.0")
    blocks = list(range(8))
    run = p2pfsm_client(peer, blocks, "pd")
    summary = stop_vllm_server(server)
    assert run.load is not None and run.load.success and run.load.released
    assert run.landed == blocks
    assert run.seconds >= 0.9, "the round ended before the late blocks were stored"
    supplies = [e for e in summary["events"] if e["event"] == "add_stored_blocks"]
    assert [(e["why"], e["blocks"]) for e in supplies] == [
        ("fetch", [0, 1, 2, 3, 6, 7]), ("late_store", [4, 5])]
    frames = frames_of(summary)
    assert only(frames, "out", "transfer_done")["success"] is True
    assert all(s["success"] for s in summary["stores"]) and len(summary["stores"]) == 2


def test_pd_abort_p2pfsm_client_vllm_server(procs: list[PeerProcess]) -> None:
    server, peer = start_vllm_server(procs)
    blocks = [0, 1, 2, 3, MISSING]
    run = p2pfsm_client(peer, blocks, "pd", load=3.0)
    summary = stop_vllm_server(server)
    assert run.load is not None and not run.load.success
    assert run.load.released, "the load ended without the abort_ack"
    assert 2.9 <= run.seconds < 9.0, run.seconds
    assert run.landed == [0, 1, 2, 3]  # what was stored did land, byte for byte
    frames = frames_of(summary)
    assert only(frames, "in", "abort_fetch")["round_seq"] == 0
    assert only(frames, "out", "abort_ack")["round_seq"] == 0
    assert "transfer_done" not in types(frames, "out")
    assert run.session_state == "ready"


def test_pd_finish_p2pfsm_client_vllm_server(procs: list[PeerProcess]) -> None:
    server, peer = start_vllm_server(procs, "--finish-after", "1.0")
    blocks = [0, 1, 2, 3, MISSING]
    run = p2pfsm_client(peer, blocks, "pd", load=30.0)
    summary = stop_vllm_server(server)
    assert run.load is not None and not run.load.success and run.load.released
    assert 0.9 <= run.seconds < 10.0, "the host finish did not end the load early"
    assert run.landed == [0, 1, 2, 3]
    frames = frames_of(summary)
    assert only(frames, "out", "transfer_done")["success"] is False
    assert "abort_fetch" not in types(frames, "in")
    assert any(e["event"] == "finish_request" for e in summary["events"])


def test_sym_lookup_p2pfsm_client_vllm_server(procs: list[PeerProcess]) -> None:
    # Block 6 is HIT_PENDING until vLLM's host stores it 0.5 s after the lookup.
    server, peer = start_vllm_server(procs, "--hold-back", "6", "--late-after", "0.5")
    blocks = [0, 1, 2, 3, 4, 5, 6, MISSING]
    run = p2pfsm_client(peer, blocks, "sym")
    summary = stop_vllm_server(server)
    assert run.lookup is not None and run.lookup.answered
    assert run.lookup.hits == (True,) * 7 + (False,)
    assert run.load is not None and run.load.success and run.load.released
    assert run.chosen == list(range(7)) and run.landed == run.chosen
    frames = frames_of(summary)
    requests = [t for t in types(frames, "in") if t in ("lookup", "fetch", "abort_fetch")]
    assert requests == ["lookup", "fetch"]
    assert only(frames, "in", "lookup")["nkeys"] == 8
    assert only(frames, "out", "lookup_resp")["hits"] == [True] * 7 + [False]
    assert only(frames, "in", "fetch")["nkeys"] == 7  # no terminal fetch after a fetch
    assert only(frames, "out", "transfer_done")["success"] is True
    assert summary["lookup_results"].get("HIT_PENDING", 0) >= 1
    events = [e["event"] for e in summary["events"]]
    assert "fetch_supplied_by_lookup_pins" in events
    assert "parent.on_request_finished" in events


def test_sym_nohit_p2pfsm_client_vllm_server(procs: list[PeerProcess]) -> None:
    server, peer = start_vllm_server(procs)
    run = p2pfsm_client(peer, [MISSING - 1, MISSING], "sym")
    summary = stop_vllm_server(server)
    assert run.lookup is not None and run.lookup.answered
    assert run.lookup.hits == (False, False)
    assert run.load is None and run.chosen == []
    frames = frames_of(summary)
    assert only(frames, "out", "lookup_resp")["hits"] == [False, False]
    terminal = only(frames, "in", "fetch")
    assert terminal["nkeys"] == 0 and terminal["round_seq"] == 0
    assert "transfer_done" not in types(frames, "out")
    events = [e["event"] for e in summary["events"]]
    assert "fetch_terminal_empty" in events and "parent.on_request_finished" in events
    assert run.session_state == "ready"


# ============================================ direction 2: vLLM client -> p2pfsm server


def vllm_frames(result: dict[str, Any]) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = result["frames"]
    return frames


def assert_vllm_ok(result: dict[str, Any]) -> None:
    assert result["ready"], result["_tail"]
    assert result["success"] and result["verified"], result["_tail"]
    assert result["_rc"] == 0, result["_tail"]


def assert_server_clean(server: P2pfsmServer, state: ServerSnapshot) -> None:
    """No violations; when the flow was over, the one session was ready and held nothing
    open (no round, lookup, write or timer: every pin released, nothing left to expire)."""
    check_node(server.node)
    assert state.states == ["ready"], state
    assert [{k: v for k, v in c.items() if v} for c in state.open_counts] == [{}], state


def test_pd_happy_vllm_client_p2pfsm_server(procs: list[PeerProcess],
                                            p2pfsm_server: Callable[..., P2pfsmServer]) -> None:
    server = p2pfsm_server()
    result, state = vllm_client(procs, server, "--keys", "0-7", "--mode", "pd")
    assert_vllm_ok(result)
    assert result["landed"] == list(range(8))
    frames = vllm_frames(result)
    assert only(frames, "in", "transfer_done")["success"] is True
    assert only(frames, "in", "connect")["config_fingerprint"] == FP
    assert state.stores == [True]
    assert_server_clean(server, state)


def test_pd_demand_vllm_client_p2pfsm_server(procs: list[PeerProcess],
                                             p2pfsm_server: Callable[..., P2pfsmServer]) -> None:
    server = p2pfsm_server(hold_back=(4, 5), late_after=1.0)
    result, state = vllm_client(procs, server, "--keys", "0-7", "--mode", "pd")
    assert_vllm_ok(result)
    assert result["landed"] == list(range(8))
    assert result["seconds"] >= 0.9
    assert [idxs for idxs, _ in server.supplies] == [[0, 1, 2, 3, 6, 7], [4, 5]]
    assert state.stores == [True, True]
    assert only(vllm_frames(result), "in", "transfer_done")["success"] is True
    assert_server_clean(server, state)


def test_pd_miss_vllm_client_p2pfsm_demo_server(
        procs: list[PeerProcess], p2pfsm_server: Callable[..., P2pfsmServer]) -> None:
    # The demo host finishes a request naming a block it lacks: the round fails at once
    # with transfer_done(false) once its writes landed, not at the consumer's deadline.
    server = p2pfsm_server()
    result, state = vllm_client(procs, server, "--keys", f"0-3,{MISSING}", "--mode", "pd",
                                "--load-timeout", "3")
    assert result["ready"] and not result["success"], result["_tail"]
    assert result["seconds"] < 2.9, result["seconds"]
    frames = vllm_frames(result)
    assert only(frames, "in", "transfer_done")["success"] is False
    assert "abort_fetch" not in types(frames, "out")
    assert_server_clean(server, state)


def test_pd_abort_vllm_client_p2pfsm_server(procs: list[PeerProcess],
                                            p2pfsm_server: Callable[..., P2pfsmServer]) -> None:
    server = p2pfsm_server(finish_after=None)  # a host that never gives up: the load times out
    result, state = vllm_client(procs, server, "--keys", f"0-3,{MISSING}", "--mode", "pd",
                         "--load-timeout", "3")
    assert result["ready"] and not result["success"], result["_tail"]
    assert 2.9 <= result["seconds"] < 9.0, result["seconds"]
    assert result["landed"] == [0, 1, 2, 3]
    frames = vllm_frames(result)
    assert only(frames, "out", "abort_fetch")["round_seq"] == 0
    assert only(frames, "in", "abort_ack")["round_seq"] == 0
    assert "transfer_done" not in types(frames, "in")
    assert state.stores == [False]  # the aborted round's pins are released
    assert_server_clean(server, state)


def test_pd_finish_vllm_client_p2pfsm_server(procs: list[PeerProcess],
                                             p2pfsm_server: Callable[..., P2pfsmServer]) -> None:
    server = p2pfsm_server(finish_after=1.0)
    result, state = vllm_client(procs, server, "--keys", f"0-3,{MISSING}", "--mode", "pd")
    assert result["ready"] and not result["success"], result["_tail"]
    assert 0.9 <= result["seconds"] < 10.0, "the host finish did not end the load early"
    assert result["landed"] == [0, 1, 2, 3]
    frames = vllm_frames(result)
    assert only(frames, "in", "transfer_done")["success"] is False
    assert "abort_fetch" not in types(frames, "out")
    assert server.finished == [result_request_id(frames)]
    assert_server_clean(server, state)


def result_request_id(frames: list[dict[str, Any]]) -> str:
    return str(only(frames, "out", "fetch")["kv_request_id"])


def test_sym_lookup_vllm_client_p2pfsm_server(procs: list[PeerProcess],
                                              p2pfsm_server: Callable[..., P2pfsmServer]) -> None:
    server = p2pfsm_server()
    result, state = vllm_client(procs, server, "--keys", f"0-6,{MISSING}", "--mode", "sym")
    assert_vllm_ok(result)
    assert result["hits"] == 7 and result["landed"] == list(range(7))
    frames = vllm_frames(result)
    assert only(frames, "out", "lookup")["nkeys"] == 8
    assert only(frames, "in", "lookup_resp")["hits"] == [True] * 7 + [False]
    assert only(frames, "out", "fetch")["nkeys"] == 7
    assert only(frames, "in", "transfer_done")["success"] is True
    assert server.supplies == []  # served from the lookup's pins, nothing supplied again
    assert_server_clean(server, state)


def test_sym_nohit_vllm_client_p2pfsm_server(procs: list[PeerProcess],
                                             p2pfsm_server: Callable[..., P2pfsmServer]) -> None:
    server = p2pfsm_server()
    result, state = vllm_client(procs, server, "--keys", f"{MISSING - 1}-{MISSING}",
                                "--mode", "sym")
    assert_vllm_ok(result)
    assert result["hits"] == 0 and result["chosen"] == []
    frames = vllm_frames(result)
    assert only(frames, "in", "lookup_resp")["hits"] == [False, False]
    terminal = only(frames, "out", "fetch")
    assert terminal["nkeys"] == 0 and terminal["round_seq"] == 0
    assert "transfer_done" not in types(frames, "in")
    assert server.supplies == []
    assert_server_clean(server, state)


def test_sym_split_answer_vllm_client_p2pfsm_server(
        procs: list[PeerProcess], p2pfsm_server: Callable[..., P2pfsmServer]) -> None:
    """A p2pfsm producer answering in parts: the keys it holds (and the one it lacks) at
    once, the two it finds a second later in another lookup_resp; vLLM 0.33.0's client
    matches each key on its own and fetches all eight."""
    server = p2pfsm_server(hold_back=(4, 5), late_after=1.0, parts=True)
    result, state = vllm_client(procs, server, "--keys", f"0-7,{MISSING}", "--mode", "sym")
    assert_vllm_ok(result)
    assert result["hits"] == 8 and result["landed"] == list(range(8))
    frames = vllm_frames(result)
    answers = [f["hits"] for f in frames if f["dir"] == "in" and f["type"] == "lookup_resp"]
    assert answers == [[True] * 6 + [False], [True, True]], answers
    assert only(frames, "out", "fetch")["nkeys"] == 8
    assert only(frames, "in", "transfer_done")["success"] is True
    assert state.stores == [True]  # the late keys' pins, released once written
    assert_server_clean(server, state)


def test_fingerprint_exact_p2pfsm_client_vllm_server(procs: list[PeerProcess]) -> None:
    """A known difference: vLLM skips the check when either fingerprint is empty; p2pfsm
    requires equality, so without ``model_config`` it refuses a configured vLLM peer."""
    server, peer = start_vllm_server(procs)
    node = Node(NodeConfig(bind="tcp://127.0.0.1:0", num_blocks=1, block_len=BLOCK_LEN))
    try:
        session = node.connect(peer)
        node.run_until(lambda: not session.alive, 30)
        dead = node.deaths.get(peer)
        assert dead is not None and dead.mismatch is not None, session.state
        assert dead.mismatch.field == "config_fingerprint"
        node.run_until(lambda: False, 0.3)
    finally:
        node.close()
    summary = stop_vllm_server(server)
    # The rejection sent our one disconnect, so the session ended knowing the peer was
    # told: closing it sends nothing more (vLLM opens a session for any frame of an
    # identity it no longer knows; a second disconnect would leave an empty one there).
    frames = frames_of(summary)  # one vLLM session: no empty one opened by a late frame
    assert only(frames, "in", "connect")["config_fingerprint"] == ""
    only(frames, "in", "disconnect")  # p2pfsm says so, once; vLLM would stay silent
    assert not [t for t in types(frames, "in") if t in ("fetch", "lookup")]


# ====================================================== the CLI, once in each direction


def test_cli_fetch_against_vllm_server(procs: list[PeerProcess]) -> None:
    server, peer = start_vllm_server(procs)
    cmd = [sys.executable, "-m", "p2pfsm.tools.cli", "fetch", "--connect", f"tcp://{peer}",
           "--keys", "0-15", "--mode", "sym", "--fingerprint", FP]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    summary = stop_vllm_server(server)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["success"] and report["verified"] and report["hits"] == 16
    assert report["bytes"] == 16 * BLOCK_LEN
    frames = frames_of(summary)
    assert only(frames, "out", "transfer_done")["success"] is True


def test_cli_serve_against_vllm_client(procs: list[PeerProcess]) -> None:
    cmd = [sys.executable, "-m", "p2pfsm.tools.cli", "serve", "--bind", "tcp://127.0.0.1:0",
           "--blocks", str(SERVER_BLOCKS), "--fingerprint", FP]
    serve = PeerProcess(cmd, "p2pfsm-serve")
    procs.append(serve)
    line = serve.wait_for(
        lambda: next((ln for ln in serve.lines() if ln.startswith("serving ")), None),
        "serving line", 60)
    peer = line.rsplit("tcp://", 1)[1].strip()
    client = PeerProcess(vllm_argv("client", "--connect", peer, "--keys", "0-15"), "vllm-client")
    procs.append(client)
    result = client.record("result", 120)
    assert result["success"] and result["verified"], client.tail()
    assert result["landed"] == list(range(16))
    assert client.proc.wait(30) == 0, client.tail()  # it exits by itself once done
    assert serve.stop() == 0, serve.tail()


# ==================== one request id, used again (a vLLM scheduler may load in pieces)
#
# vLLM 0.33.0 restarts a request's round_seq at 0 once its client state is pruned (no
# load or probe left), and its PD producer supplies round 0 only (add_stored_blocks has
# no round). p2pfsm does the same whenever no frame of an earlier round can still arrive
# (docs/explanation/architecture.md), so all four directions serve the second use of the id.


def test_reuse_pd_vllm_client_p2pfsm_server(procs: list[PeerProcess],
                                            p2pfsm_server: Callable[..., P2pfsmServer]) -> None:
    server = p2pfsm_server()
    result, _ = vllm_client(procs, server, "--keys", "0-7", "--repeat", "2")
    first, second = result["attempts"]
    assert first["success"] and first["verified"], result["_tail"]
    dones = [f for f in vllm_frames(result) if f["type"] == "transfer_done"]
    assert [(d["round_seq"], d["success"]) for d in dones] == [(0, True), (0, True)]
    assert second["success"] and second["verified"], result["_tail"]
    assert_vllm_ok(result)


def test_reuse_sym_vllm_client_p2pfsm_server(procs: list[PeerProcess],
                                             p2pfsm_server: Callable[..., P2pfsmServer]) -> None:
    server = p2pfsm_server()
    result, _ = vllm_client(procs, server, "--keys", "0-7", "--mode", "sym", "--repeat", "2",
                            "--lookup-timeout", "5")
    first, second = result["attempts"]
    assert first["success"] and first["verified"], result["_tail"]
    frames = vllm_frames(result)
    assert types(frames, "in").count("lookup_resp") == 2
    assert second["success"] and second["verified"], result["_tail"]
    assert_vllm_ok(result)


def test_reuse_pd_p2pfsm_client_vllm_server(procs: list[PeerProcess]) -> None:
    server, peer = start_vllm_server(procs)
    runs = p2pfsm_client_runs(peer, list(range(8)), "pd", 2, load=3.0)
    summary = stop_vllm_server(server)
    first, second = runs
    assert first.load is not None and first.load.success and first.landed == list(range(8))
    frames = frames_of(summary)
    fetch_rounds = [f["round_seq"] for f in frames if f["type"] == "fetch"]
    aborts = [f["round_seq"] for f in frames if f["type"] == "abort_fetch"]
    assert fetch_rounds == [0, 0] and aborts == []
    assert second.load is not None and second.load.success
    assert second.landed == list(range(8))


def test_reuse_sym_p2pfsm_client_vllm_server(procs: list[PeerProcess]) -> None:
    server, peer = start_vllm_server(procs)
    runs = p2pfsm_client_runs(peer, list(range(8)), "sym", 2)
    summary = stop_vllm_server(server)
    for run in runs:
        assert run.load is not None and run.load.success and run.landed == list(range(8))
    # Like vLLM, p2pfsm restarts a request with nothing open at round 0.
    fetches = [f for f in frames_of(summary) if f["type"] == "fetch"]
    assert [f["round_seq"] for f in fetches] == [0, 0]
