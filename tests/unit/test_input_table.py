"""``models/inputs.toml``: every trigger is reached, a bad table fails at load, and the
session's dispatch, the spec action names and the timer names all come from it."""

from __future__ import annotations

import re
import tomllib
from dataclasses import fields
from pathlib import Path

import pytest
from helpers.world import PEER_ID, Driver, keys, of_type, only, peer_connect

from p2pfsm.errors import ModelError
from p2pfsm.fsm import Tracer, input_table, machines
from p2pfsm.fsm.inputs import parse_inputs
from p2pfsm.fsm.registry import models_directory
from p2pfsm.protocol import (
    AbortAck,
    AbortFetch,
    ConnectAck,
    Fetch,
    Lookup,
    LookupResp,
    TransferDone,
    decode,
    encode,
)
from p2pfsm.session import (
    FrameReceived,
    HostAnswerLookup,
    HostFetch,
    HostFinish,
    HostLookup,
    HostStart,
    HostSupply,
    Input,
    LookupRequest,
    RegistrationFinished,
    Timeouts,
    TimerFired,
    TimerId,
    TransportLost,
    WriteFinished,
)
from p2pfsm.session.dispatch import _FRAMES, HANDLERS
from p2pfsm.session.machine import LIVE_STATES
from p2pfsm.spec_calls import TIMER_ACTIONS, action_of

ROOT = Path(__file__).resolve().parents[2]
TEXT = (models_directory() / "inputs.toml").read_text()


def _parse(text: str) -> object:
    return parse_inputs(tomllib.loads(text), "inputs.toml", machines())


def test_every_trigger_is_reached_by_an_input_or_a_declared_cascade() -> None:
    table = input_table()
    declared = {(name, t) for name, spec in machines().items() for t in spec.triggers}
    covered = table.reached() | set(table.cascade)
    assert declared - covered == set(), "triggers no input row reaches and no cascade lists"
    assert covered <= declared


@pytest.mark.parametrize(("patch", "message"), [
    (('machine = "client_round"\nkey = ["kv_request_id", "round_seq"]\ngate = "recv_response"\n'
      'trigger = "recv_transfer_done"', 'machine = "client_rnd"\ntrigger = "recv_transfer_done"'),
     "inputs.toml: input[6] (frame transfer_done): unknown machine 'client_rnd' (known: "
     "['client_lookup', 'client_round', 'server_lookup', 'server_round', 'session'])"),
    (('trigger = "timer_load"', 'trigger = "timer_loading"'),
     "inputs.toml: input[10] (timer load): machine 'client_round' has no trigger "
     "'timer_loading'"),
    (('gate = "recv_request"\ntrigger = "recv_abort_fetch"',
      'gate = "recv_req"\ntrigger = "recv_abort_fetch"'),
     "inputs.toml: input[5] (frame abort_fetch): machine 'session' has no trigger 'recv_req'"),
    (('stale = "recv_stale"', 'live_states = ["ready"]\nstale = "recv_stale"'),
     "inputs.toml: 'live_states' moved to the session's [sets] (live)"),
    (('stale = "recv_stale"', 'stale = "recv_old"'),
     "inputs.toml: stale: machine 'session' has no trigger 'recv_old'"),
    (('name = "demand"', 'name = "store"'), "inputs.toml: timer 'store' is declared twice"),
    (('"server_round.settle" =', '"server_round.settled" ='),
     "inputs.toml: cascade: machine 'server_round' has no trigger 'settled'"),
    (('{ when = "is_terminal", trigger', '{ if = "is_terminal", trigger'),
     "inputs.toml: input[3] (frame fetch): a variant needs 'when' or 'unless' naming a field"),
    (('kind = "transport"', 'kind = "socket"'),
     "inputs.toml: input[26]: 'kind' must be one of ['frame', 'host', 'result', 'timer', "
     "'transport'], got 'socket'"),
    (('event = "FrameReceived"', 'event = 7'),
     "inputs.toml: input[0]: 'event' must be a non-empty string"),
    (('{ when = "is_terminal", trigger', '{ when = "is_terminal", x = 1, trigger'),
     "inputs.toml: input[3] (frame fetch): a variant is {when|unless = field, trigger = name}"),
    (('fanout = ["client_lookup.host_finish",', 'fanout = [3, "client_lookup.host_finish",'),
     "inputs.toml: input[23] (host finish): fanout: expected a list of names, got [3, "
     "'client_lookup.host_finish', 'server_lookup.request_closed', "
     "'server_round.host_finish']"),
    (('"client_lookup.host_finish"', '"client_lookup"'),
     "inputs.toml: input[23] (host finish): fanout: expected 'machine.trigger', got "
     "'client_lookup'"),
])
def test_a_bad_table_is_a_clear_error_at_load(patch: tuple[str, str], message: str) -> None:
    """The whole message: what is wrong and where (the row, its kind and name)."""
    assert patch[0] in TEXT
    with pytest.raises(ModelError) as err:
        _parse(TEXT.replace(*patch, 1))
    assert str(err.value) == message


