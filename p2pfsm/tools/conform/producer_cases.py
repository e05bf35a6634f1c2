"""Directed cases for a target in the producer role (the tester is the consumer).

Each case is a function of a :class:`~p2pfsm.tools.conform.registry.Context`; its ``rule``
names what the models (``models/*.toml``) require of the target, which is what a
failure prints as expected.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

import msgpack

from p2pfsm.demo_blocks import demo_key
from p2pfsm.protocol import AbortAck, AbortFetch, Connect, ConnectAck, Fetch, TransferDone
from p2pfsm.tools.conform.registry import Context, case
from p2pfsm.tools.conform.tester import NUM_BLOCKS, Tester, describe
from p2pfsm.tools.conform.verdict import CaseFailure, NotApplicable

PRODUCER: Final = "producer"
MISSING: Final = 1 << 40
"""A demo block number no target holds."""


def _blocks(ctx: Context, n: int = 8) -> list[int]:
    if ctx.target.blocks < 1:
        raise NotApplicable("the target holds no demo block (--target-blocks)")
    return list(range(min(n, ctx.target.blocks)))


def _dones(t: Tester, rid: str) -> list[TransferDone]:
    return [m for m in t.received("transfer_done")
            if isinstance(m, TransferDone) and m.kv_request_id == rid]


def _served_round(t: Tester, rid: str, blocks: list[int], expected: str, rule: str) -> None:
    """Fetch ``blocks`` for ``rid`` through our session: fail with ``rule`` unless the
    load (waited for as ``expected``) succeeds, then check every byte."""
    slots = [NUM_BLOCKS - 1 - i for i in range(len(blocks))]  # not the block numbers
    job = t.fetch(rid, blocks, slots)
    result = t.load_result(job, expected)
    if not result.success:
        raise CaseFailure(rule, f"{result.reason}: {result.detail}; {t.summary()}")
    t.check_blocks(blocks, slots)


def _pd_round(t: Tester, rid: str, blocks: list[int], what: str = "") -> None:
    """A PD round through our session: every byte checked, one transfer_done(true)."""
    _served_round(t, rid, blocks, f"{what}transfer_done(true) for the fetch of {rid!r} (all "
                  "blocks the target holds) (server_round: serving -> writing -> done, "
                  "send_transfer_done)", f"{what}the round served: transfer_done(success=true)")


def _not_served(t: Tester, rid: str, slots: list[int], rule: str) -> str:
    """Fail when a transfer_done(true) for ``rid`` came or bytes landed in ``slots``."""
    served = [d for d in _dones(t, rid) if d.success]
    if served or not t.zeroed(slots):
        raise CaseFailure(rule, ("transfer_done(success=true); " if served else "")
                          + ("bytes landed in our blocks; " if not t.zeroed(slots) else "")
                          + t.summary())
    failed = _dones(t, rid)
    return "answered transfer_done(false)" if failed else "not answered"


def _fingerprint_other(fp: str) -> str:
    return "0123456789abcdef" if fp != "0123456789abcdef" else "fedcba9876543210"


@case("handshake", PRODUCER, "connect is answered by the target's connect and its "
      "connect_ack, in that order, with its own identity and our block_len and hash seed",
      "session: connecting -(recv_connect, compatible)-> registering -(registration_done: "
      "send_connect_ack)-> awaiting_ack -(recv_connect_ack)-> ready; only connect, "
      "connect_ack and disconnect before ready")
def handshake(ctx: Context) -> str:
    t = ctx.tester()
    t.handshake()
    t.observe()
    t.check_clean()
    kinds = [m.TYPE for m in t.received()]
    return f"target sent {' '.join(kinds)}"


@case("gating.before-connect", PRODUCER, "a fetch sent before any connect is not served; "
      "the target still completes a handshake and a PD round afterwards",
      "requests are admitted only after the handshake (session: recv_request is declared "
      "only in awaiting_ack and ready); no block is written to a peer whose metadata is "
      "not registered")
def gating_before_connect(ctx: Context) -> str:
    t = ctx.tester()
    slots = [0, 1, 2, 3]
    blocks = _blocks(ctx, 4)
    slots = slots[:len(blocks)]
    t.send(Fetch("conform-early", tuple(demo_key(b) for b in blocks), tuple(slots), 0))
    t.observe()
    note = _not_served(t, "conform-early", slots, "no answer to a fetch before connect "
                       "(requests are admitted only after the handshake)")
    t.handshake()
    t.observe()
    _not_served(t, "conform-early", slots, "the early fetch stays unserved after the "
                "handshake")
    _pd_round(t, "conform-after", _blocks(ctx), "then ")
    t.check_clean()
    return f"early fetch {note}"


@case("gating.before-ack", PRODUCER, "a fetch sent right after our connect is answered, "
      "if at all, only after the target's connect_ack, and then byte-exact",
      "session: recv_request is declared in awaiting_ack and ready only, so nothing of a "
      "request is served before the target has registered us and sent connect_ack")
def gating_before_ack(ctx: Context) -> str:
    t = ctx.tester()
    blocks = _blocks(ctx, 4)
    slots = list(range(len(blocks)))
    t.start()
    t.send(Fetch("conform-eager", tuple(demo_key(b) for b in blocks), tuple(slots), 0))
    t.expect(lambda: t.session.ready, "the handshake to complete")
    t.observe()
    kinds = [(m.TYPE, getattr(m, "kv_request_id", None)) for m in t.received()]
    ack = kinds.index(("connect_ack", None)) if ("connect_ack", None) in kinds else len(kinds)
    if ("transfer_done", "conform-eager") in kinds[:ack]:
        raise CaseFailure("no transfer_done before the target's connect_ack", t.summary())
    dones = _dones(t, "conform-eager")
    if any(d.success for d in dones):
        t.check_blocks(blocks, slots)
        note = "served after connect_ack (implicit ack)"
    else:
        note = "answered transfer_done(false)" if dones else "not served"
        if not t.zeroed(slots):
            raise CaseFailure("no bytes land for a fetch that was not served", t.summary())
    t.check_clean()
    return note


def _mismatch(ctx: Context, field: str, block_len: int | None = None,
              num_blocks: int = NUM_BLOCKS, hash_seed: str | None = None,
              fingerprint: str | None = None) -> str:
    t = ctx.tester()
    target = ctx.target
    t.send(Connect(t.local_id, t.data.metadata, t.data.base_addr, num_blocks,
                   target.block_len if block_len is None else block_len,
                   target.fingerprint if fingerprint is None else fingerprint,
                   target.hash_seed if hash_seed is None else hash_seed))
    t.observe()
    rule = (f"an incompatible connect ({field} differs) refused: no connect_ack, never a "
            "block exchanged (session: recv_connect unless is_peer_compatible -> ended, "
            "send_disconnect)")
    if t.received("connect_ack"):
        raise CaseFailure(rule, t.summary())
    # Behave as a lenient peer would: ack its connect, then ask for blocks.
    if t.received("connect"):
        t.send(ConnectAck(t.local_id))
    blocks = _blocks(ctx, 4)
    slots = list(range(len(blocks)))
    t.send(Fetch(f"conform-{field}", tuple(demo_key(b) for b in blocks), tuple(slots), 0))
    t.observe()
    if t.received("connect_ack"):
        raise CaseFailure(rule, t.summary())
    note = _not_served(t, f"conform-{field}", slots, rule)
    said = "disconnect" if t.received("disconnect") else "no disconnect"
    return f"{said}; the fetch after it {note}"


@case("mismatch.block-len", PRODUCER, "a connect with another block_len is refused and "
      "no block is exchanged", "peers with different block_len never exchange blocks")
def mismatch_block_len(ctx: Context) -> str:
    return _mismatch(ctx, "block_len", block_len=ctx.target.block_len * 2,
                     num_blocks=NUM_BLOCKS // 2)


@case("mismatch.hash-seed", PRODUCER, "a connect with another hash_seed is refused and "
      "no block is exchanged", "peers with different hash_seed never exchange blocks")
def mismatch_hash_seed(ctx: Context) -> str:
    return _mismatch(ctx, "hash_seed", hash_seed=ctx.target.hash_seed + "-other")


@case("mismatch.fingerprint", PRODUCER, "a connect with another (non-empty) config "
      "fingerprint is refused and no block is exchanged",
      "peers with different config fingerprints never exchange blocks")
def mismatch_fingerprint(ctx: Context) -> str:
    return _mismatch(ctx, "config_fingerprint",
                     fingerprint=_fingerprint_other(ctx.target.fingerprint))


@case("mismatch.fingerprint-empty", PRODUCER, "a connect with an empty fingerprint is "
      "refused by a target that has one", "fingerprints must match exactly (an empty one "
      "matches only an empty one)")
def mismatch_fingerprint_empty(ctx: Context) -> str:
    if not ctx.target.fingerprint:
        raise NotApplicable("the target has no fingerprint (--fingerprint not given)")
    return _mismatch(ctx, "config_fingerprint", fingerprint="")


@case("pd.round", PRODUCER, "a PD fetch of 8 held blocks into other block indexes: the "
      "WRITEs land byte-exact and one transfer_done(true) ends the round",
      "server_round: fetch -> writes of every key -> transfer_done(success) once, after "
      "every write landed")
def pd_round(ctx: Context) -> str:
    t = ctx.tester()
    t.handshake()
    blocks = _blocks(ctx)
    _pd_round(t, "conform-pd", blocks)
    t.observe()
    dones = _dones(t, "conform-pd")
    if len(dones) != 1:
        raise CaseFailure("exactly one transfer_done for the round", t.summary())
    t.check_clean()
    return f"{len(blocks)} blocks x {ctx.target.block_len} B byte-exact"


@case("pd.missing-key", PRODUCER, "a fetch naming a key the target does not hold never "
      "ends with transfer_done(true): it fails, or waits until our abort is acked",
      "server_round: transfer_done(success) only once every key's write landed; unmet "
      "demand ends as transfer_done(false) (host finish or decline) or by an abort")
def pd_missing_key(ctx: Context) -> str:
    t = ctx.tester()
    t.handshake()
    blocks = [*_blocks(ctx, 4), MISSING]
    slots = list(range(len(blocks)))
    job = t.fetch("conform-missing", blocks, slots)
    ended = t.wait(lambda: any(r.job_id == job for r in t.loads), ctx.target.window)
    if not ended:
        t.finish("conform-missing")  # abort the waiting round
    result = t.load_result(job, "transfer_done(false), or abort_ack for our abort")
    if result.success:
        raise CaseFailure("no transfer_done(true) for a round with a key never written",
                          t.summary())
    t.check_clean()
    return "transfer_done(false)" if ended else "waited; aborted and acked"


def _abort_beside(ctx: Context, t: Tester) -> list[int]:
    """Request A's round (one key missing) aborted while request B's is served; B checked
    byte-exact, A ended unserved and released. Returns the held blocks."""
    held = _blocks(ctx, 12)
    a_blocks = [*held[:4], MISSING]
    b_blocks = held[4:] or held
    a_slots = list(range(len(a_blocks)))
    b_slots = [NUM_BLOCKS - 1 - i for i in range(len(b_blocks))]
    a_job = t.fetch("conform-iso-a", a_blocks, a_slots)
    b_job = t.fetch("conform-iso-b", b_blocks, b_slots)
    t.finish("conform-iso-a")  # abort A's round while B's is served
    b = t.load_result(b_job, "transfer_done(true) for the other request's round")
    if not b.success:
        raise CaseFailure("the other request's round served in full",
                          f"{b.reason}: {b.detail}; {t.summary()}")
    t.check_blocks(b_blocks, b_slots)
    a = t.load_result(a_job, "abort_ack (or transfer_done(false)) for the aborted round")
    if a.success or not a.released:
        raise CaseFailure("the aborted round ends unserved and released", str(a))
    return held


@case("round.isolation", PRODUCER, "aborting one request's round leaves a concurrent "
      "request's round intact: byte-exact, transfer_done(true)",
      "finishing, failing or aborting one round never touches another round's supply, "
      "pins or demand; a terminal message completes only the round that asked for it")
def round_isolation(ctx: Context) -> str:
    t = ctx.tester()
    t.handshake()
    _abort_beside(ctx, t)
    t.observe()
    t.check_clean()
    return ""


@case("round.after-abort", PRODUCER, "a request whose round was aborted is served again "
      "in its next round (round_seq 1): byte-exact, transfer_done(true) for that round",
      "state per (request, round): a new round of a request is served like any round; "
      "rounds ended by an abort are not reused while their frames may arrive")
def round_after_abort(ctx: Context) -> str:
    t = ctx.tester()
    t.handshake()
    held = _abort_beside(ctx, t)
    _pd_round(t, "conform-iso-a", held[:4], "the aborted request again: ")
    rounds = sorted({getattr(m, "round_seq", -1) for m in t.received("transfer_done")
                     if getattr(m, "kv_request_id", "") == "conform-iso-a"})
    t.check_clean()
    return f"transfer_done for rounds {rounds}"


@case("lookup.order", PRODUCER, "a lookup of 6 held keys and one missing is answered for "
      "every key, each lookup_resp in the lookup's key order, hits exactly the held keys",
      "server_lookup: every key answered once (hit or miss), a lookup_resp lists keys of "
      "the lookup in its order (split and coalesced answers allowed)")
def lookup_order(ctx: Context) -> str:
    t = ctx.tester()
    t.handshake()
    blocks = [*_blocks(ctx, 6), MISSING]
    t.lookup("conform-lookup", blocks)
    t.expect(lambda: bool(t.lookups), "lookup_resp answering every key of the lookup")
    res = t.lookups[0]
    want = tuple(b != MISSING for b in blocks)
    if not res.answered or res.hits != want:
        raise CaseFailure(f"hits {''.join('T' if h else 'F' for h in want)}, every key "
                          "answered", f"answered={res.answered} hits="
                          f"{''.join('T' if h else 'F' for h in res.hits)}; {t.summary()}")
    order = {demo_key(b): i for i, b in enumerate(blocks)}
    resps = t.received("lookup_resp")
    for resp in resps:
        idx = [order.get(k, -1) for k in getattr(resp, "keys", ())]
        if -1 in idx or idx != sorted(idx):
            raise CaseFailure("each lookup_resp's keys are the lookup's, in its order",
                              f"keys at lookup positions {idx}")
    t.finish("conform-lookup")
    t.observe()
    t.check_clean()
    return f"{len(resps)} lookup_resp frame(s)"


@case("lookup.terminal-fetch", PRODUCER, "after a lookup with no hit, finish sends the "
      "terminal empty fetch: the target answers nothing for it and keeps serving",
      "the terminal fetch (no keys) ends the request's parked lookups and rounds silently; "
      "no transfer_done for it")
def terminal_fetch(ctx: Context) -> str:
    t = ctx.tester()
    t.handshake()
    t.lookup("conform-term", [MISSING])
    t.expect(lambda: bool(t.lookups), "lookup_resp for the lookup")
    t.finish("conform-term")
    sent = [f.message for f in t.frames if f.sent and isinstance(f.message, Fetch)
            and f.message.kv_request_id == "conform-term"]
    if not sent or sent[-1].keys:
        raise NotApplicable("our session sent no terminal fetch")
    t.observe()
    if _dones(t, "conform-term"):
        raise CaseFailure("no transfer_done for a terminal fetch", t.summary())
    _pd_round(t, "conform-term-after", _blocks(ctx), "then ")
    t.check_clean()
    return "silent, then served another request"


@case("abort.ack", PRODUCER, "fetch (one key missing) then abort_fetch: abort_ack for the "
      "round, nothing lands after it, no frame of the round after it",
      "server_round: recv_abort_fetch -> draining_abort; send_abort_ack only once no write "
      "can land; an abort of a round with nothing in flight is acked at once")
def abort_ack(ctx: Context) -> str:
    t = ctx.tester()
    t.handshake()
    blocks = [*_blocks(ctx, 4), MISSING]
    slots = list(range(len(blocks)))
    job = t.fetch("conform-abort", blocks, slots)
    t.finish("conform-abort")  # a loading round: our session sends abort_fetch(round 0)
    aborts = [f for f in t.frames if f.sent and isinstance(f.message, AbortFetch)]
    if not aborts:
        raise NotApplicable("our session sent no abort_fetch")
    t.expect(lambda: any(isinstance(m, AbortAck) and m.kv_request_id == "conform-abort"
                         for m in t.received("abort_ack")),
             "abort_ack(conform-abort, round 0) once the round's writes are quiescent")
    result = t.load_result(job, "the load's result once acked")
    if not result.released:
        raise CaseFailure("the destination released by the answer", str(result))
    at = len(t.frames)
    before = [t.slot_bytes(s) for s in slots]
    t.observe()
    if [t.slot_bytes(s) for s in slots] != before:
        raise CaseFailure("no write lands after abort_ack (quiescence)", "our blocks "
                          "changed after abort_ack")
    late = [f.text for f in t.frames[at:] if not f.sent and f.message is not None
            and getattr(f.message, "kv_request_id", None) == "conform-abort"]
    if late:
        raise CaseFailure("no frame of an acked round after its abort_ack", "; ".join(late))
    t.check_clean()
    done = _dones(t, "conform-abort")
    return "transfer_done, then abort_ack" if done else "abort_ack"


@case("duplicate.connect-ack", PRODUCER, "a second connect_ack on a ready session is "
      "harmless: the session stays up and serves a PD round",
      "session: recv_connect_ack in ready is declared with no effect")
def duplicate_ack(ctx: Context) -> str:
    t = ctx.tester()
    t.handshake()
    t.send(ConnectAck(t.local_id))
    _pd_round(t, "conform-dup", _blocks(ctx))
    t.observe()
    if t.received("disconnect"):
        raise CaseFailure("the session stays up", t.summary())
    t.check_clean()
    return ""


@case("stale.round", PRODUCER, "an abort_fetch for a round that already ended is acked "
      "(or ignored) and changes nothing: the request is served again afterwards",
      "an abort of a round with nothing in flight is acked at once; a stale frame "
      "never ends the session or touches another round")
def stale_round(ctx: Context) -> str:
    t = ctx.tester()
    t.handshake()
    _pd_round(t, "conform-stale", _blocks(ctx))
    t.send(AbortFetch("conform-stale", 0))
    acked = t.wait(lambda: any(getattr(m, "kv_request_id", None) == "conform-stale"
                               for m in t.received("abort_ack")), ctx.target.window)
    if t.received("disconnect"):
        raise CaseFailure("the session stays up after a stale abort", t.summary())
    _pd_round(t, "conform-stale2", _blocks(ctx), "then ")
    t.check_clean()
    return "acked" if acked else "ignored"


def _malformed(ctx: Context, frame: bytes, text: str, rid: str = "") -> str:
    t = ctx.tester()
    t.handshake()
    t.send_raw(frame, text)
    t.observe()
    if t.received("disconnect") or not t.session.ready:
        raise CaseFailure(f"{text} changes nothing: the session stays up (a malformed "
                          "frame is rejected with its field and reason; an unknown type "
                          "is ignored)", t.summary())
    if rid and any(d.success for d in _dones(t, rid)):
        raise CaseFailure("a malformed fetch is never served", t.summary())
    _pd_round(t, "conform-after-bad", _blocks(ctx), "then ")
    t.check_clean()
    answered = [describe(m) for m in t.received() if getattr(m, "kv_request_id", "") == rid]
    return f"answered {' '.join(answered)}" if rid and answered else ""


_MALFORMED_RULE = ("a malformed frame never changes state: it is rejected (field and "
                   "reason) and the session goes on; an unknown type is ignored")


@case("malformed.not-msgpack", PRODUCER, "bytes that are not msgpack change nothing: the "
      "session stays up and serves a PD round", _MALFORMED_RULE)
def malformed_bytes(ctx: Context) -> str:
    return _malformed(ctx, b"\xc1\x00\xff garbage", "<bytes that are not msgpack>")


@case("malformed.not-a-map", PRODUCER, "a msgpack array instead of a map changes "
      "nothing: the session stays up and serves a PD round", _MALFORMED_RULE)
def malformed_array(ctx: Context) -> str:
    return _malformed(ctx, msgpack.packb([1, 2, 3]), "<a msgpack array, not a map>")


@case("malformed.bad-field", PRODUCER, "a fetch whose keys are not a list is not served "
      "(at most transfer_done(false)) and changes nothing else", _MALFORMED_RULE)
def malformed_field(ctx: Context) -> str:
    frame = msgpack.packb({"type": "fetch", "kv_request_id": "conform-bad", "keys": 5,
                           "block_indexes": [0], "round_seq": 0})
    return _malformed(ctx, frame, "<fetch with keys=5>", "conform-bad")


@case("malformed.index-out-of-range", PRODUCER, "a fetch naming a block index past our "
      "advertised region is not served, nothing is written, and the session goes on",
      "no write targets a block index outside the peer's advertised region; a rejected "
      "frame changes nothing")
def malformed_index(ctx: Context) -> str:
    blocks = _blocks(ctx, 1)
    frame = msgpack.packb({"type": "fetch", "kv_request_id": "conform-range",
                           "keys": [demo_key(blocks[0])], "block_indexes": [NUM_BLOCKS + 7],
                           "round_seq": 0}, use_bin_type=True)
    return _malformed(ctx, frame, f"<fetch into our block {NUM_BLOCKS + 7} of {NUM_BLOCKS}>",
                      "conform-range")


@case("malformed.unknown-type", PRODUCER, "a frame of an unknown type is ignored: the "
      "session stays up and serves a PD round", _MALFORMED_RULE)
def malformed_type(ctx: Context) -> str:
    return _malformed(ctx, msgpack.packb({"type": "frobnicate", "x": 1}),
                      "<a map of unknown type 'frobnicate'>")


RESTART_ATTEMPTS: Final = 3


def _settled(t: Tester) -> Callable[[], bool]:
    """Whether ``t``'s handshake ended: ready, or its session over."""
    return lambda: t.session.ready or t.dead is not None


