"""The lookups a node serves: the tokens ``on_lookup`` is shown, and the keys left pending.

A node numbers every lookup it asks its host about with a token unique in the node (a
session's own lookup token restarts with each session). A lookup whose answer left keys
pending is kept here under that token until :meth:`~p2pfsm.executor.node.Node.
resolve_lookup` settles them all, or its session ends it.
"""

from __future__ import annotations

from dataclasses import dataclass

from p2pfsm.errors import LocalProtocolError
from p2pfsm.session import Session

__all__ = ["ServedLookup", "ServedLookups"]


@dataclass(eq=False)
class ServedLookup:
    """A peer's lookup with keys the host left pending."""

    peer_id: str
    session: Session
    session_token: int
    pending: frozenset[bytes]


class ServedLookups:
    """Tokens handed to ``on_lookup`` and the lookups still pending, by token."""

    __slots__ = ("_by_session", "_by_token", "_serial", "asking")

    def __init__(self) -> None:
        self._serial = 0  # the last token handed out
        self.asking: int | None = None  # the token on_lookup is being asked about
        self._by_token: dict[int, ServedLookup] = {}
        self._by_session: dict[tuple[str, int], int] = {}  # (peer, session token) -> ours

    def new_token(self) -> int:
        """The token for the next lookup the host is asked about."""
        self._serial += 1
        return self._serial

    def checked(self, token: object, peer_id: str) -> ServedLookup | None:
        """The pending lookup ``token`` of ``peer_id`` (None: nothing pending any more).
        Raises :class:`LocalProtocolError` for a token never handed out, the one being
        asked about right now, or one of another peer."""
        if type(token) is not int or not 0 < token <= self._serial:
            raise LocalProtocolError(f"resolve_lookup: no lookup {token!r} was asked")
        if token == self.asking:
            raise LocalProtocolError(
                f"resolve_lookup: lookup {token} is being asked; answer it from on_lookup")
        served = self._by_token.get(token)
        if served is not None and served.peer_id != peer_id:
            raise LocalProtocolError(f"resolve_lookup: lookup {token} is not from {peer_id}")
        return served

    def get(self, token: int) -> ServedLookup | None:
        return self._by_token.get(token)

    def hold(self, token: int, served: ServedLookup) -> None:
        """Keep ``served`` (it has keys pending) under ``token``."""
        self._by_token[token] = served
        self._by_session[(served.peer_id, served.session_token)] = token

    def token_of(self, peer_id: str, session_token: int) -> int | None:
        """Our token for the peer's session lookup ``session_token``, if it is held."""
        return self._by_session.get((peer_id, session_token))

    def forget(self, token: int) -> None:
        served = self._by_token.pop(token, None)
        if served is not None:
            self._by_session.pop((served.peer_id, served.session_token), None)
