# ruff: noqa: F811  (the fixtures imported from test_vllm_interop are parameters here)
"""p2pfsm's sessions inside vLLM 0.33.0 (``p2pfsm.vllm``): a drop-in for vLLM's own.

Each vLLM process is ``python -m p2pfsm.vllm.peer`` from ``.venv-vllm``, with vLLM's real
``ZmqTransport`` / ``ZmqConnection`` and ``NixlTransport``; ``--adapter`` makes it run
p2pfsm's sessions through :func:`p2pfsm.vllm.install`. The adapter plays against a stock
vLLM process in both roles and, as a client, against a p2pfsm node; every byte is checked
against ``p2pfsm.demo.blocks``. One server process serves several client runs where the
runs cannot disturb each other (different request ids), to keep the suite's time down.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any

import pytest
from test_vllm_interop import (  # type: ignore[import-not-found]
    MISSING,
    VLLM_PYTHON,
    P2pfsmServer,
    PeerProcess,
    _opt_in,  # noqa: F401  (the suite's opt-in, autouse here too)
    assert_server_clean,
    frames_of,
    only,
    p2pfsm_server,  # noqa: F401  (fixture)
    procs,  # noqa: F401  (fixture)
    start_vllm_server,
    stop_vllm_server,
    types,
    vllm_argv,
    vllm_client,
    vllm_frames,
)
from test_vllm_interop import pytestmark as _marks  # type: ignore[import-not-found]

pytestmark = _marks

# A server that serves several clients one after another outlives the default bound
# (120 s) on a busy machine, where each client takes seconds just to import vLLM.
LONG = ("--max-seconds", "400")


def run_client(procs: list[PeerProcess], peer: str, *args: str) -> dict[str, Any]:
    """One vLLM client process against ``peer``; its result line, once it exited."""
    client = PeerProcess(vllm_argv("client", "--connect", peer, *args), "vllm-client")
    procs.append(client)
    result: dict[str, Any] = client.record("result", 120)
    result["_rc"] = client.proc.wait(30)
    result["_tail"] = client.tail()
    return result


def verified(result: dict[str, Any], blocks: list[int]) -> None:
    assert result["ready"], result["_tail"]
    assert result["success"] and result["verified"], result["_tail"]
    assert result["landed"] == blocks, result["_tail"]
    assert result["_rc"] == 0, result["_tail"]


# ------------------------------------------------------------------------ the switch


SWITCH_SCRIPT = """
import os, importlib
import vllm.v1.kv_offload.tiering.p2p.session as pkg
import p2pfsm.vllm as pv
from p2pfsm.vllm.session import P2PSession as Adapter
from p2pfsm.vllm import autoinstall
stock = pkg.P2PSession
assert stock is not Adapter and not pv.installed()
pv.install(); pv.install()
assert pv.installed() and pkg.P2PSession is Adapter
from vllm.v1.kv_offload.tiering.p2p.session import P2PSession as later
assert later is Adapter  # what a manager imported afterwards builds with
pv.uninstall(); pv.uninstall()
assert pkg.P2PSession is stock and not pv.installed()
os.environ.pop(autoinstall.ENV_VAR, None)
autoinstall.register()
assert pkg.P2PSession is stock
os.environ[autoinstall.ENV_VAR] = "1"
autoinstall.register()
assert pkg.P2PSession is Adapter
pv.uninstall()
print("switch ok")
"""


def test_install_uninstall_idempotent_and_env_var() -> None:
    done = subprocess.run([str(VLLM_PYTHON), "-c", SWITCH_SCRIPT], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and "switch ok" in done.stdout, done.stdout + done.stderr


def test_package_imports_without_vllm() -> None:
    import p2pfsm.vllm  # this venv has no vLLM

    assert callable(p2pfsm.vllm.install)
    with pytest.raises(ModuleNotFoundError):
        p2pfsm.vllm.install()


# ------------------------------------------- adapter server, stock vLLM clients


def test_adapter_server_stock_clients(procs: list[PeerProcess]) -> None:
    """PD, demand (4 and 5 stored 1 s late), abort after the load timeout, lookup with a
    HIT_PENDING key turning into a hit, and no hits: one adapter server, five clients."""
    server, peer = start_vllm_server(procs, "--adapter", "--hold-back", "4,5",
                                     "--late-after", "1.0", *LONG)
    demand = run_client(procs, peer, "--keys", "0-7")
    verified(demand, list(range(8)))
    assert demand["seconds"] >= 0.9, "the round ended before the late blocks were stored"
    happy = run_client(procs, peer, "--keys", "8-11")
    verified(happy, list(range(8, 12)))
    abort = run_client(procs, peer, "--keys", f"0-3,{MISSING}", "--load-timeout", "3")
    assert abort["ready"] and not abort["success"], abort["_tail"]
    assert abort["landed"] == [0, 1, 2, 3], abort["_tail"]
    assert only(vllm_frames(abort), "in", "abort_ack")["round_seq"] == 0
    sym = run_client(procs, peer, "--keys", f"0-6,{MISSING}", "--mode", "sym")
    verified(sym, list(range(7)))
    assert only(vllm_frames(sym), "in", "lookup_resp")["hits"] == [True] * 7 + [False]
    nohit = run_client(procs, peer, "--keys", f"{MISSING - 1}-{MISSING}", "--mode", "sym")
    assert nohit["success"] and nohit["chosen"] == [], nohit["_tail"]
    summary = stop_vllm_server(server)
    assert len(summary["peers"]) == 5
    assert all(p["reason"] == "peer disconnected" for p in summary["peers"]), summary["peers"]
    # Every store job got exactly one result: supplies and lookup pins.
    jobs = [s["job_id"] for s in summary["stores"]]
    assert len(jobs) == len(set(jobs)), summary["stores"]
    created = [e for e in summary["events"]
               if e["event"] in ("add_stored_blocks", "parent.create_store_job")]
    assert sorted(jobs) == sorted(e["job_id"] for e in created), (jobs, created)
    events = [e["event"] for e in summary["events"]]
    assert events.count("parent.on_new_request") == events.count("parent.on_request_finished")
    terminal = [f for p in summary["peers"] for f in p["frames"]
                if f["type"] == "fetch" and f["dir"] == "in" and f["nkeys"] == 0]
    assert len(terminal) == 1  # the no-hit lookup's terminal fetch


def test_adapter_server_host_finish(procs: list[PeerProcess]) -> None:
    server, peer = start_vllm_server(procs, "--adapter", "--finish-after", "1.0")
    result = run_client(procs, peer, "--keys", f"0-3,{MISSING}")
    summary = stop_vllm_server(server)
    assert result["ready"] and not result["success"], result["_tail"]
    assert 0.9 <= result["seconds"] < 10.0 and result["landed"] == [0, 1, 2, 3]
    frames = frames_of(summary)
    assert only(frames, "out", "transfer_done")["success"] is False
    assert "abort_fetch" not in types(frames, "in")


# ------------------------------------------- stock vLLM server, adapter clients


def test_stock_server_adapter_clients(procs: list[PeerProcess]) -> None:
    """The same flows with the roles swapped, plus one request id used twice."""
    server, peer = start_vllm_server(procs, "--hold-back", "4,5", "--late-after", "1.0",
                                     *LONG)
    demand = run_client(procs, peer, "--adapter", "--keys", "0-7")
    verified(demand, list(range(8)))
    assert demand["seconds"] >= 0.9
    assert demand["sessions"] == "p2pfsm"
    abort = run_client(procs, peer, "--adapter", "--keys", f"0-3,{MISSING}",
                       "--load-timeout", "3")
    assert abort["ready"] and not abort["success"], abort["_tail"]
    assert abort["landed"] == [0, 1, 2, 3], abort["_tail"]
    assert 2.9 <= abort["seconds"] < 9.0
    frames = vllm_frames(abort)
    assert only(frames, "out", "abort_fetch")["round_seq"] == 0
    assert "transfer_done" not in types(frames, "in")
    sym = run_client(procs, peer, "--adapter", "--keys", f"0-6,{MISSING}", "--mode", "sym")
    verified(sym, list(range(7)))
    nohit = run_client(procs, peer, "--adapter", "--keys", f"{MISSING - 1}-{MISSING}",
                       "--mode", "sym")
    assert nohit["success"] and nohit["chosen"] == [], nohit["_tail"]
    terminal = only(vllm_frames(nohit), "out", "fetch")
    assert terminal["nkeys"] == 0 and terminal["round_seq"] == 0
    reuse = run_client(procs, peer, "--adapter", "--keys", "8-11", "--repeat", "2")
    assert [a["verified"] for a in reuse["attempts"]] == [True, True], reuse["_tail"]
    dones = [f for f in vllm_frames(reuse) if f["type"] == "transfer_done"]
    assert [(d["round_seq"], d["success"]) for d in dones] == [(0, True), (0, True)]
    summary = stop_vllm_server(server)
    assert all(s["success"] for s in summary["stores"][:2]), summary["stores"]


def test_stock_server_finish_adapter_client(procs: list[PeerProcess]) -> None:
    server, peer = start_vllm_server(procs, "--finish-after", "1.0")
    result = run_client(procs, peer, "--adapter", "--keys", f"0-3,{MISSING}")
    stop_vllm_server(server)
    assert result["ready"] and not result["success"], result["_tail"]
    assert 0.9 <= result["seconds"] < 10.0 and result["landed"] == [0, 1, 2, 3]
    assert only(vllm_frames(result), "in", "transfer_done")["success"] is False


# ------------------------------------------------ adapter client, p2pfsm server


@pytest.mark.parametrize("mode,keys,hits", [("pd", "0-7", 8), ("sym", f"0-6,{MISSING}", 7)])
def test_adapter_client_p2pfsm_server(procs: list[PeerProcess],
                                      p2pfsm_server: Callable[..., P2pfsmServer],
                                      mode: str, keys: str, hits: int) -> None:
    server = p2pfsm_server(hold_back=(4, 5), late_after=1.0) if mode == "pd" else p2pfsm_server()
    result, state = vllm_client(procs, server, "--adapter", "--keys", keys, "--mode", mode)
    assert result["ready"] and result["success"] and result["verified"], result["_tail"]
    assert result["landed"] == list(range(hits))
    assert only(vllm_frames(result), "in", "transfer_done")["success"] is True
    assert_server_clean(server, state)
