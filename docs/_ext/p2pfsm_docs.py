"""Sphinx extension of the p2pfsm docs: the generated reference pages and mermaid.

Before the build it writes ``reference/api.md`` (the host API, autodoc), ``cli.md``
(every command's ``--help``, from the argparse parsers), ``wire.md`` (the nine messages,
their fields and the frame limits, from :mod:`p2pfsm.protocol`), ``models.md`` (every
machine's states and transitions, from ``models/``) and ``cases.md`` (the conformance
suite's directed cases, from :mod:`p2pfsm.tools.conform`). Those files are git-ignored: the code
and the models are their only source. ``mermaid`` fences become ``<pre class="mermaid">``
blocks, drawn in the browser by the mermaid.js of the npm package that ``.ci/docs.sh``
unpacks into ``_static/mermaid`` (no network at view time).
"""

from __future__ import annotations

import argparse
import dataclasses
import html
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

DOCS = Path(__file__).resolve().parent.parent
MERMAID_JS = DOCS / "_static" / "mermaid" / "mermaid.min.js"
GENERATED = ("api", "cli", "wire", "models", "cases")

# The host API, in reading order: (section, [(module, [names])]). Each name is documented
# once, under ``p2pfsm.NAME`` when the top-level package exports that very object, under
# its module otherwise; names of ``p2pfsm.__all__`` listed nowhere here get a section.
API: tuple[tuple[str, str, tuple[tuple[str, tuple[str, ...]], ...]], ...] = (
    ("Node", "One process's endpoint and its configuration.",
     (("p2pfsm.executor.node", ("Node", "NodeConfig", "fingerprint")),)),
    ("asyncio", "A node driven by an asyncio loop.",
     (("p2pfsm.aio", ("AsyncNode", "FetchHandle")),)),
    ("Memory", "The memory a node registers: its own, the host's, or a cache laid out "
     "per layer.",
     (("p2pfsm.executor.nixl.memory", ("HostRegion",)),
      ("p2pfsm.executor.nixl.layout", ("Layout", "Region")),
      ("p2pfsm.executor.nixl.plane", ("DataPlane",)))),
    ("Results and producer callbacks", "What a job ends with, and what a producer is "
     "asked.",
     (("p2pfsm.session.outputs", ("LoadResult", "StoreResult", "LookupResult",
                                  "DestinationReleased", "RoundEnded", "FetchArrived",
                                  "LookupRequest", "SessionDead", "FailReason")),
      ("p2pfsm.executor.node.jobs", ("JobFuture", "LookupAsk")),
      ("p2pfsm.executor.node", ("LookupAnswer",)))),
    ("Host helpers", "A prompt's block keys as vLLM computes them, and a producer's index "
     "of the blocks it holds.",
     (("p2pfsm.blocks", ("BlockHasher", "PinnedBlocks")),)),
    ("Metrics", "A node's counters and histograms, and their Prometheus exposition.",
     (("p2pfsm.metrics", ("NodeMetrics", "COUNTERS", "GAUGES", "HISTOGRAMS", "BUCKETS")),
      ("p2pfsm.prometheus", ("serve_metrics", "MetricsServer", "MetricsCollector")))),
    ("Authentication", "CURVE keys.",
     (("p2pfsm.executor.zmq.curve", ("CurveKeys", "load_curve_keys")),)),
    ("Sessions (sans-IO)", "A session without sockets, clocks or threads.",
     (("p2pfsm.session", ("Session", "SessionConfig", "Timeouts")),)),
    ("Limits", "The bounds applied to every frame from a peer.",
     (("p2pfsm.protocol.limits", ("Limits", "DEFAULT_LIMITS")),)),
    ("Errors", "Every error p2pfsm raises derives from P2PFSMError.",
     (("p2pfsm.errors", ("P2PFSMError", "ConfigError", "LocalProtocolError",
                         "RemoteProtocolError", "MalformedFrame", "UnknownMessageType",
                         "HandshakeMismatch", "InvalidTransition", "ModelError",
                         "TransportError")),)),
)

_UNDOCUMENTED_TOP = {"__version__", "BUILD"}


def _directive(obj: object) -> str:
    if inspect.isclass(obj):
        return "exception" if issubclass(obj, BaseException) else "class"
    return "function" if callable(obj) else "data"


def api_names() -> list[tuple[str, list[str]]]:
    """Per section, the dotted names to document (top-level where exported)."""
    import p2pfsm

    top = {name: getattr(p2pfsm, name) for name in p2pfsm.__all__
           if name not in _UNDOCUMENTED_TOP}
    seen: set[int] = set()
    sections: list[tuple[str, list[str]]] = []
    for title, _what, groups in API:
        dotted = []
        for module, names in groups:
            mod = importlib.import_module(module)
            for name in names:
                obj = getattr(mod, name)
                exported = name in top and top[name] is obj
                dotted.append(f"p2pfsm.{name}" if exported else f"{module}.{name}")
                seen.add(id(obj))
        sections.append((title, dotted))
    rest = [f"p2pfsm.{n}" for n, obj in sorted(top.items()) if id(obj) not in seen]
    if rest:
        sections.insert(0, ("Top-level package", rest))
    return sections


