"""What each trigger of each machine carries: its payload types, declared once.

A guard or action of a machine takes the payload of the trigger that fired it, typed
(``def remember_peer(self, ev: Connect)``): no guard or action asks an ``isinstance``
of it. :data:`PAYLOADS` says, per machine and trigger, which types reach it (``None``:
a step no input carries, a cascade's); ``tests/unit/test_payloads.py`` holds every
guard's and action's annotation to it, and the input table's rows (their event class,
a frame's message class) to it, so a payload no annotation admits cannot be declared.
"""

from __future__ import annotations

from collections.abc import Mapping

from p2pfsm.protocol import (
    AbortAck,
    AbortFetch,
    Connect,
    ConnectAck,
    Disconnect,
    Fetch,
    FetchRound,
    Lookup,
    LookupResp,
    TransferDone,
)
from p2pfsm.session.child import EndSession, PinHits
from p2pfsm.session.client import LookupPart
from p2pfsm.session.inputs import (
    HostClose,
    HostDecline,
    HostFetch,
    HostFinish,
    HostLookup,
    HostStart,
    HostSupply,
    PeerGone,
    RegistrationFinished,
    TimerFired,
    TransportLost,
    WriteFinished,
)
from p2pfsm.session.server import LookupAnswer

Payload = tuple[type | None, ...]
"""The types one trigger's step may carry (None: no payload)."""

_REQUESTS: Payload = (Fetch, Lookup, AbortFetch)
_RESPONSES: Payload = (TransferDone, AbortAck, LookupResp)

PAYLOADS: Mapping[str, Mapping[str, Payload]] = {
    "session": {
        "recv_connect": (Connect,), "recv_connect_ack": (ConnectAck,),
        "recv_disconnect": (Disconnect,), "recv_request": _REQUESTS,
        "recv_response": _RESPONSES, "recv_stale": _REQUESTS + _RESPONSES,
        "recv_bad_fetch": (FetchRound,), "recv_unknown_abort": (AbortFetch,),
        "recv_expired_fetch": (Fetch,), "finish_lookup_round": (FetchRound,),
        "host_start": (HostStart,), "host_close": (HostClose,),
        "host_fetch_over": (HostFetch,), "host_lookup_over": (HostLookup,),
        "host_supply_over": (HostSupply,), "registration_done": (RegistrationFinished,),
        "registration_failed": (RegistrationFinished,), "timer_handshake": (TimerFired,),
        "transport_lost": (TransportLost,), "abort_ack_expired": (EndSession,),
        "lookup_expired": (EndSession,),
    },
    "client_round": {
        "host_fetch": (HostFetch,), "host_finish": (HostFinish,), "peer_gone": (PeerGone,),
        "recv_abort_ack": (AbortAck,), "recv_transfer_done": (TransferDone,),
        "session_lost": (None,), "session_lost_unsent": (None,),
        "timer_load": (TimerFired,), "timer_abort_ack": (TimerFired,),
        "timer_hold": (TimerFired,), "handed_off": (None,),
    },
    "client_lookup": {
        "host_lookup": (HostLookup,), "host_finish": (HostFinish,),
        "recv_lookup_resp": (LookupPart,), "session_lost": (None,),
        "session_lost_unsent": (None,), "timer_lookup": (TimerFired,),
        "request_fetched": (HostFetch,),
    },
    "server_round": {
        "host_supply": (HostSupply,), "lookup_pin": (PinHits,), "host_decline": (HostDecline,),
        "host_finish": (None,), "recv_fetch": (Fetch,), "recv_terminal_fetch": (Fetch,),
        "recv_abort_fetch": (AbortFetch,), "write_done": (WriteFinished,),
        "write_failed": (WriteFinished,), "timer_store": (TimerFired,),
        "timer_demand": (TimerFired,), "session_lost": (None,), "settle": (None,),
    },
    "server_lookup": {
        "recv_lookup": (Lookup,), "host_answer": (LookupAnswer,),
        "timer_lookup_pending": (TimerFired,), "request_closed": (None,),
        "settle": (None,),
    },
}
"""Machine -> trigger -> the payload types its steps carry."""
