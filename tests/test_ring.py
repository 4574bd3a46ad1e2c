"""Ring on real Gloo process groups: equivalence with one process, init methods, bad input."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from _launch_util import HELPERS, free_port
import torch

import _ring_jobs as jobs
import ringtrain as rt

pytestmark = pytest.mark.timeout(180)


def test_two_ranks_match_one_process_with_double_batch(run_ranks):
    """2 ranks x batch 8 (shuffled, SGD+momentum, 2 epochs) == 1 process x batch 16."""
    two = run_ranks(jobs.train, 8)
    one = jobs.train(16)
    assert torch.equal(two[0], two[1]), "ranks diverged"
    assert (two[0] - one).abs().max().item() <= 1e-5


def test_collectives_across_two_ranks(run_ranks):
    r0, r1 = run_ranks(jobs.collectives)
    for out in (r0, r1):
        assert out["sum"].tolist() == [3.0, 4.0]
        assert out["mean"].item() == pytest.approx(0.5)
        assert out["mean_int"].item() == pytest.approx(1.5)
        assert out["max"].tolist() == [1, 0]
        assert out["min"].tolist() == [0, -1]
        assert out["gather"].tolist() == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]]
        assert out["gather_scalar"].tolist() == [0, 10]
        assert out["objects"] == [{"rank": 0, "name": "r0"}, {"rank": 1, "name": "r1"}]
        assert out["broadcast"].tolist() == [6.0]
        assert out["broadcast_object"] == "from 0"
        assert out["product"].tolist() == [6.0, 9.0]
    assert r0["reduce_sum_to_1"] is None and r1["reduce_sum_to_1"].tolist() == [3.0]
    assert r0["reduce_mean_int"].item() == pytest.approx(1.5) and r1["reduce_mean_int"] is None
    assert r0["gather_to_0"].tolist() == [[0.0, 0.0], [1.0, 1.0], [1.0, 1.0]] and r1["gather_to_0"] is None


def test_collectives_are_identity_on_one_process():
    ring = rt.Ring()
    x = torch.tensor([1.0, 2.0])
    assert torch.equal(ring.all_reduce(x, op="sum"), x)
    assert torch.equal(ring.reduce(x, op="product"), x) and torch.equal(ring.gather(x), x)
    # the same dtype as on many processes: a mean of integers is float64 everywhere
    assert ring.all_reduce(torch.tensor(3), op="mean").dtype == torch.float64
    assert ring.reduce(torch.tensor(3)).dtype == torch.float64
    assert torch.equal(ring.all_gather(x), x)
    assert ring.gather_object("a") == ["a"]
    assert torch.equal(ring.broadcast(x), x)
    assert ring.broadcast_object(7) == 7
    ring.barrier()
    with pytest.raises(rt.RingtrainError, match="HINT"):
        ring.all_reduce(x, op="avg")


def test_single_process_ring_basics(capsys):
    ring = rt.Ring(seed=0)
    assert (ring.rank, ring.world_size, ring.local_rank, ring.is_main) == (0, 1, 0, True)
    assert ring.strategy.name == "single"
    assert ring.device == torch.device("cpu")
    model, opt = ring.setup(jobs.small_model(), torch.optim.SGD(jobs.small_model().parameters(), lr=0.1))
    assert isinstance(model, torch.nn.Sequential)
    ring.print("only main")
    assert "only main" in capsys.readouterr().out


def test_print_and_progress_only_on_main(run_ranks, capfd):
    counts = run_ranks(jobs.print_and_progress, 10)
    assert counts == [3, 3]  # 10 samples over 2 ranks, batch 2 -> 3 batches each (padded)
    captured = capfd.readouterr()
    assert "hello from rank 0" in captured.out
    assert "hello from rank 1" not in captured.out + captured.err


def test_env_init_method(run_ranks):
    # ringtrain.launch sets RANK/WORLD_SIZE/MASTER_*: the torchrun contract, env://.
    outs = run_ranks(jobs.ring_error, init_method="env://")
    assert outs == ["", ""]


def _by_hand(code: str, nprocs: int = 2, timeout: float = 90) -> list[subprocess.CompletedProcess]:
    """Start ``nprocs`` plain python processes (no launcher), rank given as argv[1]."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code), str(r)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for r in range(nprocs)
    ]
    done = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


ENV_BY_HAND = """
import sys, torch, ringtrain as rt
ring = rt.Ring(device="cpu")
total = ring.all_reduce(torch.tensor([float(ring.rank + 1)]), op="sum").item()
print(f"RESULT rank={ring.rank} world={ring.world_size} env={ring.env.name} total={total}", flush=True)
"""


@pytest.mark.timeout(120)
def test_env_by_hand_with_four_variables_forms_the_group(tmp_path):
    # Seed 000 starts each process itself with MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK only.
    script = tmp_path / "by_hand.py"
    script.write_text(ENV_BY_HAND)
    port = str(free_port())
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=port, WORLD_SIZE="2",
                                       RANK=str(rank)))
             for rank in (0, 1)]
    outs = [p.communicate(timeout=100) for p in procs]
    lines = sorted(line for out, _ in outs for line in out.splitlines() if line.startswith("RESULT"))
    assert lines == ["RESULT rank=0 world=2 env=env-by-hand total=3.0",
                     "RESULT rank=1 world=2 env=env-by-hand total=3.0"], outs


