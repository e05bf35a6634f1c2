"""The demo: the two-process ``p2pfsm demo`` (its blocks are :mod:`p2pfsm.demo_blocks`).

* :mod:`p2pfsm.tools.demo.host` -- a serving host and a fetching host over real Nodes.
* :mod:`p2pfsm.tools.demo.run` -- ``p2pfsm demo``: a server process, a client, a summary.
"""
