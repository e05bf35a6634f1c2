"""Executor: the raw transports that the sans-IO sessions are bound to.

* :mod:`p2pfsm.executor.zmq_plane` -- :class:`~p2pfsm.executor.zmq_plane.ControlPlane`,
  one ROUTER plus one DEALER per peer over ZeroMQ, carrying control frames.
* :mod:`p2pfsm.executor.nixl_plane` -- :class:`~p2pfsm.executor.nixl_plane.DataPlane`,
  a registered block region and NIXL/UCX WRITEs of blocks into peers' regions.

Nothing is imported here on purpose: ``nixl`` and ``torch`` are optional and are only
loaded when a :class:`DataPlane` is built, so the rest of the package works without them.
"""
