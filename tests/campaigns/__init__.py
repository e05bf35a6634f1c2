"""Fault campaigns on real processes (docs/explanation/reliability.md): kill/freeze,
network faults in network namespaces, and churn with the producer's fds and RSS watched."""
