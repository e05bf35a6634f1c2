"""``python -m p2pfsm.vllm.peer``: the vLLM peer harness (:mod:`p2pfsm.vllm.peer.cli`)."""

import sys

from p2pfsm.vllm.peer.cli import main

sys.exit(main())
