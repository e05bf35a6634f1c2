"""Whether the tester could pass the target's handshake at all.

A target whose block length, hash seed or config fingerprint differs from what the
tester advertises refuses every case's handshake: that is one fact about the command
line, not one failure per case. :func:`cannot_test` reads the target's own connect (in
the frames a tester saw) and names the first difference and the option that fixes it.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from typing import Final

from p2pfsm.protocol import Connect
from p2pfsm.tools.conform.target import Target
from p2pfsm.tools.conform.tester import Frame

_FIELDS: Final = (("block_len", "block length", "--block-len"),
                  ("hash_seed", "hash seed", "--hash-seed"),
                  ("config_fingerprint", "fingerprint", "--fingerprint"))


def cannot_test(target: Target, frames: Iterable[Frame]) -> str:
    """"" when no connect of the target came, or it matches what the tester advertises;
    else one line: "cannot test: the target's FIELD is VALUE: pass --OPTION VALUE"."""
    theirs = next((f.message for f in frames
                   if not f.sent and isinstance(f.message, Connect)), None)
    if theirs is None:
        return ""
    ours = {"block_len": target.block_len, "hash_seed": target.hash_seed,
            "config_fingerprint": target.fingerprint}
    for name, words, option in _FIELDS:
        value = getattr(theirs, name)
        if value != ours[name]:
            shown = repr(value) if isinstance(value, str) else str(value)
            return (f"cannot test: the target's {words} is {shown} (the tester's is "
                    f"{ours[name]!r}): pass {option} {shlex.quote(str(value))}")
    return ""
