"""Directed producer-role cases for answers in parts, late supply and repeated requests:
coalesced and split lookup answers, demand that waits for late supply, a duplicate fetch
(the tester is the consumer).

Split with :mod:`~p2pfsm.tools.conform.producer_cases` to keep each module small; these run
after its cases and use its helpers.
"""

from __future__ import annotations

from p2pfsm.demo_blocks import demo_key
from p2pfsm.protocol import Fetch, LookupResp
from p2pfsm.session import LookupResult
from p2pfsm.tools.conform.producer_cases import (
    MISSING,
    PRODUCER,
    _blocks,
    _dones,
    _pd_round,
    _served_round,
)
from p2pfsm.tools.conform.registry import Context, case
from p2pfsm.tools.conform.tester import NUM_BLOCKS, Tester
from p2pfsm.tools.conform.verdict import CaseFailure, NotApplicable


def _flags(hits: tuple[bool, ...]) -> str:
    return "".join("T" if h else "F" for h in hits)


def _answer_order(t: Tester, blocks: list[int]) -> list[list[int]]:
    """Per lookup_resp (in arrival order), the lookup positions of ``blocks``' keys in it."""
    where = {demo_key(b): i for i, b in enumerate(blocks)}
    parts = [[where[k] for k in m.keys if k in where]
             for m in t.received("lookup_resp") if isinstance(m, LookupResp)]
    return [p for p in parts if p]


def check_parts(t: Tester, blocks: list[int]) -> int:
    """Fail unless every key of the lookup of ``blocks`` was answered exactly once, each
    lookup_resp listing its keys in the lookup's order; the number of parts."""
    parts = _answer_order(t, blocks)
    if any(p != sorted(p) for p in parts) or sorted(i for p in parts for i in p) != list(
            range(len(blocks))):
        raise CaseFailure("each key of a lookup answered once, every lookup_resp in the "
                          "lookup's order (split and coalesced answers allowed)",
                          f"lookup positions answered, per lookup_resp: {parts}; "
                          + t.summary())
    return len(parts)


@case("lookup.coalesced", PRODUCER, "two lookups of one request sent back to back (3 "
      "held keys and a miss, then 2 others and a miss): every key of both answered once, "
      "in its lookup's order, hits exactly the held keys, in one lookup_resp per lookup or "
      "coalesced; then a fetch of every hit is served byte-exact",
      "server_lookup: every key of every lookup answered once, hit or miss (a producer may "
      "split and coalesce answers: each (key, hit) pair answers the oldest lookup still "
      "waiting for that key); the hits are pinned as the round's supply")
def lookup_coalesced(ctx: Context) -> str:
    held = _blocks(ctx, 5)
    if len(held) < 5:
        raise NotApplicable("fewer than 5 demo blocks (--target-blocks)")
    t = ctx.tester()
    t.handshake()
    rid = "conform-coalesced"
    first, second = [*held[:3], MISSING], [*held[3:5], MISSING + 1]
    t.lookup(rid, first)
    t.lookup(rid, second)
    t.expect(lambda: len(t.lookups) >= 2, "lookup_resp answering every key of both lookups")
    by_keys: dict[tuple[bytes, ...], LookupResult] = {r.keys: r for r in t.lookups}
    resps = [m for m in t.received("lookup_resp") if isinstance(m, LookupResp)]
    for blocks in (first, second):
        res = by_keys.get(tuple(demo_key(b) for b in blocks))
        want = tuple(b < MISSING for b in blocks)
        if res is None or not res.answered or res.hits != want:
            got = "no result" if res is None else (f"answered={res.answered} hits="
                                                   f"{_flags(res.hits)}")
            raise CaseFailure(f"hits {_flags(want)} for the lookup of blocks {blocks}, "
                              "every key answered", f"{got}; {t.summary()}")
        check_parts(t, blocks)
    both = sum(1 for m in resps if {*m.keys} & {demo_key(b) for b in first}
               and {*m.keys} & {demo_key(b) for b in second})
    hits = [b for b in first + second if b < MISSING]
    _served_round(t, rid, hits, f"transfer_done(true) for the fetch of both lookups' hits "
                  f"({rid!r}, the lookups' round)",
                  "the hits of both lookups served: transfer_done(success=true)")
    t.finish(rid)
    t.observe()
    t.check_clean()
    shape = "coalesced" if both else "one per lookup" if len(resps) == 2 else "in parts"
    return f"{len(resps)} lookup_resp for 2 lookups ({shape}); {len(hits)} hits served"


@case("duplicate.fetch", PRODUCER, "a PD fetch of 8 held blocks sent twice, the copy "
      "right after the original: the round is served once (byte-exact, one "
      "transfer_done(true)), the copy changes nothing, and the session serves another round",
      "server_round: one round per (request, round_seq): a fetch for a round already "
      "demanded is rejected and changes nothing (the round's own reply comes; at most one "
      "transfer_done per round); a rejected frame never ends the session")
