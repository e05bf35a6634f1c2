#!/usr/bin/env bash
# Creates .venv-vllm: a separate venv holding vLLM 0.33.0's P2P tier, the peer that
# tests/interop/ runs p2pfsm against. Only the packages that importing
# vllm.v1.kv_offload.tiering.p2p.{session,control.zmq,data.nixl} needs go in, not
# vLLM's full dependency set:
#   * torch 2.13.0, the CPU wheel (vLLM pins 2.14.0; its P2P tier runs on 2.13.0);
#   * vllm 0.33.0 with --no-deps, plus the light packages its import needs;
#   * nixl and nixl-cu12 1.5.1 with --no-deps (nixl-cu12 asks for an unpinned torch);
#   * the pinned packages of .ci/vllm-manager.txt with --no-deps: what importing vLLM's
#     own tier manager (...p2p.manager: vllm.config, pydantic, transformers, ...) needs;
#   * p2pfsm itself, editable and without its test extras, so the peer script can
#     import p2pfsm.demo.blocks (the shared block model).
# Re-running it reuses an existing .venv-vllm. Measured: see docs/howto/interop.md.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${P2PFSM_VLLM_VENV:-.venv-vllm}
python3 -m venv "$VENV"
# Keep the venv out of git status (and out of anything that copies untracked files).
printf '*\n' > "$VENV/.gitignore"
PIP="$VENV/bin/pip"
"$PIP" install -q --upgrade pip
"$PIP" install -q torch==2.13.0
"$PIP" install -q --no-deps vllm==0.33.0
"$PIP" install -q packaging numpy msgspec pyzmq psutil urllib3 regex
"$PIP" install -q --no-deps nixl==1.5.1 nixl-cu12==1.5.1
"$PIP" install -q transitions==0.9.3 'msgpack>=1.0,<2'
"$PIP" install -q --no-deps -r .ci/vllm-manager.txt
"$PIP" install -q -e . --no-deps
"$VENV/bin/python" - <<'PY'
import vllm.v1.kv_offload.tiering.p2p.session  # noqa: F401
import vllm.v1.kv_offload.tiering.p2p.control.zmq  # noqa: F401
import vllm.v1.kv_offload.tiering.p2p.data.nixl  # noqa: F401
import vllm.v1.kv_offload.tiering.p2p.manager  # noqa: F401
import p2pfsm.demo.blocks  # noqa: F401
print("vLLM 0.33.0 P2P tier importable from .venv-vllm")
PY
