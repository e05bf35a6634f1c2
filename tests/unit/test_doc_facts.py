"""The architecture page's fact lists (:mod:`p2pfsm.tools.doc_facts`): rendered from the models
and the code, written between their markers only, and current in the checkout."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import pytest

from p2pfsm.errors import ConfigError
from p2pfsm.fsm import input_table, machines
from p2pfsm.layers import RUNTIME, TOOLS
from p2pfsm.session import Input, Output
from p2pfsm.tools import doc_facts

PAGE = doc_facts.page_path(Path(__file__).resolve().parents[2])


def _page(stale: str = "stale line") -> str:
    return "# Title\n\nProse before.\n\n" + "".join(
        f"<!-- facts:{name} -->\n{stale}\n<!-- /facts:{name} -->\n\nProse after {name}.\n\n"
        for name in doc_facts.BLOCKS)


def test_the_checkout_page_is_current() -> None:
    text = PAGE.read_text()
    assert doc_facts.fill(text, machines(), str(PAGE)) == text


def test_fill_rewrites_the_lists_and_keeps_the_prose() -> None:
    filled = doc_facts.fill(_page(), machines())
    assert "stale line" not in filled
    prose = [line for line in filled.splitlines() if line.startswith(("Prose", "# "))]
    assert prose == ["# Title", "Prose before."] + [f"Prose after {n}." for n in doc_facts.BLOCKS]
    assert doc_facts.fill(filled, machines()) == filled


@pytest.mark.parametrize("name", list(doc_facts.BLOCKS))
def test_a_missing_or_doubled_list_is_refused(name: str) -> None:
    page = _page()
    pair = re.search(rf"<!-- facts:{name} -->.*?<!-- /facts:{name} -->\n", page, re.S)
    assert pair is not None
    for broken in (page.replace(pair.group(0), ""), page + pair.group(0)):
        with pytest.raises(ConfigError, match=f"facts:{name}"):
            doc_facts.fill(broken, machines(), "page.md")


def _words(text: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_][A-Za-z_.]*", text))


def test_the_lists_name_every_state_input_output_and_module() -> None:
    specs = machines()
    table = _words(doc_facts.machines_block(specs))
    for spec in specs.values():
        assert {spec.name, *spec.states, *spec.sets} <= table
    assert {c.__name__ for c in typing.get_args(Input)} <= _words(doc_facts.inputs_block(specs))
    assert {c.__name__ for c in typing.get_args(Output)} <= _words(doc_facts.outputs_block(specs))
    layers = _words(doc_facts.layers_block(specs))
    assert {e.removeprefix("p2pfsm.") for e in RUNTIME + TOOLS} <= layers


def test_an_input_is_filed_under_the_kind_its_table_row_gives() -> None:
    table = input_table()
    assert "from the host: `HostStart`" in doc_facts.inputs_block(machines(), table)
    unrouted = dataclasses.replace(
        table, inputs=tuple(row for row in table.inputs if row.event != "HostDecline"))
    text = doc_facts.inputs_block(machines(), unrouted)
    assert "other: `HostDecline`" in text and "`HostFinish`, `HostDecline`" not in text
