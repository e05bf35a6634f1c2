"""``tla/MachineTables.tla`` is generated from models/ and used by TLC: every machine step
of a trace-validation run must be a row of it (``FiredDeclared``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from p2pfsm.fsm import machines
from p2pfsm.tools.verify import tables
from p2pfsm.tools.verify.traces import random_trace, validate


def test_the_tables_are_fresh(spec_dir: Path) -> None:
    text = tables.path(spec_dir).read_text()
    assert text == tables.to_tla(machines()), "stale: run `p2pfsm diagrams`"


def test_every_transition_of_the_models_is_a_row(spec_dir: Path) -> None:
    text = tables.path(spec_dir).read_text()
    for name, spec in machines().items():
        for source, trigger, dest in spec.edges():
            assert f'<<"{source}", "{trigger}", "{dest}">>' in text, (name, trigger)


def test_a_step_missing_from_the_tables_fails_trace_validation(
    require_tlc: None, spec_dir: Path, tmp_path: Path,
) -> None:
    for tla in spec_dir.glob("*.tla"):
        shutil.copy(tla, tmp_path / tla.name)
    trace = random_trace(0)
    assert validate([trace], source=tmp_path).accepted == {1}
    _machine, trigger, source, dest = sorted(s for e in trace for s in e.steps)[0]
    row = f'<<"{source}", "{trigger}", "{dest}">>'
    table = tables.path(tmp_path)
    assert row in table.read_text()
    table.write_text(table.read_text().replace(row, f'<<"{source}", "{trigger}", "nowhere">>'))
    with pytest.raises(RuntimeError, match="FiredDeclared"):
        validate([trace], source=tmp_path)
