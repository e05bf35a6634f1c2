"""How often a data plane's NIXL agent must be progressed, having no progress thread.

NIXL's Python default starts a UCX progress thread that polls with a zero timeout and
burns a whole core per process even when idle (measured here). The data plane
(:class:`~p2pfsm.executor.nixl.plane.DataPlane`) creates its agent with
``enable_prog_thread=False``, so UCX only progresses inside NIXL calls: ``poll()``
(``check_xfer_state``) drives our own WRITEs, and ``progress()`` (``get_new_notifs``,
which runs the worker's progress loop) serves the *passive* side. NIXL's Python API
exposes no descriptor to wait on, so progress is periodic and driven by the executor's
event loop, which already wakes up for the control plane: it calls ``progress()`` (about
1 us when idle) every time it wakes while the pace is not idle, at least once per idle
interval otherwise, and never waits longer than the plane's ``progress_interval_ms``
(:meth:`ProgressPace.interval_ms`), which is

* 0 (progress on every turn, the loop does not sleep) for the first ``prompt_s`` after a
  WRITE of ours is posted and after ``expect_inbound()`` is asked for promptness (a
  client does when it sends a fetch). The default is 0 (no such window): measured here
  (docs/explanation/performance.md), a loop blocked in epoll on the control plane for up to 1 ms,
  waking for every frame, fetched faster and with a third of the CPU of one that spins,
  on a box with more runnable threads than cores;
* ``busy_progress_ms`` (1 ms) while our own WRITEs are in flight after that, for
  ``warmup_s`` after each ``add_peer()``, and while ``expect_inbound()`` says a peer may
  be writing into us;
* ``idle_progress_ms`` (200 ms) otherwise.

Why this is enough (measured here, two processes, CMA): the first WRITE from a new peer
stays ``PROC`` for as long as the target does not progress (UCX wire-up needs the
target), and completes within a few ms once it does; later WRITEs complete without any
target progress. ``make_connection`` and a NIXL notification sent during the handshake
did not remove that first-transfer dependency, hence the busy window after ``add_peer``
and ``expect_inbound()`` (a client calls it while it waits for blocks). The idle tick
keeps UCX keepalives and late wire-up serviced at negligible cost.
"""

from __future__ import annotations

import time
from typing import Final

from p2pfsm.errors import ConfigError

__all__ = ["IDLE_PROGRESS_MS", "ProgressPace"]

IDLE_PROGRESS_MS: Final = 200
"""The default idle pace: each wake-up of an idle loop costs ~0.1-0.5 ms of CPU on a VM,
so 5 a second keep an idle node near 0.25 % of a core (20 a second: 0.95 %)."""


class ProgressPace:
    """The longest a loop may go without progressing the agent, by what is going on.

    ``busy_ms`` and ``idle_ms`` come checked (positive ints); ``warmup_s`` and
    ``prompt_s`` are checked here (numbers >= 0, else :class:`ConfigError`). The
    attributes are plain so a benchmark can set another pace between fetches.
    """

    def __init__(self, busy_ms: int, idle_ms: int, warmup_s: float, prompt_s: float) -> None:
        self.busy_ms = busy_ms
        self.idle_ms = idle_ms
        if not isinstance(warmup_s, int | float) or warmup_s < 0:
            raise ConfigError(f"warmup_s must be a number >= 0, got {warmup_s!r}")
        self.warmup_s = float(warmup_s)
        if not isinstance(prompt_s, int | float) or prompt_s < 0:
            raise ConfigError(f"prompt_s must be a number >= 0, got {prompt_s!r}")
        self.prompt_s = float(prompt_s)
        self.prompt_until = 0.0
        self.busy_until = 0.0

    def interval_ms(self, writing: bool) -> int:
        """0 in a prompt window; the busy pace while ``writing`` (WRITEs of ours in
        flight) or in a busy window; the idle pace otherwise."""
        now = time.monotonic()
        if now < self.prompt_until:
            return 0
        if writing or now < self.busy_until:
            return self.busy_ms
        return self.idle_ms

    def warm_up(self) -> None:
        """A peer was added: busy for ``warmup_s`` from now (its first WRITE needs us)."""
        self.busy_until = time.monotonic() + self.warmup_s

    def posted(self) -> None:
        """A WRITE of ours was posted and runs: prompt for ``prompt_s`` from now."""
        self.prompt_until = max(self.prompt_until, time.monotonic() + self.prompt_s)

    def expect_inbound(self, seconds: float, prompt: bool) -> None:
        """Busy for ``seconds`` more; ``prompt``: and prompt for ``prompt_s``."""
        now = time.monotonic()
        self.busy_until = max(self.busy_until, now + max(0.0, seconds))
        if prompt:
            self.prompt_until = max(self.prompt_until, now + self.prompt_s)
