"""A missing or broken dependency of the data plane is named, with the command that fixes it."""

from __future__ import annotations

import subprocess
import sys

import pytest

PROBE = """
import sys
for name in {hidden!r}:
    sys.modules[name] = None  # makes 'import name' fail as if it were not installed
from p2pfsm.errors import TransportError
from p2pfsm.executor.nixl.agent import import_nixl
try:
    import_nixl()
except TransportError as exc:
    print(exc)
else:
    print("imported")
"""


def probe(*hidden: str) -> str:
    ran = subprocess.run([sys.executable, "-c", PROBE.format(hidden=list(hidden))],
                         capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    return ran.stdout.strip()


@pytest.mark.parametrize("hidden", [("nixl", "nixl_cu12")])
def test_nixl_missing_says_how_to_install_it(hidden: tuple[str, ...]) -> None:
    text = probe(*hidden)
    assert "NIXL cannot be imported" in text and "pip install 'p2pfsm[nixl]'" in text
    assert ".ci/install.sh" not in text


def test_a_missing_numpy_under_nixl_is_the_error_shown() -> None:
    pytest.importorskip("nixl_cu12")
    text = probe("numpy")
    assert "numpy" in text and "pip install 'p2pfsm[nixl]'" in text, text


def test_vllm_install_without_vllm_says_vllm_is_missing() -> None:
    code = ("import sys\nsys.modules['vllm'] = None\nimport p2pfsm.vllm\n"
            "try:\n    p2pfsm.vllm.install()\nexcept Exception as exc:\n"
            "    print(type(exc).__name__, exc)\n")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith("UnsupportedVllm vLLM is not installed"), ran.stdout
    assert "pip install 'p2pfsm[vllm]'" in ran.stdout
