"""The switch: make vLLM's P2P tier (0.33.0 or 0.34.0) build p2pfsm's sessions, and undo it.

vLLM's tier manager (``vllm.v1.kv_offload.tiering.p2p.manager``) builds each peer's
session through its module-level name ``P2PSession``, which it imports from
``vllm.v1.kv_offload.tiering.p2p.session`` when it is first imported. :func:`install`
rebinds that name in the session package (so a manager imported later picks up the
adapter) and in the manager module if it is imported already; :func:`uninstall` puts
vLLM's class back in both. :func:`install` also guards vLLM's ZeroMQ transport
(:mod:`p2pfsm.vllm.guard`) and makes vLLM's NIXL transport refuse a peer presenting
this node's own agent (:mod:`p2pfsm.vllm.nixl_guard`); :func:`uninstall` removes both.
The full install (``transport="p2pfsm"``) rebinds the name ``ZmqTransport`` the same way,
in vLLM's control package and manager, to :class:`p2pfsm.vllm.control.PlaneTransport`,
and the name ``NixlTransport``, in vLLM's data package and manager, to
:class:`p2pfsm.vllm.data.PlaneDataTransport`. No vLLM file changes, and nothing of vLLM
is imported beyond the modules patched. Both are idempotent; sessions built
before a switch keep the class they were built with. :func:`install` first checks
the installed vLLM against :mod:`p2pfsm.vllm.releases`: a missing vLLM, or a release
p2pfsm was not taught, is refused with one line before anything changes.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from p2pfsm.vllm import guard, nixl_guard, releases

SESSION_PACKAGE = "vllm.v1.kv_offload.tiering.p2p.session"
MANAGER_MODULE = "vllm.v1.kv_offload.tiering.p2p.manager"

CONTROL_PACKAGE = "vllm.v1.kv_offload.tiering.p2p.control"
DATA_PACKAGE = "vllm.v1.kv_offload.tiering.p2p.data"
ENV_TRANSPORT = "P2PFSM_VLLM_TRANSPORT"
TRANSPORTS = ("vllm", "p2pfsm")

_original: Any = None
_original_transport: Any = None
_original_data: Any = None


def _modules() -> list[Any]:
    """Where the name is looked up: the session package, and the manager once imported."""
    found = [importlib.import_module(SESSION_PACKAGE)]
    manager = sys.modules.get(MANAGER_MODULE)
    if manager is not None:
        found.append(manager)
    return found


def install(transport: str | None = None) -> None:
    """New sessions of vLLM's P2P tier are p2pfsm's from now on; with ``transport``
    ``"p2pfsm"`` (default: ``P2PFSM_VLLM_TRANSPORT``, else ``"vllm"``) new control
    transports are p2pfsm's ControlPlane too (:mod:`p2pfsm.vllm.control`), and new data
    transports p2pfsm's DataPlane (:mod:`p2pfsm.vllm.data`)."""
    global _original
    releases.installed()  # refuses a missing or unknown vLLM before anything changes
    from p2pfsm.vllm.session import P2PSession

    kind = transport if transport is not None else transport_wanted()
    if kind not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, got {kind!r}")
    modules = _modules()
    if _original is None:
        _original = modules[0].P2PSession
    for module in modules:
        module.P2PSession = P2PSession
    if guard.wanted():
        guard.install()
    else:
        guard.uninstall()
    nixl_guard.install()  # the own-agent refusal, on vLLM's NIXL transport
    _use_transport(kind)


def uninstall() -> None:
    """New sessions of vLLM's P2P tier are vLLM's own again (its transports too)."""
    global _original
    _use_transport("vllm")
    if _original is None:
        return
    for module in _modules():
        module.P2PSession = _original
    _original = None
    guard.uninstall()
    nixl_guard.uninstall()


def transport_wanted() -> str:
    """The transports the environment asks for (``P2PFSM_VLLM_TRANSPORT``)."""
    return os.environ.get(ENV_TRANSPORT, "").strip() or "vllm"


def _transport_modules(package: str = CONTROL_PACKAGE) -> list[Any]:
    """Where vLLM's manager looks a transport class up: its package (control or data),
    and the manager once imported."""
    found = [importlib.import_module(package)]
    manager = sys.modules.get(MANAGER_MODULE)
    if manager is not None:
        found.append(manager)
    return found


def _use_transport(kind: str) -> None:
    global _original_transport, _original_data
    control = _transport_modules()
    data = _transport_modules(DATA_PACKAGE)
    if kind == "p2pfsm":
        from p2pfsm.vllm.control import PlaneTransport
        from p2pfsm.vllm.data import PlaneDataTransport

        if _original_transport is None:
            _original_transport = control[0].ZmqTransport
        if _original_data is None:
            _original_data = data[0].NixlTransport
        for module in control:
            module.ZmqTransport = PlaneTransport
        for module in data:
            module.NixlTransport = PlaneDataTransport
        return
    if _original_transport is not None:
        for module in control:
            module.ZmqTransport = _original_transport
        _original_transport = None
    if _original_data is not None:
        for module in data:
            module.NixlTransport = _original_data
        _original_data = None


def current_transport() -> Any:
    """The control transport class vLLM's tier manager builds now."""
    return _transport_modules()[-1].ZmqTransport


def current_data_transport() -> Any:
    """The data transport class vLLM's tier manager builds now."""
    return _transport_modules(DATA_PACKAGE)[-1].NixlTransport


def installed() -> bool:
    """True while vLLM's tier builds p2pfsm's sessions."""
    from p2pfsm.vllm.session import P2PSession

    return all(m.P2PSession is P2PSession for m in _modules())


def current() -> Any:
    """The class vLLM's tier builds a session with now."""
    return _modules()[-1].P2PSession
