"""Session configuration: our identity, our memory layout, and deadlines."""

from __future__ import annotations

from dataclasses import dataclass, field

from p2pfsm.errors import ConfigError, ModelError
from p2pfsm.fsm import DEFAULT_PROFILE, Behaviour, Profile, profile
from p2pfsm.fsm.profiles import EXECUTOR_TIMEOUT_KEYS
from p2pfsm.protocol import DEFAULT_LIMITS, Limits
from p2pfsm.session.tombstones import DEFAULT_MAX_TOMBSTONES, TombstoneBudget

DEFAULT_HASH_SEED = "vllm-none-hash"
"""vLLM's default prefix-cache hash seed (a wire-visible fact)."""

DEFAULT_MAX_LOOKUPS_PER_REQUEST = 32
"""Unanswered lookups one peer may hold open per kv_request_id (SessionConfig)."""


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Deadlines in seconds; defaults are the native profile's (vLLM 0.33.0's).

    ``load_probed``: the load deadline of a fetch of a request that ran lookups (None: the
    same as ``load``). ``hold``: how long a destination a lost peer may still write is
    held before it is released on the clock (None: never; only a proof releases it)."""

    handshake: float = 30.0
    load: float = 30.0
    abort_ack: float = 10.0
    store: float = 30.0
    lookup: float = 30.0
    lookup_pending: float = 5.0
    demand: float = 90.0
    """The producer fails a fetch still unmet this long (the consumer aborts far earlier)."""
    tombstone: float = 120.0
    """How long per-request round memory outlives the request (the assumed frame lifetime)."""
    load_probed: float | None = None
    hold: float | None = None

    def __post_init__(self) -> None:
        for name in ("handshake", "load", "abort_ack", "store", "lookup", "lookup_pending",
                     "demand", "tombstone", "load_probed", "hold"):
            value = getattr(self, name)
            if value is None and name in ("load_probed", "hold"):
                continue
            if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
                raise ConfigError(f"timeouts.{name}: expected a positive number, got {value!r}")

    @classmethod
    def of_profile(cls, prof: Profile) -> Timeouts:
        """The profile's session deadlines (the others at their defaults; its executor
        deadlines, :data:`~p2pfsm.fsm.profiles.EXECUTOR_TIMEOUT_KEYS`, are not the
        Session's)."""
        return cls(**{k: v for k, v in prof.timeouts.items() if k not in EXECUTOR_TIMEOUT_KEYS})

    def load_for(self, probed: bool) -> float:
        """The load deadline of a fetch (``probed``: its request ran lookups)."""
        return self.load_probed if probed and self.load_probed is not None else self.load


PROFILE_TIMEOUTS = Timeouts()
"""The default of ``timeouts`` in :class:`SessionConfig` (and the node's config): this
very object stands for "the profile's deadlines"."""


def resolve_profile(name: object) -> Profile:
    """The profile ``name``; an unknown name is a :class:`ConfigError` naming the known."""
    try:
        return profile(name)  # type: ignore[arg-type]
    except ModelError as exc:
        raise ConfigError(f"profile: {exc}") from None


def profile_timeouts(name: str, timeouts: Timeouts) -> Timeouts:
    """``timeouts``, or the profile's when it is :data:`PROFILE_TIMEOUTS` (left out); an
    unknown profile is a :class:`ConfigError` either way."""
    prof = resolve_profile(name)
    return Timeouts.of_profile(prof) if timeouts is PROFILE_TIMEOUTS else timeouts


