"""The compiled build (:mod:`p2pfsm.native`): which build is active, what it covers, and
(``-m compiled``) that a mypyc build behaves exactly as the pure Python it comes from."""

from __future__ import annotations

import importlib.machinery
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import p2pfsm
from p2pfsm import native

ROOT = Path(__file__).resolve().parents[2]


def test_build_names_what_runs() -> None:
    compiled = native.compiled_modules()
    assert set(compiled) <= {native.module_name(s) for s in native.SOURCES}
    for name in compiled:
        origin = sys.modules[name].__file__ or ""
        assert origin.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)), origin
    want = ("pure" if not compiled else
            "compiled" if len(compiled) == len(native.SOURCES) else "mixed")
    build = p2pfsm.BUILD
    assert build == want
    with pytest.raises(AttributeError):
        _ = p2pfsm.NO_SUCH_NAME


def test_every_module_of_the_compiled_packages_is_compiled_or_said_why_not() -> None:
    on_disk = {p.relative_to(ROOT).as_posix()
               for pkg in native.PACKAGES for p in (ROOT / "p2pfsm" / pkg).glob("*.py")}
    assert on_disk == set(native.SOURCES) | set(native.LEFT_OUT)
    assert not set(native.SOURCES) & set(native.LEFT_OUT)


def _copy_tree(dest: Path) -> None:
    """What a digest run needs: the package (no extension modules), the models, mypy's
    settings and the digest helper."""
    shutil.copytree(ROOT / "p2pfsm", dest / "p2pfsm",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd"))
    shutil.copytree(ROOT / "models", dest / "models")
    shutil.copy(ROOT / "pyproject.toml", dest)
    shutil.copytree(ROOT / "tests" / "helpers", dest / "tests" / "helpers",
                    ignore=shutil.ignore_patterns("__pycache__"))


def _run(tree: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


@pytest.mark.compiled
def test_compiled_build_gives_the_pure_digest(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    _copy_tree(tree)
    probe = "import p2pfsm; print(p2pfsm.BUILD)"
    assert _run(tree, "-c", probe) == "pure"
    pure = _run(tree, "-m", "tests.helpers.run_digest", "300")
    built = native.build(tree)
    assert len(built) == len(native.SOURCES) + 1  # and the shared library
    assert _run(tree, "-c", probe) == "compiled"
    assert _run(tree, "-m", "tests.helpers.run_digest", "300") == pure
    assert native.clean(tree) == built
    assert _run(tree, "-c", probe) == "pure"
