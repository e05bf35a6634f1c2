"""A guard on vLLM's ZeroMQ control transport, turned on by :func:`p2pfsm.vllm.install`.

vLLM's ``ZmqTransport`` dials back every routing identity that sends it any frame that
decodes, and parses the identity as it goes: one frame with a bad identity ends the
process, and frames that are not a connect open sessions. :func:`install` replaces two
of its methods (``ZmqTransport._recv_router``, ``ZmqConnection.close``) and the module
function that sets socket options (never at import time; :func:`uninstall` puts vLLM's
back) so that a node on the adapter refuses what p2pfsm's own node refuses:

* a frame from an identity with no connection opens one (a dial-back) only when it is a
  well-formed connect (p2pfsm's own decoder and :class:`GuardConfig` limits, so
  ``num_blocks`` above ``max_num_blocks`` is refused before any NIXL registration) whose
  ``peer_id`` is that identity and whose host, when it is an IP literal (or
  ``localhost``), is the address the frame came from; anything else is dropped and
  counted (:func:`drops`), and no exception escapes;
* an identity that does not parse as ``host:port`` (no colon, not ASCII, a port that is
  not a number in 1..65535) is dropped before anything uses it;
* every socket the transport opens refuses frames above ``max_frame_bytes`` before
  allocating them (libzmq ``MAXMSGSIZE``: the connection is dropped);
* dial-backs whose peer has not sent ``connect_ack`` yet have a budget
  (``max_pending``); when it is full, one of the host holding the most of them (the
  newcomer's on a tie), oldest first, is marked dead, so the transport closes it and its
  session ends: identities that never finish a handshake cannot exhaust descriptors;
* a connection's DEALER monitor is detached before its PAIR socket is closed (closing
  the PAIR first can wedge libzmq's I/O thread and with it every new peer).

Settings come from the environment when :func:`install` runs (docs/explanation/vllm.md);
``P2PFSM_VLLM_GUARD=0`` makes :func:`p2pfsm.vllm.install` leave vLLM's transport as it
is (the adapter's sessions still bound ``num_blocks``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from p2pfsm.errors import TransportError
from p2pfsm.executor.zmq.admission import is_connect_from
from p2pfsm.executor.zmq.peer_ids import ip_of, origin_of, parse_peer_id
from p2pfsm.executor.zmq.plane import frame_meta
from p2pfsm.protocol import Limits

log = logging.getLogger("p2pfsm.vllm.guard")

ZMQ_MODULE = "vllm.v1.kv_offload.tiering.p2p.control.zmq"
ENV_MAX_PENDING = "P2PFSM_VLLM_MAX_PENDING"
ENV_MAX_FRAME = "P2PFSM_VLLM_MAX_FRAME_BYTES"
ENV_MAX_BLOCKS = "P2PFSM_VLLM_MAX_PEER_BLOCKS"
ENV_ANY_HOST = "P2PFSM_VLLM_DIAL_BACK_ANY_HOST"
ENV_GUARD = "P2PFSM_VLLM_GUARD"
FRAMES_PER_POLL = 256
"""Most frames one poll reads off the ROUTER; the rest wait in ZeroMQ's per-peer queues
(bounded by their high-water marks) for the next poll. vLLM's tier manager handles what
one poll read before it polls again, so this bounds one tick's work: a peer flooding
frames is read in turn with every other (the ROUTER queues per peer, fairly) instead of
making each tick, and with it a newcomer's handshake, wait behind thousands of its
frames."""


@dataclass(frozen=True)
class GuardConfig:
    """The guard's bounds.

    Attributes:
        max_pending: dial-backs whose peer has not sent ``connect_ack`` yet.
        max_frame_bytes: longest frame any of the transport's sockets accepts.
        max_num_blocks: most blocks a peer's connect may advertise (vLLM's data plane
            builds one NIXL descriptor per advertised block when it registers the peer).
        dial_back_any_host: dial back an identity naming another host than the address
            its frame came from (peers behind NAT).
    """

    max_pending: int = 32
    max_frame_bytes: int = 16 << 20
    max_num_blocks: int = 1 << 20
    dial_back_any_host: bool = False

    @property
    def limits(self) -> Limits:
        """p2pfsm's frame limits with this config's bounds."""
        return Limits(max_frame_bytes=self.max_frame_bytes,
                      max_metadata_bytes=self.max_frame_bytes,
                      max_num_blocks=self.max_num_blocks)

    @classmethod
    def from_env(cls) -> GuardConfig:
        """The defaults, with what the environment sets (module docstring)."""
        base = cls()
        return cls(max_pending=_env_int(ENV_MAX_PENDING, base.max_pending),
                   max_frame_bytes=_env_int(ENV_MAX_FRAME, base.max_frame_bytes),
                   max_num_blocks=_env_int(ENV_MAX_BLOCKS, base.max_num_blocks),
                   dial_back_any_host=os.environ.get(ENV_ANY_HOST, "").strip() == "1")


def _env_int(name: str, default: int) -> int:
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    value = int(text)
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {text!r}")
    return value


@dataclass
class _State:
    """What the guard keeps per transport: pending dial-backs (peer id -> origin host)
    and the count of frames dropped, per reason."""

    pending: OrderedDict[str, str] = field(default_factory=OrderedDict)
    drops: dict[str, int] = field(default_factory=dict)

    def drop(self, reason: str, detail: str = "") -> None:
        self.drops[reason] = self.drops.get(reason, 0) + 1
        if self.drops[reason] == 1 or log.isEnabledFor(logging.DEBUG):
            log.warning("vLLM control transport: frame dropped (%s)%s", reason, detail)


_config = GuardConfig()
_originals: dict[str, Any] = {}


def _no_decoder(data: bytes) -> Any:
    raise RuntimeError("no msgpack decoder before install()")


_decode: Callable[[bytes], Any] = _no_decoder  # vLLM's (msgspec), set by install()


def config() -> GuardConfig:
    """The bounds in force (set by the last :func:`install`)."""
    return _config


def limits() -> Limits:
    """The frame limits the adapter's sessions check with while the guard is installed."""
    return _config.limits


