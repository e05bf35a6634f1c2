"""Hypothesis drives two sessions over the simulated network with host calls, timers and
faults, and checks the protocol's properties after every step (tests/stateful/machine.py).

Checked on every step (the world raises SafetyViolation inside the step), over FIFO
channels that may lose frames or be cut:
* each job gets at most one result; successful loads carry the right bytes;
* no load is reported released while a write into its destination is in flight; no
  write lands in a destination after its job was reported released, and a released
  block still holds its canary when it is given to a new load;
* no pinned source is released while a write reads it; no write before registration;
* rounds are isolated: a frame about (kv_request_id, round) fires only that round's
  machines, and a transfer_done or abort_ack completes only the load it answers;
* no load round reuses a number while an older round of that number has a frame on
  the wire (the consumer's fetch or abort, the producer's reply);
* two conformant peers never reject each other's frames unless a frame was lost;
* a malformed frame changes nothing.
Checked once the run is quiet (faults off, everything delivered, timers fired):
* every job has exactly one result, every pin is released, no machine is left open.

The must-fail mutants (tests/mutants) must each make this test fail in the CI profile.
"""

from __future__ import annotations

from .machine import HostileNetwork, TwoSessions

TestTwoSessions = TwoSessions.TestCase
TestHostileNetwork = HostileNetwork.TestCase
