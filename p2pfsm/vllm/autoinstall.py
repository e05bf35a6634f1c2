"""Turn the switch from the environment: ``P2PFSM_VLLM_SESSIONS=1``.

vLLM loads every ``vllm.general_plugins`` entry point in each of its processes before it
builds an engine; p2pfsm's (declared in its ``pyproject.toml``) is :func:`register`,
which calls :func:`p2pfsm.vllm.install` when the variable is ``1`` and does nothing
otherwise. So ``P2PFSM_VLLM_SESSIONS=1 vllm serve ...`` runs p2pfsm's sessions with no
code change. Importing this module has no effect of its own.
"""

from __future__ import annotations

import os

ENV_VAR = "P2PFSM_VLLM_SESSIONS"


def wanted() -> bool:
    """Whether the environment asks for p2pfsm's sessions."""
    return os.environ.get(ENV_VAR, "").strip() == "1"


def register() -> None:
    """vLLM's plugin hook: install the adapter when the environment asks for it."""
    if wanted():
        from p2pfsm.vllm.switch import install

        install()
