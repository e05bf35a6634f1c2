"""The tools people and CI run around the runtime; no runtime module imports them.

* :mod:`p2pfsm.tools.cli` -- the ``p2pfsm`` command (and :mod:`p2pfsm.tools.argtypes`).
* :mod:`p2pfsm.tools.bench` -- benchmarks.
* :mod:`p2pfsm.tools.conform` -- the conformance tester.
* :mod:`p2pfsm.tools.verify` -- trace validation against the TLA+ spec.
* :mod:`p2pfsm.tools.demo` -- the demo.
* :mod:`p2pfsm.tools.diagrams` -- the machine diagrams (with
  :mod:`p2pfsm.tools.diagram_flows` and :mod:`p2pfsm.tools.doc_facts`).
* :mod:`p2pfsm.tools.vllm_peer` -- a vLLM P2P peer for interop tests and benchmarks.

Everything here may import the runtime (:mod:`p2pfsm.layers`).
"""
