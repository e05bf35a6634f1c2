#!/usr/bin/env bash
# Creates .venv and installs p2pfsm with everything its tests need: what
# `pip install 'p2pfsm[nixl,check,prometheus]'` gives a user, plus the test tools.
# torch is pinned to the CPU wheel on disk; nixl-cu12 goes in with --no-deps
# because its metadata asks for an unpinned torch (a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
# TLC (the TLA+ model checker the tests and `p2pfsm check` run) needs a Java 11+ runtime.
if ! command -v java >/dev/null 2>&1; then
    apt-get update -q && apt-get install -y -q openjdk-17-jre-headless
fi
python3 -m venv .venv
PIP=".venv/bin/pip"
"$PIP" install -q --upgrade pip
"$PIP" install -q torch==2.13.0 numpy
"$PIP" install -q --no-deps nixl-cu12==1.5.1
"$PIP" install -q -e '.[test]'
