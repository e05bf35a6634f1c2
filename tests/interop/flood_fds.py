"""Where a target's descriptors go after the 800-identity flood (docs/explanation/vllm.md).

``P2PFSM_INTEROP=1 .venv/bin/python tests/interop/flood_fds.py KIND`` (KIND: ``vllm``,
``sessions``, ``full`` or ``serve``) starts one target as ``test_vllm_hostile.py`` does,
floods it, closes the attacker, then prints the target's descriptors above the
pre-attack count every 5 s for 75 s, and what its descriptors are then: by kind
(``/proc/PID/fd``), its sockets that ``ss -anp`` lists, and its socket inodes found in
the process's socket tables (``/proc/PID/net/*``), the rest counted as in none.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_vllm_hostile as hostile
from helpers.polling import poll_until  # tests/ is on sys.path once hostile is in

WATCH_S, EVERY_S = 75.0, 5.0
TABLES = ("tcp", "tcp6", "udp", "udp6", "raw", "raw6", "unix", "netlink", "packet")


def fd_kinds(pid: int) -> tuple[collections.Counter[str], set[str]]:
    kinds: collections.Counter[str] = collections.Counter()
    sockets: set[str] = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if link.startswith("socket:["):
            sockets.add(link[len("socket:["):-1])
            kinds["socket"] += 1
        elif link.startswith("/"):
            kinds["file"] += 1
        else:
            kinds[link.split(":")[0] if not link.startswith("anon_inode") else link] += 1
    return kinds, sockets


def in_tables(pid: int, sockets: set[str]) -> collections.Counter[str]:
    """How many of ``sockets`` (inodes) each socket table of the process lists."""
    found: collections.Counter[str] = collections.Counter()
    left = set(sockets)
    for table in TABLES:
        try:
            rows = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            for field in row.split():
                if field in left:
                    found[table] += 1
                    left.discard(field)
    found["in no table"] = len(left)
    return found


def main() -> None:
    kind = sys.argv[1]
    target = hostile.Target(kind, Path(tempfile.mkdtemp()))
    attack = hostile.Attack(target)
    try:
        agent = attack.agent()
        fds0 = target.fds()
        hostile._never_handshake(attack, agent)
        print(f"{kind}: pid {target.pid}, {fds0} fds before, +{target.fds() - fds0} at the "
              f"flood's end, answers {target.alive() and attack.answers(agent)}")
        attack.close()
        t0 = time.monotonic()
        deltas = []

        def sample() -> bool:
            """One reading while the target lives; False once it died."""
            if not target.alive():
                return False
            deltas.append((round(time.monotonic() - t0), target.fds() - fds0))
            return True

        # sampling /proc over a fixed window (nothing to wait on); it ends early only if
        # the target dies
        poll_until(sample, lambda alive: not alive, WATCH_S, "the watch window",
                   interval=EVERY_S, at_deadline="last")
        print("fds above the count before, (s after the attacker left, delta):", deltas)
        kinds, sockets = fd_kinds(target.pid)
        print("descriptors by kind:", dict(kinds))
        ss = subprocess.run(["ss", "-anp"], capture_output=True, text=True,
                            check=False).stdout.splitlines()
        listed = collections.Counter(" ".join(line.split()[:2]) for line in ss
                                     if f"pid={target.pid}," in line)
        print("sockets ss -anp lists:", dict(listed))
        print("socket inodes by the process's socket table:", dict(in_tables(target.pid,
                                                                                 sockets)))
    finally:
        attack.close()
        target.stop()


if __name__ == "__main__":
    main()
