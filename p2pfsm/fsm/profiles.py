"""Behaviour profiles: ``models/profiles/<name>.toml`` read into a checked :class:`Profile`.

A profile holds what differs between implementations of one wire and is behaviour, not
bytes: deadlines, when an aborted load is reported, what a missing abort_ack or an
overdue lookup answer does, what a fetch still queued behind the handshake does, how
long a destination a lost peer may still write is held. The machines' guards read its
:class:`Behaviour`; the session's deadlines come from its ``timeouts``. A profile names
the wire it speaks (``wire``), so a later wire is one more profile file with its own
wire name, not a branch in code.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import TypeVar

from p2pfsm.errors import ModelError
from p2pfsm.fsm import registry
from p2pfsm.fsm.spec import read_model_file

PROFILES_DIR = "profiles"
"""The folder of ``models/`` that holds one file per profile."""

DEFAULT_PROFILE = "native"
"""The profile a node or session runs unless told otherwise."""

WIRES = frozenset({"vllm-p2p"})
"""Wires this build speaks (a profile naming another is refused at load)."""

EXECUTOR_TIMEOUT_KEYS = frozenset({"stall"})
"""Deadlines an executor keeps, not the Session: ``stall``, the age at which a write still
running is a peer fault that ends the session (the vLLM drop-in's sessions, as vLLM
0.34.0's producer; p2pfsm's node has no such rule: a pin waits for its write's end)."""

TIMEOUT_KEYS = frozenset({"handshake", "load", "load_probed", "abort_ack", "lookup", "hold",
                          *EXECUTOR_TIMEOUT_KEYS})
"""Deadlines a profile may set (seconds, positive); ``load_probed``, ``hold`` and
``stall`` may be left out (the load deadline; no bounded hold; no stall rule)."""

_REQUIRED_TIMEOUTS = frozenset({"handshake", "load", "abort_ack", "lookup"})
_KEYS = frozenset({"name", "doc", "wire", "behaviour", "timeouts", "executor"})
_E = TypeVar("_E", bound=enum.StrEnum)


class ReportFailedLoad(enum.StrEnum):
    """When an aborted load (deadline or host finish) gets its one result."""

    AT_ABORT_ACK = "at_abort_ack"
    """Once the peer acknowledged the abort (or raced it with transfer_done): the result
    says ``released=True``."""
    AT_ABORT_SEND = "at_abort_send"
    """When the abort is sent, ``released=False``; a DestinationReleased follows."""


class AbortAckTimeout(enum.StrEnum):
    """What an abort_ack missing past its deadline does."""

    RESEND_ABORT = "resend_abort"
    """The abort is sent again; the round waits on (a timeout proves nothing)."""
    END_SESSION = "end_session"
    """The whole peer session ends ("abort ack timed out"); its loads are orphaned."""


class LookupTimeout(enum.StrEnum):
    """What a lookup whose answer is overdue does."""

    REPORT_MISS = "report_miss"
    """The lookup reports its hits so far and MISS for the rest; the session stays."""
    END_SESSION = "end_session"
    """The whole peer session ends ("lookup response timed out"); every open lookup
    reports its hits so far and MISS for the rest, as at any session loss."""


class UnsentFetch(enum.StrEnum):
    """What a fetch still queued behind the handshake does when its load's deadline
    passes or the host finishes its request."""

    SEND_THEN_ABORT = "send_then_abort"
    """It is aborted as a sent one: the flush sends the fetch, then its abort_fetch."""
    RETIRE_LOCALLY = "retire_locally"
    """It is retired where it waits: never sent, no abort; the job fails (its destination
    free) and the request's terminal (empty) fetch is queued, which the flush drops while
    a load or lookup of the request is open."""


@dataclass(frozen=True, slots=True)
class Behaviour:
    """The choices the machines' guards read."""

    report_failed_load: ReportFailedLoad
    abort_ack_timeout: AbortAckTimeout
    lookup_timeout: LookupTimeout
    unsent_fetch: UnsentFetch


class LostLoad(enum.StrEnum):
    """When an executor tells its host of a load whose session ended under it (the
    Session reports it at the end either way; an executor reads this, not the machines)."""

    AT_END = "at_end"
    """With the host's next results (the poll where the session ends)."""
    AT_CLOSE = "at_close"
    """From the host's close of the session (vLLM's ``close().failed_jobs``)."""


@dataclass(frozen=True, slots=True)
class ExecutorBehaviour:
    """What an executor (the vLLM drop-in's sessions) reads of a profile, not the
    machines: the host's view of a session's end. The spec reads none of it."""

    lost_load: LostLoad = LostLoad.AT_END
    buffered_terminals: bool = False
    """After the peer's disconnect frame or the connection's loss, the transfer_done and
    abort_ack frames already received in the same batch still reach the session (every
    other frame of it is dropped); a frame the session itself rejected drops them too.
    False: every frame received after the end is dropped."""


@dataclass(frozen=True, slots=True)
class Profile:
    """One named profile of ``models/profiles/``."""

    name: str
    doc: str
    wire: str
    behaviour: Behaviour
    timeouts: Mapping[str, float]
    """Deadlines in seconds, by :data:`TIMEOUT_KEYS` name (only those the file sets)."""
    executor: ExecutorBehaviour = ExecutorBehaviour()
    """The ``[executor]`` table (optional): read by an executor, not the Session."""

    @property
    def stall(self) -> float | None:
        """The stall deadline of a running write in seconds, or None (no such rule)."""
        return self.timeouts.get("stall")


def _enum(kind: type[_E], raw: Mapping[str, object], key: str, origin: str) -> _E:
    value = raw.get(key)
    try:
        return kind(str(value) if isinstance(value, str) else "")
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in kind)
        raise ModelError(f"{origin}: behaviour.{key}: expected one of {allowed}, "
                         f"got {value!r}") from None