def _state(transport: Any) -> _State:
    state = transport.__dict__.get("_p2pfsm_guard")
    if state is None:
        state = transport.__dict__["_p2pfsm_guard"] = _State()
    return state  # type: ignore[no-any-return]


def drops(transport: Any) -> dict[str, int]:
    """Frames the guard dropped on ``transport``, per reason."""
    return dict(_state(transport).drops)


def pending(transport: Any) -> list[str]:
    """Peer ids of the dial-backs still in the pending budget, oldest first."""
    return list(_state(transport).pending)


def _apply_socket_options(sock: zmq.Socket[Any]) -> None:
    """vLLM's heartbeat options, then our frame bound (before the socket binds or
    connects, so that every connection has it)."""
    _originals["_apply_heartbeat"](sock)
    sock.setsockopt(zmq.MAXMSGSIZE, _config.max_frame_bytes)


def _close_monitor_first(self: Any) -> None:
    """vLLM's close, with the DEALER's monitor detached first (module docstring)."""
    if not self._closed:
        with contextlib.suppress(zmq.ZMQError):
            self._sockets.dealer.disable_monitor()
    _originals["close"](self)


def _same_host(host: str, source: str | None) -> bool:
    """Whether a dial-back to ``host`` goes where the frame came from (``source``): an IP
    literal must be that address, ``localhost`` a loopback one; another host name is
    taken as it is (vLLM's identities are whatever its host setting says, and resolving
    a name here would block the poll loop)."""
    if _config.dial_back_any_host:
        return True
    ip, src = ip_of(host), (None if source is None else ip_of(source))
    if ip is not None:
        return ip == src
    if host.lower() == "localhost":
        return src is not None and src.is_loopback
    return True


