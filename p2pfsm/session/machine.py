"""The session machine's rules that need no session (``models/session.toml``).

Its named state sets, the handshake's compatibility check and the dead session's rate
limit. The machine's guards and actions are methods of
:class:`~p2pfsm.session.core.Session`, which holds its state (the session machine stays
with the session; the roles are parts it holds).
"""

from __future__ import annotations

from p2pfsm.errors import HandshakeMismatch
from p2pfsm.fsm import machine
from p2pfsm.protocol import Connect
from p2pfsm.session.config import SessionConfig

STALE_ANSWER_INTERVAL_S = 1.0
"""A dead session answers its peer's frames with a disconnect at most this often."""

LIVE_STATES = machine("session").state_set("live")
"""Session states in which the peer may still hear from us (models/session.toml [sets])."""
OPEN_STATES = machine("session").state_set("open")
"""Session states in which frames go out at once (else they wait in the send queue)."""
UNSTARTED_STATES = machine("session").state_set("unstarted")
"""Session states before HostStart: host calls other than start and close are refused."""


def _slices(layout: tuple[tuple[int, int, int], ...] | None) -> tuple[int, ...] | None:
    """What two peers' layouts must share: each region's slice length, in order. None
    for a connect without a layout (vLLM's plain region), which pairs only with another
    such connect."""
    return None if layout is None else tuple(entry[2] for entry in layout)


def _said(layout: tuple[tuple[int, int, int], ...] | None) -> str:
    if layout is None:
        return "one plain region (no layout field, as vLLM 0.33.0)"
    return f"{len(layout)} regions of slices {[entry[2] for entry in layout]}"


def names_differ(ours: tuple[str, ...], theirs: tuple[str, ...]) -> tuple[str, str] | None:
    """The region names only we have and only the peer has (sorted, comma-separated),
    or None when both name the same set."""
    only_ours, only_theirs = set(ours) - set(theirs), set(theirs) - set(ours)
    if not only_ours and not only_theirs:
        return None
    return (f"names the peer lacks: [{', '.join(sorted(only_ours))}]",
            f"names we lack: [{', '.join(sorted(only_theirs))}]")


def _named_mismatch(cfg: SessionConfig, peer: Connect) -> HandshakeMismatch | None:
    """Regions paired by name (both sides named theirs): the same names, and each
    region's slice length that of its namesake."""
    ours, theirs = cfg.layout_names, peer.layout_names
    assert ours is not None and theirs is not None
    differ = names_differ(ours, theirs)
    if differ is not None:
        return HandshakeMismatch("layout_names", *differ)
    our_slices = _slices(cfg.layout) or (cfg.block_len,)
    their_slices = dict(zip(theirs, _slices(peer.layout) or (peer.block_len,), strict=True))
    for name, length in zip(ours, our_slices, strict=True):
        if their_slices[name] != length:
            return HandshakeMismatch("layout", f"region {name}: {length} bytes a block",
                                     f"region {name}: {their_slices[name]} bytes a block")
    return None


def _fingerprint_said(cfg: SessionConfig, peer: Connect) -> str:
    """Our fingerprint, and the model-config fields it covers that differ from the
    peer's (both sent per-field digests) or, when the peer sent none, all of them."""
    ours = cfg.config_fingerprint
    if cfg.config_digests is None:
        return ours
    mine = dict(cfg.config_digests)
    if peer.config_digests is None:
        return (f"{ours} (of model_config fields {', '.join(sorted(mine))}; the peer sends "
                f"only its hash: compare these fields with its config)")
    theirs = dict(peer.config_digests)
    differ = sorted(k for k in mine.keys() & theirs.keys() if mine[k] != theirs[k])
    parts = [f"fields that differ: {', '.join(differ)}"] if differ else []
    if mine.keys() - theirs.keys():
        parts.append(f"only ours: {', '.join(sorted(mine.keys() - theirs.keys()))}")
    if theirs.keys() - mine.keys():
        parts.append(f"only the peer's: {', '.join(sorted(theirs.keys() - mine.keys()))}")
    return f"{ours} (model_config {'; '.join(parts) or 'fields equal'})"


def handshake_mismatch(cfg: SessionConfig, peer: Connect) -> HandshakeMismatch | None:
    """Why ``peer``'s connect cannot pair with our config, or None when it can."""
    checks: list[tuple[str, object, object]] = [
        ("block_len", cfg.block_len, peer.block_len),
        ("hash_seed", cfg.hash_seed, peer.hash_seed),
        ("config_fingerprint", cfg.config_fingerprint, peer.config_fingerprint),
    ]
    if cfg.expected_peer_id is not None:
        checks.append(("peer_id", cfg.expected_peer_id, peer.peer_id))
    for name, ours, theirs in checks:
        if ours != theirs:
            if name == "config_fingerprint":
                return HandshakeMismatch(name, _fingerprint_said(cfg, peer), theirs)
            return HandshakeMismatch(name, ours, theirs)
    if cfg.layout_names is not None and peer.layout_names is not None:
        named = _named_mismatch(cfg, peer)
        if named is not None:
            return named
    elif _slices(cfg.layout) != _slices(peer.layout):
        return HandshakeMismatch("layout", _said(cfg.layout), _said(peer.layout))
    if peer.agent_metadata == cfg.agent_metadata or peer.peer_id == cfg.local_id:
        return HandshakeMismatch("agent_metadata", "ours", "ours (a peer posing as us)")
    return None
