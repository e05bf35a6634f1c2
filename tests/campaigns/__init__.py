"""Fault campaigns on real processes (docs/reliability.md): kill/freeze, network faults in
network namespaces, and churn with the producer's fds and RSS watched."""
