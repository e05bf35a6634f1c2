"""Dealers short of descriptors or of ZeroMQ sockets for a dial-back (real libzmq).

A flood of connects brings a node near its descriptor limit (the hostile suite's 800
identities: an inbound connection each, and three sockets per dial-back). A dial-back
that cannot be had must be refused (the control plane drops the connect as "dial-back
failed"), never an error out of the control plane's poll, nor libzmq's abort when it
resolves the source address without a descriptor to spare.
"""

from __future__ import annotations

import select
from collections.abc import Iterator

import pytest
import zmq

from p2pfsm.errors import TransportError
from p2pfsm.executor.fds import HEADROOM
from p2pfsm.executor.zmq.dealers import Dealers
from p2pfsm.executor.zmq.heartbeats import Heartbeats
from tests.helpers.descriptors import descriptors_left

ONE_DIAL = 3
"""Sockets one DEALER costs: itself, its monitor's PAIR inside libzmq, and ours."""


@pytest.fixture
def dealers() -> Iterator[Dealers]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, ONE_DIAL)  # room for one dial-back (EMFILE past it)
    epoll = select.epoll()
    made = Dealers(ctx, epoll, b"127.0.0.1:1", heartbeats=Heartbeats.checked(0, 0, 0),
                   sndhwm=16, rcvhwm=16, linger_ms=0, immediate=True,
                   connect_timeout_ms=10_000, curve=None, source=None, max_peers=8,
                   max_pending=None)
    try:
        yield made
    finally:
        for peer in list(made.peers.values()):
            made.teardown(peer, 0)
        epoll.close()
        ctx.term()


def test_a_dealer_with_no_socket_left_is_a_transport_error(dealers: Dealers) -> None:
    first = dealers.open("127.0.0.1:9", None, dialled_back=True)
    with pytest.raises(TransportError, match=r"cannot open DEALER to 127\.0\.0\.1:10"):
        dealers.open("127.0.0.1:10", None, dialled_back=True)
    assert list(dealers.peers) == ["127.0.0.1:9"]
    dealers.teardown(first, 0)  # its sockets free again once libzmq reaps them


def test_a_dial_back_short_of_descriptors_is_refused_before_libzmq(dealers: Dealers) -> None:
    with descriptors_left(HEADROOM // 2), pytest.raises(TransportError,
                                                        match="descriptors free"):
        dealers.open("127.0.0.1:9", None, dialled_back=True)
    assert dealers.peers == {}
    dealers.open("127.0.0.1:9", None, dialled_back=True)  # with descriptors to spare
    assert list(dealers.peers) == ["127.0.0.1:9"]
