"""comm/checks.py's rows (issue 20, item 5): they keep their wire format and are read by name.
(comm/'s imports are checked with the whole package's in tests/test_layers.py.)"""

from __future__ import annotations

import os

import torch

import ringtrain.comm
from ringtrain.comm import checks

COMM = os.path.dirname(ringtrain.comm.__file__)


def test_a_row_travels_as_the_same_flat_ints_as_before():
    call = checks.Call(checks.Kind.ALLGATHER, torch.float32, "cuda", op=2, root=1, shape=(3, 4), agree="x",
                       aux=3, held=2, held_digest=7)
    row = checks._encode(call)
    wire = row.wire()
    assert len(wire) == checks.WIDTH == 18
    # positions: magic, kind, dtype (+CUDA_FLAG), op, root, ndim, 8 dims, agree hash, aux, held, digest
    assert wire[:6] == [checks.MAGIC, int(checks.Kind.ALLGATHER), row.dtype, 2, 1, 2]
    assert row.dtype >= checks.CUDA_FLAG
    assert wire[6:14] == [3, 4] + [-1] * 6
    assert wire[14:] == [checks.hash_text("x"), 3, 2, 7]
    assert checks.Row.parse(wire) == row
    assert row.ours and not row.joined and not row.invalid
    assert row._replace(op=checks.INVALID_OP).invalid
    assert checks.describe(row) == "allgather(cuda float32[3, 4], op=Adasum, root_rank=1)"
    assert not checks.Row.parse([0] * checks.WIDTH).ours


def test_invalid_op_is_defined_once():
    from ringtrain.comm import validate

    assert validate.INVALID_OP is checks.INVALID_OP
    for name in os.listdir(COMM):
        if name.endswith(".py"):
            assert "-9" not in open(os.path.join(COMM, name)).read().replace("INVALID_OP = -9", ""), name
