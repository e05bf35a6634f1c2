"""The optional compiled build: ``p2pfsm/fsm/``, ``p2pfsm/protocol/`` and ``p2pfsm/session/``
through mypyc.

Pure Python is the reference and the default (the wheel CI builds, an editable install).
The compiled build turns the modules of :data:`SOURCES` into C extension modules; the
``.py`` files stay beside them, and Python imports an extension module before a source
file of the same name, so where the extensions exist they are used, and where they do
not (another platform, a plain install) everything runs as pure Python. Both builds
pass the same suites and give the same behaviour digest (``docs/explanation/performance.md``,
"Compiled build").

    python -m p2pfsm.native build    # in place, next to the sources (git-ignored)
    python -m p2pfsm.native status   # which build is active; stale extensions
    python -m p2pfsm.native clean    # back to pure Python
    P2PFSM_COMPILE=1 pip wheel --no-deps .   # a compiled wheel (.ci/hatch_build.py)

``p2pfsm.BUILD`` (``"pure"``, ``"compiled"`` or ``"mixed"``) says which is active.
This module imports nothing of p2pfsm at its top, so that the wheel's build hook can
load it by path, without the package's dependencies.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.machinery
import os
import sys
import tempfile
from pathlib import Path

SOURCES: tuple[str, ...] = (
    "p2pfsm/fsm/build.py",
    "p2pfsm/fsm/compiled.py",
    "p2pfsm/fsm/inputs.py",
    "p2pfsm/fsm/registry.py",
    "p2pfsm/fsm/spec.py",
    "p2pfsm/fsm/trace.py",
    "p2pfsm/protocol/codec.py",
    "p2pfsm/protocol/fetch_checks.py",
    "p2pfsm/protocol/names.py",
    "p2pfsm/protocol/validate.py",
    "p2pfsm/session/checks.py",
    "p2pfsm/session/dispatch.py",
    "p2pfsm/session/machine.py",
    "p2pfsm/session/owner.py",
    "p2pfsm/session/steps.py",
)
"""The files compiled, relative to the checkout (or wheel) root."""

_SESSION_STATE = ("its classes hold a Session's state, which `p2pfsm conform` "
                  "(tools/conform/walk_tester.py) and the fuzz harness copy with copy.deepcopy; a "
                  "mypyc native class cannot be copied (its __new__ runs __init__; "
                  "mypyc_attr(serializable=True) would make mypy_extensions a run-time "
                  "dependency, and with mypy 2.4.1 such a class did not even run its "
                  "__init__ when called, when tried)")

LEFT_OUT: dict[str, str] = {
    "p2pfsm/fsm/__init__.py": "re-exports only; nothing runs there per event",
    "p2pfsm/fsm/generate.py": "writes each machine's source text once, at import; the code "
                              "it writes runs as plain Python, compiled build or not",
    "p2pfsm/fsm/profiles.py": "the behaviour profiles are read once, when a config is "
                              "built; nothing runs there per event",
    "p2pfsm/protocol/__init__.py": "re-exports only; nothing runs there per event",
    "p2pfsm/protocol/frozen.py": "patches the __init__ of pure-Python dataclasses once, at "
                                 "import; the __init__ it writes runs as plain Python",
    "p2pfsm/protocol/limits.py": "a compiled dataclass converts its int fields when built "
                                 "(True -> 1, 1.5 -> TypeError) before __post_init__ could "
                                 "refuse bad values with a ConfigError",
    "p2pfsm/protocol/messages.py": "mypyc takes a dataclass's ClassVar (the TYPE of each "
                                   "message) for a field with a default (mypyc issue 1122), "
                                   "so the classes could not be built",
    "p2pfsm/session/__init__.py": "re-exports only; nothing runs there per event",
    "p2pfsm/session/config.py": "SessionConfig and Timeouts are dataclasses the host builds: "
                                "compiled, they would convert or refuse their fields when "
                                "built, before __post_init__ could refuse bad values with a "
                                "ConfigError (as protocol/limits.py)",
    "p2pfsm/session/core.py": "tests and the mutation harness replace Session methods on the "
                              "class (handle, arm), which compiled callers inside the class "
                              "would bypass; and compiling it measured 1-3 us per fetch, "
                              "inside the noise (docs/explanation/performance.md)",
    "p2pfsm/session/inputs.py": "the inputs are dataclasses the executor and host build: "
                                "compiled, a field of the wrong type would raise TypeError "
                                "when built instead of the session's LocalProtocolError",
    "p2pfsm/session/child.py": _SESSION_STATE,
    "p2pfsm/session/client.py": _SESSION_STATE,
    "p2pfsm/session/client_part.py": _SESSION_STATE,
    "p2pfsm/session/server_part.py": _SESSION_STATE,
    "p2pfsm/session/server.py": _SESSION_STATE,
    "p2pfsm/session/timers.py": _SESSION_STATE,
    "p2pfsm/session/tombstones.py": _SESSION_STATE,
    "p2pfsm/session/view.py": _SESSION_STATE,
    "p2pfsm/session/outbox.py": "its functions were Session methods (core.py, which stays "
                                "Python for the reasons given there); compiling it alone is "
                                "left to a measurement",
    "p2pfsm/session/payloads.py": "a declaration the tests read; nothing runs there per event",
    "p2pfsm/session/route.py": "one Route per frame row and trigger, built when the dispatch "
                               "is imported; nothing builds one per event",
    "p2pfsm/session/outputs.py": "the outputs are dataclasses the executor, tests and tools "
                                 "build and compare; compiled, their fields would be "
                                 "converted or refused when built (as inputs.py)",
}
"""Files of the compiled packages that stay Python, and why."""

PACKAGES: tuple[str, ...] = ("fsm", "protocol", "session")
"""The packages under ``p2pfsm/`` whose every module is in :data:`SOURCES` or
:data:`LEFT_OUT`."""

GROUP = "p2pfsm_native"
"""mypyc's shared library, ``p2pfsm_native__mypyc.<suffix>``, sits beside the package (a
name inside it would give the compiled modules a wrong ``__file__``)."""


def module_name(source: str) -> str:
    """``p2pfsm/fsm/spec.py`` -> ``p2pfsm.fsm.spec``."""
    return source.removesuffix(".py").replace("/", ".")


def compiled_modules() -> tuple[str, ...]:
    """The modules of :data:`SOURCES` that this process runs as extension modules."""
    found: list[str] = []
    for source in SOURCES:
        module = importlib.import_module(module_name(source))
        origin = getattr(module, "__file__", None) or ""
        if origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
            found.append(module.__name__)
    return tuple(found)


def build_kind() -> str:
    """``"compiled"`` when every module of :data:`SOURCES` is an extension module, ``"pure"``
    when none is, ``"mixed"`` otherwise (a partial or broken build)."""
    count = len(compiled_modules())
    return "pure" if count == 0 else "compiled" if count == len(SOURCES) else "mixed"


def _extension_files(root: Path) -> list[Path]:
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    files = [root / (source.removesuffix(".py") + suffix) for source in SOURCES]
    return [*files, root / f"{GROUP}__mypyc{suffix}"]


def stale(root: Path) -> list[str]:
    """The sources under ``root`` newer than their extension module (an in-place build
    not redone after an edit: the extension, not the edit, would run)."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    out: list[str] = []
    for source in SOURCES:
        ext = root / (source.removesuffix(".py") + suffix)
        if ext.exists() and (root / source).stat().st_mtime > ext.stat().st_mtime:
            out.append(source)
    return out


