"""CURVE for the control plane: key files, the ZAP gatekeeper and what a refusal means.

A CURVE node's ROUTER is a CURVE server whose clients must hold a key in an allow-list,
enforced by a ZAP authenticator on the node's context (:class:`Gatekeeper`); each DEALER
is a CURVE client with our keypair and the peer's server key. Refused handshakes are
logged with their cause, on both ends (:func:`refusal_of`, :func:`router_refusals`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from p2pfsm.errors import ConfigError, TransportError
from p2pfsm.executor.zmq.monitors import EV_AUTH_FAILED, EV_HANDSHAKE_NO_DETAIL, monitor_events

__all__ = ["CurveKeys", "Gatekeeper", "handshake_cause", "load_curve_keys", "refusal_of",
           "router_refusals"]

log = logging.getLogger("p2pfsm.zmq")

_MECHANISM_MISMATCH = int(zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)


@dataclass(frozen=True, slots=True)
class CurveKeys:
    """A node's CURVE keys (Z85 text, 40 bytes each).

    Attributes:
        public, secret: our keypair: the ROUTER's server key and every DEALER's client key.
        allow: the client public keys our ROUTER accepts (checked by ZAP).
        peer_key: the server public key for our own :meth:`ControlPlane.connect` calls
            when none is given (None: the allow-list's key when it holds exactly one).
            A dial-back uses the key the peer authenticated with instead.
    """

    public: bytes
    secret: bytes
    allow: frozenset[bytes]
    peer_key: bytes | None = None

    def server_key_for(self, peer_id: str) -> bytes:
        if self.peer_key is not None:
            return self.peer_key
        if len(self.allow) == 1:
            return next(iter(self.allow))
        raise TransportError(
            f"no CURVE server key for {peer_id}: the allow-list holds {len(self.allow)} keys; "
            "set curve_peer_key (p2pfsm fetch --peer-key FILE)")


def _public_key_file(path: str, what: str) -> bytes:
    try:
        public, _secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{what}: cannot read a CURVE key from {path!r}: {exc}") from None
    if len(public) != 40:
        raise ConfigError(f"{what}: {path!r} holds no 40-character Z85 public key")
    return public


def load_curve_keys(secret_file: str, allow: Iterable[str],
                    peer_key: str | None = None) -> CurveKeys:
    """Read key files in ZeroMQ's format (``zmq.auth.create_certificates``).

    ``secret_file`` is our ``NAME.key_secret``; each ``allow`` entry is a public key file
    or a directory whose ``*.key`` files are all allowed; ``peer_key`` a public key file.
    Raises :class:`ConfigError` naming the file for anything unreadable or empty.
    """
    try:
        public, secret = zmq.auth.load_certificate(secret_file)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"curve_secret_key: cannot read {secret_file!r}: {exc}") from None
    if secret is None or len(secret) != 40 or len(public) != 40:
        raise ConfigError(f"curve_secret_key: {secret_file!r} is not a secret key file "
                          "(NAME.key_secret written by p2pfsm keygen)")
    allowed: set[bytes] = set()
    for entry in allow:
        if os.path.isdir(entry):
            try:
                found = zmq.auth.load_certificates(entry)
            except (OSError, ValueError) as exc:
                raise ConfigError(f"curve_allow: cannot read keys in {entry!r}: {exc}") from None
            if not found:
                raise ConfigError(f"curve_allow: no *.key files in {entry!r}")
            allowed.update(k for k in found if len(k) == 40)
        else:
            allowed.add(_public_key_file(entry, "curve_allow"))
    if not allowed:
        raise ConfigError("curve_allow: a CURVE node needs at least one allowed public key")
    server = None if peer_key is None else _public_key_file(peer_key, "curve_peer_key")
    return CurveKeys(public, secret, frozenset(allowed), server)


class Gatekeeper(ThreadAuthenticator):
    """ZAP for our context: a CURVE client is let in only with a key in the allow-list;
    every refusal is logged with the peer's address."""

    def __init__(self, context: zmq.Context[Any], allow: frozenset[bytes]) -> None:
        super().__init__(context, log=logging.getLogger("p2pfsm.zmq.zap"))
        self._allow = allow
        self._address = "?"

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        # One request at a time on the authenticator's thread: the address is that of
        # the request whose key callback() is asked about next.
        self._address = msg[3].decode("ascii", "replace") if len(msg) > 3 else "?"
        if len(msg) > 5 and msg[5] != b"CURVE":
            log.warning("refused a connection from %s: mechanism %s, not CURVE",
                        self._address, msg[5].decode("ascii", "replace"))
        await super().handle_zap_message(msg)

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self._allow:
            return True
        log.warning("refused a connection from %s: CURVE key %s is not in the allow-list",
                    self._address, key.decode("ascii", "replace"))
        return False


def handshake_cause(event: int, value: int, curve: bool) -> str:
    """Why our connection's ZMTP handshake failed, for the session's death reason:
    :func:`refusal_of` when we speak CURVE, else what a NULL-security dealer can tell."""
    if curve:
        return refusal_of(event, value)
    if value == _MECHANISM_MISMATCH:
        return ("the peer requires CURVE and we have none (curve_secret_key / "
                "--secret-key)")
    if event == EV_HANDSHAKE_NO_DETAIL:
        return ("the peer closed the connection during the handshake (a CURVE peer "
                "refuses a client without CURVE so)")
    return f"ZMTP handshake failed (libzmq error {value:#x})"


def refusal_of(event: int, value: int) -> str:
    """Why a peer cut our CURVE handshake, from the monitor's event and value."""
    if event == EV_AUTH_FAILED:
        return "our CURVE key is not in its allow-list"
    if value == _MECHANISM_MISMATCH:
        return "it speaks no CURVE (a NULL-security peer)"
    if event == EV_HANDSHAKE_NO_DETAIL:
        # The peer closed the connection on our hello: it could not read it, which is
        # what a server key other than the one we hold for it (curve_peer_key) does.
        return ("it could not read our CURVE hello: its key is not the server key we "
                "hold for it (--peer-key / curve_peer_key)")
    return f"CURVE handshake failed (protocol error {value:#x})"



def router_refusals(monitor: zmq.Socket[bytes], where: str, limit: int) -> list[str]:
    """Read the handshakes a CURVE ROUTER refused from its ``monitor`` (at most ``limit``)
    and log them; return the drop reason of each. ZAP has logged a refused key with its
    address already; libzmq does not say who offered no key at all, so that line names
    our endpoint (``where`` when the event names none)."""
    reasons: list[str] = []
    for event, value, endpoint in monitor_events(monitor, limit):
        if event == EV_AUTH_FAILED:
            reasons.append("refused: key not allowed")
            continue
        at = endpoint.decode("ascii", "replace") if endpoint else where
        mismatch = value == _MECHANISM_MISMATCH
        reasons.append("refused: no CURVE key" if mismatch else "refused: handshake failed")
        if event == EV_HANDSHAKE_NO_DETAIL:
            # The connection closed before its handshake ended: a reachability probe
            # (`p2pfsm fetch` makes one), or a peer that went away. Nothing refused.
            log.info("a connection on %s ended before its CURVE handshake did (libzmq "
                     "error 0x%x): a port probe, or a peer that went away", at, value)
            continue
        log.warning("refused a connection on %s: %s", at,
                    "the peer offered no CURVE key (NULL security)" if mismatch
                    else f"CURVE handshake failed (libzmq error 0x{value:x})")
    return reasons
