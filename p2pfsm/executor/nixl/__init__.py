"""The NIXL data plane: :class:`~p2pfsm.executor.nixl.plane.DataPlane` (one registered
block region, block WRITEs into peers' regions over UCX), its table of WRITEs, the
memory it registers and where each block's slices are. ``nixl`` and ``torch`` are loaded
only when a DataPlane is built."""