def test_the_dispatch_and_the_spec_names_are_read_from_the_table() -> None:
    table = input_table()
    assert table.live_states == LIVE_STATES
    assert set(_FRAMES) == set(table.of_kind("frame"))
    for name, (row, routes) in _FRAMES.items():
        if row.machine == "session":
            assert routes is None, name
            continue
        # Each trigger the row may fire (a terminal fetch: its variant) has its route, and
        # the route carries the row's gate: no part spells either.
        assert routes is not None and set(routes) == set(row.triggers), name
        assert {(r.gate, r.trigger) for r, _take in routes.values()} == \
            {(row.gate, t) for t in row.triggers}, name
    events = {row.event for row in table.inputs}
    assert {cls.__name__ for cls in HANDLERS} == events
    assert {n: (r.machine, r.trigger) for n, r in table.of_kind("timer").items()} == TIMER_ACTIONS
    assert action_of("ready", HostFinish("r")) == "ClientRoundHostFinish"
    assert action_of("dead", FrameReceived(b"")) == "NetworkDiscard"
    assert action_of("ready", TimerFired(TimerId("lookup_pending", (1,)))) == \
        "ServerLookupTimerLookupPending"


def test_one_name_per_timer_in_code_models_and_spec() -> None:
    table_timers = set(input_table().of_kind("timer"))
    spec = (ROOT / "tla" / "P2P.tla").read_text()
    kinds = re.search(r"^TimerKinds == \{([^}]*)\}", spec, re.M)
    assert kinds is not None
    # The spec's handshake timer is the fault "hstimer"; every role timer has its name.
    assert set(re.findall(r'"(\w+)"', kinds[1])) == table_timers - {"handshake"}
    used = set(re.findall(r'Timer\("(\w+)"\)', spec))
    assert used == table_timers - {"handshake"}
    armed = set()
    for path in (ROOT / "p2pfsm" / "session").glob("*.py"):
        text = path.read_text()
        armed |= set(re.findall(r'TimerId\(\s*"(\w+)"', text))
        armed |= set(re.findall(r'timer_id\(\(\s*"(\w+)"', text))  # TimerId's fast path
        armed |= set(re.findall(r'self\._timer\("(\w+)"\)', text))  # ClientRound's
    assert armed == table_timers
    assert all(f"timer_{n}" == r.trigger for n, r in input_table().of_kind("timer").items())
    assert table_timers <= {f.name for f in fields(Timeouts)}  # and its deadline's name


def _row_step(ev: Input) -> tuple[str, str]:
    """The (machine, trigger) the table says ``ev`` starts."""
    table = input_table()
    if isinstance(ev, FrameReceived):
        msg = decode(ev.frame)
        row = table.of_kind("frame")[msg.TYPE]
        return row.machine, row.trigger_for(msg)
    if isinstance(ev, TimerFired):
        row = table.of_kind("timer")[ev.timer.kind]
        return row.machine, row.trigger
    row = table.by_event(type(ev).__name__)
    return row.machine, row.trigger_for(ev)


def test_each_input_takes_the_step_its_row_names() -> None:
    """The role handlers (which find or create the instance) fire what the table says."""
    d = Driver()
    d.s.tracer = tracer = Tracer()

    def step(ev: Input) -> None:
        tracer.records.clear()
        if isinstance(ev, TimerFired):
            d.now = max(d.now, d.timers[ev.timer])
        d(ev)
        assert _row_step(ev) in {(r.machine, r.trigger) for r in tracer.records}, ev

    step(HostStart())
    step(FrameReceived(encode(peer_connect())))
    step(RegistrationFinished(True))
    step(FrameReceived(encode(ConnectAck(PEER_ID))))
    step(HostFetch(1, "r1", keys([1]), (0,)))
    step(FrameReceived(encode(TransferDone("r1", True, 0))))
    step(HostLookup("r2", keys([2])))
    step(FrameReceived(encode(LookupResp("r2", keys([2]), (False,)))))
    step(FrameReceived(encode(Fetch("s1", keys([3]), (1,), 0))))
    step(HostSupply(5, "s1", keys([3]), (2,)))
    step(WriteFinished(0, False))
    step(FrameReceived(encode(Fetch("s2", keys([4]), (1,), 0))))
    step(FrameReceived(encode(AbortFetch("s2", 0))))
    out = d(FrameReceived(encode(Lookup("s3", keys([5]), 0))))
    token = only(of_type(out, LookupRequest)).token
    step(HostAnswerLookup(token, {}, None, frozenset(keys([5]))))
    step(TimerFired(only(d.armed("lookup_pending"))))
    step(HostFetch(2, "r4", keys([6]), (3,)))
    step(TimerFired(only(d.armed("load"))))
    step(TimerFired(only(d.armed("abort_ack"))))
    step(FrameReceived(encode(AbortAck("r4", 0))))
    step(HostFetch(3, "r5", keys([7]), (4,)))
    step(HostFinish("r5"))
    step(TransportLost("cut"))
