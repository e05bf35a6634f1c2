"""Fuzzing host inputs with bad arguments: LocalProtocolError, and nothing changed.

Host calls (HostFetch, HostSupply, HostLookup, HostAnswerLookup, HostFinish,
HostStart, WriteFinished, TimerFired) with arguments drawn to be wrong in every way
the session checks (length mismatch, duplicate or empty or non-bytes keys, indexes
outside the region or not ints, jobs already in use, unknown tokens, keys not pending,
unknown writes) and sometimes right, on sessions in every state. For every call:

* either it raises LocalProtocolError, and then the session's full digest is unchanged
  and no output of the refused call leaks into the next call; or it returns outputs;
* a call built to be invalid must raise (``expect_error``);
* HostAnswerLookup for a token no lookup holds is benign by design (the lookup may
  have ended meanwhile): it must change nothing and output at most the StoreResult
  that frees its pins;
* no other exception escapes, and every frame the session sends decodes back to itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from helpers.world import NUM_BLOCKS, Driver, key
from hypothesis import given
from hypothesis import strategies as st

from fuzz.states import STATES, fresh, full_snapshot, settle_clock
from fuzz.stats import COUNTS, fuzz_settings
from fuzz.test_fuzz_session import check_outputs
from p2pfsm.errors import LocalProtocolError
from p2pfsm.session import (
    HostAnswerLookup,
    HostFetch,
    HostFinish,
    HostLookup,
    HostStart,
    HostSupply,
    Input,
    StoreResult,
    TimerFired,
    TimerId,
    WriteFinished,
)

JOBS = (1, 2, 3, 50, 51, 52, 77)
"""Job ids the built states use (busy: loads 1-3, stores 50-52), plus a fresh one."""


@dataclass(frozen=True)
class BadKey:
    """A hashable non-bytes stand-in (the session must refuse it)."""

    name: str


good_keys = st.sampled_from([key(i) for i in range(12)])
bad_keys = st.sampled_from((b"", "k", 7, None, True, BadKey("k")))
good_indexes = st.integers(0, NUM_BLOCKS - 1)
bad_indexes = st.sampled_from((-1, NUM_BLOCKS, 2**31, 2**64, True, 1.0, "1", None))
request_ids = st.sampled_from(("load", "load2", "abrt", "look", "serve", "pd", "dem", "probe",
                               "pinned", "new"))


@st.composite
def keys_and_indexes(draw: st.DrawFn) -> tuple[tuple[object, ...], tuple[object, ...], bool]:
    """(keys, indexes, bad): ``bad`` when the pair breaks a rule ``_check_keys`` enforces."""
    n = draw(st.integers(0, 4))
    ks: list[object] = list(draw(st.lists(good_keys, min_size=n, max_size=n, unique=True)))
    idx: list[object] = list(draw(st.lists(good_indexes, min_size=n, max_size=n)))
    flaw = draw(st.sampled_from(("none", "none", "key", "index", "dup", "short", "long")))
    if flaw == "key" and ks:
        ks[draw(st.integers(0, n - 1))] = draw(bad_keys)
    elif flaw == "index" and idx:
        idx[draw(st.integers(0, n - 1))] = draw(bad_indexes)
    elif flaw == "dup" and ks:
        ks.append(ks[0])
        idx.append(0)
    elif flaw == "short" and idx:
        idx.pop()
    elif flaw == "long":
        idx.append(0)
    else:
        flaw = "none"
    return tuple(ks), tuple(idx), flaw != "none"


@st.composite
def host_calls(draw: st.DrawFn) -> tuple[Input, bool]:
    """(event, expect_error) where expect_error holds whatever the session's state."""
    kind = draw(st.sampled_from(("fetch", "supply", "lookup", "answer", "answer", "finish",
                                 "start", "write", "timer")))
    ks, idx, bad = draw(keys_and_indexes())
    if kind == "fetch":
        return HostFetch(draw(st.sampled_from(JOBS)), draw(request_ids), ks, idx), bad  # type: ignore[arg-type]
    if kind == "supply":
        return HostSupply(draw(st.sampled_from(JOBS)), draw(request_ids), ks, idx), bad  # type: ignore[arg-type]
    if kind == "lookup":
        bad_lookup = len(set(ks)) != len(ks) or any(type(k) is not bytes or not k for k in ks)
        return HostLookup(draw(request_ids), ks), bad_lookup  # type: ignore[arg-type]
    if kind == "answer":
        hits = dict(zip(ks, idx, strict=False))
        job = draw(st.one_of(st.none(), st.sampled_from(JOBS)))
        pending = frozenset(draw(st.lists(st.one_of(good_keys, bad_keys), max_size=2)))
        token = draw(st.one_of(st.integers(0, 3), st.sampled_from((-1, 99, 2**70))))
        return HostAnswerLookup(token, hits, job, pending), bool(hits) and job is None  # type: ignore[arg-type]
    if kind == "finish":
        return HostFinish(draw(request_ids)), False
    if kind == "start":
        return HostStart(), False
    if kind == "write":
        return WriteFinished(draw(st.sampled_from((0, 1, 99, -1))), draw(st.booleans())), False
    timer = draw(st.sampled_from((TimerId("load", ("nope", 0)), TimerId("store", (999,)),
                                  TimerId("lookup", (42,)), TimerId("handshake"),
                                  TimerId("bogus"))))
    return TimerFired(timer), False


