"""The ways p2pfsm's adapter ends loads and supply that no Session input names.

vLLM 0.34.0's manager resets its cache through the sessions (``abort_loads()``,
``drain_stores()``). p2pfsm's Session has no such calls, so :class:`LoadEnds` (a part of
:class:`~p2pfsm.vllm.session.P2PSession`) ends each such load or request the way the
host's finish of its request does: the same ``abort_fetch`` (or ``transfer_done(false)``)
on the wire, and each job's one result. (The shorter deadline of a symmetric P2P load is
the profile's ``load_probed``, kept by the Session's load rounds.)
"""

from __future__ import annotations

from collections.abc import Iterable

from vllm.v1.kv_offload.tiering.p2p.session.server import StoreResult as VllmStoreResult

from p2pfsm.session import HostFinish, Input, Session
from p2pfsm.vllm.surface import StoreDrainResult
from p2pfsm.vllm.withdrawn import Withdrawn


class LoadEnds:
    """``abort_loads`` and ``drain_stores``."""

    _session: Session
    _load_reqs: dict[int, str]  # open load job -> kv_request_id
    _stores: list[VllmStoreResult]
    _withdrawn: Withdrawn

    def _host(self, event: Input) -> None:
        raise NotImplementedError  # the session's

    def abort_loads(self) -> None:
        """Abort every load still open (a cache reset): each is ended as a finish of its
        request would end it, so it is reported failed at once where the release does
        so, its destination released on abort_ack, transfer_done or close."""
        for kv_request_id in dict.fromkeys(self._load_reqs.values()):
            self._host(HostFinish(kv_request_id))

    def drain_stores(self, kv_request_ids: Iterable[str] | None = None) -> StoreDrainResult:
        """Withdraw our supply (of ``kv_request_ids``, else of every request the peer
        asked of us): the store jobs of rounds no fetch has named yet fail now
        (:class:`~p2pfsm.vllm.withdrawn.Withdrawn`), each round is ended as a finish of
        its request ends it, and the PD ids among them are named."""
        rounds = self._session.server.rounds
        ids = list(rounds) if kv_request_ids is None else list(kv_request_ids)
        mark = len(self._stores)
        withdrawn = self._withdrawn.withdraw(self._session, ids)
        reaped: set[str] = set()
        for kv_request_id in ids:
            serving = rounds.get(kv_request_id)
            if not serving:
                continue
            if any(r.origin == "host" for r in serving.values()):
                reaped.add(kv_request_id)
            self._host(HostFinish(kv_request_id))
        stores = [VllmStoreResult(job, False) for job in withdrawn] + self._stores[mark:]
        del self._stores[mark:]
        return StoreDrainResult(stores, reaped)
