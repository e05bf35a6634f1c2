"""Entry point of the helper process that the server sees freeze (SIGSTOP).

It builds its own NIXL agent for real metadata (the only p2pfsm code it runs: the
data plane, so the server's writes land somewhere), and speaks the protocol with the
raw pyzmq peer of ``wire.py``. It reports ``("ready",)`` after the handshake and, when
``fetch_blocks`` is non-zero, sends that fetch and stops itself at once, mid-round.
"""

from __future__ import annotations

import os
import signal
import uuid
from multiprocessing.connection import Connection

import zmq

from .wire import BLOCK_LEN, SERVED_BLOCKS, RawPeer, demo_key, fetch_msg


def helper_main(conn: Connection, server: str, fetch_blocks: int) -> None:
    from p2pfsm.executor.nixl.plane import DataPlane

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    plane = DataPlane(f"frozen-{uuid.uuid4().hex[:12]}", SERVED_BLOCKS, BLOCK_LEN)
    peer = RawPeer(ctx, server)
    try:
        peer.handshake(plane.metadata, plane.base_addr)
        conn.send(("ready", peer.peer_id))
        if fetch_blocks:
            peer.send(fetch_msg("frozen-fetch", [demo_key(i) for i in range(fetch_blocks)],
                                list(range(fetch_blocks))))
            os.kill(os.getpid(), signal.SIGSTOP)
        conn.recv()  # anything (or EOF) ends it
    except EOFError:
        pass
    finally:
        peer.close()
        plane.close()
        ctx.destroy(linger=0)
