"""The behaviour digest (tests/helpers/run_digest.py) is stable and sees a change."""

from __future__ import annotations

import pytest
from helpers.run_digest import run_digest

from p2pfsm.session import Session


def test_the_digest_is_the_same_run_after_run() -> None:
    assert run_digest(8) == run_digest(8)


def test_the_digest_sees_a_session_that_drops_an_output(monkeypatch: pytest.MonkeyPatch) -> None:
    before = run_digest(8)
    real = Session.handle

    def drops_the_last(self: Session, event: object, now: float) -> list[object]:
        return real(self, event, now)[:-1]  # type: ignore[arg-type]

    monkeypatch.setattr(Session, "handle", drops_the_last)
    assert run_digest(8) != before
