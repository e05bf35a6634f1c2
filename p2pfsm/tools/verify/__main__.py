"""``python -m p2pfsm.tools.verify [--config ...]``: the same as ``p2pfsm check``."""

import sys

from p2pfsm.tools.verify.check import check_main

sys.exit(check_main(sys.argv[1:]))
