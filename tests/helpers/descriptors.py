"""A test's process with only a few descriptors left to open (its soft RLIMIT_NOFILE
lowered for the block, then put back)."""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Iterator


@contextlib.contextmanager
def descriptors_left(count: int) -> Iterator[None]:
    """Inside the block this process may open only ``count`` more descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    used = len(os.listdir("/proc/self/fd"))
    resource.setrlimit(resource.RLIMIT_NOFILE, (used + count, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
