"""strategy='hvd' under the Ring: Horovod's DistributedOptimizer in place of DDP, same training."""

from __future__ import annotations

import pytest

import _ring_jobs as jobs
import ringtrain as rt

pytestmark = pytest.mark.timeout(240)


def test_hvd_matches_one_process_with_and_without_accumulation(run_ranks):
    reference = jobs.train(16, 2, n=88)  # 88: epochs end with a short (flushed) window
    plain = run_ranks(jobs.train, 8, 2, n=88, strategy="hvd")
    accumulated = run_ranks(jobs.train, 4, 2, n=88, strategy="hvd", accumulate=2)
    for name, params in (("hvd", plain), ("hvd+accumulate", accumulated)):
        assert (params[0] - params[1]).abs().max().item() == 0, name
        assert (params[0] - reference).abs().max().item() <= 1e-5, name


def test_fp16_and_bf16_compression_stay_close(run_ranks):
    reference = jobs.train(16, 2)
    for strategy in (rt.strategies.Horovod(compression="fp16"), rt.strategies.DDP(compression="fp16"),
                     rt.strategies.Horovod(compression="bf16")):
        params = run_ranks(jobs.train, 8, 2, strategy=strategy)[0]
        assert (params - reference).abs().max().item() <= 5e-3, strategy


def test_hvd_with_fp16_scaler_and_clipping(run_ranks):
    outs = run_ranks(jobs.train, 8, 1, strategy="hvd", precision="16-mixed", clip=1.0)
    reference = jobs.train(16, 1, precision="16-mixed", clip=1.0)
    assert (outs[0] - reference).abs().max().item() <= 2e-3


def test_bad_compression():
    with pytest.raises(rt.RingtrainError, match="compression"):
        rt.Ring(strategy=rt.strategies.DDP(compression="int8"), init_method="tcp://127.0.0.1:1", world_size=1, rank=0)
