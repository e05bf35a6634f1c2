"""p2pfsm inside vLLM 0.33.0: its P2P tier's sessions, backed by p2pfsm's machines.

Nothing here imports vLLM when this package is imported, so ``import p2pfsm.vllm``
works without vLLM installed; the submodules that need it import it themselves.
"""
