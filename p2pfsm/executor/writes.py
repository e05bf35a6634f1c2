"""A node's WRITEs in flight: one id from start to end, and what each one was for.

A WRITE is named by the pair (session, the session's ``xfer``): the node passes it to
:meth:`DataPlane.write`, the plane reports it under it from :meth:`DataPlane.poll` and
takes it in :meth:`DataPlane.cancel` (NIXL's handle stays inside the plane). A session
that replaces another never hears of the old one's writes: each result goes back to the
session that started the write.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from p2pfsm.executor.nixl_plane import DataPlane, WriteId
from p2pfsm.session import Session, StartWrite


@dataclass(eq=False, slots=True)
class Write:
    """One of our WRITEs: its session, the session's id for it, and its size."""

    peer_id: str
    xfer: int
    nbytes: int
    session: Session

    @property
    def key(self) -> tuple[Session, int]:
        """Its id in :class:`Writes` and in the data plane: (session, xfer)."""
        return (self.session, self.xfer)


class Writes:
    """Our WRITEs that the data plane still runs, by (session, xfer)."""

    __slots__ = ("_block_len", "_by_id", "_data")

    def __init__(self, data: DataPlane, block_len: int) -> None:
        self._data = data
        self._block_len = block_len
        self._by_id: dict[WriteId, Write] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def start(self, peer: str, out: StartWrite, session: Session) -> None:
        """Start ``session``'s write on the data plane; a TransportError if it cannot."""
        write = Write(peer, out.xfer, len(out.local_indexes) * self._block_len, session)
        key = write.key
        self._data.write(key, peer, out.local_indexes, out.remote_indexes)
        self._by_id[key] = write

    def cancel(self, session: Session | None, xfer: int) -> Write | None:
        """Cancel ``session``'s write ``xfer``; the write when it stopped at once (it is
        forgotten then), None when it runs on (its end comes from :meth:`finished`) or
        is unknown."""
        write = self._by_id.get((session, xfer))
        if write is not None and self._data.cancel(write.key):
            del self._by_id[write.key]
            return write
        return None

    def finished(self) -> Iterator[tuple[Write, bool]]:
        """The writes the data plane reports ended (each forgotten), with success."""
        for write_id, ok in self._data.poll():
            write = self._by_id.pop(write_id, None)
            if write is not None:
                yield write, ok

    def running(self) -> list[Write]:
        """The writes still running, oldest first."""
        return list(self._by_id.values())

    def forget(self, write: Write) -> None:
        """Stop tracking ``write`` (the node closes without waiting for its end)."""
        del self._by_id[write.key]
