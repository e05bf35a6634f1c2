#!/usr/bin/env bash
# The docs site: builds docs/ into docs/_build/html with Sphinx (warnings are errors).
#   bash .ci/docs.sh          build
#   bash .ci/docs.sh tools    only install the tools (.venv-docs, mermaid.js), no build
#   bash .ci/docs.sh serve    build, then serve it on http://127.0.0.1:8000
#   bash .ci/docs.sh check    build, then open every page in headless Chromium
#                             (.ci/docs_browser.py; screenshots in docs-artifacts/)
# The tools live in their own venv, .venv-docs (p2pfsm[docs]); mermaid.js comes from the
# npm package, unpacked into docs/_static/mermaid, so the site needs no network to draw.
set -euo pipefail
cd "$(dirname "$0")/.."
MERMAID_VERSION=12.4.0
if [ ! -x .venv-docs/bin/sphinx-build ]; then
    python3 -m venv .venv-docs
    .venv-docs/bin/pip install -q --upgrade pip
fi
.venv-docs/bin/pip install -q -e '.[docs]'
JS=docs/_static/mermaid
if [ "$(cat "$JS/VERSION" 2>/dev/null)" != "$MERMAID_VERSION" ]; then
    TMP=$(mktemp -d)
    (cd "$TMP" && npm pack --silent "mermaid@$MERMAID_VERSION" >/dev/null \
        && tar xzf "mermaid-$MERMAID_VERSION.tgz" package/dist/mermaid.min.js package/LICENSE)
    mkdir -p "$JS"
    cp "$TMP/package/dist/mermaid.min.js" "$TMP/package/LICENSE" "$JS/"
    echo "$MERMAID_VERSION" > "$JS/VERSION"
    rm -rf "$TMP"
fi
if [ "${1:-}" = tools ]; then
    exit 0
fi
rm -rf docs/_build/html
.venv-docs/bin/sphinx-build -q -W --keep-going -b html docs docs/_build/html
echo "docs built: docs/_build/html/index.html"
case "${1:-}" in
    serve)
        echo "serving on http://127.0.0.1:8000 (Ctrl-C stops)"
        exec .venv-docs/bin/python -m http.server 8000 --bind 127.0.0.1 \
            --directory docs/_build/html ;;
    check)
        if ! command -v chromium >/dev/null 2>&1; then
            apt-get update -q && apt-get install -y -q chromium >/dev/null
        fi
        .venv-docs/bin/python .ci/docs_browser.py ;;
    "") ;;
    *) echo "usage: bash .ci/docs.sh [serve|check|tools]" >&2; exit 2 ;;
esac