def feed_host(d: Driver, event: Input, expect_error: bool) -> None:
    settle_clock(d)
    s = d.s
    before = full_snapshot(s)
    unknown_token = isinstance(event, HostAnswerLookup) and event.token not in s.view.served
    # What the session's state alone makes invalid.
    if isinstance(event, HostFetch | HostSupply | HostLookup | HostFinish):
        expect_error |= s.state == "idle"
    if isinstance(event, HostStart):
        expect_error = s.state != "idle"
    if isinstance(event, HostFetch):
        expect_error |= event.job_id in s.view.load_jobs
    if isinstance(event, HostSupply):
        expect_error |= event.job_id in s.view.store_jobs
    if isinstance(event, WriteFinished):
        expect_error = event.xfer not in s.view.writes
    COUNTS.session_events += 1
    try:
        out = d(event)
    except LocalProtocolError:
        assert full_snapshot(s) == before, f"refused {event} changed the session"
        assert s.view.pending_outputs == (), \
            f"refused {event} left outputs behind: {s.view.pending_outputs}"
        COUNTS.rejected_host_calls += 1
        return
    except BaseException:
        COUNTS.crashes += 1
        raise
    assert not expect_error, f"{event} was accepted in state {s.state}: {out}"
    check_outputs(out)
    if unknown_token:
        assert isinstance(event, HostAnswerLookup)
        assert full_snapshot(s) == before, f"answer for unknown token changed the session: {out}"
        assert out in ([], [StoreResult(event.job_id, False)]), out


@fuzz_settings(700)
@given(st.sampled_from(sorted(STATES)), st.lists(host_calls(), min_size=1, max_size=6))
def test_fuzzed_host_calls(state: str, calls: list[tuple[Input, bool]]) -> None:
    d = fresh(state)
    for event, expect_error in calls:
        feed_host(d, event, expect_error)


MUST_RAISE: dict[str, Input] = {
    "fetch-index-bool": HostFetch(9, "f", (key(1),), (True,)),  # type: ignore[arg-type]
    "fetch-index-float": HostFetch(9, "f", (key(1),), (1.0,)),  # type: ignore[arg-type]
    "fetch-key-str": HostFetch(9, "f", ("k",), (1,)),  # type: ignore[arg-type]
    "supply-index-2^31": HostSupply(90, "s", (key(1),), (2**31,)),
    "supply-empty-key": HostSupply(90, "s", (b"",), (1,)),
    "lookup-key-none": HostLookup("p", (None,)),  # type: ignore[arg-type]
    "answer-unknown-token-hits-no-job": HostAnswerLookup(99, {key(1): 1}, None),
    "write-unknown": WriteFinished(12345, True),
}


@pytest.mark.parametrize("event", MUST_RAISE.values(), ids=MUST_RAISE.keys())
@pytest.mark.parametrize("state", ["ready", "ready+busy"])
def test_known_bad_host_calls_raise(state: str, event: Input) -> None:
    d = fresh(state)
    before = full_snapshot(d.s)
    with pytest.raises(LocalProtocolError):
        d(event)
    assert full_snapshot(d.s) == before
