"""Entry point of the flood process: well-formed connects from 127.0.0.1, each under a
new routing id, as fast as one process can send them, none of whose handshakes ever
finishes.

Every other id names an unbound port (the server's dial-back is refused); the rest name
a listener of this process that never accepts (TCP comes up, ZMTP never; the newest 125
listeners stay open). A process of its own, so that it does not share the legitimate
client's interpreter. It keeps at most 250 DEALERs open (each closed with a linger, so
its frame still goes out) and publishes how many connects it sent in ``sent``; any
message (or EOF) on ``conn`` stops it.

Every routing id is used once. A second connection under an id whose first one is still
open takes the id over (ROUTER_HANDOVER), and libzmq then stops reading the first one:
its close stays unread (CLOSE_WAIT) until the server's heartbeat PING ends it, past the
after-check's window (docs/explanation/reliability.md, Findings).
"""

from __future__ import annotations

import collections
import ctypes
import socket
from multiprocessing.connection import Connection

import zmq

from .wire import RawPeer, connect_msg, free_port, pack

OPEN_AT_ONCE = 250
UNDER_WAY = 1000
"""After this many connects the flood tells the test, once, on its pipe ("under way")."""


def flood_main(conn: Connection, server: str, metadata: bytes, base_addr: int,
               sent: ctypes.c_longlong) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, 8192)
    silent: collections.deque[socket.socket] = collections.deque()
    open_peers: collections.deque[RawPeer] = collections.deque()
    used: set[int] = set()
    try:
        count = 0
        while not conn.poll(0):
            if count % 2:
                lst = socket.socket()
                silent.append(lst)
                lst.bind(("127.0.0.1", 0))
                lst.listen(8)  # never accepted
                port = lst.getsockname()[1]
            else:
                port = free_port()
            if port in used:
                continue  # every id once (module docstring)
            used.add(port)
            ident = f"127.0.0.1:{port}"
            peer = RawPeer(ctx, server, identity=ident.encode(), bind=False)
            peer.dealer.setsockopt(zmq.LINGER, 2000)
            peer.send_raw(pack(connect_msg(ident, metadata, base_addr)))
            open_peers.append(peer)
            count += 1
            sent.value = count
            if count == UNDER_WAY:
                conn.send("under way")
            while len(open_peers) > OPEN_AT_ONCE:
                open_peers.popleft().close()
            while len(silent) > OPEN_AT_ONCE // 2:
                silent.popleft().close()
    except (EOFError, BrokenPipeError):
        pass
    finally:
        while open_peers:
            open_peers.popleft().close()
        ctx.destroy(linger=0)
        while silent:
            silent.popleft().close()
