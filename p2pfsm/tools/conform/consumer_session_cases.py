"""Directed consumer-role cases about supply and the producer's life: demand (a fetch that
waits for supply), our disconnect, and our restart (the tester is the producer).

Split with :mod:`~p2pfsm.tools.conform.consumer_cases` to keep each module small; these run
after its cases and use its :class:`~p2pfsm.tools.conform.consumer_cases.Consumer`.
"""

from __future__ import annotations

from collections.abc import Sequence

from p2pfsm.session import HostSupply
from p2pfsm.tools.conform.consumer_cases import (
    CONSUMER,
    _concluded,
    _first_fetch,
    _limit,
    _reported,
    _served,
    _silent,
)
from p2pfsm.tools.conform.registry import Context, case
from p2pfsm.tools.conform.tester import Tester
from p2pfsm.tools.conform.verdict import CaseFailure, NotApplicable

_HANDSHAKE = ("connect", "connect_ack", "disconnect")
"""Frame types a consumer may still send on a session that ended (or to open a new one)."""


def _supply(t: Tester, rid: str, keys: Sequence[bytes]) -> None:
    t.feed(HostSupply(t.next_job(), rid, tuple(keys), tuple(t.held[k] for k in keys)))


@case("consumer.demand", CONSUMER, "a PD fetch of 8 blocks supplied in two halves, the "
      "second one window after the first: the consumer waits for the rest (no abort, no "
      "result before its load deadline) and reports success once served",
      "server_round: supply that arrives after the fetch is written as it comes, the rest "
      "waits as demand; client_round: awaiting until transfer_done (or its load deadline): "
      "written blocks are no result")
def demand(ctx: Context) -> str:
    t, c = _silent(ctx, "0-7")
    fetch = _first_fetch(t, c, "a fetch")
    arrived = next(a for a in t.arrived if a.kv_request_id == fetch.kv_request_id)
    have = [k for k in arrived.missing if k in t.held]
    if len(have) < 2:
        raise NotApplicable("the consumer fetched fewer than 2 blocks we hold")
    half = len(have) // 2
    _supply(t, fetch.kv_request_id, have[:half])
    t.observe()
    rule = "the round waits for the rest of its supply"
    if t.received("abort_fetch") or not c.running():
        raise CaseFailure(f"{rule}: no abort_fetch and no result within one window (its "
                          "load deadline is longer)", t.summary())
    t.check_clean()
    _supply(t, fetch.kv_request_id, have[half:])
    _concluded(ctx, c, rule)
    if not _served(t):
        raise CaseFailure(f"{rule}: the round served by us", t.summary())
    return f"{half} + {len(have) - half} blocks supplied apart; exit 0"


@case("consumer.disconnect", CONSUMER, "we send disconnect while the consumer's fetch "
      "waits: its load fails (exit status not 0) and it sends nothing more on that session "
      "(a new connect is allowed)",
      "session: recv_disconnect -> ended; client_round: session_lost -> failed (the load's "
      "one result is a failure); nothing is sent on an ended session")
def disconnect(ctx: Context) -> str:
    t, c = _silent(ctx, "0-3")
    _first_fetch(t, c, "a fetch")
    t.check_clean()
    at = len(t.frames)
    t.close_session()
    if not any(f.sent and f.message is not None and f.message.TYPE == "disconnect"
               for f in t.frames[at:]):
        raise NotApplicable("our session sent no disconnect")
    rule = "the load failed by our disconnect"
    rc = c.wait(rule, _limit(ctx))
    after = [f.text for f in t.frames[at:] if not f.sent
             and (f.message is None or f.message.TYPE not in _HANDSHAKE)]
    if after:
        raise CaseFailure(f"{rule}: nothing of the ended session after our disconnect",
                          f"{after[0]} after our disconnect; " + t.summary())
    _reported(c, rc, False, rule)
    again = [f for f in t.frames[at:] if not f.sent and f.message is not None
             and f.message.TYPE == "connect"]
    return f"exit {rc}" + ("; connected again" if again else "")


@case("consumer.producer-restart", CONSUMER, "we die (no disconnect) while the consumer's "
      "fetch waits and come back on the same host:port with a new NIXL agent, dropping "
      "every frame until a connect (as a fresh node does): the consumer never reports that "
      "load loaded unless the new incarnation served it; a connect to us gets a clean "
      "handshake",
      "client_round: a load ends loaded only on transfer_done(true) of its round (its "
      "writes never came from the dead incarnation): otherwise timer_load / abort / "
      "session_lost -> failed; a restarted producer's new session starts at connect")
def producer_restart(ctx: Context) -> str:
    first, c = _silent(ctx, "0-3", load_timeout=1.0, abort_ack_timeout=1.0)
    _first_fetch(first, c, "a fetch")
    first.check_clean()
    identity = first.local_id
    first.close()  # dies: nothing more is sent
    again = ctx.tester(bind=identity)
    again.connect_first = True
    c.t = again
    rule = "the load of the dead incarnation not reported loaded"
    rc = c.wait(rule, _limit(ctx, 1.0))
    again.check_clean()
    if rc == 0 and not _served(again):
        raise CaseFailure(f"{rule}: the consumer reports a failed load (exit status not 0)",
                          f"exit 0, and the new incarnation served nothing; its output: "
                          f"{c.output()!r}; " + again.summary())
    seen = "handshake with the new incarnation" if again.session.ready else (
        f"{len(again.dropped)} frame(s) of the old session dropped")
    return f"exit {rc}; {seen}"
