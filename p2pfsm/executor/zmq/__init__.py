"""The ZeroMQ control plane: :class:`~p2pfsm.executor.zmq.plane.ControlPlane` (one bound
ROUTER, one DEALER per peer), who is let in and dialled back, heartbeats, CURVE and the
events it reports."""
