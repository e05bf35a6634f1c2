"""Peer ids: ``"host:port"`` strings, parsed strictly, and the IP a host text names.

A peer id is a node's ``local_id`` and the ZeroMQ identity of each of its DEALERs, so a
ROUTER sees it on every frame. It is read from the network, hence parsed strictly:
ASCII only, a host that is an IPv4 literal, a bracketed IPv6 literal or an RFC 1123
name, and a canonical decimal port.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Final

from p2pfsm.errors import TransportError

__all__ = ["host_is_valid", "ip_of", "misnamed_dials", "origin_of", "parse_peer_id",
           "peer_address"]

_MAX_HOSTNAME_LEN: Final = 253
_MAX_PEER_ID_LEN: Final = _MAX_HOSTNAME_LEN + 1 + 5
_HOST_CHARS: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-")
_DIGITS_AND_DOTS: Final = frozenset("0123456789.")


def host_is_valid(host: str) -> bool:
    """``host`` is a bracketed IPv6 literal, a well-formed IPv4 literal or an RFC 1123 name."""
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return False
        return True
    if not host or len(host) > _MAX_HOSTNAME_LEN:
        return False
    if set(host) <= _DIGITS_AND_DOTS:
        # Looks numeric, so it must be a well-formed IPv4 literal (no octet > 255,
        # no leading zeros), never a "hostname" such as 1.2.3.999.
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return False
        return True
    for label in host.split("."):
        if not 1 <= len(label) <= 63 or not set(label) <= _HOST_CHARS:
            return False
        if label[0] == "-" or label[-1] == "-":
            return False
    return True


def peer_address(text: str) -> str:
    """A peer's address as the host gives it, ``"host:port"`` or ``"tcp://host:port"``,
    as its peer id ``"host:port"`` (anything else is returned as it is, for the call
    that takes it to refuse)."""
    if isinstance(text, str) and text.startswith("tcp://"):
        return text[len("tcp://"):]
    return text


def parse_peer_id(raw: str | bytes, *, allow_port_zero: bool = False) -> tuple[str, int]:
    """Parse a peer id ``"host:port"`` strictly; return ``(host, port)``.

    Raises :class:`TransportError` for anything else: non-ASCII or non-UTF-8 bytes, no
    colon, a port that is not a canonical decimal in 1..65535 (0 too when
    ``allow_port_zero``), or a host that is neither an IPv4 literal, a bracketed IPv6
    literal nor an RFC 1123 host name. Never raises anything else, whatever ``raw`` is.
    """
    if isinstance(raw, bytes):
        try:
            text = raw.decode("ascii")
        except UnicodeDecodeError:
            raise TransportError(f"peer id is not ASCII: {raw[:64]!r}") from None
    elif isinstance(raw, str):
        if not raw.isascii():
            raise TransportError(f"peer id is not ASCII: {raw[:64]!r}")
        text = raw
    else:
        raise TransportError(f"peer id must be str or bytes, not {type(raw).__name__}")
    if len(text) > _MAX_PEER_ID_LEN:
        raise TransportError(f"peer id longer than {_MAX_PEER_ID_LEN} characters")
    host, colon, port_text = text.rpartition(":")
    if not colon:
        raise TransportError(f"peer id has no ':port': {text!r}")
    if not port_text.isdigit() or (len(port_text) > 1 and port_text[0] == "0"):
        raise TransportError(f"peer id port is not a canonical decimal: {text!r}")
    port = int(port_text)
    if not (0 if allow_port_zero else 1) <= port <= 65535:
        raise TransportError(f"peer id port out of range: {text!r}")
    if not host_is_valid(host):
        raise TransportError(f"peer id host is not an IP literal or host name: {text!r}")
    return host, port



def ip_of(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a host text names when it is an IP literal (IPv4-mapped IPv6 as
    IPv4), else None."""
    text = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ip = ipaddress.ip_address(text.partition("%")[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def origin_of(host: str, source: str | None) -> str:
    """The host a dial-back is charged to in the pending budget: the IP its connection
    came from (ZeroMQ's ``Peer-Address``, which a peer cannot choose), else the host
    its id names (our own dials, or no address known)."""
    ip = ip_of(source) if source is not None else None
    if ip is None:
        ip = ip_of(host)
    return host.lower() if ip is None else str(ip)


def misnamed_dials(peer_id: str, dialled: list[str]) -> list[str]:
    """Of the peer ids we ``dialled``, those that name ``peer_id``'s address by another
    host text: the same port, and a host name (not an IP literal) that resolves to
    ``peer_id``'s IP (``localhost:5555`` for ``127.0.0.1:5555``). Resolves only such
    names (from the hosts file or DNS)."""
    host, _, port = peer_id.rpartition(":")
    ip = ip_of(host)
    if ip is None:
        return []
    found: list[str] = []
    for other in dialled:
        other_host, _, other_port = other.rpartition(":")
        if other == peer_id or other_port != port or ip_of(other_host) is not None:
            continue
        try:
            infos = socket.getaddrinfo(other_host, None, proto=socket.IPPROTO_TCP)
        except (OSError, UnicodeError):
            continue
        if any(ip_of(str(info[4][0])) == ip for info in infos):
            found.append(other)
    return found