def build(root: Path, build_lib: Path | None = None, *, quiet: bool = True) -> list[Path]:
    """Compile :data:`SOURCES` of the tree at ``root`` with mypyc.

    Args:
        root: the directory holding ``p2pfsm/`` and ``pyproject.toml`` (mypy's settings).
        build_lib: where to write the extension modules (``p2pfsm/...`` under it and the
            shared library at its top); None: in place, next to the sources.
        quiet: hide the C compiler's output.

    Returns:
        The extension files written. Needs mypy (mypyc), setuptools and a C compiler.
    """
    from mypyc.build import mypycify  # build-time only: not a dependency of p2pfsm
    from setuptools import Distribution

    root = root.resolve()
    out = root if build_lib is None else build_lib.resolve()
    here = Path.cwd()
    with tempfile.TemporaryDirectory(prefix="p2pfsm-mypyc-") as tmp:
        os.chdir(root)  # mypyc names modules and C files by the relative paths
        try:
            extensions = mypycify(
                ["--config-file", str(root / "pyproject.toml"), *SOURCES],
                group_name=GROUP, opt_level="3", target_dir=str(Path(tmp, "c")),
            )
            dist = Distribution({"name": "p2pfsm-native", "ext_modules": extensions})
            cmd = dist.get_command_obj("build_ext")
            cmd.build_lib = str(out)
            cmd.build_temp = str(Path(tmp, "temp"))
            cmd.inplace = False
            dist.verbose = not quiet
            dist.run_command("build_ext")
        finally:
            os.chdir(here)
    return [p for p in _extension_files(out) if p.exists()]


def clean(root: Path) -> list[Path]:
    """Remove the extension modules of an in-place build under ``root``."""
    gone = [p for p in _extension_files(root) if p.exists()]
    for path in gone:
        path.unlink()
    return gone


def _root() -> Path:
    return Path(__file__).resolve().parent.parent


def main(argv: list[str] | None = None) -> int:
    """``python -m p2pfsm.native build|status|clean``."""
    parser = argparse.ArgumentParser(prog="python -m p2pfsm.native",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("action", choices=("build", "status", "clean"))
    parser.add_argument("--root", type=Path, default=_root(),
                        help="the tree holding p2pfsm/ (default: this package's)")
    args = parser.parse_args(argv)
    root: Path = args.root
    if args.action == "build":
        for path in build(root):
            print(f"built {path}")
        return 0
    if args.action == "clean":
        for path in clean(root):
            print(f"removed {path}")
        return 0
    print(f"p2pfsm: {build_kind()} build")
    for name in compiled_modules():
        print(f"  compiled: {name}")
    for source, why in LEFT_OUT.items():
        print(f"  Python:   {module_name(source)} ({why})")
    old = stale(root)
    for source in old:
        print(f"  STALE: {source} is newer than its extension module (rebuild or clean)")
    return 1 if old else 0


if __name__ == "__main__":
    sys.exit(main())