@case("peer.restart", PRODUCER, "a consumer that dies (no disconnect) and comes back on "
      "the same host:port with a new NIXL agent gets a fresh ready session within "
      f"{RESTART_ATTEMPTS} connects and a byte-exact PD round",
      "after a peer restarts, a fresh ready session exists (a connect of a new incarnation "
      "ends the old session without a disconnect; without incarnations a second connect "
      "is a protocol error and the next connect starts afresh); no write reaches the old "
      "agent's memory")
def peer_restart(ctx: Context) -> str:
    first = ctx.tester(incarnation=1)
    first.handshake()
    blocks = _blocks(ctx)
    _pd_round(first, "conform-life-1", blocks)
    identity = first.local_id
    first.close()  # dies: nothing more is sent
    for attempt in range(1, RESTART_ATTEMPTS + 1):
        again = ctx.tester(bind=identity, incarnation=1 + attempt)
        again.start()
        again.wait(_settled(again), ctx.target.deadline)
        if again.session.ready:
            break
        again.close()
    else:
        raise CaseFailure(f"a ready session for the restarted peer within {RESTART_ATTEMPTS} "
                          "connects", again.summary())
    _pd_round(again, "conform-life-2", blocks, "after the restart: ")
    again.check_clean()
    return f"ready after {attempt} connect(s)"


@case("disconnect", PRODUCER, "after our disconnect the target serves nothing more on "
      "that session, and a fresh peer still gets a handshake and a PD round",
      "session: recv_disconnect -> ended (the peer knows; nothing more is sent); a fetch "
      "on an ended session is not served")
def disconnect(ctx: Context) -> str:
    t = ctx.tester()
    t.handshake()
    t.close_session()
    if not any(f.sent and f.message is not None and f.message.TYPE == "disconnect"
               for f in t.frames):
        raise NotApplicable("our session sent no disconnect")
    blocks = _blocks(ctx, 4)
    slots = list(range(len(blocks)))
    t.send(Fetch("conform-closed", tuple(demo_key(b) for b in blocks), tuple(slots), 0))
    t.observe()
    note = _not_served(t, "conform-closed", slots, "a fetch after disconnect is not served")
    fresh = ctx.tester()
    fresh.handshake()
    _pd_round(fresh, "conform-fresh", _blocks(ctx), "a fresh peer: ")
    fresh.check_clean()
    echo = "; echoed disconnect" if t.received("disconnect") else ""
    return f"fetch after disconnect {note}{echo}"
