"""The simulated world: two real sessions over a seeded network, clock and data plane.

* :mod:`p2pfsm.sim.world` -- :class:`~p2pfsm.sim.world.SimWorld`, the deterministic
  executor the tests, the stateful suite and trace validation drive.
* :mod:`p2pfsm.sim.demo` -- ``p2pfsm demo --sim``: a seeded run with its summary.
"""
