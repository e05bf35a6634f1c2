"""A node's configuration, checked whole at construction (a bad value never fails later)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from p2pfsm.errors import ConfigError
from p2pfsm.session import DEFAULT_HASH_SEED, Timeouts
from p2pfsm.session.config import (
    DEFAULT_MAX_LOOKUPS_PER_REQUEST,
    PROFILE_TIMEOUTS,
    profile_timeouts,
)

if TYPE_CHECKING:
    from p2pfsm.executor.zmq.curve import CurveKeys

MAX_BLOCKS = (1 << 31) - 1
"""Largest region in blocks: NIXL takes descriptor indexes as int32."""

MAX_REGION_BYTES = 1 << 48
"""Largest region in bytes the node accepts (256 TiB: beyond any host or GPU)."""


def fingerprint(model_config: Mapping[str, Any] | None) -> str:
    """vLLM's config fingerprint: sha256 of sorted-key compact JSON, first 16 hex chars."""
    if not model_config:
        return ""
    text = json.dumps(model_config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def config_digests(model_config: Mapping[str, Any] | None
                   ) -> tuple[tuple[str, str], ...] | None:
    """``(field, digest)`` of each field of ``model_config``, sorted: the fingerprint's
    digest of ``{field: value}`` alone (None without a model config)."""
    if not model_config:
        return None
    return tuple((str(key), fingerprint({key: model_config[key]}))
                 for key in sorted(model_config, key=str))


def _int_in(name: str, value: object, low: int, high: int) -> None:
    if type(value) is not int or not low <= value <= high:
        raise ConfigError(f"{name}: expected an int in [{low}, {high}], got {value!r}")


def _device_ok(device: object) -> bool:
    if device in ("cpu", "cuda"):
        return True
    if not isinstance(device, str):
        return False
    kind, sep, index = device.partition(":")
    return kind == "cuda" and bool(sep) and index.isascii() and index.isdigit()


@dataclass(frozen=True)
class NodeConfig:
    """Everything a node needs; see ``docs/howto/engine.md``. Every field is checked here.

    Args:
        bind: ``HOST:PORT`` (or ``tcp://HOST:PORT``, the same) of our ROUTER (port 0:
            any free port); kept in the ``tcp://`` form.
        num_blocks, block_len: our block region (``num_blocks * block_len`` bytes).
        hash_seed: prefix-cache hash seed; peers must match (vLLM's default).
        model_config: dict whose fingerprint peers must match (or pass ``fingerprint``).
        fingerprint: an explicit fingerprint string (overrides ``model_config``).
        timeouts: session deadlines.
        device: ``"cpu"`` or ``"cuda[:N]"``: where the node allocates the region, or
            (with ``memory``) the device the memory must be on. None: ``"cpu"``, or the
            memory's own device.
        memory: the host's own memory to register instead (a contiguous torch tensor of
            exactly ``num_blocks * block_len`` bytes, or a
            :class:`~p2pfsm.executor.nixl.memory.HostRegion`), or a list of them for a cache
            laid out per layer (block ``i`` a row of each, rows summing to
            ``block_len``: :func:`~p2pfsm.executor.nixl.memory.describe_regions`); None: the
            node allocates.
        heartbeat_ivl_ms, heartbeat_timeout_ms: ZMTP liveness of each peer connection:
            our DEALER PINGs every ``heartbeat_ivl_ms`` and drops the connection when
            nothing comes back within ``heartbeat_timeout_ms`` of a PING (also the TTL
            it asks the peer to enforce). A frozen peer is noticed within their sum,
            12 s by default as with vLLM's 2 s + 10 s, at 5 s between PINGs instead of 2
            (each PING wakes both ends' ZeroMQ I/O threads: 128 idle peers cost 2.5x
            fewer wake-ups). The ROUTER PINGs every 6 intervals.
        connect_timeout_ms: how long a peer connection may take to come up (TCP and ZMTP
            handshake) before its session dies with "transport lost: connect timeout".
            A refused connect does not wait: "transport lost: connection refused".
        advertise_host: the host our peers dial back and see in our id (bind
            ``tcp://0.0.0.0:PORT`` and advertise the pod IP); None: the bind host.
        max_peers: most peer connections at once; more are dropped at the door.
        max_violations: rejected frames one session may send before the node closes it
            (a disconnect; every job of it gets its result); 0: never close for that.
        idle_timeout_s: a session a peer opened to us (not one we dialled) that has
            carried no frame and held no work for this long is closed, as vLLM evicts
            idle peers after 300 s; None: never.
        max_lookups_per_request: unanswered lookups a peer may hold open for one
            kv_request_id; one more is a protocol violation (rejected, counted).
        answer_lookups_in_parts: answer each served lookup's keys as the host resolves
            them (one lookup_resp for what it resolves at once, one per later answer),
            not in one lookup_resp once every key is settled (SessionConfig).
        profile: the behaviour profile every session of the node runs
            (``models/profiles/``: "native", "vllm-0.33", "vllm-0.34"); ``timeouts``,
            when left out, are its deadlines.
        peer_profiles: ``peer_id -> profile`` for the peers whose sessions run another
            profile than ``profile`` (with that profile's deadlines, unless ``timeouts``
            is given).
        reconnect_backoff_s: a session the host opened (``connect``) that dies is opened
            again, first at once, then (while each attempt fails before it is ready)
            after a wait that starts at the first number and doubles up to the second
            (default (0.1, 1.0)), each wait drawn at random between half of it and all of
            it; counted in ``redials``, each attempt logged. A fetch or
            lookup to the peer meanwhile waits for the new session up to its own
            deadline, or fails with SESSION_ENDED saying why; a session the peer opens to
            us meanwhile (it restarted and connected first) takes the redial's place at
            once. Not for a peer that restarted (its connect opens the new session), an
            incompatible peer, or a session the host or node closed. None: never; the
            host calls ``connect`` again.
        history: how many past deaths, violations and ended sessions the node keeps
            (oldest go first; :attr:`Node.counts` keeps the totals).
        trace: path of a trace log to write (None: no log); see
            :class:`p2pfsm.spec_log.CallLog`.
        max_pending_peers: peers that opened a connection to us with a connect but have
            not finished the handshake: at most this many (one is dropped for a newer
            one, from the source host holding the most: see docs/howto/curve.md); ready peers
            count against ``max_peers`` instead.
        max_new_peers_per_s: new peer identities admitted per source host (the address
            a connection comes from) and second, with a burst of as many at once; past
            it a new identity's frames are dropped at the door and counted
            (``identities_rate_limited``). Known peers, our own dials and a peer lost
            lately coming back are never charged; a flood from one host never holds
            another host's newcomers out.
        dial_back_any_host: dial a connecting peer back at the host its id names even
            when its connection came from another address (NAT); off: only an id
            whose host is the IP the connection came from is dialled back.
        curve_secret_key: path of our ``NAME.key_secret`` (``p2pfsm keygen``): ZeroMQ
            CURVE on every socket, only peers in ``curve_allow`` let in. None: NULL
            security (vLLM's).
        curve_allow: the peers allowed in: public key files (``NAME.key``) or
            directories of them (every ``*.key``). Required with ``curve_secret_key``.
        max_tombstones, max_node_tombstones: entries one session's per-request memory
            (its peer's terminal fetches and expired lookups, the host's finished
            requests) keeps in each table, and that all sessions keep together; past
            either the oldest goes early (``tombstones_dropped``). A session that ends
            keeps none.
        curve_peer_key: the server's public key file for our own ``connect`` calls;
            None: the one key of ``curve_allow`` when it holds exactly one. A dial-back
            uses the key the peer authenticated with.
    """

    bind: str
    num_blocks: int
    block_len: int
    hash_seed: str = DEFAULT_HASH_SEED
    model_config: Mapping[str, Any] | None = None
    fingerprint: str | None = None
    timeouts: Timeouts = PROFILE_TIMEOUTS
    device: str | None = None
    memory: Any = field(default=None, compare=False, repr=False)
    heartbeat_ivl_ms: int = 5000
    heartbeat_timeout_ms: int = 7000
    connect_timeout_ms: int = 10_000
    advertise_host: str | None = None
    max_peers: int = 128
    history: int = 1000
    max_violations: int = 64
    idle_timeout_s: float | None = 300.0
    trace: str | None = None
    max_pending_peers: int = 32
    max_new_peers_per_s: int = 500
    dial_back_any_host: bool = False
    curve_secret_key: str | None = None
    curve_allow: tuple[str, ...] = ()
    curve_peer_key: str | None = None
    max_lookups_per_request: int = DEFAULT_MAX_LOOKUPS_PER_REQUEST
    answer_lookups_in_parts: bool = False
    reconnect_backoff_s: tuple[float, float] | None = (0.1, 1.0)
    reconnect_max_attempts: int | None = None
    max_tombstones: int = 4096
    max_node_tombstones: int = 65_536
    profile: str = "native"
    peer_profiles: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.bind, str) and not self.bind.startswith("tcp://") \
                and ":" in self.bind and "/" not in self.bind:
            object.__setattr__(self, "bind", f"tcp://{self.bind}")  # "HOST:PORT" alike
        # Whether timeouts were given (they then hold for every profile of the node).
        object.__setattr__(self, "_own_timeouts", self.timeouts is not PROFILE_TIMEOUTS)
        if isinstance(self.timeouts, Timeouts):  # else refused below, with the others
            object.__setattr__(self, "timeouts", profile_timeouts(self.profile, self.timeouts))
        if not isinstance(self.peer_profiles, Mapping):
            raise ConfigError(f"peer_profiles: expected a mapping, got {self.peer_profiles!r}")
        for peer_id, name in self.peer_profiles.items():
            if not isinstance(peer_id, str) or not peer_id:
                raise ConfigError(f"peer_profiles: expected peer ids, got {peer_id!r}")
            profile_timeouts(name, PROFILE_TIMEOUTS)  # an unknown profile: ConfigError
        if not isinstance(self.bind, str) or not self.bind.startswith("tcp://"):
            raise ConfigError(f"bind: expected 'HOST:PORT' or 'tcp://HOST:PORT', "
                              f"got {self.bind!r}")
        _int_in("num_blocks", self.num_blocks, 1, MAX_BLOCKS)
        _int_in("block_len", self.block_len, 1, MAX_REGION_BYTES)
        if self.num_blocks * self.block_len > MAX_REGION_BYTES:
            raise ConfigError(
                f"num_blocks * block_len: {self.num_blocks * self.block_len} bytes is more "
                f"than {MAX_REGION_BYTES}")
        if not isinstance(self.hash_seed, str) or not self.hash_seed:
            raise ConfigError(f"hash_seed: expected a non-empty str, got {self.hash_seed!r}")
        if self.model_config is not None and not isinstance(self.model_config, Mapping):
            raise ConfigError(f"model_config: expected a mapping, got {self.model_config!r}")
        if self.model_config:
            try:
                fingerprint(self.model_config)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"model_config: not JSON-serialisable: {exc}") from None
        if self.fingerprint is not None and not isinstance(self.fingerprint, str):
            raise ConfigError(f"fingerprint: expected a str, got {self.fingerprint!r}")
        if not isinstance(self.timeouts, Timeouts):
            raise ConfigError(f"timeouts: expected a Timeouts, got {self.timeouts!r}")
        if self.device is not None and not _device_ok(self.device):
            raise ConfigError(f"device: expected 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        _int_in("heartbeat_ivl_ms", self.heartbeat_ivl_ms, 0, 3_600_000)
        _int_in("heartbeat_timeout_ms", self.heartbeat_timeout_ms, 0, 6_553_500)
        _int_in("connect_timeout_ms", self.connect_timeout_ms, 1, 3_600_000)
        if self.advertise_host is not None and (
                not isinstance(self.advertise_host, str) or not self.advertise_host
                or any(c in self.advertise_host for c in "/: ")):
            raise ConfigError(
                f"advertise_host: expected a host name or IPv4 address, got "
                f"{self.advertise_host!r}")
        _int_in("max_peers", self.max_peers, 1, 65_535)
        _int_in("history", self.history, 1, 1_000_000)
        _int_in("max_violations", self.max_violations, 0, 1_000_000)
        idle = self.idle_timeout_s
        if idle is not None and (not isinstance(idle, int | float) or isinstance(idle, bool)
                                 or not 0 < idle <= 86_400):
            raise ConfigError(f"idle_timeout_s: expected None or seconds in (0, 86400], "
                              f"got {idle!r}")
        if self.trace is not None and (not isinstance(self.trace, str) or not self.trace):
            raise ConfigError(f"trace: expected a file path, got {self.trace!r}")
        _int_in("max_pending_peers", self.max_pending_peers, 1, 65_535)
        _int_in("max_new_peers_per_s", self.max_new_peers_per_s, 1, 1_000_000)
        _int_in("max_lookups_per_request", self.max_lookups_per_request, 1, 1_000_000)
        _int_in("max_tombstones", self.max_tombstones, 1, 1_000_000)
        _int_in("max_node_tombstones", self.max_node_tombstones, 1, 100_000_000)
        backoff = self.reconnect_backoff_s
        if backoff is not None and not (
                isinstance(backoff, tuple) and len(backoff) == 2
                and all(isinstance(b, int | float) and not isinstance(b, bool) for b in backoff)
                and 0 < backoff[0] <= backoff[1] <= 3600):
            raise ConfigError(f"reconnect_backoff_s: expected None or (first, most) seconds "
                              f"with 0 < first <= most <= 3600, got {backoff!r}")
        if self.reconnect_max_attempts is not None:
            _int_in("reconnect_max_attempts", self.reconnect_max_attempts, 1, 1_000_000)
        for name in ("dial_back_any_host", "answer_lookups_in_parts"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name}: expected a bool, got {getattr(self, name)!r}")
        self.curve_keys()  # reads and checks the key files now

    def session_profile(self, peer_id: str) -> tuple[str, Timeouts]:
        """The profile a session to ``peer_id`` runs, and its deadlines."""
        name = self.peer_profiles.get(peer_id, self.profile)
        if name == self.profile or getattr(self, "_own_timeouts", True):
            return name, self.timeouts
        return name, profile_timeouts(name, PROFILE_TIMEOUTS)

    def curve_keys(self) -> CurveKeys | None:
        """The CURVE keys read from the key files (None: NULL security); ConfigError
        naming the field for a missing or unreadable file."""
        allow = self.curve_allow
        if isinstance(allow, str) or not isinstance(allow, tuple) or not all(
                isinstance(a, str) and a for a in allow):
            raise ConfigError(f"curve_allow: expected a tuple of key file or directory "
                              f"paths, got {allow!r}")
        for name in ("curve_secret_key", "curve_peer_key"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ConfigError(f"{name}: expected a key file path, got {value!r}")
        if self.curve_secret_key is None:
            if allow or self.curve_peer_key is not None:
                raise ConfigError("curve_allow / curve_peer_key: need curve_secret_key")
            return None
        if not allow:
            raise ConfigError("curve_allow: CURVE needs the public keys of the peers to let "
                              "in (key files or directories)")
        from p2pfsm.executor.zmq.curve import load_curve_keys

        return load_curve_keys(self.curve_secret_key, allow, self.curve_peer_key)

    @property
    def config_digests(self) -> tuple[tuple[str, str], ...] | None:
        """Per-field digests of ``model_config`` for our connect (None when an explicit
        ``fingerprint`` is given or there is no model config)."""
        return None if self.fingerprint is not None else config_digests(self.model_config)

    @property
    def config_fingerprint(self) -> str:
        return self.fingerprint if self.fingerprint is not None else fingerprint(self.model_config)
