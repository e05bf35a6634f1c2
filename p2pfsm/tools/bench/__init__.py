"""Benchmarks printed by ``p2pfsm bench``: ratios against raw operations of the same run.

* :mod:`p2pfsm.tools.bench.fsm` -- one control event through the compiled machines.
* :mod:`p2pfsm.tools.bench.transfer` -- fetches between two real nodes vs raw NIXL and ZeroMQ.
"""
