"""What a node opens before its parts: its two planes, and the trace log it may write."""

from __future__ import annotations

import uuid
from collections.abc import Callable

from p2pfsm.errors import ConfigError
from p2pfsm.executor.nixl.plane import DataPlane
from p2pfsm.executor.node.config import NodeConfig
from p2pfsm.executor.zmq.admission import is_connect_from
from p2pfsm.executor.zmq.plane import ControlPlane
from p2pfsm.spec_log import CallHook


def open_planes(config: NodeConfig,
                holds_session: Callable[[str], bool]) -> tuple[ControlPlane, DataPlane]:
    """The node's control plane (bound) and data plane (its region registered); none
    left open when either fails. ``holds_session`` tells the control plane whether the
    node keeps an ended session of a peer (whose frames still reach it)."""
    control = ControlPlane(config.bind, heartbeat_ivl_ms=config.heartbeat_ivl_ms,
                           heartbeat_timeout_ms=config.heartbeat_timeout_ms,
                           heartbeat_ttl_ms=config.heartbeat_timeout_ms,
                           connect_timeout_ms=config.connect_timeout_ms,
                           max_peers=config.max_peers,
                           advertise_host=config.advertise_host,
                           dial_back_check=is_connect_from,
                           holds_session=holds_session,
                           dial_back_any_host=config.dial_back_any_host,
                           max_pending=config.max_pending_peers,
                           max_new_peers_per_s=config.max_new_peers_per_s,
                           curve=config.curve_keys())
    try:
        name = f"p2pfsm-{uuid.uuid4()}"
        data = DataPlane(name, config.num_blocks, config.block_len, config.device,
                         memory=config.memory)
    except BaseException:
        control.close()
        raise
    return control, data


def trace_hook(config: NodeConfig, local_id: str) -> CallHook | None:
    """The spec trace log ``config.trace`` asks for (None: none)."""
    if config.trace is None:
        return None
    from p2pfsm.spec_log import CallLog

    try:
        return CallLog(config.trace, local_id)
    except OSError as exc:
        raise ConfigError(f"cannot write the trace log {config.trace}: {exc}") from exc
