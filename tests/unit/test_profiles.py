"""Behaviour profiles (models/profiles/): loaded, checked, and refused when malformed."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from p2pfsm.errors import ModelError
from p2pfsm.fsm import (
    AbortAckTimeout,
    LookupTimeout,
    ReportFailedLoad,
    UnsentFetch,
    profile,
    profiles,
)
from p2pfsm.fsm.profiles import load_profiles, parse_profile
from p2pfsm.fsm.registry import models_directory
from p2pfsm.session import Timeouts

NATIVE = (models_directory() / "profiles" / "native.toml").read_text()


def test_the_three_profiles_and_what_differs_between_them() -> None:
    assert set(profiles()) == {"native", "vllm-0.33", "vllm-0.34"}
    native, v33, v34 = profile("native"), profile("vllm-0.33"), profile("vllm-0.34")
    assert (native.behaviour.report_failed_load, native.behaviour.abort_ack_timeout) == (
        v33.behaviour.report_failed_load, v33.behaviour.abort_ack_timeout)
    # an overdue lookup answer ends the session in both vLLM releases, not in native
    assert native.behaviour.lookup_timeout is LookupTimeout.REPORT_MISS
    assert v33.behaviour.lookup_timeout is v34.behaviour.lookup_timeout is LookupTimeout.END_SESSION
    assert native.behaviour.report_failed_load is ReportFailedLoad.AT_ABORT_ACK
    assert v34.behaviour.report_failed_load is ReportFailedLoad.AT_ABORT_SEND
    assert v34.behaviour.abort_ack_timeout is AbortAckTimeout.END_SESSION
    # a fetch still queued behind the handshake: vLLM 0.34.0 retires it where it waits
    assert native.behaviour.unsent_fetch is v33.behaviour.unsent_fetch \
        is UnsentFetch.SEND_THEN_ABORT
    assert v34.behaviour.unsent_fetch is UnsentFetch.RETIRE_LOCALLY
    t34 = Timeouts.of_profile(v34)
    assert (t34.load, t34.load_for(True), t34.abort_ack, t34.lookup, t34.hold) == (
        30.0, 10.0, 5.0, 8.0, 30.0)
    # native's deadlines are the defaults (what a session has always run with)
    assert Timeouts.of_profile(native) == Timeouts() == Timeouts.of_profile(v33)
    # the stall deadline of a running write is vLLM 0.34.0's alone, an executor's (the
    # drop-in's sessions), not among the Session's deadlines
    assert (native.stall, v33.stall, v34.stall) == (None, None, 20.0)
    assert not hasattr(t34, "stall")


@pytest.mark.parametrize(("patch", "message"), [
    (('report_failed_load = "at_abort_ack"', 'report_failed_load = "later"'),
     "behaviour.report_failed_load: expected one of 'at_abort_ack', 'at_abort_send', "
     "got 'later'"),
    (('lookup_timeout = "report_miss"', 'lookup_timeout = "never"'),
     "behaviour.lookup_timeout: expected one of 'report_miss', 'end_session', got 'never'"),
    (('lookup_timeout = "report_miss"\n', ''),
     "behaviour.lookup_timeout: expected one of 'report_miss', 'end_session', got None"),
    (('unsent_fetch = "send_then_abort"', 'unsent_fetch = "drop"'),
     "behaviour.unsent_fetch: expected one of 'send_then_abort', 'retire_locally', "
     "got 'drop'"),
    (('abort_ack = 10.0', 'abort_ack = -1'), "timeouts.abort_ack: expected a positive"),
    (('lookup = 30.0', 'lookup = 30.0\nstalled = 20.0'), "unknown timeouts ['stalled']"),
    (('lookup = 30.0', 'lookup = 30.0\nstall = 0'),
     "native.toml: timeouts.stall: expected a positive number of seconds, got 0"),
    (('lookup = 30.0', 'lookup = 30.0\nstall = "20"'),
     "timeouts.stall: expected a positive number of seconds, got '20'"),
    (('lookup = 30.0', 'lookup = 30.0\nstall = inf'),
     "timeouts.stall: expected a positive number of seconds, got inf"),
    (('lookup = 30.0', 'lookup = 30.0\nstall = true'),
     "timeouts.stall: expected a positive number of seconds, got True"),
    (('load = 30.0\n', ''), "timeouts ['load'] missing"),
    (('wire = "vllm-p2p"', 'wire = "g5"'), "wire 'g5' is not one this build speaks"),
    (('wire = "vllm-p2p"', 'wire = "vllm-p2p"\nextra = 1'), "unknown keys ['extra']"),
    (('lookup = 30.0', 'lookup = 30.0\n[executor]\nlost_load = "later"'),
     "executor.lost_load: expected one of 'at_end', 'at_close', got 'later'"),
    (('lookup = 30.0', 'lookup = 30.0\n[executor]\nbuffered_terminals = 1'),
     "executor.buffered_terminals: expected true or false, got 1"),
    (('lookup = 30.0', 'lookup = 30.0\n[executor]\nlost = "at_close"'),
     "unknown executor keys ['lost']"),
])
def test_a_malformed_profile_is_a_clear_error(patch: tuple[str, str], message: str) -> None:
    assert patch[0] in NATIVE
    with pytest.raises(ModelError) as err:
        parse_profile(tomllib.loads(NATIVE.replace(*patch, 1)), "native.toml")
    assert message in str(err.value)


def test_a_file_must_carry_its_own_name_and_native_must_exist(tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "other.toml").write_text(NATIVE)
    with pytest.raises(ModelError, match="declares name 'native', expected 'other'"):
        load_profiles(tmp_path)
    (tmp_path / "profiles" / "other.toml").unlink()
    with pytest.raises(ModelError, match="no 'native' profile"):
        load_profiles(tmp_path)


def test_an_unknown_name_lists_the_known() -> None:
    with pytest.raises(ModelError, match=r"unknown profile 'x' \(known: \['native'"):
        profile("x")
