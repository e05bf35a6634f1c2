#!/usr/bin/env bash
# Usage: bash .ci/install-vllm.sh [0.33.0|0.34.0]   (default 0.33.0)
# Creates the venv holding one vLLM release's P2P tier, the peer that tests/interop/
# runs p2pfsm against: .venv-vllm for 0.33.0, .venv-vllm-0.34 for 0.34.0
# (P2PFSM_VLLM_VENV overrides the path). Only the packages that importing
# vllm.v1.kv_offload.tiering.p2p.{session,control.zmq,data.nixl,manager} needs go in,
# not vLLM's full dependency set:
#   * torch 2.13.0, the CPU wheel (vLLM pins 2.14.0; its P2P tier runs on 2.13.0);
#   * vllm with --no-deps, plus the light packages its import needs;
#   * nixl and nixl-cu12 1.5.1 with --no-deps (nixl-cu12 asks for an unpinned torch);
#   * the pinned packages of .ci/vllm-manager.txt with --no-deps: what importing vLLM's
#     own tier manager (...p2p.manager: vllm.config, pydantic, transformers, ...) needs;
#     the same pins satisfy both releases' requirements;
#   * p2pfsm itself, editable and without its test extras, so the peer script can
#     import p2pfsm.demo_blocks (the shared block model).
# Re-running it reuses an existing venv. Measured: see docs/howto/interop.md.
set -euo pipefail
cd "$(dirname "$0")/.."
RELEASE=${1:-0.33.0}
case "$RELEASE" in
  0.33.0) DEFAULT_VENV=.venv-vllm ;;
  0.34.0) DEFAULT_VENV=.venv-vllm-0.34 ;;
  *) echo "install-vllm.sh: unsupported vLLM release $RELEASE (supported: 0.33.0, 0.34.0)" >&2
     exit 2 ;;
esac
VENV=${P2PFSM_VLLM_VENV:-$DEFAULT_VENV}
python3 -m venv "$VENV"
# Keep the venv out of git status (and out of anything that copies untracked files).
printf '*\n' > "$VENV/.gitignore"
PIP="$VENV/bin/pip"
"$PIP" install -q --upgrade pip
"$PIP" install -q torch==2.13.0
"$PIP" install -q --no-deps "vllm==$RELEASE"
"$PIP" install -q packaging numpy msgspec pyzmq psutil urllib3 regex
"$PIP" install -q --no-deps nixl==1.5.1 nixl-cu12==1.5.1
"$PIP" install -q transitions==0.9.3 'msgpack>=1.0,<2'
"$PIP" install -q --no-deps -r .ci/vllm-manager.txt
"$PIP" install -q -e . --no-deps
"$VENV/bin/python" - "$RELEASE" "$VENV" <<'PY'
import sys
from importlib.metadata import version

import vllm.v1.kv_offload.tiering.p2p.session  # noqa: F401
import vllm.v1.kv_offload.tiering.p2p.control.zmq  # noqa: F401
import vllm.v1.kv_offload.tiering.p2p.data.nixl  # noqa: F401
import vllm.v1.kv_offload.tiering.p2p.manager  # noqa: F401
import p2pfsm.demo_blocks  # noqa: F401
assert version("vllm") == sys.argv[1], version("vllm")
print(f"vLLM {sys.argv[1]} P2P tier importable from {sys.argv[2]}")
PY
