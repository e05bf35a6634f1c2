"""The demo: the interop harness's block model and the two-process ``p2pfsm demo``.

* :mod:`p2pfsm.demo.blocks` -- key(i) and content(i) of the shared block model.
* :mod:`p2pfsm.demo.host` -- a serving host and a fetching host over real Nodes.
* :mod:`p2pfsm.demo.run` -- ``p2pfsm demo``: a server process, a client, a summary.
"""
