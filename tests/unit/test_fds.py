"""The descriptor check before a dial-back or an agent load: a count of ``/proc/self/fd``
stands for a while only with plenty to spare, and never across a change of the limit."""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator

import pytest

from p2pfsm.errors import TransportError
from p2pfsm.executor import fds
from tests.helpers.descriptors import descriptors_left


class Counting:
    """Counts the listings of ``/proc/self/fd``; a clock the test moves."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.listings = 0
        self.now = 1000.0
        real = fds._open_count

        def open_count() -> tuple[int, int] | None:
            self.listings += 1
            return real()

        monkeypatch.setattr(fds, "_open_count", open_count)
        monkeypatch.setattr(fds, "_clock", lambda: self.now)
        monkeypatch.setattr(fds, "_counted", (float("-inf"), 0, 0))


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counting]:
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("no /proc here")
    yield Counting(monkeypatch)


def _plenty() -> int:
    """Descriptors to leave free: well above the headroom and the slack (the test is
    skipped where the hard limit does not allow as many)."""
    count = fds.HEADROOM + fds.SLACK + 256
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and len(os.listdir("/proc/self/fd")) + count > hard:
        pytest.skip(f"the hard descriptor limit ({hard}) is too low for this test")
    return count


def test_a_count_with_slack_to_spare_stands_until_it_is_old(counting: Counting) -> None:
    with descriptors_left(_plenty()):
        fds.require_headroom("first")
        counting.now += fds.RECOUNT_S / 2
        fds.require_headroom("second")
        assert counting.listings == 1
        counting.now += fds.RECOUNT_S
        fds.require_headroom("third")
        assert counting.listings == 2


def test_near_the_limit_every_check_counts(counting: Counting) -> None:
    with descriptors_left(fds.HEADROOM + fds.SLACK // 2):
        fds.require_headroom("first")
        fds.require_headroom("second")
    assert counting.listings == 2


def test_a_lowered_limit_is_counted_at_once(counting: Counting) -> None:
    with descriptors_left(_plenty()):
        fds.require_headroom("with plenty")
    with descriptors_left(fds.HEADROOM // 2), pytest.raises(TransportError,
                                                            match="descriptors free"):
        fds.require_headroom("short of them")
    assert counting.listings == 2
