"""What a part of the session may ask of the session that holds it.

The session (:class:`~p2pfsm.session.core.Session`) holds two parts, named like the machines
they hold (``models/client_*``, ``models/server_*``): the client part
(:mod:`~p2pfsm.session.client_part`, the consumer role) and the server part
(:mod:`~p2pfsm.session.server_part`, the producer role);
each owns its own tables and reaches the session only through :class:`Owner`, as an
HTTP/2 connection's streams reach their connection. The session machine (handshake,
send gating, death) stays with the session, and so do the timers, the step's outputs
and the children's outbox; a part never reads another part.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol

from p2pfsm.fsm import CompiledMachine
from p2pfsm.protocol import Connect, Message
from p2pfsm.session.inputs import TimerId
from p2pfsm.session.outputs import Output


class Owner(Protocol):
    """The session, as its parts see it.

    Output: :meth:`send` a frame (now, or queued behind the handshake), :meth:`arm` and
    :meth:`disarm` a timer (deadlines on the session's clock, :attr:`now`), :meth:`emit`
    an executor output. Machines, the session's own (:attr:`machine`, its instance the
    owner) or a part's child, fire three ways: :meth:`step` for an input, then the
    models' state-triggered transitions (:meth:`settle`); :meth:`step_nested` inside
    another step (a frame's gate once the part validated the frame, the session's answer
    to what no child takes, a settle, a lookup's pins), leaving the settling to the step
    that holds it; :meth:`settle` alone. Each applies the child's outbox and retires it
    when terminal. Reads: :attr:`now`, :attr:`alive`, :attr:`ready` and the peer's connect
    (:attr:`peer`, None before the handshake).
    """

    machine: ClassVar[CompiledMachine]

    @property
    def now(self) -> float: ...

    @property
    def alive(self) -> bool: ...

    @property
    def ready(self) -> bool: ...

    @property
    def peer(self) -> Connect | None: ...

    def send(self, message: Message) -> None: ...

    def arm(self, timer: TimerId, delay: float, *, keep: bool = False) -> None: ...

    def disarm(self, timer: TimerId) -> None: ...

    def emit(self, output: Output) -> None: ...

    def step(self, m: CompiledMachine, obj: Any, trigger: str, ev: object = None) -> str: ...

    def step_nested(self, m: CompiledMachine, obj: Any, trigger: str,
                    ev: object = None) -> str: ...

    def settle(self) -> None: ...
