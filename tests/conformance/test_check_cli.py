"""``p2pfsm check`` as a user runs it: exit status, the readable counterexample, cleanup.

The gate passes (exit 0); a must-fail config named on its own is violated (exit 1, the
counterexample printed step by step in the models' terms); ``--config mustfail`` exits 0
only when every must-fail config fails; a SIGTERM stops TLC and removes its temporary files; TLC's
progress lines reach stderr while it runs (not with --json or -q).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from p2pfsm.tools.verify import configs, tlc
from p2pfsm.tools.verify.check import check_main

CHECK = [sys.executable, "-m", "p2pfsm.tools.cli", "check"]


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CHECK, *args], capture_output=True, text=True, timeout=600,
                          env=env)


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended meanwhile
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_a_must_fail_config_exits_1_with_a_readable_counterexample(require_tlc: None) -> None:
    proc = _run("--config", "p3_finish_drops_load")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert "VIOLATED (as this must-fail config requires)" in out
    assert "OneLoadResultInv violated" in out
    assert "Each step: the TLA+ action" in out  # the legend
    assert "Initial predicate" in out
    assert "ClientRoundHostFinish = client_round host_finish" in out
    # BugP3: the finish drops the loading round without a result, which no transition does.
    assert "a client_round r1/0: loading -> (gone)" in out
    assert "no transition of models/ does this" in " ".join(out.split())  # may wrap
    assert "sent abort_fetch r1/0 job=1 a -> b" in out


def test_the_mustfail_group_exits_0_when_every_config_fails(
    spec_dir: Path, must_fail_runs: dict[str, tlc.TlcResult],
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    # The group's verdicts over the real TLC results of the session's must-fail runs
    # (conftest), so each config is checked by TLC once per test session.
    by_path = {cfg.path: must_fail_runs[cfg.name]
               for cfg in configs.must_fail_configs(spec_dir)}
    monkeypatch.setattr(tlc, "run", lambda _dir, _module, path, **_kw: by_path[path])
    assert check_main(["--config", "mustfail"]) == 0
    out = capsys.readouterr().out
    assert out.count("FAILS AS EXPECTED") >= 5
    assert "UNEXPECTEDLY PASSES" not in out


def test_an_unknown_config_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert check_main(["--config", "no_such_config"]) == 2
    assert "no_such_config" in capsys.readouterr().err


def test_sigterm_stops_tlc_and_removes_its_files(require_tlc: None, tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([*CHECK, "--config", "live", "--workers", "1"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        java = _children(proc.pid)
        deadline = time.monotonic() + 60
        while not java and time.monotonic() < deadline:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.05)  # returns early only if check died
                break
            java = _children(proc.pid)
        assert java, f"TLC never started: {proc.poll()}"
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
        assert proc.returncode == 128 + signal.SIGTERM
        assert all(not Path(f"/proc/{pid}").exists() for pid in java), "TLC left running"
        assert not list(tmp_path.glob("p2pfsm-tlc-*")), "temporary files left behind"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_tlc_progress_goes_to_stderr_unless_json_or_quiet(require_tlc: None) -> None:
    loud = _run("--config", "p3_finish_drops_load")
    assert loud.returncode == 1, loud.stdout + loud.stderr
    lines = loud.stderr.splitlines()
    assert lines[0].startswith("mustfail/p3_finish_drops_load: tlc: Starting..."), loud.stderr
    assert any(" tlc: Finished in " in line for line in lines), loud.stderr
    assert "tlc:" not in loud.stdout
    for flag in ("--json", "-q"):
        quiet = _run("--config", "p3_finish_drops_load", flag)
        assert quiet.returncode == 1, quiet.stdout + quiet.stderr
        assert quiet.stderr == "", (flag, quiet.stderr)
    hushed = subprocess.run([*CHECK[:-1], "-q", "check", "--config", "p3_finish_drops_load"],
                            capture_output=True, text=True, timeout=600)
    assert hushed.returncode == 1 and hushed.stderr == "", hushed.stderr


def test_tlc_progress_streams_while_tlc_runs(require_tlc: None) -> None:
    """The first progress line arrives while TLC still runs (the live config takes
    minutes), not at its end."""
    proc = subprocess.Popen([*CHECK, "--config", "live", "--workers", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        ready, _, _ = select.select([proc.stderr], [], [], 120.0)
        line = proc.stderr.readline() if ready else ""
        assert line.startswith("live: tlc: Starting..."), (line, proc.poll())
        assert proc.poll() is None, "TLC ended before its first progress line was read"
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
