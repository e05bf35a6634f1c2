"""The implementation under test: where it listens and the configuration it must share."""

from __future__ import annotations

from dataclasses import dataclass

from p2pfsm.session import DEFAULT_HASH_SEED


@dataclass(frozen=True, slots=True)
class Target:
    """A peer under test and what a compatible peer of it must advertise.

    Args:
        addr: its ``HOST:PORT`` (its ROUTER, and the identity it must present).
        block_len: bytes per block (ours must be equal).
        hash_seed, fingerprint: as the target's model config gives them.
        blocks: demo blocks ``0..blocks-1`` the target holds (``p2pfsm.demo_blocks``).
        window: seconds of an observation window ("the target sends nothing").
        deadline: seconds the target has to answer what it must answer.
        consumer_cmd: for the consumer role (``addr`` is then ""), a command template
            that runs the target's consumer against our address: ``{addr}`` (our
            ``HOST:PORT``), ``{keys}`` (demo blocks, e.g. ``0-7``), ``{mode}`` (``pd`` or
            ``sym``), ``{load_timeout}`` and ``{abort_ack_timeout}`` (seconds),
            ``{repeat}`` (fetches of the same request, one after another). Exit status
            0 means the consumer reports every load done and verified; anything else,
            a failed load.
        late_blocks: demo blocks the target also holds but stores only some time after
            a request asks for them (its host's late supply; none: the cases that need
            them are n/a).
    """

    addr: str
    block_len: int = 4096
    hash_seed: str = DEFAULT_HASH_SEED
    fingerprint: str = ""
    blocks: int = 16
    window: float = 1.0
    deadline: float = 10.0
    consumer_cmd: str = ""
    late_blocks: tuple[int, ...] = ()
