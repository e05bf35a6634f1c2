"""A descriptor any thread can make readable, to wake a loop blocked in ``epoll``.

An ``eventfd``: :meth:`Waker.wake` adds one to its counter (a write, safe from any
thread and from signal handlers), which makes it readable; :meth:`Waker.clear` reads the
counter back to zero. The loop registers :meth:`fileno` level-triggered and clears it
each turn before it looks at its queues, so a wake that comes later is never lost: the
descriptor stays readable until the next turn clears it.
"""

from __future__ import annotations

import os
import threading


class Waker:
    """One eventfd; close it with :meth:`close`."""

    def __init__(self) -> None:
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.armed = False
        """A wake came since the last clear (a poll skips :meth:`clear` without one)."""
        # wake() and close() may run on different threads: never write to a descriptor
        # number that close() gave back (the OS may have reused it).
        self._lock = threading.Lock()
        self._closed = False

    def fileno(self) -> int:
        return self._fd

    def wake(self) -> None:
        """Make the descriptor readable (idempotent until the next :meth:`clear`); after
        :meth:`close`, nothing."""
        with self._lock:
            if self._closed:
                return
            os.eventfd_write(self._fd, 1)
            self.armed = True

    def clear(self) -> bool:
        """Make it unreadable again; True when a wake came since the last clear."""
        if not self.armed:
            return False
        self.armed = False
        try:
            os.eventfd_read(self._fd)
        except BlockingIOError:
            return False  # wake() wrote after we read: the next clear takes it
        return True

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self._fd)
