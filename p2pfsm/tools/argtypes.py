"""Argument types shared by the command line and its bench driver."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import Any

from p2pfsm.errors import ConfigError

__all__ = ["fingerprint_arg", "peer_of", "positive"]


def positive(kind: type[int] | type[float]) -> Callable[[str], Any]:
    """An argparse type: a number of ``kind`` above zero."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
        return value
    return parse


def peer_of(url: str) -> str:
    """``tcp://HOST:PORT`` or ``HOST:PORT`` -> ``HOST:PORT`` (a ConfigError for anything
    else)."""
    peer = url[len("tcp://"):] if url.startswith("tcp://") else url
    if ":" not in peer or "/" in peer:
        raise ConfigError(f"--connect: expected HOST:PORT or tcp://HOST:PORT, got {url!r}")
    return peer


def fingerprint_arg(text: str) -> str:
    """``--fingerprint``: empty (no model config) or 16 hex digits, as vLLM computes it."""
    if text and not re.fullmatch(r"[0-9a-f]{16}", text):
        raise argparse.ArgumentTypeError(
            f"expected 16 lowercase hex digits (vLLM's config fingerprint) or '', got {text!r}")
    return text
