"""What every executor of sessions shares: the effects interface
(:mod:`~p2pfsm.executor.runtime.effects`), the driver that feeds sessions and hands their
outputs to it (:mod:`~p2pfsm.executor.runtime.driver`), and the sessions' deadlines
(:mod:`~p2pfsm.executor.runtime.deadlines`). The node, the vLLM adapter, the simulated
world and the conformance tester run on it."""
