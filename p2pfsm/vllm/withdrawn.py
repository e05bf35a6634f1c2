"""Store jobs a cache reset withdrew from rounds no fetch has named yet.

vLLM 0.34.0's ``drain_stores()`` fails, at once, every store job whose blocks no WRITE
reads, so that its manager can reset the cache and reuse those blocks; a fetch that
comes later for such a round is answered ``transfer_done(false)``. p2pfsm's Session has
no input that withdraws supply, so the adapter does it around the Session: a job of a
round still waiting for its fetch (``server_round.toml``'s ``unfetched`` set) is reported
failed now, the Session's own later result for it is dropped (one result per job), and
any WRITE of its round is refused before the transport sees it: the round then fails as
a failed WRITE fails it, and the reused blocks are never read.
"""

from __future__ import annotations

from collections.abc import Iterable

from p2pfsm.session import Session
from p2pfsm.session.server import SERVER_ROUND

_UNFETCHED = SERVER_ROUND.state_set("unfetched")


class Withdrawn:
    """The withdrawn store jobs of one session, until the Session gives their result."""

    def __init__(self) -> None:
        self._jobs: set[int] = set()

    def withdraw(self, session: Session, kv_request_ids: Iterable[str]) -> list[int]:
        """Withdraw the jobs of the unfetched rounds of ``kv_request_ids``; the new ones."""
        rounds = session.server.rounds
        new: list[int] = []
        for kv_request_id in kv_request_ids:
            for rnd in rounds.get(kv_request_id, {}).values():
                if rnd.fsm_state in _UNFETCHED:
                    new.extend(sorted(rnd.jobs - self._jobs))
                    self._jobs.update(rnd.jobs)
        return new

    def refuses(self, session: Session, xfer: int) -> bool:
        """Whether WRITE ``xfer`` reads blocks of a withdrawn job (then it must not run)."""
        rnd = session.server.writes.get(xfer)
        return rnd is not None and not self._jobs.isdisjoint(rnd.jobs)

    def settled(self, job_id: int) -> bool:
        """True (once) for the Session's result of a job reported already."""
        if job_id in self._jobs:
            self._jobs.discard(job_id)
            return True
        return False
