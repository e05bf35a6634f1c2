"""Helpers shared by the scenario tests (importable as ``helpers``)."""
