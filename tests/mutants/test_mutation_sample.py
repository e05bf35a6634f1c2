"""CI's share of the mutation score: a fixed few mutants, each of which must be killed.

The whole measure (``python -m tests.mutants.mutation``, docs/explanation/verification.md, "Mutation
score") takes an hour; this runs a handful on every CI run so that a change which
weakens the fast suites shows here. Each mutant runs the scenario and stateful suites in
a pytest subprocess (``-x``, under :mod:`mutants.mutation_plugin`) and must make them
fail:

* source mutants (:data:`SOURCE`): mutmut's mutations from the measured sample, written
  as :class:`~mutants.slips.Slip` s so that CI needs no mutmut (planted in memory in the
  subprocess, never on disk);
* model mutants: :data:`MODELS_DRAWN` of ``models/*.toml``'s mutants that the loader
  takes, drawn with :data:`SEED` (:mod:`mutants.toml_mutator`);
* executor mutants: the executor's slips (``catalogue.EXECUTOR_SLIPS`` and
  ``NODE_SLIPS``), each of which the node-level stateful test alone
  (:data:`EXECUTOR_SUITE`: real nodes, ZeroMQ and NIXL) must fail on.

The draw is fixed, so the outcome is the same on every run.
"""

from __future__ import annotations

import importlib.util
import json
import random
import tempfile
from pathlib import Path

import pytest

from p2pfsm.errors import ModelError

from . import toml_mutator
from .catalogue import EXECUTOR, EXECUTOR_SLIPS, NODE_SLIPS
from .runner import SLIP_QUIET
from .slips import Slip, compiled

pytestmark = pytest.mark.mutation  # .ci/run: pytest -m mutation tests/mutants

SUITE = ("tests/scenarios", "tests/stateful")
EXECUTOR_SUITE = ("tests/integration/test_node_stateful.py",)
SEED = 0
MODELS_DRAWN = 5

EQUIVALENT: dict[str, str] = {
    "server_round.t20.drop_action.disarm_store_timer":
        "a store timer is armed only while lookup pins wait for their fetch (pinned, "
        "pinned_closed); an abort there ends the round at once, and the round's end drops "
        "its timers, so the one left armed never fires (test_scenario_lookup.py's abort of "
        "a pinned round)",
}
"""Model mutants no test can kill (the code they change is never observable), by name,
with why: the draw passes over them."""

SOURCE: tuple[Slip, ...] = (
    Slip("p2pfsm.session.core", "Session.is_peer_reconnected",
         "return known is not None and ev.incarnation == known",
         "return known is not None or ev.incarnation == known"),
    Slip("p2pfsm.session.core", "Session.is_peer_reconnected",
         "known = None if self.peer is None else self.peer.incarnation",
         "known = None if self.peer is not None else self.peer.incarnation"),
    Slip("p2pfsm.session.client", "ClientLookup._miss",
         "hits = tuple(self.answers.get(k, False) for k in self.keys)",
         "hits = tuple(self.answers.get(k, True) for k in self.keys)"),
    Slip("p2pfsm.session.server", "ServerRound.reject_supply",
         "self.env.outbox.append(StoreResult(ev.job_id, False, FailReason.NOT_SERVED,",
         "self.env.outbox.append(StoreResult(ev.job_id, True, FailReason.NOT_SERVED,"),
    Slip("p2pfsm.session.core", "Session.end_work_queued",
         'self._env.outbox.append(EndRoles("session_lost_unsent"))',
         'self._env.outbox.append(EndRoles("SESSION_LOST_UNSENT"))'),
)
"""Source mutants mutmut killed in the measured sample (seed 0), as the diff it shows:
``is_peer_reconnected__mutmut_5`` and ``_4``, ``report_unanswered_miss__mutmut_7`` (its
line now in ``ClientLookup._miss``),
``reject_supply__mutmut_10``, ``end_work_queued__mutmut_4``."""


def _loadable_draw() -> list[toml_mutator.TomlMutant]:
    """:data:`MODELS_DRAWN` mutants the loader takes, drawn in a fixed order."""
    population = toml_mutator.enumerate_mutants()
    random.Random(SEED).shuffle(population)
    chosen: list[toml_mutator.TomlMutant] = []
    for mutant in population:
        if mutant.name in EQUIVALENT:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            toml_mutator.write_models(mutant, Path(tmp))
            try:
                toml_mutator.load_all(Path(tmp))
            except ModelError:
                continue
        chosen.append(mutant)
        if len(chosen) == MODELS_DRAWN:
            break
    return chosen


@pytest.mark.parametrize("slip", SOURCE, ids=lambda s: f"{s.where}:{SOURCE.index(s)}")
def test_a_source_mutant_is_killed(slip: Slip) -> None:
    compiled(slip)  # the line is still there once: the mutant still means what it did
    code, first = toml_mutator.run_suite(None, SUITE, timeout=600, env={
        "P2PFSM_SLIP": json.dumps([slip.module, slip.qualname, slip.old, slip.new])})
    assert code not in (0, None), f"{slip.where}: {slip.old!r} -> {slip.new!r} survived"
    assert code == 1 and "::" in first, f"{slip.where}: no test failed ({code}): {first}"
    print(f"{slip.where}: killed by {first}")


@pytest.mark.pure_only  # the plugin repoints registry.models_directory: a compiled
# registry calls its own function directly and would load the real models
@pytest.mark.parametrize("mutant", _loadable_draw(), ids=lambda m: m.name)
def test_a_model_mutant_is_killed(mutant: toml_mutator.TomlMutant) -> None:
    verdict = toml_mutator.judge(mutant, SUITE, timeout=600)
    assert verdict.status == "killed" and "::" in verdict.by, (
        f"{mutant.name}: {verdict.status} {verdict.by}")
    print(f"{mutant.name}: killed by {verdict.by} in {verdict.seconds:.1f} s")


@pytest.mark.parametrize("name", [e.name for e in (*EXECUTOR_SLIPS, *NODE_SLIPS)])
def test_an_executor_mutant_is_killed_by_the_node_stateful_test(name: str) -> None:
    pytest.importorskip("torch")
    if importlib.util.find_spec("nixl") is None and importlib.util.find_spec("nixl_cu12") is None:
        pytest.skip("NIXL is not installed (.ci/install.sh installs it)")
    slip = EXECUTOR[name].slip
    assert slip is not None
    compiled(slip)
    code, first = toml_mutator.run_suite(None, EXECUTOR_SUITE, timeout=600, env={
        "P2PFSM_SLIP": json.dumps([slip.module, slip.qualname, slip.old, slip.new]),
        **SLIP_QUIET})
    # Exit 1: tests ran and one failed (its first line may be a logged callback error).
    assert code == 1, f"{name}: {slip.old!r} -> {slip.new!r} survived ({code}): {first}"
    print(f"{name}: killed by {first}")
