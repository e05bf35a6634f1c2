"""What every role of the vLLM peer harness shares: its output lines, its stop flag, and
the transports, sessions and regions it builds the way vLLM's tier manager would.

Importing this module imports vLLM (with its logs sent to stderr unless the environment
says otherwise); it patches nothing (:mod:`p2pfsm.tools.vllm_peer.patches` does, when asked).
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from typing import Any

# vLLM reads these when it is first imported: keep its logs off stdout.
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

import numpy as np
import zmq
from vllm.v1.kv_offload.tiering.p2p.session import P2PSession

from p2pfsm.errors import ConfigError, TransportError
from p2pfsm.vllm.switch import current, current_data_transport, current_transport

MARK = "P2PINTEROP "
HOST = "127.0.0.1"
TICK_S = 0.001


class StopFlag:
    """Set once a signal asks the harness to stop (SIGTERM, SIGINT, its own alarm);
    every loop checks it."""

    def __init__(self) -> None:
        self.requested = False

    def __bool__(self) -> bool:
        return self.requested


STOP = StopFlag()


def wait_for_frames(transport: Any) -> None:
    """Block until a frame reaches the control transport, or TICK_S at most: NIXL
    completions and vLLM's timers have nothing to wait on, so they are looked at every
    tick. vLLM's transport is waited on at its ROUTER, p2pfsm's (the full install) with
    its ``wait``."""
    ms = max(1, round(TICK_S * 1000))
    wait = getattr(transport, "wait", None)
    if callable(wait):
        wait(ms)
    else:
        transport._router.poll(ms, zmq.POLLIN)


def new_session(*args: Any) -> P2PSession:
    """A session of the class vLLM's tier manager would build now: vLLM's own, or
    p2pfsm's once ``--adapter`` ran :func:`p2pfsm.vllm.install`."""
    return current()(*args)


def session_kind() -> str:
    return "vllm" if current() is P2PSession else "p2pfsm"


def emit(kind: str, **fields: Any) -> None:
    print(MARK + json.dumps({"kind": kind, **fields}, sort_keys=True), flush=True)



def parse_blocks(text: str) -> list[int]:
    """``"0-7"`` or ``"0-3,9999"`` -> block numbers; ``""`` -> []."""
    out: list[int] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        lo, sep, hi = part.partition("-")
        out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return out


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def bind_transport(port: int = 0) -> tuple[Any, str]:
    """A control transport (vLLM's ZmqTransport, or p2pfsm's after the full install) on
    loopback ``port`` (0: a free one); local_id is that exact
    "host:port"."""
    cls = current_transport()  # vLLM's, or p2pfsm's after the full install
    if port:
        return cls(f"{HOST}:{port}", HOST, port), f"{HOST}:{port}"
    for _ in range(20):
        port = free_port()
        local_id = f"{HOST}:{port}"
        try:
            return cls(local_id, HOST, port), local_id
        except (zmq.ZMQError, TransportError, ConfigError):
            continue
    raise RuntimeError("no free loopback port for the ROUTER")


def make_region(num_blocks: int, block_len: int) -> np.ndarray:
    return np.zeros((num_blocks, block_len), dtype=np.uint8)


def make_data(region: np.ndarray, config: dict[str, Any] | None) -> Any:
    """A data transport of the class vLLM's tier manager would build now: vLLM's
    ``NixlTransport``, or p2pfsm's after the full install."""
    data = current_data_transport()(f"vllm-interop-{uuid.uuid4().hex[:12]}",
                                    memoryview(region.data), config_fields=config)
    if not data.available:
        raise RuntimeError("vLLM found no NIXL (pip install --no-deps nixl==1.5.1 nixl-cu12)")
    return data
