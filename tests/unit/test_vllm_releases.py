"""The table of vLLM releases the drop-in knows (:mod:`p2pfsm.vllm.releases`)."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

import pytest

import p2pfsm.vllm
from p2pfsm.errors import ConfigError
from p2pfsm.fsm import profile
from p2pfsm.vllm import releases
from p2pfsm.vllm.releases import RELEASES, UnsupportedVllm


def test_each_supported_release_has_its_profile_and_constants() -> None:
    assert releases.SUPPORTED == ("0.33.0", "0.34.0")
    old, new = RELEASES["0.33.0"], RELEASES["0.34.0"]
    assert (old.profile, new.profile) == ("vllm-0.33", "vllm-0.34")
    assert releases.PROFILES["vllm-0.34"] is new
    # 0.33.0 has one load timeout; 0.34.0 one per kind of load.
    assert old.pd_load_timeout == old.p2p_load_timeout == "_LOAD_TIMEOUT_S"
    assert (new.pd_load_timeout, new.p2p_load_timeout) == ("_PD_LOAD_TIMEOUT_S",
                                                           "_P2P_LOAD_TIMEOUT_S")
    assert old.stall_timeout_env is None
    assert new.stall_timeout_env == "VLLM_P2P_TRANSFER_STALL_TIMEOUT_S"
    # vLLM's setting of the stall deadline exists where the profile has one (its default)
    for r in (old, new):
        assert (r.stall_timeout_env is None) == (profile(r.profile).stall is None)
    assert not (old.early_load_failure or old.abort_ack_timeout_ends_session
                or old.retains_transfers or old.close_releases_destinations)
    assert (new.early_load_failure and new.abort_ack_timeout_ends_session
            and new.retains_transfers and new.close_releases_destinations)


def test_how_a_session_end_looks_to_the_manager_is_each_release_s_profile() -> None:
    """Both releases' managers read a load of an ended session from close(); only
    0.34.0's session still takes the transfer_done / abort_ack frames received with the
    peer's disconnect or the connection's loss (its profile's [executor] table)."""
    old, new = RELEASES["0.33.0"], RELEASES["0.34.0"]
    assert old.lost_loads_at_close and new.lost_loads_at_close
    assert (old.buffered_terminals, new.buffered_terminals) == (False, True)
    native = profile("native").executor
    assert (native.lost_load.value, native.buffered_terminals) == ("at_end", False)


def test_a_local_version_suffix_is_the_same_release() -> None:
    assert releases.release("0.34.0+cu129") is RELEASES["0.34.0"]


def test_an_unknown_release_is_refused_in_one_line() -> None:
    with pytest.raises(UnsupportedVllm) as info:
        releases.release("0.35.0")
    assert str(info.value) == ("p2pfsm.vllm supports vLLM 0.33.0, 0.34.0; "
                               "the installed vLLM is 0.35.0")


def test_install_without_vllm_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    def absent(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(releases.metadata, "version", absent)
    with pytest.raises(UnsupportedVllm, match=r"^vLLM is not installed: .*0\.33\.0 or 0\.34\.0"):
        p2pfsm.vllm.install()


def test_install_refuses_an_unknown_release(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(releases.metadata, "version", lambda name: "0.32.1")
    with pytest.raises(UnsupportedVllm, match=r"the installed vLLM is 0\.32\.1$"):
        p2pfsm.vllm.install()


def test_bench_runs_the_vllm_side_on_the_release_chosen(tmp_path: Path) -> None:
    from p2pfsm.tools.bench import matrix

    with pytest.raises(ConfigError, match=r"--vllm: expected one of 0\.33\.0, 0\.34\.0"):
        matrix.use_release("0.35.0")
    venv = tmp_path / ".venv-vllm-0.34" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text("")
    try:
        matrix.use_release("0.34.0")
        assert matrix.release() == "0.34.0"
        assert matrix.vllm_python(tmp_path) == venv / "python"
    finally:
        matrix.use_release("0.33.0")
    assert matrix.release() == "0.33.0"
