"""Sphinx configuration of the p2pfsm docs site (``bash .ci/docs.sh``).

MyST reads the Markdown pages; ``_ext/p2pfsm_docs.py`` writes the generated reference
pages (host API, command line, wire, machines) before the build and renders ``mermaid``
fences with the mermaid.js that ``.ci/docs.sh`` takes from the npm package.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))
sys.path.insert(0, str(HERE.parent))

project = "p2pfsm"
author = "p2pfsm authors"
copyright = "p2pfsm authors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "p2pfsm_docs",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "diagrams", "README.md"]
suppress_warnings: list[str] = []

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3
myst_fence_as_directive = ["mermaid"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_class_signature = "separated"
autodoc_default_options = {"members": True, "show-inheritance": True}
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_ivar = True

html_theme = "furo"
html_title = "p2pfsm"
html_static_path = ["_static"]
html_css_files = ["p2pfsm.css"]
