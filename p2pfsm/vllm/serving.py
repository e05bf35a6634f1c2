"""The peer's lookups, answered from vLLM's tier manager (a part of ``P2PSession``).

The Session reports each lookup the peer sends us (``LookupRequest``) and its end
(``LookupClosed``); vLLM's manager lends its lookup table once per scheduler step
(``serve_external_requests(parent)``). :class:`Serving` asks ``parent`` about the keys
still pending, pins the hits in one store job, and gives the Session each answer
(``HostAnswerLookup``); the Session decides what goes on the wire. Importing this module
imports vLLM.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.kv_offload.base import LookupResult as VllmLookup
from vllm.v1.kv_offload.base import ReqContext

from p2pfsm.session import HostAnswerLookup, Input, LookupClosed, LookupRequest
from p2pfsm.vllm.surface import Served


class Serving:
    """``serve_external_requests`` and the Session's lookup outputs of the server role."""

    peer_id: str
    _served: dict[int, Served]  # the Session's lookup token -> its lookup, being answered
    _finished_ctxs: list[ReqContext]  # asked lookups that ended: the manager is told

    def _feed(self, event: Input) -> None:
        raise NotImplementedError  # the session's

    def serve_external_requests(self, parent: Any) -> None:
        """Answer the peer's lookups from ``parent`` (valid only during this call)."""
        for token, served in list(self._served.items()):
            if token not in self._served:
                continue  # closed by the answer just given to another one
            if not served.asked:
                served.asked = True
                parent.on_new_request(served.ctx)
            self._ask(served, parent)
        finished, self._finished_ctxs = self._finished_ctxs, []
        for ctx in finished:
            parent.on_request_finished(ctx)

    def _ask(self, served: Served, parent: Any) -> None:
        hits: list[bytes] = []
        pending: set[bytes] = set()
        for key in [k for k in served.req.keys if k in served.pending]:
            result = parent.lookup(key, served.ctx)
            if result is VllmLookup.HIT:
                hits.append(key)
            elif result is not VllmLookup.MISS:
                pending.add(key)  # HIT_PENDING and RETRY: ask again next time
        if pending == served.pending and not hits:
            return  # nothing settled since the last answer
        answer: dict[bytes, int] = {}
        job_id: int | None = None
        if hits:
            job = parent.create_store_job(hits, served.ctx)
            job_id = int(job.job_id)
            answer = {bytes(k): int(c) for k, c in zip(job.keys, job.chunk_ids.tolist(),
                                                       strict=True)}
        served.pending = pending
        self._feed(HostAnswerLookup(served.req.token, answer, job_id, frozenset(pending)))

    def _close_serves(self) -> list[ReqContext]:
        """At close: the contexts of every lookup the manager was told of and not yet
        told the end of (it fails them)."""
        serves = [s.ctx for s in self._served.values() if s.asked] + self._finished_ctxs
        self._served.clear()
        self._finished_ctxs = []
        return serves

    # the Session's outputs (Executor methods)
    def lookup_request(self, peer: str, out: LookupRequest) -> None:
        ctx = ReqContext(req_id=f"p2p:{self.peer_id}:{out.kv_request_id}:lu{out.token}")
        self._served[out.token] = Served(out, ctx)

    def lookup_closed(self, peer: str, out: LookupClosed) -> None:
        served = self._served.pop(out.token, None)
        if served is not None and served.asked:
            self._finished_ctxs.append(served.ctx)
