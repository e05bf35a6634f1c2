"""Fixtures shared by the integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from . import Child


@pytest.fixture
def children() -> Iterator[list[Child]]:
    """Child processes a test starts; every one is stopped when the test ends."""
    started: list[Child] = []
    try:
        yield started
    finally:
        for child in started:
            child.stop()
