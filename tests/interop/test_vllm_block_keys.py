"""BlockHasher's keys equal vLLM's own: its prefix-cache chain (``hash_block_tokens``
from the root ``init_none_hash`` derives, algorithm ``sha256``) and its offload key
(``make_offload_key``), computed by vLLM in its own venv."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from p2pfsm.blocks import BlockHasher

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = Path(os.environ.get("P2PFSM_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))

pytestmark = [
    pytest.mark.interop,
    pytest.mark.skipif(not VLLM_PYTHON.is_file(), reason=f"no vLLM venv at {VLLM_PYTHON}"),
]

VLLM_KEYS = """
import json, sys
from vllm.utils.hashing import sha256
from vllm.v1.core import kv_cache_utils as k
from vllm.v1.kv_offload.base import make_offload_key
k.init_none_hash(sha256)
tokens, size, group, salt = json.loads(sys.argv[1])
parent, keys = None, []
for n in range(len(tokens) // size):
    extra = (salt,) if salt and n == 0 else None
    parent = k.hash_block_tokens(sha256, parent, tokens[n * size:(n + 1) * size], extra)
    keys.append(make_offload_key(parent, group).hex())
print(json.dumps([k.get_none_hash_seed(), keys]))
"""


@pytest.mark.parametrize(("seed", "salt"), [("vllm-none-hash", None), ("4242", "tenant-1")])
def test_block_keys_equal_vllms(seed: str, salt: str | None) -> None:
    tokens, size, group = list(range(1000, 1037)), 16, 1  # two full blocks, a partial one
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    if seed != "vllm-none-hash":
        env["PYTHONHASHSEED"] = seed
    done = subprocess.run([str(VLLM_PYTHON), "-c", VLLM_KEYS,
                           json.dumps([tokens, size, group, salt])],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    vllm_seed, vllm_keys = json.loads(done.stdout.strip().splitlines()[-1])
    assert vllm_seed == seed
    extra = [(salt,)] if salt else []
    ours = BlockHasher(size, seed, group).keys(tokens, extra_keys=extra)
    assert [key.hex() for key in ours] == vllm_keys and len(ours) == 2