def duplicate_fetch(ctx: Context) -> str:
    t = ctx.tester()
    t.handshake()
    rid = "conform-twice"
    blocks = _blocks(ctx)
    slots = [NUM_BLOCKS - 1 - i for i in range(len(blocks))]
    job = t.fetch(rid, blocks, slots)
    sent = [f.message for f in t.frames if f.sent and isinstance(f.message, Fetch)
            and f.message.kv_request_id == rid]
    if not sent:
        raise NotApplicable("our session sent no fetch")
    t.send(sent[-1])  # the copy, behind the session's back
    result = t.load_result(job, f"transfer_done(true) for the fetch of {rid!r}")
    t.observe()
    dones = [d for d in _dones(t, rid) if d.round_seq == sent[-1].round_seq]
    if len(dones) > 1:
        raise CaseFailure("at most one transfer_done for the round (the copy of its fetch "
                          "is rejected, not served again)", t.summary())
    if t.received("disconnect") or not t.session.ready:
        raise CaseFailure("the session stays up (a rejected fetch changes nothing)",
                          t.summary())
    if not result.success:
        raise CaseFailure("the round served once: transfer_done(success=true)",
                          f"{result.reason}: {result.detail}; {t.summary()}")
    t.check_blocks(blocks, slots)
    _pd_round(t, "conform-twice-after", blocks, "then ")
    t.check_clean()
    return "served once; the copy changed nothing"


def _late(ctx: Context, n: int) -> list[int]:
    late = list(ctx.target.late_blocks[:n])
    if not late:
        raise NotApplicable("no --late-blocks: when a target's host stores a block is not "
                            "driven over the wire; name blocks it stores late (p2pfsm serve "
                            "--hold-back, vLLM's interop node --hold-back)")
    return late


@case("demand.late-supply", PRODUCER, "a PD fetch of 4 blocks the target holds at once and "
      "up to 4 it stores late (--late-blocks): the round waits for the late ones as demand "
      "and ends with one transfer_done(true), every block byte-exact",
      "server_round: keys without supply wait as demand while supply may still come; "
      "writes follow the supply as it arrives; transfer_done(success) once, after every "
      "key's write landed")
def late_supply(ctx: Context) -> str:
    late = _late(ctx, 4)
    t = ctx.tester()
    t.handshake()
    blocks = [*_blocks(ctx, 4), *late]
    _pd_round(t, "conform-late", blocks, "supply that arrives after the fetch: ")
    t.observe()
    if len(_dones(t, "conform-late")) != 1:
        raise CaseFailure("exactly one transfer_done for the round", t.summary())
    t.check_clean()
    return f"{len(blocks)} blocks ({len(late)} late) byte-exact"


@case("lookup.split", PRODUCER, "a lookup of 3 held keys, 2 the target stores late "
      "(--late-blocks) and a miss: every key answered once, each lookup_resp in the "
      "lookup's order (in parts or whole), held keys hit, the miss a miss (a late key "
      "either); then a fetch of the hits is served byte-exact",
      "server_lookup: every key answered once, hit or miss, in as many lookup_resp as the "
      "producer sends (split answers allowed), each listing keys of the lookup in its "
      "order; a pending key is answered when its host resolves it")
def lookup_split(ctx: Context) -> str:
    late = _late(ctx, 2)
    held = _blocks(ctx, 3)
    t = ctx.tester()
    t.handshake()
    rid = "conform-split"
    blocks = [held[0], late[0], *held[1:], *late[1:], MISSING]
    t.lookup(rid, blocks)
    t.expect(lambda: bool(t.lookups), "lookup_resp answering every key of the lookup")
    res = t.lookups[0]
    wrong = [b for b, h in zip(blocks, res.hits, strict=True)
             if b not in late and h != (b < MISSING)]
    if not res.answered or wrong:
        raise CaseFailure("every key answered: held keys hit, the missing key a miss",
                          f"answered={res.answered} hits={_flags(res.hits)}; "
                          + t.summary())
    parts = check_parts(t, blocks)
    hits = [b for b, h in zip(blocks, res.hits, strict=True) if h]
    _served_round(t, rid, hits, f"transfer_done(true) for the fetch of the hits ({rid!r})",
                  "the hits served: transfer_done(success=true)")
    t.finish(rid)
    t.observe()
    t.check_clean()
    late_hits = sum(1 for b, h in zip(blocks, res.hits, strict=True) if h and b in late)
    return (f"answered in {parts} lookup_resp; {late_hits} of {len(late)} late key(s) hit; "
            f"{len(hits)} hits served")
