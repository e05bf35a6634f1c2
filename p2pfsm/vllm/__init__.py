"""p2pfsm inside vLLM (0.33.0, 0.34.0): its P2P tier's sessions, backed by p2pfsm's machines.

``p2pfsm.vllm.install()`` makes a stock vLLM tier build :class:`p2pfsm.vllm.session.
P2PSession` wherever it would build its own; ``uninstall()`` undoes it (docs/explanation/vllm.md).
Nothing here imports vLLM when this package is imported, so ``import p2pfsm.vllm``
works without vLLM installed; the functions and submodules that need it import it then.
"""

from __future__ import annotations


def _require_vllm() -> None:
    """:class:`~p2pfsm.vllm.releases.UnsupportedVllm` naming the supported releases when
    vLLM is missing or a release p2pfsm was not taught (before an import of vLLM, or of
    what it brings, fails on a name that does not say vLLM)."""
    from p2pfsm.vllm import releases

    releases.installed()


def install(transport: str | None = None) -> None:
    """New sessions of vLLM's P2P tier are p2pfsm's (see :mod:`p2pfsm.vllm.switch`);
    ``transport="p2pfsm"`` (or ``P2PFSM_VLLM_TRANSPORT=p2pfsm``) also puts p2pfsm's
    control and data planes behind vLLM's control and data transports (the full
    install). UnsupportedVllm when vLLM is missing or of an unknown release."""
    _require_vllm()
    from p2pfsm.vllm.switch import install as _install

    _install(transport)


def uninstall() -> None:
    """New sessions of vLLM's P2P tier are vLLM's own again."""
    _require_vllm()
    from p2pfsm.vllm.switch import uninstall as _uninstall

    _uninstall()


def installed() -> bool:
    """True while vLLM's tier builds p2pfsm's sessions."""
    _require_vllm()
    from p2pfsm.vllm.switch import installed as _installed

    return _installed()


__all__ = ["install", "installed", "uninstall"]
