"""Every executor slip (``EXECUTOR_SLIPS``) is caught by the default-suite tests it names.

For each slip, those tests run in a pytest subprocess with the slip planted
(``-p mutants.plugin``, ``P2PFSM_MUTANT``): every one of them must fail a check (an
assertion). The control runs
them all on the real code: every one must pass. A slip is planted in the test process
only (a spawned helper process runs the real code): each slip sits on a path the test
process itself takes.
"""

from __future__ import annotations

import importlib.util

import pytest

from .catalogue import EXECUTOR, EXECUTOR_SLIPS
from .runner import pytest_under

pytest.importorskip("torch")
if importlib.util.find_spec("nixl") is None and importlib.util.find_spec("nixl_cu12") is None:
    # The catching tests would skip, and a skipped test catches nothing.
    pytest.skip("NIXL is not installed (.ci/install.sh installs it)", allow_module_level=True)

CATCHING = sorted({t for e in EXECUTOR_SLIPS for t in e.caught_by})


def test_the_real_code_passes_every_catching_test() -> None:
    run = pytest_under(None, CATCHING)
    assert run.code == 0 and not run.failed, f"the real code failed: {run}"
    print(f"real code: {run.summary}")


@pytest.mark.parametrize("name", sorted(e.name for e in EXECUTOR_SLIPS))
def test_each_catching_test_fails_under_the_slip(name: str) -> None:
    entry = EXECUTOR[name]
    assert entry.slip is not None and entry.caught_by
    run = pytest_under(name, list(entry.caught_by))
    # Only a failed check is a catch (an error such as a failed import is not).
    missed = [t for t in entry.caught_by
              if not any(f.startswith(t) and ("AssertionError" in f or " - assert " in f)
                         for f in run.failed)]
    assert run.code == 1 and not missed, (f"{name} ({entry.what}) was not caught by "
                                          f"{missed}: {run}")
    print(f"{name}: {run.summary}")
    for line in run.failed:
        print(f"  FAILED {line}")