def _timeouts(raw: object, origin: str) -> Mapping[str, float]:
    if not isinstance(raw, dict):
        raise ModelError(f"{origin}: [timeouts] must be a table")
    unknown = raw.keys() - TIMEOUT_KEYS
    if unknown:
        raise ModelError(f"{origin}: unknown timeouts {sorted(unknown)} "
                         f"(known: {sorted(TIMEOUT_KEYS)})")
    missing = _REQUIRED_TIMEOUTS - raw.keys()
    if missing:
        raise ModelError(f"{origin}: timeouts {sorted(missing)} missing")
    out: dict[str, float] = {}
    for key, value in raw.items():
        if (not isinstance(value, int | float) or isinstance(value, bool)
                or not math.isfinite(value) or value <= 0):
            raise ModelError(f"{origin}: timeouts.{key}: expected a positive number of "
                             f"seconds, got {value!r}")
        out[key] = float(value)
    return MappingProxyType(out)


def _executor(raw: object, origin: str) -> ExecutorBehaviour:
    if raw is None:
        return ExecutorBehaviour()
    if not isinstance(raw, dict):
        raise ModelError(f"{origin}: [executor] must be a table")
    unknown = raw.keys() - {"lost_load", "buffered_terminals"}
    if unknown:
        raise ModelError(f"{origin}: unknown executor keys {sorted(unknown)}")
    lost = raw.get("lost_load", LostLoad.AT_END.value)
    try:
        lost_load = LostLoad(lost if isinstance(lost, str) else "")
    except ValueError:
        allowed = ", ".join(repr(m.value) for m in LostLoad)
        raise ModelError(f"{origin}: executor.lost_load: expected one of {allowed}, "
                         f"got {lost!r}") from None
    buffered = raw.get("buffered_terminals", False)
    if not isinstance(buffered, bool):
        raise ModelError(f"{origin}: executor.buffered_terminals: expected true or false, "
                         f"got {buffered!r}")
    return ExecutorBehaviour(lost_load, buffered)


def parse_profile(data: Mapping[str, object], origin: str) -> Profile:
    """A checked :class:`Profile` from a profile file's table (``origin`` names it in
    errors); anything unknown, missing or out of range is a :class:`ModelError`."""
    unknown = data.keys() - _KEYS
    if unknown:
        raise ModelError(f"{origin}: unknown keys {sorted(unknown)}")
    name, doc, wire = data.get("name"), data.get("doc"), data.get("wire")
    for key, value in (("name", name), ("doc", doc), ("wire", wire)):
        if not isinstance(value, str) or not value:
            raise ModelError(f"{origin}: {key} must be a non-empty string")
    assert isinstance(name, str) and isinstance(doc, str) and isinstance(wire, str)
    if wire not in WIRES:
        raise ModelError(f"{origin}: wire {wire!r} is not one this build speaks "
                         f"({sorted(WIRES)})")
    raw = data.get("behaviour")
    if not isinstance(raw, dict):
        raise ModelError(f"{origin}: [behaviour] must be a table")
    extra = raw.keys() - {"report_failed_load", "abort_ack_timeout", "lookup_timeout",
                          "unsent_fetch"}
    if extra:
        raise ModelError(f"{origin}: unknown behaviour keys {sorted(extra)}")
    behaviour = Behaviour(_enum(ReportFailedLoad, raw, "report_failed_load", origin),
                          _enum(AbortAckTimeout, raw, "abort_ack_timeout", origin),
                          _enum(LookupTimeout, raw, "lookup_timeout", origin),
                          _enum(UnsentFetch, raw, "unsent_fetch", origin))
    return Profile(name, doc, wire, behaviour, _timeouts(data.get("timeouts"), origin),
                   _executor(data.get("executor"), origin))


def profiles_dir(models: Path) -> Path:
    """The profile folder of a models directory."""
    return models / PROFILES_DIR


def load_profiles(models: Path) -> dict[str, Profile]:
    """Every profile of ``models/profiles/``, by name (sorted); a file whose ``name``
    is not its stem is a :class:`ModelError`."""
    out: dict[str, Profile] = {}
    for path in sorted(profiles_dir(models).glob("*.toml")):
        prof = parse_profile(read_model_file(path, "profile file"), path.name)
        if prof.name != path.stem:
            raise ModelError(f"{path}: declares name {prof.name!r}, expected {path.stem!r}")
        out[prof.name] = prof
    if DEFAULT_PROFILE not in out:
        raise ModelError(f"{profiles_dir(models)}: no {DEFAULT_PROFILE!r} profile")
    return out


@cache
def profiles() -> Mapping[str, Profile]:
    """Every profile this install knows, loaded once."""
    return MappingProxyType(load_profiles(registry.models_directory()))


def profile(name: str) -> Profile:
    """The profile ``name``; an unknown one is a :class:`ModelError` naming the known."""
    known = profiles()
    try:
        return known[name]
    except (KeyError, TypeError):
        raise ModelError(f"unknown profile {name!r} (known: {sorted(known)})") from None
