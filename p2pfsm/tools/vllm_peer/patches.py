"""The two changes the harness makes to vLLM, applied only when asked and undone.

* :func:`apply` replaces ``ZmqConnection.close`` with one that stops the connection's
  monitor first. vLLM's closes the monitor's PAIR socket, then the DEALER: the DEALER's
  close event then goes to a monitor with no reader, and libzmq's I/O thread can block on
  it for good, so the process accepts no new peer (seen here after a few sessions, with
  both vLLM's sessions and p2pfsm's). The rest is vLLM's close. Apply it before
  :func:`p2pfsm.vllm.install`, whose guard keeps whatever ``close`` it finds and puts it
  back on uninstall.
* :func:`set_client_timeouts` sets vLLM's client-side load and abort-ack timeouts
  (``--load-timeout``, ``--abort-ack-timeout``; the capture harness did the same): each
  load timeout constant of the installed release (:mod:`p2pfsm.vllm.releases`).

:func:`undo` restores every original. Nothing here runs when the module is imported.
"""

from __future__ import annotations

import contextlib
from typing import Any

import zmq
from vllm.v1.kv_offload.tiering.p2p.control.zmq import ZmqConnection
from vllm.v1.kv_offload.tiering.p2p.session import client as vllm_client

from p2pfsm.vllm import releases

_originals: dict[str, Any] = {}
_stock_close: Any = None  # vLLM's close, kept for a patched close still referenced later


def _close_monitor_first(self: ZmqConnection) -> None:
    """vLLM's ``ZmqConnection.close``, with the monitor stopped first (module docstring)."""
    if not self._closed:
        with contextlib.suppress(zmq.ZMQError):
            self._sockets.dealer.disable_monitor()
    _stock_close(self)


def apply() -> None:
    """Stop the monitor before vLLM's ``ZmqConnection.close`` runs (idempotent)."""
    global _stock_close
    if "close" not in _originals:
        _originals["close"] = ZmqConnection.close
        if _stock_close is None:
            _stock_close = ZmqConnection.close
        ZmqConnection.close = _close_monitor_first


def set_client_timeouts(load_s: float, abort_ack_s: float | None = None) -> None:
    """vLLM's client load timeouts (and abort-ack timeout, when given), in seconds."""
    release = releases.installed()
    for name in dict.fromkeys((release.pd_load_timeout, release.p2p_load_timeout)):
        _originals.setdefault(name, getattr(vllm_client, name))
        setattr(vllm_client, name, load_s)
    if abort_ack_s is not None:
        _originals.setdefault("abort_ack", vllm_client._ABORT_ACK_TIMEOUT_S)
        vllm_client._ABORT_ACK_TIMEOUT_S = abort_ack_s


def undo() -> None:
    """vLLM's ``close`` and timeouts as they were (idempotent)."""
    if "close" in _originals:
        ZmqConnection.close = _originals.pop("close")
    for name in [n for n in _originals if n.endswith("LOAD_TIMEOUT_S")]:
        setattr(vllm_client, name, _originals.pop(name))
    if "abort_ack" in _originals:
        vllm_client._ABORT_ACK_TIMEOUT_S = _originals.pop("abort_ack")
