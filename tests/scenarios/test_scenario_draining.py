"""A draining serve round owes exactly the reply its state names (models/server_round.toml):
``draining_abort`` an abort_ack, ``draining_failed`` a transfer_done(false),
``draining_silent`` nothing; each is sent only once no write of the round can land.

The last two cases take transitions the gate config's bounds do not reach (two
terminal fetches of one round; a drop and a death in one behaviour), so they are
exercised here against the code (p2pfsm/tools/verify/unreachable.py, BEYOND_GATE)."""

from __future__ import annotations

from helpers.world import keys, of_type, only, ready_driver, sent

from p2pfsm.protocol import AbortAck, AbortFetch, Fetch, TransferDone
from p2pfsm.session import (
    CancelWrite,
    HostSupply,
    StartWrite,
    StoreResult,
    TransportLost,
    WriteFinished,
)
from p2pfsm.session.server import ServerRound


def _serving_with_write() -> tuple[object, ServerRound, int]:
    d = ready_driver()
    d.recv(Fetch("r1", keys([1, 2]), (5, 6), 0))
    xfer = only(of_type(d(HostSupply(10, "r1", keys([1]), (1,))), StartWrite)).xfer
    rnd = d.s.view.rounds["r1"][0]
    assert rnd.fsm_state == "serving"
    return d, rnd, xfer


def test_a_failed_round_still_owes_transfer_done_after_a_terminal_fetch() -> None:
    d, rnd, xfer = _serving_with_write()
    d.fire(only(d.armed("demand")))
    assert rnd.fsm_state == "draining_failed"
    assert not sent(d.recv(Fetch("r1", (), (), 1)))
    assert rnd.fsm_state == "draining_failed"
    out = d(WriteFinished(xfer, False))
    assert sent(out) == [TransferDone("r1", False, 0)]
    assert of_type(out, StoreResult) == [StoreResult(10, False)]


def test_an_abort_after_a_terminal_fetch_is_acked_once_quiescent() -> None:
    d, rnd, xfer = _serving_with_write()
    assert of_type(d.recv(Fetch("r1", (), (), 1)), CancelWrite) == [CancelWrite(xfer)]
    assert rnd.fsm_state == "draining_silent"
    assert not sent(d.recv(AbortFetch("r1", 0)))
    assert rnd.fsm_state == "draining_abort"
    assert sent(d(WriteFinished(xfer, False))) == [AbortAck("r1", 0)]


def test_a_second_terminal_fetch_leaves_a_silent_round_silent() -> None:
    d, rnd, xfer = _serving_with_write()
    d.recv(Fetch("r1", (), (), 1))
    assert not sent(d.recv(Fetch("r1", (), (), 2)))
    assert rnd.fsm_state == "draining_silent"
    out = d(WriteFinished(xfer, True))
    assert not sent(out) and of_type(out, StoreResult) == [StoreResult(10, False)]
    assert d.s.open_counts()["server_round"] == 0


def test_a_silent_round_stays_silent_when_the_session_dies() -> None:
    d, rnd, xfer = _serving_with_write()
    d.recv(Fetch("r1", (), (), 1))
    d(TransportLost("cut"))
    assert rnd.fsm_state == "draining_silent"
    out = d(WriteFinished(xfer, False))
    assert not sent(out) and of_type(out, StoreResult) == [StoreResult(10, False)]
    assert d.s.open_counts()["server_round"] == 0
