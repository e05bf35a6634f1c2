"""Hostile peers against a real ``p2pfsm serve`` process (see conftest.py)."""
