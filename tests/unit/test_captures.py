"""Every control frame captured between two vLLM 0.33.0 peers decodes, and
re-encodes to the very same bytes.

The captures (``tests/data/vllm-0.33-captures/*.jsonl``, recorded from two
vLLM 0.33.0 peers) hold one JSON record per socket event. ``zmq_send``
records carry the DEALER's single frame, ``zmq_recv`` records the ROUTER's
``[routing_id, payload]``. A frame is ``{"len", "hex"}`` when its bytes were
recorded whole, or ``{"len", "head_hex"}`` (first 512 bytes) when not: that is
the case for every ``connect`` (647 bytes, mostly NIXL metadata). For those
the test rebuilds the frame from the decoded fields in ``msg`` and checks the
recorded head, the length, and the per-field ``wire`` encoding summary.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from p2pfsm.protocol import Connect, decode, encode, from_dict, names, to_dict

CAPTURES = Path(__file__).resolve().parents[1] / "data" / "vllm-0.33-captures"


@dataclass(frozen=True)
class Captured:
    where: str  # file:line
    type_name: str
    frame_len: int
    frame: bytes | None  # whole frame, when recorded
    head: bytes  # the recorded bytes (whole frame or its head)
    msg: dict[str, Any]
    wire: dict[str, str]


def _from_json(value: Any) -> Any:
    if isinstance(value, dict) and set(value) == {"$bytes"}:
        return bytes.fromhex(value["$bytes"])
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    if isinstance(value, dict):
        return {k: _from_json(v) for k, v in value.items()}
    return value


def _load() -> list[Captured]:
    found: list[Captured] = []
    for path in sorted(CAPTURES.glob("*.jsonl")):
        for line_no, line in enumerate(path.read_text().splitlines(), 1):
            rec = json.loads(line)
            if rec["ev"] not in ("zmq_send", "zmq_recv"):
                continue
            frames = rec["frames"]
            # DEALER sends one frame; the ROUTER receives [routing_id, payload].
            assert len(frames) == (1 if rec["ev"] == "zmq_send" else 2)
            payload = frames[-1]
            if "hex" in payload:
                head = bytes.fromhex(payload["hex"])
                frame: bytes | None = head
            else:
                frame = None
                head = bytes.fromhex(payload["head_hex"])
            found.append(
                Captured(
                    where=f"{path.name}:{line_no}",
                    type_name=rec["msg"]["type"],
                    frame_len=payload["len"],
                    frame=frame,
                    head=head,
                    msg=_from_json(rec["msg"]),
                    wire=rec["wire"],
                )
            )
    return found


RECORDS = _load()
FULL = [r for r in RECORDS if r.frame is not None]
HEAD_ONLY = [r for r in RECORDS if r.frame is None]


# --- a tiny msgpack reader that names each value's encoding like the captures' "wire"---


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        out = self.data[self.pos : self.pos + n]
        assert len(out) == n, "truncated"
        self.pos += n
        return out

    def uint(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def kind(self) -> tuple[str, Any]:
        """Return (encoding name, value) for the next value; arrays name their items."""
        b = self.take(1)[0]
        if b <= 0x7F:
            return "posfixint", b
        if 0xA0 <= b <= 0xBF:
            n = b & 0x1F
            return f"fixstr({n})", self.take(n).decode()
        if 0x90 <= b <= 0x9F or b == 0xDC:
            n = b & 0x0F if b != 0xDC else self.uint(2)
            items = [self.kind() for _ in range(n)]
            inner = "|".join(sorted({k for k, _ in items}))
            prefix = "fixarray" if b != 0xDC else "array16"
            return f"{prefix}({n})<{inner}>", [v for _, v in items]
        simple = {0xC2: ("false", False), 0xC3: ("true", True), 0xC0: ("nil", None)}
        if b in simple:
            return simple[b]
        widths = {0xCC: ("uint8", 1), 0xCD: ("uint16", 2), 0xCE: ("uint32", 4), 0xCF: ("uint64", 8)}
        if b in widths:
            name, n = widths[b]
            return name, self.uint(n)
        bins = {0xC4: ("bin8", 1), 0xC5: ("bin16", 2), 0xC6: ("bin32", 4)}
        if b in bins:
            name, w = bins[b]
            n = self.uint(w)
            return f"{name}({n})", self.take(n)
        if b == 0xD9:
            n = self.uint(1)
            return f"str8({n})", self.take(n).decode()
        raise AssertionError(f"encoding 0x{b:02x} not expected in this protocol")


def wire_summary(frame: bytes) -> dict[str, str]:
    r = _Reader(frame)
    b = r.take(1)[0]
    assert 0x80 <= b <= 0x8F, "top must be a fixmap"
    summary = {"$": f"fixmap({b & 0x0F})"}
    for _ in range(b & 0x0F):
        _, field = r.kind()
        summary[field] = r.kind()[0]
    assert r.pos == len(frame)
    return summary


def _ids(records: list[Captured]) -> list[str]:
    return [f"{r.where}:{r.type_name}" for r in records]


def _iter_frames() -> Iterator[bytes]:
    for r in FULL:
        assert r.frame is not None
        yield r.frame


# --- the tests---


def test_captures_are_present() -> None:
    assert len(list(CAPTURES.glob("*.jsonl"))) == 12
    assert len(FULL) == 68
    assert len(HEAD_ONLY) == 24


@pytest.mark.parametrize("rec", FULL, ids=_ids(FULL))
def test_full_frame_round_trips_byte_for_byte(rec: Captured) -> None:
    assert rec.frame is not None
    assert len(rec.frame) == rec.frame_len
    msg = decode(rec.frame)
    assert rec.type_name == msg.TYPE
    assert encode(msg) == rec.frame
    # The decoded fields are what the capture tool decoded, in the same order.
    assert to_dict(msg) == rec.msg
    assert list(to_dict(msg)) == list(rec.msg)
    assert wire_summary(rec.frame) == rec.wire


@pytest.mark.parametrize("rec", HEAD_ONLY, ids=_ids(HEAD_ONLY))
def test_connect_rebuilt_from_its_recorded_head(rec: Captured) -> None:
    assert rec.type_name == names.CONNECT  # only connect frames were cut
    meta = rec.msg["agent_metadata"]  # {"$bytes_len", "$head", "$sha256"}: not recorded whole
    meta_len = meta["$bytes_len"]
    # The head holds the map up to most of the metadata; find where the blob starts.
    marker = b"\xaeagent_metadata\xc5" + struct.pack(">H", meta_len)
    start = rec.head.index(marker) + len(marker)
    known = rec.head[start:]
    assert known.startswith(bytes.fromhex(meta["$head"]))
    assert (
        len(known) < meta_len
    )  # the tail of the blob (and the later fields) are not in the capture
    fields = {**rec.msg, "agent_metadata": known + bytes(meta_len - len(known))}
    msg = from_dict(fields)
    assert isinstance(msg, Connect)
    rebuilt = encode(msg)
    assert len(rebuilt) == rec.frame_len
    assert rebuilt[: len(rec.head)] == rec.head
    assert wire_summary(rebuilt) == rec.wire
    assert decode(rebuilt) == msg


def test_every_type_is_covered() -> None:
    full_types = {r.type_name for r in FULL}
    head_types = {r.type_name for r in HEAD_ONLY}
    assert full_types == names.ALL_TYPES - {names.CONNECT}
    assert head_types == {names.CONNECT}
    assert full_types | head_types == names.ALL_TYPES


def test_terminal_fetch_is_captured() -> None:
    terminal = [r for r in FULL if r.type_name == names.FETCH and not r.msg["keys"]]
    assert terminal
    for r in terminal:
        assert r.frame is not None
        assert decode(r.frame).is_terminal  # type: ignore[union-attr]


def test_frames_stay_far_below_the_limits() -> None:
    assert max(len(f) for f in _iter_frames()) < 4096
