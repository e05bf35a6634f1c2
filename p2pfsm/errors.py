"""Typed errors, grouped by who is to blame.

``LocalProtocolError`` means the host misused the API; ``RemoteProtocolError``
means the peer sent something the protocol forbids. Both leave the object they
were raised from unchanged (validate, then mutate).
"""

from __future__ import annotations


class P2PFSMError(Exception):
    """Base class of every error p2pfsm raises on purpose."""


class LocalProtocolError(P2PFSMError):
    """The host called the API in a way the protocol does not allow."""


class RemoteProtocolError(P2PFSMError):
    """The peer sent a frame the protocol forbids.

    Attributes:
        field: the wire field at fault ("" when the frame as a whole is bad).
        reason: what is wrong with it, in a few words.
    """

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}" if field else reason)


class MalformedFrame(RemoteProtocolError):
    """A frame failed decoding or validation; nothing was changed."""


class UnknownMessageType(MalformedFrame):
    """A well-formed map whose ``type`` this protocol does not define (ignored)."""


class HandshakeMismatch(RemoteProtocolError):
    """The peer's connect names a configuration incompatible with ours."""

    def __init__(self, field: str, ours: object, theirs: object) -> None:
        self.ours = ours
        self.theirs = theirs
        super().__init__(field, f"mismatch: ours={ours!r} theirs={theirs!r}")


class InvalidTransition(P2PFSMError):
    """A trigger fired in a state where the machine declares no transition."""

    def __init__(self, machine: str, state: str, trigger: str) -> None:
        self.machine = machine
        self.state = state
        self.trigger = trigger
        super().__init__(f"machine={machine} state={state} trigger={trigger}")


class ModelError(P2PFSMError):
    """A model file in models/ is malformed or names an unknown guard/action."""


class ConfigError(P2PFSMError):
    """A node or CLI configuration value is invalid."""


class TransportError(P2PFSMError):
    """The executor's ZeroMQ or NIXL layer failed (executor only)."""


NIXL_INSTALL_HINT = ("pip install 'p2pfsm[nixl]' (without a GPU, install the CPU torch "
                     "wheel first: pip install torch --index-url "
                     "https://download.pytorch.org/whl/cpu)")
"""How to get the NIXL data plane (torch, numpy, nixl-cu12); every missing-import error
names the import that failed and then this."""
