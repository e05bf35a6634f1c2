"""A node's WRITEs: what each one is for, kept in the data plane's one table of them.

A WRITE is named by its :class:`Write`: its session and the session's ``xfer`` (equal
Writes name the same WRITE), with the peer and the bytes along. The node passes it to
:meth:`DataPlane.write` as the WRITE's id; the plane keeps it in flight
(:mod:`p2pfsm.executor.nixl.xfers`), reports it from :meth:`DataPlane.poll` and takes it
in :meth:`DataPlane.cancel` (NIXL's handle stays inside the plane), so no second table
of writes exists. A session that replaces another never hears of the old one's writes:
each result goes back to the session that started the write.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from p2pfsm.executor.nixl.plane import DataPlane
from p2pfsm.session import Session, StartWrite


@dataclass(frozen=True, slots=True)
class Write:
    """One of our WRITEs: its session and the session's id for it (what names it), its
    peer and its size."""

    session: Session
    xfer: int
    peer_id: str = field(compare=False)
    nbytes: int = field(compare=False)


class Writes:
    """Our WRITEs that the data plane has not reported yet."""

    __slots__ = ("_block_len", "_data")

    def __init__(self, data: DataPlane, block_len: int) -> None:
        self._data = data
        self._block_len = block_len

    def __len__(self) -> int:
        return len(self._data.writes)

    def start(self, peer: str, out: StartWrite, session: Session) -> None:
        """Start ``session``'s write on the data plane; a TransportError if it cannot."""
        write = Write(session, out.xfer, peer, len(out.local_indexes) * self._block_len)
        self._data.write(write, peer, out.local_indexes, out.remote_indexes)

    def cancel(self, session: Session, xfer: int) -> bool:
        """Cancel ``session``'s write ``xfer``: True when it stopped at once (it will not
        be reported then), False when it runs on (its end comes from :meth:`finished`)
        or is unknown."""
        write = Write(session, xfer, "", 0)
        return self._data.writes.holds(write) and self._data.cancel(write)

    def finished(self) -> Iterator[tuple[Write, bool]]:
        """The writes the data plane reports ended, with success."""
        for write, ok in self._data.poll():
            if isinstance(write, Write):
                yield write, ok

    def running(self) -> list[Write]:
        """The writes not reported yet, oldest first."""
        return [w for w in self._data.writes.unreported() if isinstance(w, Write)]

    def forget(self, write: Write) -> None:
        """Stop waiting for ``write`` (the node closes without waiting for its end)."""
        self._data.abandon(write)