def _recv_router(self: Any) -> None:
    """vLLM's ROUTER read, with the guard's checks (module docstring)."""
    state = _state(self)
    admitted: set[str] = set()  # dial-backs admitted in this pass (no connection yet)
    for _ in range(FRAMES_PER_POLL):
        try:
            parts = self._router.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            break
        except zmq.ZMQError as exc:
            log.warning("vLLM control transport: recv error: %s", exc)
            break
        if len(parts) != 2:
            state.drop("frame parts", f": {len(parts)}")
            continue
        raw_id, body = parts[0].bytes, parts[1]
        data = body.bytes
        if len(data) > _config.max_frame_bytes:
            state.drop("frame too large", f": {len(data)} bytes")
            continue
        try:
            host, _port = parse_peer_id(raw_id)
        except TransportError as exc:
            state.drop("bad identity", f": {exc}")
            continue
        sender = raw_id.decode("ascii")
        conn = self._connections.get(sender)
        if conn is None and sender not in admitted:
            if not is_connect_from(sender, data, _config.limits):
                state.drop("not a connect", f" from {sender}")
                continue
            source = frame_meta(body, "Peer-Address")
            if not _same_host(host, source):
                state.drop("address mismatch", f": {sender} came from {source}")
                continue
        try:
            msg = _decode(data)
        except Exception as exc:
            state.drop("undecodable", f" from {sender}: {exc}")
            continue
        if conn is not None:
            if isinstance(msg, dict) and msg.get("type") == "connect_ack":
                state.pending.pop(sender, None)  # its handshake is done on its side
            conn.enqueue(msg)
            continue
        if sender not in admitted:
            _admit(self, state, sender, origin_of(host, frame_meta(body, "Peer-Address")),
                   admitted)
            admitted.add(sender)
        self._pending_inbound.append((sender, msg))


def _admit(transport: Any, state: _State, sender: str, origin: str,
           admitted: set[str]) -> None:
    """Give ``sender`` a slot in the pending budget, evicting one when it is full."""
    conns = transport._connections
    for peer in [p for p in state.pending
                 if p not in admitted and (p not in conns or not conns[p].alive)]:
        del state.pending[peer]  # closed, or its session is over
    while len(state.pending) >= _config.max_pending:
        count: dict[str, int] = {}
        for host in state.pending.values():
            count[host] = count.get(host, 0) + 1
        most = max(count.values())
        host = origin if count.get(origin) == most else next(
            h for h in state.pending.values() if count[h] == most)
        victim = next(p for p, h in state.pending.items() if h == host)
        del state.pending[victim]
        state.drop("evicted: too many unfinished handshakes", f": {victim}")
        conn = conns.get(victim)
        if conn is not None:
            conn.mark_dead()  # the transport closes it; its session ends
        else:  # admitted in this pass: forget its frames
            admitted.discard(victim)
            transport._pending_inbound[:] = [
                (p, m) for p, m in transport._pending_inbound if p != victim]
    state.pending[sender] = origin


def wanted() -> bool:
    """False when the environment opts out of the guard (``P2PFSM_VLLM_GUARD=0``)."""
    return os.environ.get(ENV_GUARD, "").strip() != "0"


def install() -> None:
    """Guard every ``ZmqTransport`` from now on (idempotent; reads the environment)."""
    global _config, _decode
    import importlib

    import msgspec  # what vLLM's transport decodes with (vLLM depends on it)

    _config = GuardConfig.from_env()
    _decode = msgspec.msgpack.decode
    if _originals:
        return
    module: Any = importlib.import_module(ZMQ_MODULE)
    _originals.update(_apply_heartbeat=module._apply_heartbeat,
                      _recv_router=module.ZmqTransport._recv_router,
                      close=module.ZmqConnection.close)
    module._apply_heartbeat = _apply_socket_options
    module.ZmqTransport._recv_router = _recv_router
    module.ZmqConnection.close = _close_monitor_first


def uninstall() -> None:
    """vLLM's transport methods again (idempotent)."""
    import importlib

    if not _originals:
        return
    module: Any = importlib.import_module(ZMQ_MODULE)
    module._apply_heartbeat = _originals.pop("_apply_heartbeat")
    module.ZmqTransport._recv_router = _originals.pop("_recv_router")
    module.ZmqConnection.close = _originals.pop("close")


def installed() -> bool:
    """True while vLLM's transport is guarded."""
    return bool(_originals)
