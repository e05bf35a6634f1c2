"""Verification: the TLA+ spec of ``tla/`` checked by TLC, and held against ``models/``.

:mod:`.tlc` runs TLC 2.15 and parses its answer; :mod:`.check` is ``p2pfsm check``;
:mod:`.names` derives TLA+ action names from the models; :mod:`.graph` reads the
reachable state graph TLC dumps and projects it onto each machine; :mod:`.configs`
locates the spec and its configs; :mod:`.coverage` counts the steps of each ``Next``
disjunct and fails the check on one that never fires.
"""

from p2pfsm.tools.verify.check import check_main, counterexample_table
from p2pfsm.tools.verify.configs import Config, resolve, spec_dir
from p2pfsm.tools.verify.graph import StateGraph, load_dot
from p2pfsm.tools.verify.names import ENVIRONMENT_ACTIONS, action_map, action_name, spec_actions
from p2pfsm.tools.verify.tlc import TlcNotFound, TlcResult, TraceStep, run

__all__ = [
    "ENVIRONMENT_ACTIONS",
    "Config",
    "StateGraph",
    "TlcNotFound",
    "TlcResult",
    "TraceStep",
    "action_map",
    "action_name",
    "check_main",
    "counterexample_table",
    "load_dot",
    "resolve",
    "run",
    "spec_actions",
    "spec_dir",
]
