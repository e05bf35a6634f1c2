"""The generated reference pages (docs/_ext/p2pfsm_docs.py) cover what the code and the
models say: every public name of ``p2pfsm``, every command, the nine messages with their
fields and the frame limits, every machine with its states and transitions."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from pathlib import Path

import p2pfsm
from p2pfsm import protocol
from p2pfsm.fsm.registry import machines
from p2pfsm.protocol.limits import DEFAULT_LIMITS, Limits
from p2pfsm.tools.cli import build_parser

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "docs" / "_ext"))
p2pfsm_docs = importlib.import_module("p2pfsm_docs")


def _documented() -> list[str]:
    return [name for _title, names in p2pfsm_docs.api_names() for name in names]


def test_every_top_level_name_is_documented_once_under_p2pfsm() -> None:
    documented = _documented()
    for name in p2pfsm.__all__:
        if name in ("BUILD", "__version__"):
            continue
        assert documented.count(f"p2pfsm.{name}") == 1, name


def test_each_object_is_documented_once_under_the_name_it_is_exported_as() -> None:
    objects = []
    for dotted in _documented():
        module, _, attr = dotted.rpartition(".")
        obj = getattr(importlib.import_module(module), attr)
        objects.append(id(obj))
        exported = attr in p2pfsm.__all__ and getattr(p2pfsm, attr) is obj
        assert (module == "p2pfsm") == exported, dotted
    assert len(objects) == len(set(objects))


def test_the_host_api_page_names_the_node_and_the_async_node() -> None:
    page = p2pfsm_docs.api_page()
    for name in ("Node", "NodeConfig", "AsyncNode", "HostRegion", "LoadResult",
                 "NodeMetrics", "serve_metrics", "P2PFSMError"):
        assert f".{name}\n" in page, name


def test_the_cli_page_has_every_command() -> None:
    page = p2pfsm_docs.cli_page()
    for name in p2pfsm_docs._subparsers(build_parser()):
        assert f"## p2pfsm {name}\n" in page, name
    assert "--config" in page  # `check` shows its own parser's options


def test_the_wire_page_has_the_nine_messages_their_fields_and_the_limits() -> None:
    page = p2pfsm_docs.wire_page()
    messages = [getattr(protocol, n) for n in protocol.__all__
                if isinstance(getattr(getattr(protocol, n), "TYPE", None), str)]
    assert len(messages) == 9
    for m in messages:
        assert f"## `{m.TYPE}`" in page, m
        for f in dataclasses.fields(m):
            assert f"| `{f.name}`" in page, (m, f.name)
    for f in dataclasses.fields(Limits):
        assert f"| `{f.name}` | {getattr(DEFAULT_LIMITS, f.name):,} |" in page, f.name


def test_the_models_page_has_every_state_and_transition() -> None:
    page = p2pfsm_docs.models_page()
    for name, spec in machines().items():
        assert f"## {name}\n" in page
        for state in spec.states:
            assert f"| `{state}` |" in page, (name, state)
        rows = len(spec.transitions)
        section = page.split(f"## {name}\n", 1)[1].split("\n## ", 1)[0]
        assert section.count("\n| `") - len(spec.states) == rows, name
