"""The switch: make vLLM 0.33.0's P2P tier build p2pfsm's sessions, and undo it.

vLLM's tier manager (``vllm.v1.kv_offload.tiering.p2p.manager``) builds each peer's
session through its module-level name ``P2PSession``, which it imports from
``vllm.v1.kv_offload.tiering.p2p.session`` when it is first imported. :func:`install`
rebinds that name in the session package (so a manager imported later picks up the
adapter) and in the manager module if it is imported already; :func:`uninstall` puts
vLLM's class back in both. :func:`install` also guards vLLM's ZeroMQ transport
(:mod:`p2pfsm.vllm.guard`) and :func:`uninstall` removes the guard. No vLLM file
changes and nothing more of vLLM is imported. Both are idempotent; sessions built
before a switch keep the class they were built with.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from p2pfsm.vllm import guard

SESSION_PACKAGE = "vllm.v1.kv_offload.tiering.p2p.session"
MANAGER_MODULE = "vllm.v1.kv_offload.tiering.p2p.manager"

_original: Any = None


def _modules() -> list[Any]:
    """Where the name is looked up: the session package, and the manager once imported."""
    found = [importlib.import_module(SESSION_PACKAGE)]
    manager = sys.modules.get(MANAGER_MODULE)
    if manager is not None:
        found.append(manager)
    return found


def install() -> None:
    """New sessions of vLLM's P2P tier are p2pfsm's from now on."""
    global _original
    from p2pfsm.vllm.session import P2PSession

    modules = _modules()
    if _original is None:
        _original = modules[0].P2PSession
    for module in modules:
        module.P2PSession = P2PSession
    if guard.wanted():
        guard.install()
    else:
        guard.uninstall()


def uninstall() -> None:
    """New sessions of vLLM's P2P tier are vLLM's own again."""
    global _original
    if _original is None:
        return
    for module in _modules():
        module.P2PSession = _original
    _original = None
    guard.uninstall()


def installed() -> bool:
    """True while vLLM's tier builds p2pfsm's sessions."""
    from p2pfsm.vllm.session import P2PSession

    return all(m.P2PSession is P2PSession for m in _modules())


def current() -> Any:
    """The class vLLM's tier builds a session with now."""
    return _modules()[-1].P2PSession
