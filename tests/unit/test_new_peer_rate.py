"""The new-identity rate limit's buckets (``NewPeerRate``), driven by an explicit clock:
no sockets, no sleeps."""

from __future__ import annotations

import pytest

from p2pfsm.errors import ConfigError
from p2pfsm.executor.zmq.admission import NewPeerRate


def test_a_burst_of_rate_is_admitted_then_one_more_is_refused() -> None:
    rate = NewPeerRate(5)
    assert [rate.take("10.0.0.1", 100.0) for _ in range(5)] == [True] * 5
    assert rate.take("10.0.0.1", 100.0) is False
    assert rate.take("10.0.0.1", 100.0) is False  # a refusal takes nothing either
    assert rate.tokens("10.0.0.1", 100.0) == 0.0


def test_the_bucket_refills_at_rate_a_second_up_to_the_burst() -> None:
    rate = NewPeerRate(5)
    for _ in range(5):
        assert rate.take("10.0.0.1", 0.0)
    assert not rate.take("10.0.0.1", 0.1)  # half a token back
    assert rate.take("10.0.0.1", 0.2)  # a whole one: 1/rate after the bucket ran dry
    assert not rate.take("10.0.0.1", 0.2)
    assert rate.tokens("10.0.0.1", 0.6) == pytest.approx(2.0)
    # Never more than the burst, however long the host was quiet.
    assert rate.tokens("10.0.0.1", 1_000.0) == 5.0
    assert [rate.take("10.0.0.1", 1_000.0) for _ in range(6)] == [True] * 5 + [False]


def test_rounding_never_costs_a_token() -> None:
    rate = NewPeerRate(5)
    for _ in range(5):
        assert rate.take("10.0.0.1", 10.0)
    # (10.2 - 10.0) * 5 is 0.99999... in floats: still the one token 0.2 s brings back.
    assert rate.take("10.0.0.1", 10.2)
    assert not rate.take("10.0.0.1", 10.2)


def test_each_source_host_has_its_own_bucket() -> None:
    rate = NewPeerRate(2)
    assert rate.take("10.0.0.1", 0.0) and rate.take("10.0.0.1", 0.0)
    assert not rate.take("10.0.0.1", 0.0)
    # Another host's newcomers are not held out by the first host's burst.
    assert rate.take("10.0.0.2", 0.0) and rate.take("10.0.0.2", 0.0)
    assert not rate.take("10.0.0.2", 0.0)


def test_an_identity_that_was_not_admitted_after_all_is_given_back() -> None:
    rate = NewPeerRate(1)
    assert rate.take("h", 0.0)
    rate.refund("h")  # e.g. its dial-back could not be opened
    assert rate.take("h", 0.0)
    rate.refund("h")
    rate.refund("h")  # never above the burst
    assert rate.tokens("h", 0.0) == 1.0
    rate.refund("never-seen")  # nothing to give back to: no bucket is made


def test_only_hosts_whose_bucket_is_not_full_are_kept() -> None:
    rate = NewPeerRate(3, max_hosts=4)
    rate.take("a", 0.0)
    rate.take("b", 0.5)
    assert len(rate) == 2
    rate.take("c", 1.2)  # a's bucket is full again (1 s after its last use): forgotten
    assert len(rate) == 2
    for host in ("d", "e", "f", "g"):
        rate.take(host, 1.3)
    assert len(rate) == 4  # at most max_hosts: the least recently used went
    assert rate.tokens("b", 1.3) == 3.0  # forgotten: it starts afresh (never stricter)


def test_asking_what_is_left_charges_nothing() -> None:
    """Only take() charges. (That a known peer's frames never reach the bucket at all,
    its own dials and a lost peer coming back neither, is tested with sockets in
    tests/integration/test_zmq_plane.py.)"""
    rate = NewPeerRate(1)
    assert rate.tokens("h", 0.0) == 1.0
    assert rate.tokens("h", 0.0) == 1.0
    assert rate.take("h", 0.0)
    assert rate.tokens("h", 0.0) == 0.0


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "5", None])
def test_a_bad_rate_is_a_config_error(bad: object) -> None:
    with pytest.raises(ConfigError, match="max_new_peers_per_s"):
        NewPeerRate(bad)  # type: ignore[arg-type]
