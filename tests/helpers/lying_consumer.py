"""A consumer that reports every load loaded, for the conformance suite's own tests.

``python tests/helpers/lying_consumer.py FETCH-OPTIONS...``: runs ``p2pfsm fetch`` with
those options (a correct consumer on the wire), then prints its report with every
load's ``success`` and ``verified`` set true and exits 0: a load the producer declined
is reported as loaded, the lie the consumer walk must catch from the results alone.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

from p2pfsm.tools.cli import main as cli


def main(argv: list[str]) -> int:
    """Run the fetch, print its report with every load claimed; always 0."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli(["fetch", *argv])
    report = json.loads(out.getvalue().strip().splitlines()[-1])
    for load in [report, *report.get("attempts", [])]:
        load["success"] = load["verified"] = True
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
