"""The spec's variables in a TLC state, read as machine instances.

TLC prints each state as TLA+ text per variable; :func:`parse_state` parses them
(:mod:`p2pfsm.tools.verify.tla_values`), keeping what it cannot parse as opaque text.
:func:`instances` names every session, client round and server round of a state as
``(machine, peer, instance name) -> (state, record)``; :func:`lookup_lists` gives a
peer's lookups per request, oldest first, and :func:`align` pairs a list's entries
before and after a step. Read by :mod:`p2pfsm.tools.verify.explain`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from p2pfsm.tools.verify.tla_values import Fn, parse_value, show


def parse_state(state: Mapping[str, str]) -> dict[str, object]:
    """A TLC state's variables as values (text TLC printed that does not parse: opaque)."""
    out: dict[str, object] = {}
    for name, text in state.items():
        try:
            out[name] = parse_value(text)
        except ValueError:
            out[name] = _Opaque(re.sub(r"\s+", " ", text).strip())
    return out


@dataclass(frozen=True, slots=True)
class _Opaque:
    text: str

    def __str__(self) -> str:
        return self.text


def value_at(fn: object, key: object) -> object:
    """``fn[key]`` of a TLA+ function, None when ``fn`` is none or lacks the key."""
    if isinstance(fn, Fn):
        return fn.get(key)
    return None


def peers_of(values: Mapping[str, object]) -> list[str]:
    """The peers of a state (the domain of ``sess``), sorted."""
    sess = values.get("sess")
    return sorted(str(k) for k in sess) if isinstance(sess, Fn) else []


def round_name(key: object) -> str:
    """A round's name, ``req/seq`` (``req/unbound`` for a negative seq)."""
    if isinstance(key, tuple) and len(key) == 2:
        req, seq = key
        return f"{req}/{'unbound' if isinstance(seq, int) and seq < 0 else seq}"
    return show(key)


def keys_text(keys: object) -> str:
    """A set of lookup keys as ``[k1, k2]``, sorted."""
    if isinstance(keys, frozenset):
        return "[" + ", ".join(sorted(map(str, keys))) + "]"
    return show(keys)


# An instance: (machine, peer, instance name) -> (state, record).
Instances = dict[tuple[str, str, str], tuple[str, object]]


def lookup_lists(values: Mapping[str, object], var: str, peer: str
                 ) -> dict[str, tuple[object, ...]]:
    """A peer's lookups in ``var`` (``cl`` or ``sl``) per request, oldest first."""
    out: dict[str, tuple[object, ...]] = {}
    per_peer = value_at(values.get(var), peer)
    if isinstance(per_peer, Fn):
        for req, lst in per_peer.items():
            if isinstance(lst, tuple):
                out[str(req)] = lst
    return out


def lookup_name(req: str, rec: object) -> str:
    """A lookup's instance name: ``req/seq keys=[...]``."""
    seq = value_at(rec, "seq")
    seq_text = "unbound" if isinstance(seq, int) and seq < 0 else str(seq)
    return f"{req}/{seq_text} keys={keys_text(value_at(rec, 'keys'))}"


def lookup_state(rec: object) -> str:
    """A lookup's state: its ``st``; a served lookup is "resolving" while listed."""
    st = value_at(rec, "st")
    return st if isinstance(st, str) else "resolving"


def _identity(rec: object) -> tuple[object, object]:
    return (value_at(rec, "seq"), value_at(rec, "keys"))


def align(before: Sequence[object], after: Sequence[object]
           ) -> list[tuple[int | None, int | None]]:
    """Pairs (i, j) matching list entries by identity (round and keys), fewest changes
    first; (i, None) an entry gone, (None, j) an entry added."""
    n, m = len(before), len(after)
    inf = 10 ** 9

    def cost(i: int, j: int) -> int:
        if _identity(before[i]) != _identity(after[j]):
            return inf
        return 0 if before[i] == after[j] else 1

    best = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n, -1, -1):
        for j in range(m, -1, -1):
            if i == n and j == m:
                continue
            options = []
            if i < n:
                options.append(1 + best[i + 1][j])
            if j < m:
                options.append(1 + best[i][j + 1])
            if i < n and j < m:
                options.append(cost(i, j) + best[i + 1][j + 1])
            best[i][j] = min(options)
    pairs: list[tuple[int | None, int | None]] = []
    i = j = 0
    while i < n or j < m:
        if i < n and j < m and cost(i, j) < inf and best[i][j] == cost(i, j) + best[i + 1][j + 1]:
            pairs.append((i, j))
            i, j = i + 1, j + 1
        elif i < n and best[i][j] == 1 + best[i + 1][j]:
            pairs.append((i, None))
            i += 1
        else:
            pairs.append((None, j))
            j += 1
    return pairs


def _map_instances(values: Mapping[str, object], var: str, machine: str, peer: str,
                   out: Instances) -> None:
    per_peer = value_at(values.get(var), peer)
    if isinstance(per_peer, Fn):
        for key, rec in per_peer.items():
            st = value_at(rec, "st")
            if isinstance(st, str):
                out[(machine, peer, round_name(key))] = (st, rec)


def instances(values: Mapping[str, object]) -> Instances:
    """Every session, client round and server round of a state."""
    out: Instances = {}
    for peer in peers_of(values):
        st = value_at(values.get("sess"), peer)
        if isinstance(st, str):
            out[("session", peer, peer)] = (st, st)
        _map_instances(values, "cr", "client_round", peer, out)
        _map_instances(values, "sr", "server_round", peer, out)
    return out