@dataclass(frozen=True, slots=True)
class SessionConfig:
    """What a session advertises in its connect and checks in the peer's.

    Args:
        local_id: our "host:port" identity (also the NIXL agent name).
        agent_metadata: our data plane's registration blob.
        base_addr: address of block 0 of our region.
        num_blocks: blocks in our region.
        block_len: bytes per block; the peer's must be equal.
        hash_seed: prefix-cache hash seed; the peer's must be equal.
        config_fingerprint: model-config fingerprint; the peer's must be equal (exactly).
        expected_peer_id: when set, the peer's connect must carry this peer_id.
        layout: our memory's regions, sent in our connect's ``layout`` field (None: left
            out, the plain region ``base_addr``, ``num_blocks`` and ``block_len``
            describe). The peer's regions must pair up with ours (same count, same
            slice lengths), and a peer that sends no layout only pairs with a node
            that sends none.
        layout_names: a name for each of our regions, in ``layout`` order (one for the
            plain region), sent in our connect's ``layout_names`` field (None: left
            out). When the peer names its regions too, regions pair by name: the names
            must be the same set, and each region's slice length that of its namesake.
        config_digests: ``(field, digest)`` of each field of our model configuration,
            sent in our connect's ``config_digests`` (None: left out); a fingerprint
            mismatch then names the fields that differ (or, with a peer that sends
            none, the fields the fingerprint covers).
        incarnation: sent in our connect (None: left out, as vLLM does); a node draws
            one at start, so that its peers recognise a restart on its first frame.
        max_lookups_per_request: unanswered lookups the peer may have open for one
            kv_request_id; one more is rejected as a protocol violation (changes
            nothing; the peer's lookup deadline ends its wait). An honest consumer has
            one per round it probes, answered in arrival order.
        answer_lookups_in_parts: answer a served lookup's keys as the host resolves
            them (what it resolves at once in one lookup_resp, each later answer in
            another) instead of in one lookup_resp once every key is settled; the
            protocol lets a producer split its answers, and the consumer gets its hits
            sooner. Off by default, as vLLM 0.33.0's producer sends one answer.
        max_tombstones: entries each of the tables the peer fills (its terminal
            fetches, its expired lookups, our host's finished requests) keeps at most;
            past it the oldest goes early (counted in ``tombstone_budget``).
        tombstone_budget: the entries all sessions of a node hold together (shared);
            None: no such bound.
        profile: the behaviour profile (``models/profiles/``): when an aborted load is
            reported, what a missing abort_ack does, and the deadlines ``timeouts``
            takes when it is left out.
    """

    local_id: str
    agent_metadata: bytes
    base_addr: int
    num_blocks: int
    block_len: int
    hash_seed: str = DEFAULT_HASH_SEED
    config_fingerprint: str = ""
    expected_peer_id: str | None = None
    timeouts: Timeouts = PROFILE_TIMEOUTS
    limits: Limits = DEFAULT_LIMITS
    incarnation: int | None = None
    layout: tuple[tuple[int, int, int], ...] | None = None
    layout_names: tuple[str, ...] | None = None
    config_digests: tuple[tuple[str, str], ...] | None = None
    max_lookups_per_request: int = DEFAULT_MAX_LOOKUPS_PER_REQUEST
    answer_lookups_in_parts: bool = False
    max_tombstones: int = DEFAULT_MAX_TOMBSTONES
    tombstone_budget: TombstoneBudget | None = field(default=None, compare=False)
    profile: str = DEFAULT_PROFILE

    def __post_init__(self) -> None:
        object.__setattr__(self, "timeouts", profile_timeouts(self.profile, self.timeouts))
        if not self.local_id:
            raise ConfigError("local_id: must not be empty")
        for name in ("num_blocks", "block_len"):
            value = getattr(self, name)
            if type(value) is not int or value <= 0:
                raise ConfigError(f"{name}: expected a positive int, got {value!r}")
        if type(self.base_addr) is not int or self.base_addr < 0:
            raise ConfigError(f"base_addr: expected a non-negative int, got {self.base_addr!r}")
        if not self.hash_seed:
            raise ConfigError("hash_seed: must not be empty")
        inc = self.incarnation
        if inc is not None and (type(inc) is not int or not 0 <= inc < 2**64):
            raise ConfigError(f"incarnation: expected None or an int in [0, 2**64), got {inc!r}")
        names = self.layout_names
        if names is not None:
            regions = 1 if self.layout is None else len(self.layout)
            if (not isinstance(names, tuple) or len(names) != regions
                    or not all(isinstance(n, str) and n for n in names)
                    or len(set(names)) != len(names)):
                raise ConfigError(f"layout_names: expected {regions} distinct non-empty "
                                  f"names, got {names!r}")
        most = self.max_lookups_per_request
        if type(most) is not int or not 1 <= most <= 1_000_000:
            raise ConfigError(f"max_lookups_per_request: expected an int in [1, 1000000], "
                              f"got {most!r}")
        cap = self.max_tombstones
        if type(cap) is not int or not 1 <= cap <= 1_000_000:
            raise ConfigError(f"max_tombstones: expected an int in [1, 1000000], got {cap!r}")
        if type(self.answer_lookups_in_parts) is not bool:
            raise ConfigError("answer_lookups_in_parts: expected a bool, got "
                              f"{self.answer_lookups_in_parts!r}")

    @property
    def behaviour(self) -> Behaviour:
        """The profile's choices the machines' guards read."""
        return resolve_profile(self.profile).behaviour
