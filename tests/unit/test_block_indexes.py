"""Block indexes a host hands a node: plain ints pass as they are, numpy and torch
integers become ints, anything else is left for the session to refuse by name."""

from __future__ import annotations

import numpy as np
import torch

from p2pfsm.executor.node.host_args import as_int, as_ints


def test_plain_ints_pass_through_the_fast_path_unchanged() -> None:
    assert as_ints([3, 1, 2]) == (3, 1, 2)
    assert as_ints(range(256)) == tuple(range(256))
    assert as_ints(()) == ()


def test_numpy_and_torch_integers_become_plain_ints() -> None:
    got = as_ints([np.int64(4), torch.tensor(5), 6])
    assert got == (4, 5, 6) and all(type(v) is int for v in got)
    got = as_ints(np.arange(3, dtype=np.int32))
    assert got == (0, 1, 2) and all(type(v) is int for v in got)


def test_what_is_not_an_index_is_left_for_the_session_to_refuse() -> None:
    got = as_ints([1, True, 2.0, "3"])
    assert got == (1, True, 2.0, "3")
    assert type(got[1]) is bool and type(got[2]) is float  # not turned into ints
    assert as_int(np.float32(1.0)) == np.float32(1.0)
    assert type(as_int(np.float32(1.0))) is np.float32