def api_page() -> str:
    """``reference/api.md``: autodoc directives for every name of :func:`api_names`."""
    import p2pfsm

    whats = {title: what for title, what, _ in API}
    whats["Top-level package"] = "Exported by `p2pfsm` and documented nowhere below."
    out = ["# Host API\n",
           "Generated from the docstrings. `import p2pfsm` exports "
           + ", ".join(f"`{n}`" for n in p2pfsm.__all__)
           + "; every other name is shown under the module it lives in.\n",
           "`p2pfsm.__version__` is the package version; `p2pfsm.BUILD` says which build "
           "runs (`\"pure\"`, `\"compiled\"` or `\"mixed\"`).\n"]
    for title, dotted in api_names():
        out.append(f"## {title}\n\n{whats[title]}\n")
        for name in dotted:
            module, _, attr = name.rpartition(".")
            obj = getattr(importlib.import_module(module), attr)
            kind = _directive(obj)
            options = ""
            if kind in ("class", "exception"):
                options = "   :members:\n   :show-inheritance:\n"
            elif kind == "data":
                options = "   :no-value:\n"
            out.append(f"```{{eval-rst}}\n.. auto{kind}:: {name}\n{options}```\n")
    return "\n".join(out)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def cli_page() -> str:
    """``reference/cli.md``: ``--help`` of ``p2pfsm`` and of every command."""
    from p2pfsm.tools import cli
    from p2pfsm.tools.verify import check

    def block(text: str) -> str:
        return "```text\n" + text.rstrip() + "\n```\n"

    parser = cli.build_parser()
    out = ["# Command line\n",
           "Generated from the argparse parsers: what `--help` prints.\n",
           "## p2pfsm\n", block(parser.format_help())]
    for name, sub in _subparsers(parser).items():
        out.append(f"## p2pfsm {name}\n")
        sub.prog = f"p2pfsm {name}"
        help_text = check._parser().format_help() if name == "check" else sub.format_help()
        out.append(block(help_text))
    return "\n".join(out)


def _attributes(doc: str | None) -> dict[str, str]:
    """The ``Attributes:`` entries of a Google-style docstring, by name."""
    found: dict[str, str] = {}
    lines = inspect.cleandoc(doc or "").splitlines()
    try:
        start = lines.index("Attributes:")
    except ValueError:
        return found
    name = ""
    for line in lines[start + 1:]:
        if not line.strip():
            continue
        if not line.startswith(" "):
            break
        m = re.match(r"\s{4}(\w+):\s*(.*)", line)
        if m and not line.startswith(" " * 5):
            name = m.group(1)
            found[name] = m.group(2)
        elif name:
            found[name] += " " + line.strip()
    return found


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _summary(doc: str | None) -> str:
    return inspect.cleandoc(doc or "").split("\n\n")[0].replace("\n", " ")


def wire_page() -> str:
    """``reference/wire.md``: the nine messages, their fields, and the frame limits."""
    from p2pfsm import protocol
    from p2pfsm.protocol import limits, names

    messages = [getattr(protocol, n) for n in protocol.__all__
                if inspect.isclass(getattr(protocol, n))
                and isinstance(getattr(getattr(protocol, n), "TYPE", None), str)]
    out = ["# Wire protocol\n",
           f"Generated from `p2pfsm.protocol`. Every frame is one msgpack map whose "
           f"`{names.TYPE_KEY}` entry names the message; its other keys are the fields "
           f"below, in the order they go on the wire. Fields marked optional are "
           f"p2pfsm's own and absent from the wire when `None` (vLLM 0.33.0 neither sends "
           f"nor reads them). {len(messages)} messages:\n",
           "| type | class | what |", "|---|---|---|"]
    out += [f"| `{m.TYPE}` | `{m.__name__}` | {_cell(_summary(m.__doc__))} |"
            for m in messages]
    out.append("")
    for m in messages:
        out.append(f"## `{m.TYPE}`\n\n{_summary(m.__doc__)} (`p2pfsm.protocol.{m.__name__}`)\n")
        docs = _attributes(m.__doc__)
        rows = ["| field | type | meaning |", "|---|---|---|"]
        for f in dataclasses.fields(m):
            optional = " (optional)" if f.default is None else ""
            rows.append(f"| `{f.name}`{optional} | `{_cell(str(f.type))}` | "
                        f"{_cell(docs.get(f.name, ''))} |")
        out.append("\n".join(rows) + "\n")
    docs = _attributes(limits.Limits.__doc__)
    rows = ["## Limits\n",
            "Every frame from a peer is checked against `p2pfsm.protocol.Limits` before "
            "any message is built; a frame over a bound is refused as malformed. The "
            "defaults:\n", "| limit | default | meaning |", "|---|---|---|"]
    for f in dataclasses.fields(limits.Limits):
        rows.append(f"| `{f.name}` | {getattr(limits.DEFAULT_LIMITS, f.name):,} | "
                    f"{_cell(docs.get(f.name, ''))} |")
    out.append("\n".join(rows) + "\n")
    return "\n".join(out)


