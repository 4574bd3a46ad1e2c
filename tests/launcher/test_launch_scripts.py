"""Reading a script's --local_rank declaration, and the argv the worker entry builds. No processes."""

from __future__ import annotations

import os

import pytest
from _launch_util import free_port, outputs, results, run_ringtrain, write

from ringtrain.launcher import scripts, worker


@pytest.mark.parametrize(
    "source, expected",
    [
        ('parser.add_argument("--local_rank", type=int, default=0)', "--local_rank"),
        ("parser.add_argument('--local-rank', type=int)", "--local-rank"),
        ('p.add_argument(\n    "--local_rank",\n    type=int,\n)', "--local_rank"),
        ('parser.add_argument("--local-rank", "--local_rank", type=int)', "--local-rank"),
        ('parser.add_argument("-l", "--local_rank", type=int)', "--local_rank"),
        ('local_rank = int(os.environ["LOCAL_RANK"])', None),
        ('parser.add_argument("--rank", type=int)  # not --local_rank', None),
        ('print("--local_rank")', None),
        ("", None),
    ],
)
def test_local_rank_spelling(source, expected):
    assert scripts.local_rank_spelling(source) == expected


def test_module_file_finds_a_package_main(tmp_path, monkeypatch):
    write(tmp_path / "pkg_for_rt_test" / "__init__.py", "")
    main = write(tmp_path / "pkg_for_rt_test" / "__main__.py", "")
    monkeypatch.chdir(tmp_path)  # found from the current directory, like `python -m`
    assert os.path.samefile(scripts.module_file("pkg_for_rt_test"), main)


def test_worker_argv_puts_the_local_rank_right_after_the_script(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert worker._argv_for("t.py", "--local_rank", ["--", "x"]) == ["t.py", "--local_rank=3", "--", "x"]
    assert worker._argv_for("t.py", "none", ["--a", "1"]) == ["t.py", "--a", "1"]


# --- a script that names its own tcp:// rendezvous (seed 004) ---------------------------------

def test_a_literal_tcp_init_method_is_read_from_the_script():
    from ringtrain.launcher.scripts import tcp_rendezvous

    assert tcp_rendezvous("dist.init_process_group('gloo', init_method='tcp://127.0.0.1:23456', rank=r)") == (
        "127.0.0.1", 23456)
    assert tcp_rendezvous('init_method = "tcp://[::1]:29999"') == ("::1", 29999)
    assert tcp_rendezvous('init_method=f"tcp://{ip}:{port}"') is None  # computed at run time: unknowable
    assert tcp_rendezvous("init_method='env://'") is None


TCP_INIT = """
    import argparse, torch, torch.distributed as dist
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=0)
    args = parser.parse_args()
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:PORT", world_size=2, rank=args.local_rank)
    t = torch.tensor([args.local_rank + 1.0])
    dist.all_reduce(t)
    import sys; sys.stdout.write(f"RESULT rank={args.local_rank} sum={t.item()}\\n"); sys.stdout.flush()
"""


@pytest.mark.timeout(150)
def test_seed004s_tcp_init_method_runs_under_ringtrain_run(tmp_path):
    # Every torchrun-style worker joins the launcher's store as a client, tcp:// included: at another
    # port nobody listens and the job hangs (plain torchrun does). ringtrain hosts its store there.
    port = free_port()
    script = write(tmp_path / "distributed.py", TCP_INIT.replace("PORT", str(port)))
    proc = run_ringtrain("run", "--nproc-per-node", "2", str(script), timeout=120)
    assert proc.returncode == 0, outputs(proc)
    assert [(r["rank"], r["sum"]) for r in results(proc.stdout)] == [("0", "3.0"), ("1", "3.0")], outputs(proc)
    # what cannot work is refused before anything starts
    for argv, words in ((["--master-port", str(port + 1)], "--master-port is"),
                        (["--max-restarts", "1"], "restarted workers would meet")):
        refused = run_ringtrain("run", "--nproc-per-node", "2", *argv, str(script), timeout=60)
        assert refused.returncode == 2 and words in refused.stderr and "HINT:" in refused.stderr, outputs(refused)