@pytest.mark.parametrize("kind", ["tcp", "file"])
def test_tcp_and_file_init_methods_form_a_group(kind, tmp_path):
    url = f"tcp://127.0.0.1:{free_port()}" if kind == "tcp" else f"file://{tmp_path / 'rendezvous'}"
    code = f"""
        import sys, torch, ringtrain as rt
        rank = int(sys.argv[1])
        ring = rt.Ring(init_method={url!r}, world_size=2, rank=rank, timeout=60)
        print("SUM", ring.all_reduce(torch.tensor(rank + 1.0), op="sum").item(), ring.world_size)
        ring.close()
    """
    for res in _by_hand(code):
        assert res.returncode == 0, res.stderr
        assert "SUM 3.0 2" in res.stdout


def test_explicit_init_method_trains_like_one_process(tmp_path):
    url = f"tcp://127.0.0.1:{free_port()}"
    out = tmp_path / "params.pt"
    code = f"""
        import sys, torch
        sys.path.insert(0, {HELPERS!r})
        import _ring_jobs as jobs
        rank = int(sys.argv[1])
        p = jobs.train(8, init_method={url!r}, world_size=2, rank=rank)
        if rank == 0:
            torch.save(p, {str(out)!r})
    """
    for res in _by_hand(code):
        assert res.returncode == 0, res.stderr
    assert (torch.load(out) - jobs.train(16)).abs().max().item() <= 1e-5


def test_unreachable_master_fails_within_timeout():
    code = f"""
        import ringtrain as rt
        rt.Ring(init_method="tcp://127.0.0.1:{free_port()}", world_size=2, rank=1, timeout=3)
    """
    start = time.monotonic()
    (res,) = _by_hand(code, nprocs=1, timeout=60)
    assert time.monotonic() - start < 45
    assert res.returncode != 0
    assert "could not form the process group" in res.stderr and "HINT:" in res.stderr


def test_world_size_mismatch_with_launcher(run_ranks):
    errors = run_ranks(jobs.ring_error, world_size=4)
    for e in errors:
        assert "world_size=4" in e and "started 2 processes" in e and "HINT:" in e


def test_single_strategy_under_a_launcher_is_refused(run_ranks):
    errors = run_ranks(jobs.ring_error, strategy="single")
    assert all("strategy='single'" in e and "HINT:" in e for e in errors)


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"world_size": 2}, "only one of world_size= and rank="),
        ({"world_size": 2, "rank": 2, "init_method": "tcp://127.0.0.1:1"}, "rank=2 for world_size=2"),
        ({"strategy": "horovodish"}, "unknown strategy"),
        ({"timeout": -1}, "timeout=-1"),
        ({"backend": "nccl", "init_method": "tcp://127.0.0.1:1", "world_size": 1, "rank": 0}, "nccl"),
    ],
)
def test_bad_ring_arguments(kwargs, needle):
    message = jobs.ring_error(**kwargs)
    assert needle in message and "HINT:" in message


def test_setup_rejects_bad_input():
    ring = rt.Ring()
    with pytest.raises(rt.RingtrainError, match="unknown option"):
        ring.setup(jobs.small_model(), find_unused_params=True)
    with pytest.raises(rt.RingtrainError, match="already wrapped"):
        ring.setup(torch.nn.DataParallel(jobs.small_model()))
    with pytest.raises(rt.RingtrainError, match="not an nn.Module"):
        ring.setup("model")


def test_ddp_options_pass_through(run_ranks):
    outs = run_ranks(jobs.ddp_options)
    assert outs == [(True, True), (True, True)]


def test_evaluation_on_rank_zero_alone_through_the_ddp_model_runs_no_collective(run_ranks):
    """Issue 30, item 6: `if master_process: estimate_loss()` through the DDP-wrapped model (with a buffer, which
    DDP broadcasts in every syncing forward) no longer pairs with another rank's training forward: the job trains
    exactly as without the evaluation."""
    with_eval = run_ranks(jobs.eval_on_rank_zero_only, True)[0]
    without = run_ranks(jobs.eval_on_rank_zero_only, False)[0]
    assert torch.equal(with_eval, without)


def test_the_ring_shows_what_a_script_uses_and_ends_one_way(tmp_path):
    """Public: the strategy and the environment (and the documented methods and properties); what the Ring holds to
    drive them is private. close() and the end of a with block are one sequence: the folder is given back either
    way, an error on its way out included."""
    ring = rt.Ring(seed=0)
    assert sorted(k for k in vars(ring) if not k.startswith("_")) == ["env", "strategy"]
    assert ring.mesh is None  # asked of the strategy, not probed
    ring.close()
    for end in ("close", "with", "error"):
        folder = str(tmp_path / end)
        ring = rt.Ring(checkpoint_dir=folder, save_every=1)
        if end == "close":
            ring.close()
        elif end == "with":
            with ring:
                pass
        else:
            with pytest.raises(ValueError), ring:
                raise ValueError("the loop failed")
        rt.Ring(checkpoint_dir=folder, save_every=1).close()  # the folder was given back: a new ring takes it


def test_import_is_torch_free_and_the_ring_loads_no_pipelining():
    """``import ringtrain`` imports no torch; ``rt.Ring`` after ``import torch`` does not load
    torch.distributed.pipelining (nor torch._dynamo with it): a pipeline loads it when it builds a schedule."""
    code = textwrap.dedent("""
        import sys
        import ringtrain as rt
        assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))
        import torch
        rt.Ring, rt.strategies.Pipeline
        print(sorted(m for m in sys.modules if m.startswith(("torch.distributed.pipelining", "torch._dynamo"))))
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]", res.stdout
