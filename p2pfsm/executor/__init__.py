"""Executor: what binds the sans-IO sessions to real transports, in four folders.

* :mod:`p2pfsm.executor.runtime` -- what every executor shares: the effects interface,
  the driver, the sessions' deadlines (also used by the simulated world, the vLLM
  adapter and the conformance tester).
* :mod:`p2pfsm.executor.zmq` -- the ZeroMQ control plane
  (:class:`~p2pfsm.executor.zmq.plane.ControlPlane`: one ROUTER plus one DEALER per peer).
* :mod:`p2pfsm.executor.nixl` -- the NIXL data plane
  (:class:`~p2pfsm.executor.nixl.plane.DataPlane`: a registered block region and
  NIXL/UCX WRITEs of blocks into peers' regions).
* :mod:`p2pfsm.executor.node` -- :class:`~p2pfsm.executor.node.Node`, one process's
  endpoint, and its parts (peers, effects, turns, jobs, threads).

:mod:`p2pfsm.executor.fds` guards the file descriptors both planes need. Nothing is
imported here on purpose: ``nixl`` and ``torch`` are optional and are only loaded when a
DataPlane is built, so the rest of the package works without them.
"""
