"""Where the TLA+ spec lives and which TLC configs ``p2pfsm check`` knows.

Configs are files under ``tla/``: ``gate.cfg`` (the PR gate; ``gate_<profile>.cfg`` the
gate of another behaviour profile), ``large.cfg`` (bigger
workloads; .ci/run), ``live.cfg`` (liveness under fairness), ``live_ci.cfg`` (the same
properties over smaller scenarios; .ci/run) and ``mustfail/*.cfg`` (each re-introduces a
known bug and must give a counterexample). All of them check module ``MCP2P``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SPEC_MODULE = "MCP2P"
NAMED = ("gate", "gate_vllm033", "gate_vllm034", "large", "live", "live_ci")


@dataclass(frozen=True, slots=True)
class Config:
    """One TLC config file, relative to the spec directory."""

    name: str
    path: str
    must_fail: bool
    comment: str
    temporal: bool
    profile: str = "native"
    """The behaviour profile it checks (its ``Profile`` constant)."""

    @property
    def tlc_args(self) -> tuple[str, ...]:
        """Extra TLC flags: liveness is checked once, at the end (-lncheck final)."""
        return ("-lncheck", "final") if self.temporal else ()


def spec_dir() -> Path:
    """The ``tla/`` directory: next to the package in a source tree, else a wheel copy.

    Raises:
        FileNotFoundError: neither exists.
    """
    here = Path(__file__).resolve().parents[2]
    for candidate in (here.parent / "tla", here / "_tla"):
        if (candidate / f"{SPEC_MODULE}.tla").is_file():
            return candidate
    raise FileNotFoundError(f"no tla/{SPEC_MODULE}.tla next to {here}")


def _comment(text: str) -> str:
    lines = []
    for line in text.splitlines():
        if not line.startswith("\\*"):
            break
        lines.append(line[2:].strip())
    return " ".join(lines)


_PROFILE = re.compile(r'^\s*Profile\s*=\s*"([^"]+)"', re.MULTILINE)
_TEMPORAL = re.compile(r"^\s*PROPERT(Y|IES)\b", re.MULTILINE)


def config(directory: Path, name: str) -> Config:
    """A config by name: ``gate``, ``large``, ``live``, ``live_ci``, a must-fail stem, or a path.

    Raises:
        FileNotFoundError: no such config.
    """
    candidates = [f"{name}.cfg", name, f"mustfail/{name}.cfg", f"mustfail/{name}"]
    for rel in candidates:
        path = directory / rel
        if path.is_file() and path.suffix == ".cfg":
            stem = path.relative_to(directory).with_suffix("").as_posix()
            text = path.read_text()
            found = _PROFILE.search(text)
            return Config(stem, path.relative_to(directory).as_posix(),
                          stem.startswith("mustfail/"), _comment(text),
                          _TEMPORAL.search(text) is not None,
                          found.group(1) if found else "native")
    raise FileNotFoundError(f"no TLC config {name!r} in {directory}")


def must_fail_configs(directory: Path) -> list[Config]:
    """Every ``mustfail/*.cfg``, sorted."""
    return [config(directory, f"mustfail/{p.name}")
            for p in sorted((directory / "mustfail").glob("*.cfg"))]


def resolve(directory: Path, name: str) -> list[Config]:
    """``mustfail`` -> every must-fail config; anything else -> that one config."""
    if name == "mustfail":
        found = must_fail_configs(directory)
        if not found:
            raise FileNotFoundError(f"no must-fail configs in {directory / 'mustfail'}")
        return found
    return [config(directory, name)]