def models_page() -> str:
    """``reference/models.md``: every machine's states and transitions as tables."""
    from p2pfsm.fsm.registry import machines

    out = ["# Machine tables\n",
           "Generated from `models/*.toml`, the single source of the machines (the "
           "diagrams are on [Machines and flows](../machines.md)). A transition fires on "
           "its trigger from any of its sources when every guard holds and no `unless` "
           "guard does; `=` as destination: it stays.\n"]
    for name, spec in machines().items():
        out.append(f"## {name}\n\n{spec.doc} (`models/{name}.toml`; initial state "
                   f"`{spec.initial}`, terminal "
                   + ", ".join(f"`{s}`" for s in sorted(spec.terminal)) + ")\n")
        rows = ["| state | meaning |", "|---|---|"]
        rows += [f"| `{s}` | {_cell(d)} |" for s, d in spec.states.items()]
        out.append("\n".join(rows) + "\n")
        rows = ["| trigger | from | to | guards | actions |", "|---|---|---|---|---|"]
        for t in spec.transitions:
            guards = [*t.guards, *(f"not {u}" for u in t.unless)]
            rows.append(f"| `{t.trigger}` | {', '.join(t.sources)} | {t.dest or '='} | "
                        f"{', '.join(guards)} | {', '.join(t.actions)} |")
        out.append("\n".join(rows) + "\n")
    return "\n".join(out)


def cases_page() -> str:
    """``reference/cases.md``: the directed cases of ``p2pfsm conform``, per role."""
    try:
        from p2pfsm.tools.conform.runner import cases_for
    except ImportError:  # the docs venv has no torch or NIXL: the cases only name them
        from sphinx.ext.autodoc.mock import mock

        with mock(["torch", "numpy", "nixl", "nixl_cu12"]):
            from p2pfsm.tools.conform.runner import cases_for
    from p2pfsm.tools.conform.registry import CASES

    out = ["# Conformance cases\n",
           "Generated from `p2pfsm.tools.conform`: every directed case `p2pfsm conform` runs, in "
           "the order it runs them, with what it does and the rule of `models/` it holds the "
           "target to (`--cases ID,...` picks some). How to run them: [Test an "
           "implementation](../howto/conform.md); the reports for p2pfsm and vLLM 0.33.0: "
           "[Conformance reports](conformance.md).\n"]
    for role, tester in (("producer", "the tester is the consumer"),
                         ("consumer", "the tester is the producer")):
        cases = cases_for(role)
        out.append(f"## Cases ({role} role)\n\n{len(cases)} cases; {tester}.\n")
        rows = ["| case | what it does | the rule (models) |", "|---|---|---|"]
        rows += [f"| `{c.id}` | {_cell(c.description)} | {_cell(c.rule)} |" for c in cases]
        out.append("\n".join(rows) + "\n")
    assert len(CASES) == sum(len(cases_for(r)) for r in ("producer", "consumer"))
    return "\n".join(out)


PAGES = {"api": api_page, "cli": cli_page, "wire": wire_page, "models": models_page,
         "cases": cases_page}


def write_generated(docs: Path = DOCS) -> list[Path]:
    """Write the generated reference pages; only those whose text changed."""
    written = []
    for name, page in PAGES.items():
        path = docs / "reference" / f"{name}.md"
        text = page()
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            written.append(path)
    return written


def _mermaid_directive() -> Any:
    from docutils import nodes
    from docutils.parsers.rst import Directive

    class Mermaid(Directive):
        """A mermaid diagram: the fence's text, or the ``.mmd`` file its argument names."""

        has_content = True
        optional_arguments = 1

        def run(self) -> list[Any]:
            if self.arguments:
                env = self.state.document.settings.env
                relative, source = env.relfn2path(self.arguments[0])
                env.note_dependency(relative)
                try:
                    text = Path(source).read_text(encoding="utf-8")
                except OSError as exc:
                    raise self.error(f"mermaid: cannot read {self.arguments[0]}: {exc}") from exc
                text = "\n".join(line for line in text.splitlines()
                                 if not line.startswith("%%"))
            else:
                text = "\n".join(self.content)
            return [nodes.raw("", f'<pre class="mermaid">\n{html.escape(text)}\n</pre>\n',
                              format="html")]

    return Mermaid


def _on_init(app: Any) -> None:
    from sphinx.errors import ExtensionError

    if not MERMAID_JS.is_file():
        raise ExtensionError(f"{MERMAID_JS} is missing: bash .ci/docs.sh unpacks it from "
                             "the npm package mermaid")
    write_generated(Path(app.srcdir))


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("mermaid", _mermaid_directive())
    app.connect("builder-inited", _on_init)
    app.add_js_file("mermaid/mermaid.min.js")
    app.add_js_file("mermaid-init.js")
    return {"parallel_read_safe": True, "parallel_write_safe": True}
