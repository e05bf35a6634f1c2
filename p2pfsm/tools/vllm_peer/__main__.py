"""``python -m p2pfsm.tools.vllm_peer``: the vLLM peer harness
(:mod:`p2pfsm.tools.vllm_peer.cli`)."""

import sys

from p2pfsm.tools.vllm_peer.cli import main

sys.exit(main())
