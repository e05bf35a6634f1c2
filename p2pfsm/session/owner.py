"""What a part of the session may ask of the session that holds it.

The session (:class:`~p2pfsm.session.core.Session`) holds two parts, the consumer
(:mod:`~p2pfsm.session.consumer`) and the producer (:mod:`~p2pfsm.session.producer`);
each owns its own tables and reaches the session only through :class:`Owner`, as an
HTTP/2 connection's streams reach their connection. The session machine (handshake,
send gating, death) stays with the session, and so do the timers, the step's outputs
and the children's outbox; a part never reads another part.
"""

from __future__ import annotations

from typing import Any, Protocol

from p2pfsm.fsm import CompiledMachine
from p2pfsm.protocol import Connect, Message
from p2pfsm.session.inputs import TimerId
from p2pfsm.session.outputs import Output


class Owner(Protocol):
    """The session, as its parts see it.

    Output: :meth:`send` a frame (now, or queued behind the handshake), :meth:`arm` and
    :meth:`disarm` a timer (deadlines on the session's clock, :attr:`now`), :meth:`emit`
    an executor output. Children: :meth:`step` fires one of the part's machines for an
    input and then runs the cascade, :meth:`fire` fires one without it (inside a
    cascade, or before the host hears of a fetch), :meth:`cascade` runs it; each applies
    the child's outbox and retires it when terminal. Frames: :meth:`check_gate` raises
    when the session machine would refuse the frame's gate trigger, :meth:`gate` fires
    it (after the part validated the frame), :meth:`answer` fires the session machine's
    transition that answers what no child of the part takes (a gated frame, a host call
    on a session that is over). Reads:
    :attr:`now`, :attr:`alive` and the peer's connect (:attr:`peer`, None before the
    handshake).
    """

    @property
    def now(self) -> float: ...

    @property
    def alive(self) -> bool: ...

    @property
    def peer(self) -> Connect | None: ...

    def send(self, message: Message) -> None: ...

    def arm(self, timer: TimerId, delay: float, *, keep: bool = False) -> None: ...

    def disarm(self, timer: TimerId) -> None: ...

    def emit(self, output: Output) -> None: ...

    def step(self, m: CompiledMachine, obj: Any, trigger: str, ev: object = None) -> str: ...

    def fire(self, m: CompiledMachine, obj: Any, trigger: str, ev: object = None) -> str: ...

    def cascade(self) -> None: ...

    def check_gate(self, trigger: str) -> None: ...

    def gate(self, trigger: str, msg: Message) -> None: ...

    def answer(self, trigger: str, ev: object) -> None: ...
