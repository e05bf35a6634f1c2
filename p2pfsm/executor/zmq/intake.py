"""A control plane's inbound side: the frames its ROUTER receives, and who is let in.

Every message at the ROUTER is ``[routing id, frame]``; the routing id is the sender's
``local_id``. What the raw pattern (vLLM's: dial back on any frame) does not, this does:

* routing ids are parsed strictly (ASCII ``host:port``; host an IPv4 literal, a bracketed
  IPv6 literal or an RFC 1123 name; port a canonical decimal in 1..65535) and anything
  else is dropped instead of crashing the loop;
* messages with other than exactly two frames are dropped;
* a known identity's frames on a new connection (its last one ended: a live id is read
  on one connection only, a twin's never) are let in only from the IP its last
  connection came from (else ``"address mismatch"``), unless ``dial_back_any_host``;
* the number of peers is capped (frames from new identities beyond ``max_peers`` are
  dropped).

Hardening a node turns on:

* ``dial_back_check``: a frame from an identity with no DEALER is dialled back only when
  the check accepts it (the node passes
  :func:`~p2pfsm.executor.zmq.admission.is_connect_from`: a well-formed connect whose
  ``peer_id`` is the identity); anything else is dropped, counted as
  ``"not a connect"`` and logged at debug (rate-limited). One stray frame can no longer
  make the node dial a third party.
* the dial-back goes only to the host the connection came from (each message's
  ``Peer-Address``): an identity naming another host (or a host name) is dropped as
  ``"address mismatch"`` unless ``dial_back_any_host`` (peers behind NAT).
* ``max_pending``: dial-backs whose session is not ready yet (:meth:`ControlPlane.
  mark_ready` not called) have a budget of their own; when it is full one is evicted
  (``PeerLost(reason="evicted: too many unfinished handshakes")``): a session already
  over, else one of the host (the connection's address) holding the most pending
  dial-backs, the newcomer's own host on a tie, preferring one whose ZMTP handshake has
  not succeeded, oldest first (:meth:`~p2pfsm.executor.zmq.dealers.Dealers.make_room`). A
  flood from one host thus only evicts its own, and inside a host a dial-back that came
  up outlives those that did not. Ready peers and our own dials count against
  ``max_peers``, so identities that never finish a handshake cannot lock a legitimate
  peer out.
* ``max_new_peers_per_s``: each source host (the connection's address, as for
  ``max_pending``) may have at most that many new identities admitted a second, with a
  burst of as many (:class:`~p2pfsm.executor.zmq.admission.NewPeerRate`). Past it the frame
  of a new identity is dropped at the door like one past ``max_peers`` (no dial-back,
  nothing kept for the identity), counted as ``"new identity rate"`` and logged at
  warning (one line per 10 s). Only an identity about to be dialled back is charged:
  frames of known peers, our own dials and a lately lost peer coming back never are, nor
  is a frame dropped for another reason. Per host, so a flood from one host never stops
  another's newcomers.
* dial-backs themselves are bounded in rate whatever the identity: each identity is
  dialled back at most ``DIAL_BACKS_PER_ID_S`` times a second (a burst of as many), so a
  connect re-sent in a loop costs one dial-back per half second, not one each; and,
  with ``max_new_peers_per_s``, a host's lately lost identities coming back (exempt
  from the new-identity charge) share a bucket of that rate per host. Past either the
  frame is dropped as ``"dial-back rate"`` and logged at warning (one line per 10 s).
  In flight, an identity has at most one dial-back (its DEALER), and a host at most the
  pending budget's (it evicts its own first).
* ``curve``: an identity is dialled back only when its connection authenticated with a
  key on the allow-list (ZAP User-Id), and with that key.

(:class:`~p2pfsm.executor.zmq.plane.ControlPlane` documents each option.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

import zmq

from p2pfsm.errors import TransportError
from p2pfsm.executor.zmq.admission import NewPeerRate
from p2pfsm.executor.zmq.curve import CurveKeys, router_refusals
from p2pfsm.executor.zmq.dealers import Dealers
from p2pfsm.executor.zmq.events import ControlEvent, FrameIn, conn_of, frame_meta
from p2pfsm.executor.zmq.peer_ids import ip_of, origin_of, parse_peer_id
from p2pfsm.logwindow import LogWindow

__all__ = ["RATE_LIMITED", "RouterIntake"]

log = logging.getLogger("p2pfsm.zmq")

RATE_LIMITED: Final = "new identity rate"
""":attr:`ControlPlane.drop_counts` reason of a new identity refused by the
``max_new_peers_per_s`` rate limit."""
DIAL_RATE_LIMITED: Final = "dial-back rate"
""":attr:`ControlPlane.drop_counts` reason of a frame refused because its identity (or,
for identities lost lately, its host) was dialled back as often as allowed lately."""
DIAL_BACKS_PER_ID_S: Final = 2
"""Dial-backs one identity may have a second (a burst of as many)."""

_POLLIN: Final = int(zmq.POLLIN)  # plain ints: enum arithmetic costs on every turn
_EVENTS: Final = int(zmq.EVENTS)
_DROP_LOG_BURST: Final = 10
_DROP_LOG_WINDOW_S: Final = 10.0


def _ip_text(source: str | None) -> str | None:
    """The IP of a ``Peer-Address``, as text (None when there is none)."""
    ip = None if source is None else ip_of(source)
    return None if ip is None else str(ip)


class RouterIntake:
    """Reads the ROUTER (and, with CURVE, its monitor of refused handshakes), lets each
    frame in or drops it by reason, and opens the DEALER of a newcomer let in."""

    def __init__(
        self, router: zmq.Socket[bytes], router_monitor: zmq.Socket[bytes] | None,
        dealers: Dealers, local_id: str, *, max_batch: int, max_peers: int,
        max_pending: int | None, dial_back_check: Callable[[str, bytes], bool] | None,
        holds_session: Callable[[str], bool] | None, any_host: bool,
        curve: CurveKeys | None, rate: NewPeerRate | None, rate_clock: Callable[[], float],
    ) -> None:
        self._router = router
        self._router_monitor = router_monitor
        self._dealers = dealers
        self._local_id = local_id
        self._max_batch = max_batch
        self._max_peers = max_peers
        self._max_pending = max_pending
        self._dial_back_check = dial_back_check
        self._holds_session = holds_session
        self._any_host = any_host
        self._curve = curve
        self._rate = rate
        self._rate_clock = rate_clock
        # Dial-backs per identity, and per host for identities lost lately.
        self._dial_rate = NewPeerRate(DIAL_BACKS_PER_ID_S)
        self._back_rate = None if rate is None else NewPeerRate(rate.rate)
        self._rate_log = LogWindow(1, _DROP_LOG_WINDOW_S)  # rate-limited warnings
        self.drops: dict[str, int] = {}
        self.rate_drops = 0
        """The drops for a rate (``RATE_LIMITED``, ``DIAL_RATE_LIMITED``) so far."""
        self._drop_log = LogWindow(_DROP_LOG_BURST, _DROP_LOG_WINDOW_S)  # debug lines
        self.more = False  # the last drain stopped at max_batch

    def held(self, peer_id: str) -> bool:
        """The node still holds a session of ``peer_id`` that is over (``holds_session``)."""
        return self._holds_session is not None and self._holds_session(peer_id)

    def drain(self, out: list[ControlEvent]) -> None:
        """Append the frames let in, at most ``max_batch`` of them, to ``out``."""
        self.more = True  # until it is seen empty
        for _ in range(self._max_batch):
            # Checking EVENTS first avoids raising zmq.Again on every empty poll.
            if not int(self._router.getsockopt(_EVENTS)) & _POLLIN:
                self.more = False
                return
            try:
                parts = self._router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                self.more = False
                return
            if len(parts) != 2:
                self._drop("frame count")
                continue
            ident, frame = parts[0].bytes, parts[1].bytes
            peer_id = self._admit(ident, frame, parts[1])
            if peer_id is not None:
                out.append(FrameIn(peer_id, frame, conn_of(parts[1])))

    def drain_refusals(self) -> None:
        """Count the handshakes our ROUTER refused (CURVE only; logged by
        :func:`~p2pfsm.executor.zmq.curve.router_refusals`)."""
        if self._router_monitor is not None:
            for reason in router_refusals(self._router_monitor, self._local_id,
                                          self._max_batch):
                self._drop(reason)

    def _lost_from(self, peer_id: str, host: str, message: zmq.Frame) -> bool:
        """``peer_id`` was lost lately, or the node still holds its session that is over,
        and this message comes from its host."""
        if not self._dealers.remembered(peer_id) and not self.held(peer_id):
            return False
        source = frame_meta(message, "Peer-Address")
        return self._any_host or (source is not None and ip_of(host) == ip_of(source)
                                  and ip_of(host) is not None)

    def _drop(self, reason: str, detail: str = "") -> None:
        self.drops[reason] = self.drops.get(reason, 0) + 1
        if reason in (RATE_LIMITED, DIAL_RATE_LIMITED):
            self.rate_drops += 1
        if log.isEnabledFor(logging.DEBUG):
            self._drop_log.emit(log.debug, "dropped inbound messages",
                                "dropped an inbound message: %s%s", reason, detail)

    def _admit(self, ident: bytes, frame: bytes, message: zmq.Frame) -> str | None:
        """The peer id for a routing id, dialling back unknown ones; None = drop."""
        dealers = self._dealers
        known = dealers.by_ident.get(ident)
        if known is not None and known in dealers.peers:
            peer = dealers.peers[known]
            conn = conn_of(message)
            if conn != peer.conn:
                # A new connection under a known id (libzmq hands a live id to no other
                # connection, so the last one ended): let in only from the IP the last
                # one came from.
                source = _ip_text(frame_meta(message, "Peer-Address"))
                if (peer.conn >= 0 and not self._any_host and source != peer.source):
                    self._drop("address mismatch", f": known identity {known} came from "
                               f"{source}, its last connection from {peer.source}")
                    return None
                peer.conn, peer.source = conn, source
            if peer.done and (self._dial_back_check is None
                              or self._dial_back_check(known, frame)):
                peer.done = False  # a restarted peer: pending again, not first to go
                peer.done_at = None
            return known
        try:
            host, _port = parse_peer_id(ident)
        except TransportError:
            self._drop("bad identity")
            return None
        peer_id = ident.decode("ascii")
        if peer_id in dealers.peers:
            dealers.by_ident[ident] = peer_id
            return self._admit(ident, frame, message)  # known now (done grace, as above)
        if peer_id == self._local_id:
            self._drop("own identity")
            return None
        if self._dial_back_check is not None and not self._dial_back_check(peer_id, frame):
            if self._lost_from(peer_id, host, message):
                return peer_id  # no dial-back: the node's dead session may answer()
            self._drop("not a connect", f" from unknown identity {peer_id}")
            return None
        source = frame_meta(message, "Peer-Address")
        if not self._any_host:
            ip = ip_of(host)
            if ip is None or source is None or ip != ip_of(source):
                self._drop("address mismatch",
                           f": identity {peer_id} came from {source or 'an unknown address'}")
                return None
        server_key = None
        if self._curve is not None:
            user = frame_meta(message, "User-Id")
            server_key = None if user is None else user.encode("ascii", "replace")
            if server_key not in self._curve.allow:
                self._drop("no authenticated key", f": {peer_id} from {source}")
                return None
        if dealers.settled() >= self._max_peers:
            self._drop("peer limit", f": {peer_id}")
            return None
        origin = origin_of(host, source)
        now = self._rate_clock()
        remembered = dealers.remembered(peer_id)
        back = self._back_rate if remembered else None
        if not self._dial_rate.take(peer_id, now) or (
                back is not None and not back.take(origin, now)):
            self._refuse_dial(peer_id, origin, now)
            return None
        rate = self._rate
        if rate is not None and not remembered:
            if not rate.take(origin, now):
                self._refuse_rate(peer_id, origin, now)
                return None
        else:
            rate = None  # nothing charged: nothing to give back
        if self._max_pending is not None:
            dealers.make_room(origin)
        try:
            dealers.open(peer_id, server_key, dialled_back=True, origin=origin)
        except TransportError:
            if rate is not None:
                rate.refund(origin)
            self._drop("dial-back failed", f": {peer_id}")
            return None
        dealers.by_ident[ident] = peer_id
        return peer_id

    def _refuse_dial(self, peer_id: str, origin: str, now: float) -> None:
        """Drop a frame whose dial-back is past the rate of its identity or host:
        counted, and logged at warning at most once per ``_DROP_LOG_WINDOW_S``."""
        self._drop(DIAL_RATE_LIMITED, f": {peer_id} from {origin}")
        self._rate_log.emit(log.warning, "frames past the dial-back rate",
                            "dial-backs past their rate: dropped a connect of %s from %s "
                            "(at most %d a second per identity)", peer_id, origin,
                            DIAL_BACKS_PER_ID_S, now=now)

    def _refuse_rate(self, peer_id: str, origin: str, now: float) -> None:
        """Drop a new identity past ``max_new_peers_per_s``: counted, and logged at
        warning at most once per ``_DROP_LOG_WINDOW_S`` (with how many were left out)."""
        self._drop(RATE_LIMITED, f": {peer_id} from {origin}")
        assert self._rate is not None
        self._rate_log.emit(log.warning, "new identities past the rate",
                            "new identities past %d a second from one host: dropped %s "
                            "from %s", self._rate.rate, peer_id, origin, now=now)
