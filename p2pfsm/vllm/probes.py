"""vLLM's probe cache of one session: what ``register_lookup`` answers for each key.

vLLM's manager asks a session about one key at a time (``register_lookup``) and sends
the keys asked since the last scheduler step in one lookup per request
(``flush_pending_lookups``). :class:`Probes` keeps, per request, each key's answer as
the Session reported it (``None`` until then) and the keys not sent yet; the Session's
:class:`~p2pfsm.session.LookupResult` fills it in, and a key the peer answered before
the rest of its lookup is taken from the Session's record of that part. Nothing here
sends or decides: the lookups themselves are the Session's machines.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from p2pfsm.session import FailReason, LookupResult


class Probes:
    """The keys vLLM's manager asked of the peer, by request, and their answers."""

    def __init__(self) -> None:
        self._answers: dict[str, dict[bytes, bool | None]] = {}
        self._unsent: dict[str, list[bytes]] = {}

    def register(self, kv_request_id: str, key: bytes) -> bool | None:
        """The answer for ``key`` once known; None (and the key queued) before."""
        probes = self._answers.setdefault(kv_request_id, {})
        if key in probes:
            return probes[key]
        probes[key] = None
        self._unsent.setdefault(kv_request_id, []).append(key)
        return None

    def take_unsent(self) -> list[tuple[str, tuple[bytes, ...]]]:
        """Each request's keys registered since the last call (each key once), cleared."""
        unsent, self._unsent = self._unsent, {}
        return [(kv, tuple(dict.fromkeys(keys))) for kv, keys in unsent.items()]

    def drop(self, kv_request_id: str) -> None:
        """The request's probing is over (its fetch, or its finish): forget it."""
        self._answers.pop(kv_request_id, None)
        self._unsent.pop(kv_request_id, None)

    def answer(self, out: LookupResult) -> None:
        """Take the Session's result of one lookup. As vLLM's: a key the peer answered
        keeps its answer; one a session end left unanswered stays unresolved (close()
        then fails its request); any other unanswered key is a MISS."""
        probes = self._answers.get(out.kv_request_id)
        if probes is None:
            return  # fetched or finished meanwhile: nobody asks any more
        lost = out.reason is FailReason.SESSION_ENDED
        for key, hit in zip(out.keys, out.hits, strict=True):
            if key in probes:
                probes[key] = True if hit else (None if lost else False)

    def take_parts(self, answered: Callable[[str], Iterable[Mapping[bytes, bool]]]) -> None:
        """Take the keys the peer answered so far (``answered(kv_request_id)``: the pairs
        the Session recorded for each open lookup of the request) before their lookup is
        whole: as vLLM's, an answered key is given at once."""
        for kv_request_id, probes in self._answers.items():
            if None not in probes.values():
                continue
            for pairs in answered(kv_request_id):
                for key, hit in pairs.items():
                    if probes.get(key, False) is None:
                        probes[key] = hit

    def unanswered(self) -> list[str]:
        """The requests with a key still waiting for its answer."""
        return [kv for kv, probes in self._answers.items() if None in probes.values()]
