"""A read-only view of a session, for tests, fuzzers, tools and the spec replay.

:attr:`Session.view <p2pfsm.session.core.Session.view>` is a :class:`SessionView`: it
reads the live session (nothing is copied, so it is always current) and hands out only
read-only mappings, tuples and frozensets. The machine objects it returns (rounds,
lookups) are the session's own: read their ``fsm_state`` and data, never write them
(only their machine's actions do, tests/unit/test_machine_lint.py). Nothing outside
``p2pfsm/session/`` reads a session's private fields; what it needs to see is here.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Protocol

from p2pfsm.protocol import Message
from p2pfsm.session.child import ChildEnv, ChildOutput
from p2pfsm.session.client import ClientLookup, ClientRound
from p2pfsm.session.client_part import ClientPart
from p2pfsm.session.inputs import TimerId
from p2pfsm.session.outputs import Output
from p2pfsm.session.server import ServerLookup, ServerRound
from p2pfsm.session.server_part import ServerPart
from p2pfsm.session.timers import TimerTable


class Viewed(Protocol):
    """What the view reads of a session (:class:`~p2pfsm.session.core.Session`)."""

    fsm_state: str
    client: ClientPart
    server: ServerPart
    _queue: list[Message]
    _timers: TimerTable[TimerId]
    _out: list[Output]
    _env: ChildEnv


class SessionView:
    """What a session holds, read-only (see the module docstring).

    Args:
        session: the session to read.
    """

    __slots__ = ("_s",)

    def __init__(self, session: Viewed) -> None:
        self._s = session

    # ---------------------------------------------------- the session's own
    @property
    def state(self) -> str:
        """The session machine's state."""
        return self._s.fsm_state

    @property
    def queued(self) -> tuple[Message, ...]:
        """Frames waiting for the handshake, oldest first."""
        return tuple(self._s._queue)

    @property
    def timers(self) -> Mapping[TimerId, float]:
        """Armed timers and their deadlines."""
        return self._s._timers.view()

    @property
    def pending_outputs(self) -> tuple[Output, ...]:
        """Outputs of a step in progress (empty between ``handle`` calls)."""
        return tuple(self._s._out)

    @property
    def outbox(self) -> tuple[ChildOutput, ...]:
        """What children asked for and the session has not applied (empty between steps)."""
        return tuple(self._s._env.outbox)

    def is_child_env(self, env: object) -> bool:
        """True when ``env`` is the environment this session gives its children."""
        return env is self._s._env

    # ---------------------------------------------------------- client part
    @property
    def loads(self) -> Mapping[str, Mapping[int, ClientRound]]:
        """Open load rounds: kv_request_id -> round_seq -> round."""
        return MappingProxyType(self._s.client.loads)

    @property
    def held(self) -> Mapping[tuple[str, int], ClientRound]:
        """Load rounds held past the session's end: (kv_request_id, round_seq) -> round
        (its job has its result, released=False; its DestinationReleased is to come)."""
        return MappingProxyType(self._s.client.held)

    def load(self, kv_request_id: str, round_seq: int) -> ClientRound | None:
        """The open load round of (kv_request_id, round_seq), if any."""
        return self._s.client.loads.get(kv_request_id, {}).get(round_seq)

    @property
    def load_jobs(self) -> frozenset[int]:
        """Job ids of the open load rounds."""
        return frozenset(self._s.client.load_jobs)

    @property
    def lookups(self) -> Mapping[str, tuple[ClientLookup, ...]]:
        """Open lookups per kv_request_id, oldest first."""
        return MappingProxyType({rid: tuple(v) for rid, v in self._s.client.lookups.items()})

    @property
    def lookup_rounds(self) -> Mapping[str, int]:
        """The round a request's lookups opened that no fetch has taken yet."""
        return MappingProxyType(self._s.client.lookup_round)

    def round_floor(self, kv_request_id: str) -> int | None:
        """The lowest round number the request may use next, while remembered."""
        return self._s.client.round_floor.get(kv_request_id)

    # ---------------------------------------------------------- server part
    @property
    def rounds(self) -> Mapping[str, Mapping[int | None, ServerRound]]:
        """Open serve rounds: kv_request_id -> round_seq (None: not yet bound) -> round."""
        return MappingProxyType(self._s.server.rounds)

    @property
    def serve_rounds(self) -> tuple[ServerRound, ...]:
        """Every open serve round, in the order they were opened."""
        return tuple(self._s.server.round_by_serial.values())

    @property
    def served(self) -> Mapping[int, ServerLookup]:
        """Open served lookups by token."""
        return MappingProxyType(self._s.server.tokens)

    @property
    def writes(self) -> Mapping[int, ServerRound]:
        """Writes in flight (xfer -> the serve round that started it)."""
        return MappingProxyType(self._s.server.writes)

    @property
    def store_jobs(self) -> Mapping[int, ServerRound]:
        """Store jobs whose pins a serve round holds (job_id -> round)."""
        return MappingProxyType(self._s.server.store_jobs)

    def peer_finished(self, kv_request_id: str) -> int | None:
        """The round_seq of the peer's terminal fetch of the request, while remembered."""
        return self._s.server.peer_finished.get(kv_request_id)

    @property
    def unsettled(self) -> tuple[ServerRound | str, ...]:
        """What the cascade must still settle (empty between ``handle`` calls)."""
        return tuple(self._s.server.unsettled)
