"""pytest plugin: write the mutated functions a run called (mutmut's ``stats`` mode).

Loaded by :mod:`mutants.direct`'s reach pass (``MUTANT_UNDER_TEST=stats``): at the end
of the session it writes, as a JSON list, every function mutmut's trampolines recorded
to the file ``P2PFSM_HITS`` names.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    target = os.environ.get("P2PFSM_HITS")
    if not target:
        return
    from mutmut.state import state

    Path(target).write_text(json.dumps(sorted(state()._stats)))
