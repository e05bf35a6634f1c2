"""A scripted consumer that breaks the abort, disconnect and restart rules, for the
conformance suite's own tests.

``python tests/helpers/fake_consumer.py HOST:PORT MODE``: connects to the producer at
``HOST:PORT`` (p2pfsm's ControlPlane, a real NIXL agent for its metadata), fetches demo
blocks 0-3 of one request into its blocks 0-3, and aborts that round 1 s later. Then:

- ``frees``: 1 s after the abort, acked or not, it fetches the request again (round 1)
  into the same blocks, as a consumer that frees its destination on a timeout would;
- ``reuse``: once the abort is acked, it fetches the request again as round 0.

It exits 1 once the second fetch is answered (or after 30 s): it never reports success.

- ``claims``: no abort; it exits 0 (a load it claims succeeded) as soon as a disconnect
  comes, or 2 s after its fetch with no answer, as a consumer would that reports a load
  whose producer went away.
"""

from __future__ import annotations

import sys
import time

from p2pfsm.demo_blocks import demo_key
from p2pfsm.executor.nixl.plane import DataPlane
from p2pfsm.executor.zmq.plane import ControlPlane, FrameIn
from p2pfsm.protocol import (
    AbortAck,
    AbortFetch,
    Connect,
    ConnectAck,
    Disconnect,
    Fetch,
    TransferDone,
    decode,
    encode,
)

BLOCK_LEN = 4096
RID = "fake-consumer"
KEYS = tuple(demo_key(b) for b in range(4))
LIFETIME_S = 30.0
CLAIM_AFTER_S = 2.0


def main(peer: str, mode: str) -> int:
    """Run the script against ``peer``; the exit status."""
    control = ControlPlane("tcp://127.0.0.1:0")
    data = DataPlane("conform-fake-consumer", 16, BLOCK_LEN)
    me = control.local_id
    try:
        control.connect(peer)
        control.send(peer, encode(Connect(me, data.metadata, data.base_addr, data.num_blocks,
                                          BLOCK_LEN, "", "vllm-none-hash")))
        fetched_at = aborted_at = None
        again = False
        end = time.monotonic() + LIFETIME_S
        while time.monotonic() < end:
            for ev in control.poll(10):
                if not isinstance(ev, FrameIn):
                    continue
                msg = decode(ev.frame)
                if isinstance(msg, Connect):
                    control.send(peer, encode(ConnectAck(me)))
                elif isinstance(msg, ConnectAck) and fetched_at is None:
                    control.send(peer, encode(Fetch(RID, KEYS, (0, 1, 2, 3), 0)))
                    fetched_at = time.monotonic()
                elif isinstance(msg, AbortAck) and mode == "reuse" and not again:
                    control.send(peer, encode(Fetch(RID, KEYS, (0, 1, 2, 3), 0)))
                    again = True
                elif isinstance(msg, TransferDone) and again:
                    return 1
                elif isinstance(msg, Disconnect) and mode == "claims":
                    return 0
            now = time.monotonic()
            if mode == "claims":
                if fetched_at is not None and now - fetched_at > CLAIM_AFTER_S:
                    return 0
                continue
            if fetched_at is not None and aborted_at is None and now - fetched_at > 1.0:
                control.send(peer, encode(AbortFetch(RID, 0)))
                aborted_at = now
            if mode == "frees" and aborted_at is not None and not again \
                    and now - aborted_at > 1.0:
                control.send(peer, encode(Fetch(RID, KEYS, (0, 1, 2, 3), 1)))
                again = True
        return 1
    finally:
        control.close()
        data.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))  # a trailing {repeat} is ignored
