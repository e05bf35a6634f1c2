"""Directed cases for a target in the consumer role (the tester is the producer).

The target is a command (:attr:`~p2pfsm.tools.conform.target.Target.consumer_cmd`) that runs a
consumer against the tester's address: it connects to us, fetches demo blocks and exits
0 only when every block loaded and verified. Our side is p2pfsm's producer session, so a
frame of the target it rejects is a failure; so is a wrong exit status.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import tempfile
from typing import Final

import msgpack

from p2pfsm.protocol import AbortAck, Fetch, Message, TransferDone
from p2pfsm.tools.conform import (  # noqa: F401  (their cases come first in the registry)
    producer_cases,
    producer_lookup_cases,
)
from p2pfsm.tools.conform.registry import Context, case
from p2pfsm.tools.conform.tester import Tester
from p2pfsm.tools.conform.verdict import CaseFailure, NotApplicable

CONSUMER: Final = "consumer"
_STOP_S: Final = 5.0  # how long a stopped consumer has to exit before it is killed


class Consumer:
    """One run of the target's consumer command against a tester."""

    def __init__(self, ctx: Context, t: Tester, keys: str = "0-7", mode: str = "pd",
                 load_timeout: float | None = None, abort_ack_timeout: float | None = None,
                 repeat: int = 1) -> None:
        template = ctx.target.consumer_cmd
        if not template:
            raise NotApplicable("no --consumer-cmd: nothing to run as the consumer")
        load = ctx.target.deadline if load_timeout is None else load_timeout
        ack = ctx.target.deadline if abort_ack_timeout is None else abort_ack_timeout
        if repeat > 1 and "{repeat}" not in template:
            raise NotApplicable("--consumer-cmd has no {repeat}: the case needs the same "
                                "request fetched again")
        try:
            cmd = template.format(addr=t.local_id, keys=keys, mode=mode, load_timeout=load,
                                  abort_ack_timeout=ack, repeat=repeat)
        except (KeyError, IndexError, ValueError) as exc:
            raise NotApplicable(f"--consumer-cmd: cannot fill in {exc}") from None
        self.command = cmd
        self.t = t
        self._out = tempfile.TemporaryFile()  # noqa: SIM115 (closed by stop())
        self.proc = subprocess.Popen(shlex.split(cmd), stdout=self._out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
        self.exit_seen_at: float | None = None  # tester time when the exit was seen
        ctx.closers.append(self.stop)

    def running(self) -> bool:
        if self.proc.poll() is None:
            return True
        if self.exit_seen_at is None:
            self.exit_seen_at = self.t.now()
        return False

    def wait(self, what: str, timeout: float) -> int:
        """Pump the tester until the consumer exits; its exit status."""
        if not self.t.wait(lambda: not self.running(), timeout):
            raise CaseFailure(what, f"the consumer still runs after {timeout:.0f} s; "
                              + self.t.summary())
        rc = self.proc.returncode
        assert rc is not None
        return rc

    def output(self, last: int = 600) -> str:
        self._out.seek(0)
        return self._out.read().decode("utf-8", "replace")[-last:].strip()

    def stop(self) -> None:
        """Stop the consumer (its process group, by its pid) if it still runs."""
        if self.proc.poll() is None:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(_STOP_S)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self._out.close()


def _limit(ctx: Context, load_timeout: float | None = None) -> float:
    load = ctx.target.deadline if load_timeout is None else load_timeout
    return load + 3 * ctx.target.deadline


def _reported(c: Consumer, rc: int, success: bool, rule: str) -> None:
    if (rc == 0) != success:
        want = "success (exit 0)" if success else "a failed load (exit status not 0)"
        raise CaseFailure(f"{rule}: the consumer reports {want}",
                          f"exit status {rc}; its output: {c.output()!r}; "
                          + c.t.summary())


def _concluded(ctx: Context, c: Consumer, rule: str, success: bool = True) -> None:
    """Wait for the consumer's exit, check our tester clean and that the consumer
    reported ``success``."""
    rc = c.wait(rule, _limit(ctx))
    c.t.check_clean()
    _reported(c, rc, success, rule)


def _silent(ctx: Context, keys: str, *, load_timeout: float | None = None,
            abort_ack_timeout: float | None = None, repeat: int = 1) -> tuple[Tester, Consumer]:
    """A tester that leaves fetches unanswered, and the consumer launched against it."""
    t = ctx.tester()
    t.serve = "silent"
    return t, Consumer(ctx, t, keys, load_timeout=load_timeout,
                       abort_ack_timeout=abort_ack_timeout, repeat=repeat)


def _served(t: Tester) -> int:
    return sum(e.served for e in t.ended)


def _first_fetch(t: Tester, c: Consumer, what: str) -> Fetch:
    # As long as the consumer's whole run may take: a slow start on a busy machine (a
    # new process, its NIXL agent) is no finding.
    t.expect(lambda: bool(t.arrived) or not c.running(), what,
             timeout=4 * t.target.deadline)
    fetches = [m for m in t.received("fetch") if isinstance(m, Fetch)]
    if not fetches:
        raise CaseFailure(what, f"the consumer exited {c.proc.returncode} first; "
                          + t.summary())
    return fetches[0]


def _pd(ctx: Context, t: Tester, rule: str, keys: str = "0-7", mode: str = "pd") -> Consumer:
    c = Consumer(ctx, t, keys, mode)
    _concluded(ctx, c, rule)
    if not _served(t):
        raise CaseFailure(f"{rule}: a round served by us", t.summary())
    return c


@case("consumer.handshake", CONSUMER, "the consumer's connect is compatible and it "
      "fetches only after our connect_ack (held back for one window)",
      "session: connecting -(recv_connect, compatible)-> registering -> awaiting_ack "
      "-(recv_connect_ack)-> ready; a consumer requests only when ready")
def handshake(ctx: Context) -> str:
    t = ctx.tester(bind="127.0.0.1:0")
    t.ack_delay = ctx.target.window
    rule = "a connect, then a fetch only after our connect_ack"
    _pd(ctx, t, rule, "0-3")
    if t.dead is not None and t.dead.mismatch is not None:
        raise CaseFailure("a compatible connect", str(t.dead.mismatch))
    order = [(f.sent, f.message.TYPE) for f in t.frames if f.message is not None]
    first_in = next((kind for sent, kind in order if not sent), None)
    if first_in != "connect":
        raise CaseFailure("the consumer's first frame is its connect", t.summary())
    ack = order.index((True, "connect_ack")) if (True, "connect_ack") in order else len(order)
    early = [kind for sent, kind in order[:ack] if not sent and kind in ("fetch", "lookup")]
    if early:
        raise CaseFailure(rule, f"{early[0]} before our connect_ack; " + t.summary())
    return "connect, waited for connect_ack"


@case("consumer.pd-round", CONSUMER, "a PD fetch served normally (WRITEs, then "
      "transfer_done(true)): the consumer reports success with every byte right",
      "client_round: fetch -> awaiting -(recv_transfer_done(true))-> loaded; the consumer "
      "reports the load only after transfer_done(true)")
def pd_round(ctx: Context) -> str:
    t = ctx.tester()
    _pd(ctx, t, "the round served and reported loaded")
    fetches = t.received("fetch")
    return f"{len(fetches)} fetch(es), exit 0"


@case("consumer.transfer-failed", CONSUMER, "a fetch answered transfer_done(false): the "
      "consumer reports a failed load",
      "client_round: awaiting -(recv_transfer_done(false))-> failed; the load's result is "
      "a failure")
def transfer_failed(ctx: Context) -> str:
    t = ctx.tester()
    t.serve = "decline"
    c = Consumer(ctx, t, "0-7")
    rule = "transfer_done(false) reported as a failed load"
    rc = c.wait(rule, _limit(ctx))
    t.check_clean()
    if not t.arrived:
        raise CaseFailure("a fetch", t.summary())
    _reported(c, rc, False, rule)
    return f"exit {rc}"


@case("consumer.lookup", CONSUMER, "a lookup answered with hits and a miss, then a fetch "
      "of the hits only, served: the consumer reports success",
      "lookup: the answer's hits are what may be fetched; client_round: fetch of hits -> "
      "transfer_done(true) -> loaded")
def lookup(ctx: Context) -> str:
    if ctx.target.blocks < 4:
        raise NotApplicable("fewer than 4 demo blocks (--target-blocks)")
    t = ctx.tester()
    miss = ctx.target.blocks + 1000
    rule = "a lookup, then a fetch of its hits only"
    _pd(ctx, t, rule, f"0-3,{miss}", "sym")
    if not t.asked:
        raise CaseFailure(rule, "no lookup; " + t.summary())
    asked = set(t.asked[0].keys)
    fetched = {k for a in t.arrived for k in a.keys}
    wrong = [k for k in fetched if k not in asked or k not in t.held]
    if wrong:
        raise CaseFailure(rule, f"{len(wrong)} fetched key(s) not among the hits; "
                          + t.summary())
    return f"lookup of {len(asked)} key(s), fetch of {len(fetched)}"


@case("consumer.lookup-split", CONSUMER, "a lookup answered in two lookup_resp frames, "
      "the second one window after the first (hits and a miss): the consumer waits for "
      "every key's answer, fetches only hits, and reports success",
      "client_lookup: every key's answer counts, in as many lookup_resp frames as the "
      "producer sends (split answers allowed); the fetch names hits only")
def lookup_split(ctx: Context) -> str:
    if ctx.target.blocks < 4:
        raise NotApplicable("fewer than 4 demo blocks (--target-blocks)")
    t = ctx.tester(lookups_in_parts=True)
    t.split_lookups = True
    c = Consumer(ctx, t, f"0-3,{ctx.target.blocks + 1000}", "sym")
    rule = "a split lookup answer waited for, then a fetch of its hits only"
    t.expect(lambda: bool(t.asked) or not c.running(), "a lookup",
             timeout=2 * ctx.target.deadline)
    t.observe()
    t.answer_parked()
    _concluded(ctx, c, rule)
    if not t.asked:
        raise CaseFailure(rule, "no lookup; " + t.summary())
    fetched = {k for a in t.arrived for k in a.keys}
    if any(k not in t.held for k in fetched):
        raise CaseFailure(rule, "a fetched key that was a miss; " + t.summary())
    answers = sum(1 for f in t.frames if f.sent and f.message is not None
                  and f.message.TYPE == "lookup_resp")
    return f"{answers} lookup_resp, fetch of {len(fetched)}"


HOLD_ACKS: Final = 3
"""Our abort_ack is held back this many times the consumer's abort-ack timeout."""


def _silent_round(ctx: Context, t: Tester, c: Consumer) -> Fetch:
    """Leave the consumer's first fetch unanswered until it sends abort_fetch for it."""
    rule = ("abort_fetch for a round we leave unanswered past the consumer's load "
            "deadline (client_round: awaiting -(timer_load: send_abort)-> aborting)")
    first = _first_fetch(t, c, "a fetch")
    t.expect(lambda: bool(t.received("abort_fetch")) or not c.running(), rule,
             timeout=_limit(ctx, 1.0))
    if not t.received("abort_fetch"):
        raise CaseFailure(rule, f"the consumer exited {c.proc.returncode} first; "
                          + t.summary())
    return first


def _fetches(t: Tester, rid: str, upto: int | None = None) -> list[Fetch]:
    frames = t.frames if upto is None else t.frames[:upto]
    return [f.message for f in frames if not f.sent and isinstance(f.message, Fetch)
            and f.message.kv_request_id == rid and f.message.keys]


@case("consumer.abort-quiescence", CONSUMER, "we stay silent past the consumer's load "
      f"deadline (1 s) and hold our abort_ack for {HOLD_ACKS}x its abort-ack timeout "
      "(1 s): until the ack it neither reports the load nor fetches the same request "
      "into those blocks again",
      "client_round: aborting -(timer_abort_ack: send_abort)-> aborting; only "
      "recv_abort_ack (or a transfer_done) ends the round: a timeout is not proof that "
      "writes stopped (vLLM race: frees before quiescence)")
def abort_quiescence(ctx: Context) -> str:
    t = ctx.tester()
    t.serve = "silent"
    t.hold_abort_acks = True
    c = Consumer(ctx, t, "0-3", load_timeout=1.0, abort_ack_timeout=1.0, repeat=2)
    first = _silent_round(ctx, t, c)
    t.observe(HOLD_ACKS * 1.0)
    rule = "destination blocks held until our abort_ack"
    again = _fetches(t, first.kv_request_id)[1:]
    if again:
        raise CaseFailure(rule + ": no new fetch of the request before the ack",
                          f"fetch(round_seq={again[0].round_seq}) into the same blocks "
                          "before our abort_ack; " + t.summary())
    if not c.running():
        raise CaseFailure(rule + ": the load not reported before the ack",
                          f"the consumer exited {c.proc.returncode} before our abort_ack; "
                          + t.summary())
    t.check_clean()
    t.serve = "supply"
    t.release_abort_acks()
    rc = c.wait("the aborted load reported after our abort_ack, then the request "
                "fetched again and served", _limit(ctx))
    t.check_clean()
    _reported(c, rc, False, "one of two loads aborted")
    if not _served(t):
        raise CaseFailure("the request fetched again after our abort_ack, and served",
                          t.summary())
    resent = len(t.received("abort_fetch"))
    return f"{resent} abort_fetch before our ack; exit {rc}"


@case("consumer.round-isolation", CONSUMER, "after a round aborted and acked, the "
      "consumer's next fetch of the same request uses a new round_seq; served, it loads",
      "rounds ended by an abort are not reused while their frames may arrive: the "
      "request's round floor moves past an aborted round (vLLM race: round reuse)")
def round_isolation(ctx: Context) -> str:
    t, c = _silent(ctx, "0-3", load_timeout=1.0, repeat=2)
    first = _silent_round(ctx, t, c)
    t.serve = "supply"
    rule = "a new round_seq for the request's next fetch"
    t.expect(lambda: len(_fetches(t, first.kv_request_id)) > 1 or not c.running(), rule,
             timeout=_limit(ctx))
    rounds = [f.round_seq for f in _fetches(t, first.kv_request_id)]
    if len(rounds) < 2:
        raise CaseFailure(rule, f"no second fetch (consumer exited {c.proc.returncode}); "
                          + t.summary())
    if rounds[1] == rounds[0]:
        raise CaseFailure(rule, f"fetch round_seq {rounds[1]} again after round "
                          f"{rounds[0]} was aborted; " + t.summary())
    rc = c.wait(rule, _limit(ctx))
    t.check_clean()
    _reported(c, rc, False, "one of two loads aborted")
    return f"rounds {rounds}; exit {rc}"


@case("consumer.duplicate-done", CONSUMER, "our transfer_done(true) sent twice: the "
      "consumer ignores the second and reports success",
      "a transfer_done for a round already ended is ignored (client_round: loaded has no "
      "recv_transfer_done)")
def duplicate_done(ctx: Context) -> str:
    t = ctx.tester()

    def again(msg: Message) -> None:
        if isinstance(msg, TransferDone):
            t.send(msg)
    t.on_sent = again
    _pd(ctx, t, "a duplicate transfer_done ignored", "0-3")
    return "exit 0"


def _after_fetch(ctx: Context, t: Tester, c: Consumer, deviant: list[tuple[bytes, str]],
                 extra: list[Message]) -> None:
    """Hold the consumer's first fetch, send ``deviant`` raw frames and ``extra`` ones,
    then serve it."""
    fetch = _first_fetch(t, c, "a fetch")
    for frame, text in deviant:
        t.send_raw(frame, text)
    for msg in extra:
        t.send(msg)
    t.serve = "supply"
    for arrived in list(t.arrived):
        if arrived.kv_request_id == fetch.kv_request_id:
            t.answer_fetch(arrived)


@case("consumer.stale-done", CONSUMER, "a transfer_done(false) for a round the consumer "
      "never opened, and one for an unknown request, before its round is served: both "
      "ignored, the consumer reports success",
      "a transfer_done for an unknown round is ignored (rounds are keyed by "
      "(kv_request_id, round_seq))")
def stale_done(ctx: Context) -> str:
    t, c = _silent(ctx, "0-3")
    f = _first_fetch(t, c, "a fetch")
    _after_fetch(ctx, t, c, [], [TransferDone(f.kv_request_id, False, f.round_seq + 100),
                                 TransferDone("conform-unknown-request", False, 0)])
    rule = "stale transfer_done ignored"
    _concluded(ctx, c, rule)
    return "exit 0"


@case("consumer.malformed", CONSUMER, "malformed frames from us (not msgpack; an unknown "
      "type; a transfer_done with wrong field types) while its round waits: the "
      "consumer does not crash and reports success once served",
      "a malformed frame is dropped; the session goes on")
def malformed(ctx: Context) -> str:
    t, c = _silent(ctx, "0-3")
    junk = [(b"\xc1not msgpack", "<not msgpack>"),
            (msgpack.packb({"type": "no_such_type", "x": 1}), "<unknown type>"),
            (msgpack.packb({"type": "transfer_done", "kv_request_id": 5, "success": "yes",
                            "round_seq": "x"}), "<transfer_done with wrong field types>")]
    _after_fetch(ctx, t, c, junk, [])
    rule = "malformed frames dropped, the round goes on"
    _concluded(ctx, c, rule)
    return "exit 0"


@case("consumer.stray-abort-ack", CONSUMER, "an abort_ack for the consumer's waiting "
      "round, which it never aborted, then the round served: its load still gets exactly "
      "one result (either outcome) and the consumer does not crash",
      "every job gets exactly one result: an unsolicited abort_ack is a protocol "
      "violation (client_round: awaiting has no recv_abort_ack); it may fail the round "
      "or the session, never leave the load without a result")
def stray_abort_ack(ctx: Context) -> str:
    t, c = _silent(ctx, "0-3")
    f = _first_fetch(t, c, "a fetch")
    # Sent behind our session's back: it aborted nothing, so the ack is off-script.
    t.send(AbortAck(f.kv_request_id, f.round_seq))
    t.serve = "supply"
    for arrived in list(t.arrived):
        if arrived.kv_request_id == f.kv_request_id:
            t.answer_fetch(arrived)
    rule = "the load's one result after an unsolicited abort_ack"
    rc = c.wait(rule + " (the consumer still waiting means its load got none)", _limit(ctx))
    out = c.output(2000)
    if "Traceback (most recent call last)" in out:
        raise CaseFailure(rule + ": the consumer does not crash",
                          f"the consumer raised (exit {rc}), so its load got no result: "
                          f"{out[-600:]!r}; " + t.summary())
    return f"exit {rc}"
