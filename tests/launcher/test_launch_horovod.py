"""`ringtrain run --horovod` and horovodrun's flags (-np, -H, --hostfile).

Host lists, local-host detection and the ssh commands are pure functions, tested as such
(there is no ssh here). The rest runs the real CLI on loopback: an unmodified
``import horovod.torch`` script with no PYTHONPATH set by the test, two "nodes" on this
machine, uneven nodes, a failing node.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _launch_util import PREEMPTIBLE, outputs, preempted_by, preemption_problems, results, ringtrain_cmd, write

from ringtrain.errors import RingtrainError
from ringtrain.launcher import agent, host_list, hosts, plan as plans, run, worker
from ringtrain.launcher.host_list import Host

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "examples/horovod_style.py"  # relative: the job runs in ROOT, as the example's docstring says
ALIAS = str(Path(worker.__file__).resolve().parents[1] / "horovod" / "_alias")
HERE = {"thisbox", "thisbox.example.org", "10.1.2.3"}  # stands for local_names(): no lookups in unit tests
PY = "/opt/venv/bin/python"


# ---------------------------------------------------------------------------------------
# Host lists


def test_host_list_syntax():
    assert host_list.parse_host_list("node1:2,node2:2") == [Host("node1", 2), Host("node2", 2)]
    assert host_list.parse_host_list(" a:1 , b ") == [Host("a", 1), Host("b", 1)]  # no :N = one slot
    assert host_list.parse_host_list("[::1]:3,[fe80::1]") == [Host("::1", 3), Host("fe80::1", 1)]
    assert host_list.parse_host_list("10.0.0.1:8") == [Host("10.0.0.1", 8)]


@pytest.mark.parametrize("text, words", [
    ("a:0", "not a positive number"), ("a:x", "not a positive number"), ("a:", "not a positive number"),
    ("a:2,", "not a host name"), ("::1:2", "ambiguous"), ("[::1", "cannot read"),
    ("a:1,A:2", "listed twice"), ("a b:2", "not a host name"), ("-oProxyCommand=x:1", "not a host name"),
])
def test_bad_host_lists_say_why(text, words):
    with pytest.raises(RingtrainError, match=words) as e:
        host_list.parse_host_list(text)
    assert "HINT: " in str(e.value)


def test_hostfile_lines_comments_and_blanks(tmp_path):
    text = """
        # the cluster
        node1 slots=4   # the master
        node2  slots=2

        node3
        [::1] slots=1
    """
    assert host_list.parse_hostfile_text(text) == [Host("node1", 4), Host("node2", 2), Host("node3", 1), Host("::1", 1)]
    path = write(tmp_path / "hosts.txt", "localhost slots=2\n")
    assert host_list.read_hostfile(str(path)) == [Host("localhost", 2)]


@pytest.mark.parametrize("text, words", [
    ("node1 slots=two\n", "line 1: slots 'two'"), ("# only\n\nnode1 cpus=2\n", "line 3: cannot read"),
    ("node1 slots\n", "cannot read"), ("# nothing\n\n", "lists no hosts"), ("a\nb\na slots=2\n", "listed twice"),
])
def test_bad_hostfiles_say_where(text, words):
    with pytest.raises(RingtrainError, match=words) as e:
        host_list.parse_hostfile_text(text)
    assert "HINT: " in str(e.value)


def test_missing_hostfile(tmp_path):
    with pytest.raises(RingtrainError, match="cannot read it"):
        host_list.read_hostfile(str(tmp_path / "nope.txt"))


def test_np_fills_the_hosts_in_order():
    listed = [Host("a", 2), Host("b", 2), Host("c", 2)]
    assert host_list.assign(listed, 3) == [Host("a", 2), Host("b", 1)]  # as horovodrun's get_host_assignments
    assert host_list.assign(listed, 1) == [Host("a", 1)]
    assert host_list.assign(listed, 6) == listed and host_list.assign(listed, None) == listed
    with pytest.raises(RingtrainError, match=r"-np 7 processes, but the hosts \(a:2,b:2,c:2\) have only 6") as e:
        host_list.assign(listed, 7)
    assert "HINT: lower -np to 6" in str(e.value)
    with pytest.raises(RingtrainError, match="at least one"):
        host_list.assign(listed, 0)


def test_local_host_detection():
    for name in ("localhost", "LOCALHOST", "127.0.0.1", "::1", "[::1]", "0:0::1", "thisbox", "ThisBox.example.org",
                 "10.1.2.3"):
        assert hosts.is_local(name, HERE), name
    # Other loopback addresses are hosts to ssh to, as with horovodrun (no interface has them):
    # the way to try the ssh path on one machine. 127.0.1.1 is here only when the host name resolves to it.
    for name in ("node1", "10.0.0.1", "thisbox2", "example.org", "127.0.0.2", "127.0.1.1"):
        assert not hosts.is_local(name, HERE), name
    assert hosts.is_local("127.0.1.1", HERE | {"127.0.1.1"})
    import socket

    assert hosts.is_local(socket.gethostname())  # the real lookup: this machine by its own name
    assert socket.gethostname().lower() in hosts.local_names()
    try:
        resolved = socket.gethostbyname(socket.gethostname())
    except OSError:
        return
    assert hosts.is_local(resolved)  # ...and by the address its name resolves to


# ---------------------------------------------------------------------------------------
# The nodes' commands


def _nodes(listed, **kw):
    args = {"master_addr": None, "master_port": 29500, "options": ["--horovod"], "target": ["train.py", "--lr", "0.1"],
            "python": PY, "cwd": "/home/me/my project", "environ": {}, "names": HERE}
    return hosts.plan_nodes(listed, **{**args, **kw})


def test_all_local_hosts_are_local_agents_meeting_on_loopback():
    nodes = _nodes([Host("localhost", 1), Host("127.0.0.1", 2)], master_port=4321)
    assert [(n.rank, n.nproc, n.local) for n in nodes] == [(0, 1, True), (1, 2, True)]
    assert nodes[1].argv == [PY, "-m", "ringtrain", "run", "--nnodes", "2", "--node-rank", "1",
                             "--master-addr", "127.0.0.1", "--master-port", "4321", "--nproc-per-node", "2",
                             "--horovod", "train.py", "--lr", "0.1"]


def test_remote_hosts_are_started_over_ssh():
    env = {"NCCL_DEBUG": "INFO", "PYTHONPATH": "/x y", "HOME": "/home/me", "SECRET_TOKEN": "s", "OMP_NUM_THREADS": "4"}
    nodes = _nodes([Host("thisbox", 2), Host("node2", 2), Host("node3", 1)], environ=env,
                   target=["train.py", "--name", "it's a run", "--glob", "*.pt"])
    local, remote = nodes[0], nodes[2]
    assert local.local and local.argv[:4] == [PY, "-m", "ringtrain", "run"]
    assert local.argv[local.argv.index("--master-addr") + 1] == "thisbox"  # the first host is the master
    assert not remote.local and remote.argv[:7] == ["ssh", "-o", "BatchMode=yes", "-tt",
                                                    "-o", "StrictHostKeyChecking=accept-new", "node3"]
    assert len(remote.argv) == 8  # one remote command string, shell-quoted
    words = shlex.split(remote.argv[7])
    assert words[:6] == ["cd", "/home/me/my project", "&&", "exec", "env", "NCCL_DEBUG=INFO"]
    # only the documented variables travel (sorted), never e.g. HOME or a token of the user's; then the node's own
    # token, by which the launcher's SIGTERM finds this agent on its host (node_signal.py)
    assert words[6:8] == ["OMP_NUM_THREADS=4", "PYTHONPATH=/x y"]
    assert re.fullmatch(r"RINGTRAIN_NODE_TOKEN=[0-9a-f]{16}", words[8]), words[8]
    assert words[9:] == [PY, "-m", "ringtrain", "run", "--nnodes", "3", "--node-rank", "2", "--master-addr",
                         "thisbox", "--master-port", "29500", "--nproc-per-node", "1", "--horovod",
                         "train.py", "--name", "it's a run", "--glob", "*.pt"]
    # SIGTERM goes over a connection of its own (no terminal), to the process carrying that token
    token = words[8].split("=", 1)[1]
    assert remote.terminate_argv[:6] == ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=accept-new",
                                         "node3"]
    assert shlex.split(remote.terminate_argv[6]) == [
        "cd", "/home/me/my project", "&&", "exec", "env", "NCCL_DEBUG=INFO", "OMP_NUM_THREADS=4", "PYTHONPATH=/x y",
        PY, "-m", "ringtrain.launcher.node_signal", token, "TERM"]
    assert local.terminate_argv == [] and nodes[1].terminate_argv != remote.terminate_argv  # a token per node
    bare = _nodes([Host("node2", 1)])[0].argv[7]
    assert re.match(r"cd '/home/me/my project' && exec env RINGTRAIN_NODE_TOKEN=[0-9a-f]{16} /opt/venv/bin/python "
                    r"-m ringtrain run", bare), bare  # no variable of the user's


def _master(node) -> str:
    argv = node.argv if node.local else shlex.split(node.argv[-1])
    return argv[argv.index("--master-addr") + 1]


def test_ssh_port_and_identity_file_reach_ssh():
    nodes = _nodes([Host("thisbox", 1), Host("node2", 1)], ssh_port=2222, ssh_identity_file="/keys/id cluster")
    assert nodes[0].argv[0] == PY  # this machine: no ssh, no ssh options
    assert nodes[1].argv[:11] == ["ssh", "-o", "BatchMode=yes", "-tt", "-o", "StrictHostKeyChecking=accept-new",
                                  "-p", "2222", "-i", "/keys/id cluster", "node2"]
    assert shlex.split(nodes[1].argv[11])[:4] == ["cd", "/home/me/my project", "&&", "exec"]


def test_new_host_keys_are_learnt_unless_strict_host_keys_is_asked_for():
    # accept-new: a host never seen is added to known_hosts, a host whose key changed is refused;
    # --ssh-strict-host-keys leaves ssh's own StrictHostKeyChecking (and ~/.ssh/config) in charge.
    learnt = _nodes([Host("thisbox", 1), Host("node2", 1)])[1].argv
    strict = _nodes([Host("thisbox", 1), Host("node2", 1)], ssh_strict_host_keys=True)[1].argv
    assert learnt[:7] == ["ssh", "-o", "BatchMode=yes", "-tt", "-o", "StrictHostKeyChecking=accept-new", "node2"]
    assert strict[:5] == ["ssh", "-o", "BatchMode=yes", "-tt", "node2"]
    assert not any("StrictHostKeyChecking" in word for word in strict)
    assert re.sub("TOKEN=[0-9a-f]+", "", learnt[-1]) == re.sub("TOKEN=[0-9a-f]+", "", strict[-1])  # the same command


def test_the_command_line_flag_reaches_the_ssh_command(tmp_path, monkeypatch):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    for flag, expected in (([], True), (["--ssh-strict-host-keys"], False), (["--ssh_strict_host_keys"], False)):
        ns = run.build_parser().parse_args(["-H", "thisbox:1,node2:1", *flag, str(script)])
        nodes = hosts.nodes_from_args(ns, environ={}, names={"thisbox"})
        assert ("StrictHostKeyChecking=accept-new" in nodes[1].argv) is expected, flag
        assert nodes[0].argv[0] == sys.executable and "StrictHostKeyChecking=accept-new" not in nodes[0].argv


def test_a_failed_ssh_login_names_the_command_to_try():
    node = _nodes([Host("thisbox", 1), Host("node2", 1)], ssh_port=2222, ssh_identity_file="/keys/id")[1]
    text = hosts._describe(node, 255)
    assert "node 1 (node2, over ssh): ssh failed (exit 255)" in text
    assert ("HINT: check that `ssh -o BatchMode=yes -o StrictHostKeyChecking=accept-new -p 2222 -i /keys/id node2 "
            "true` works") in text
    assert "host key changed" in text and "ssh-keygen -R" in text
    strict = _nodes([Host("thisbox", 1), Host("node2", 1)], ssh_strict_host_keys=True)[1]
    assert "host's key is known" in hosts._describe(strict, 255)
    assert hosts._describe(node, 3) == "node 1 (node2, over ssh) failed with exit code 3; the other nodes were stopped."


def test_other_loopback_addresses_are_this_machine_over_ssh():
    # -H 127.0.0.1:1,127.0.0.2:1: node 1 over ssh to 127.0.0.2, both meeting on node 0's 127.0.0.1
    nodes = _nodes([Host("127.0.0.1", 1), Host("127.0.0.2", 1)])
    assert [n.local for n in nodes] == [True, False] and nodes[1].argv[:7] == [
        "ssh", "-o", "BatchMode=yes", "-tt", "-o", "StrictHostKeyChecking=accept-new", "127.0.0.2"]
    assert [_master(n) for n in nodes] == ["127.0.0.1", "127.0.0.1"]
    assert [_master(n) for n in _nodes([Host("localhost", 1), Host("127.0.0.2", 1)])] == ["127.0.0.1"] * 2
    with pytest.raises(RingtrainError, match="cannot reach it by that name"):
        _nodes([Host("127.0.0.1", 1), Host("127.0.0.2", 1), Host("node3", 1)])  # node3 is another machine


def test_master_address_rules():
    assert [_master(n) for n in _nodes([Host("node1", 1), Host("localhost", 1)])] == ["node1", "node1"]
    assert _master(_nodes([Host("node1", 1)], master_addr="10.1.1.1")[0]) == "10.1.1.1"
    assert _master(_nodes([Host("localhost", 1)], master_addr="thisbox")[0]) == "thisbox"
    with pytest.raises(RingtrainError, match="cannot reach it by that name") as e:
        _nodes([Host("localhost", 1), Host("node2", 1)])  # node2 could not reach "localhost"
    assert "HINT: list this machine by a name" in str(e.value)


def _ns(*argv):
    return run.build_parser().parse_args(list(argv))


def test_command_line_to_nodes(tmp_path, monkeypatch):
    script = write(tmp_path / "train.py", "print('hi')\n")
    monkeypatch.chdir(tmp_path)
    ns = _ns("--horovod", "-np", "3", "-H", "thisbox:2,node2:2", "--timeout", "60", "--master-port", "1234",
             str(script), "--epochs", "1")
    nodes = hosts.nodes_from_args(ns, environ={}, names=HERE)
    assert [(n.host, n.nproc, n.local) for n in nodes] == [("thisbox", 2, True), ("node2", 1, False)]
    assert nodes[0].argv[:2] == [sys.executable, "-m"]
    assert nodes[0].argv[-7:] == ["--max-restarts", "0", "--timeout", "60", str(script), "--epochs", "1"]
    assert "--horovod" in nodes[0].argv and "--master-port" in nodes[0].argv and "1234" in nodes[0].argv
    preempting = hosts.nodes_from_args(_ns("-np", "2", "-H", "thisbox:1,node2:1", "--preempt-signal", "USR1",
                                           "--preempt-grace", "90", str(script)), environ={}, names=HERE)
    for words in (preempting[0].argv, shlex.split(preempting[1].argv[-1])):  # every agent, over ssh too
        assert words[words.index("--preempt-signal") + 1] == "USR1"
        assert words[words.index("--preempt-grace") + 1] == "90.0"
    assert shlex.split(nodes[1].argv[-1])[1] == str(tmp_path)
    hostfile = write(tmp_path / "hosts", "node1 slots=2\nnode2 slots=2\n")
    write(tmp_path / "pkg" / "__init__.py", "")
    write(tmp_path / "pkg" / "train.py", "print('hi')\n")
    nodes = hosts.nodes_from_args(_ns("--hostfile", str(hostfile), "-m", "pkg.train"),
                                  environ={}, names=HERE)
    assert [(n.nproc, n.local) for n in nodes] == [(2, False), (2, False)]  # every slot
    assert "--master-port 29500" in nodes[0].argv[-1]  # across machines: torchrun's port
    assert nodes[1].argv[-1].endswith("-m pkg.train")
    key = write(tmp_path / "key", "not a real key\n")
    ns = _ns("-H", "127.0.0.1:1,127.0.0.2:1", "--ssh-port", "2200", "--ssh_identity_file", "key", str(script))
    nodes = hosts.nodes_from_args(ns, environ={}, names=HERE)
    assert nodes[1].argv[6:10] == ["-p", "2200", "-i", str(key)]  # the key as an absolute path
    port = int(_words(nodes[1])[_words(nodes[1]).index("--master-port") + 1])
    assert port != 29500  # every host is this machine: a free port, not torchrun's fixed one


def _words(node) -> list:
    return node.argv if node.local else shlex.split(node.argv[-1])


def test_np_alone_is_one_node_and_horovod_reaches_the_worker(tmp_path):
    script = write(tmp_path / "train.py", "print('hi')\n")
    plan = plans.plan_from_args(_ns("--horovod", "-np", "3", str(script)))
    assert (plan.nproc, plan.nnodes, plan.horovod) == ("3", "1", True)
    assert plans.plan_from_args(_ns("-np", "2", "--nproc-per-node", "2", str(script))).nproc == "2"
    args = agent.torchrun_args(plan, 1234)
    assert args.training_script_args[:3] == ["--horovod", "path", "none"]  # an argument, not an env channel
    assert agent.torchrun_args(plans.plan_from_args(_ns("-np", "3", str(script))), 1).training_script_args[0] == "path"


def test_worker_maps_torchruns_variables_to_horovods():
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
           "GROUP_WORLD_SIZE": "2"}
    import socket

    assert worker.horovod_environment(env) == {
        "HOROVOD_RANK": "5", "HOROVOD_SIZE": "8", "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "4",
        "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2", "HOROVOD_HOSTNAME": socket.gethostname()}
    assert os.path.isfile(os.path.join(worker.HOROVOD_ALIAS, "horovod", "torch", "__init__.py"))


@pytest.mark.parametrize("argv, words", [
    (["-H", "a:x"], "slots 'x' is not a positive number"),
    (["-np", "5", "-H", "localhost:2,127.0.0.1:2"], "-np 5 processes, but the hosts"),
    (["--hostfile", "/nonexistent/hosts"], "cannot read it"),
    (["-np", "2", "--nproc-per-node", "3"], "-np 2 and --nproc-per-node 3 disagree"),
    (["-np", "0"], "at least one process"),
    (["-np", "4", "--nnodes", "2"], "-np counts processes of the whole job"),
    (["-H", "localhost:2", "--nproc-per-node", "2"], "--nproc-per-node with -H/--hostfile"),
    (["-H", "localhost:2", "--hostfile", "x"], "both -H and --hostfile"),
    (["-H", "localhost:1,node9:1"], "cannot reach it by that name"),
    (["-H", "node1:1", "--ssh-port", "0"], "--ssh-port 0 is not a TCP port"),
    (["-H", "node1:1", "--ssh-identity-file", "/nonexistent/key"], "is not a file"),
])
def test_bad_arguments_exit_2_with_a_hint(tmp_path, capsys, argv, words):
    script = write(tmp_path / "train.py", "print('hi')\n")
    assert run.main([*argv, str(script)]) == 2
    err = capsys.readouterr().err
    assert words in err and "\nHINT: " in err, err


def test_a_missing_script_is_found_before_any_node_starts(tmp_path, capsys):
    assert run.main(["-np", "2", "-H", "localhost:1,127.0.0.1:1", str(tmp_path / "no.py")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_bad_arguments_from_the_real_command(tmp_path):
    script = write(tmp_path / "train.py", "print('hi')\n")
    proc = subprocess.run(ringtrain_cmd("run", "--horovod", "-np", "3", "-H", "localhost:1", str(script)),
                          check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "HINT: lower -np to 1" in proc.stderr, outputs(proc)


def test_manual_documents_horovod_and_ssh(capsys):
    with pytest.raises(SystemExit):
        run.main(["--help"])
    manual = " ".join(capsys.readouterr().out.split())
    for words in ("Horovod scripts", "-np", "--hostfile", "slots=N", "HOROVOD_CROSS_SIZE", "HOROVOD_HOSTNAME",
                  "BatchMode=yes", "passwordless ssh", "no authentication", "the first host is node 0"):
        assert words.lower() in manual.lower(), words


# ---------------------------------------------------------------------------------------
# Real jobs on loopback


PROBE = r"""
    import os, sys
    import horovod.torch as hvd

    hvd.init()
    env = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("HOROVOD_"))
    sys.stdout.write(f"RESULT rank={hvd.rank()} size={hvd.size()} local_rank={hvd.local_rank()} "
                     f"local_size={hvd.local_size()} cross_rank={hvd.cross_rank()} cross_size={hvd.cross_size()} "
                     f"sum={hvd.allreduce(__import__('torch').tensor(float(hvd.rank())), op=hvd.Sum).item()} "
                     f"impl={hvd.DistributedOptimizer.__module__} path0={os.environ['PYTHONPATH'].split(os.pathsep)[0]} "
                     f"{env}\n")
    hvd.shutdown()
"""


def _env(**extra) -> dict:
    # No PYTHONPATH at all: `import horovod.torch` must resolve through the launcher alone
    # (ringtrain itself is installed in the environment running the tests).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("HOROVOD_")}
    env["OMP_NUM_THREADS"] = "1"  # two cores: no oversubscription
    env.update(extra)
    return env


def _run(*args, timeout=150, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(ringtrain_cmd("run", *args), check=False, capture_output=True, text=True,
                          timeout=timeout, env=_env(), cwd=cwd)


def test_example_runs_unmodified_with_np(tmp_path):
    proc = _run("--horovod", "-np", "2", EXAMPLE, "--epochs", "2")
    assert proc.returncode == 0, outputs(proc)
    assert "2 worker(s)" in proc.stdout, outputs(proc)  # hvd.size() == 2: both ranks joined
    epochs = [line for line in proc.stdout.splitlines() if line.startswith("epoch")]
    assert len(epochs) == 2, outputs(proc)
    # the accuracy is averaged over both ranks' halves of the test set by hvd.allreduce
    assert float(epochs[-1].split()[-1]) > 0.7, epochs


def test_horovodruns_command_form_with_the_interpreter(tmp_path, monkeypatch):
    # Seed 001 writes `horovodrun -np 2 -H ip1:1,ip2:1 python train.py`: the same words work here.
    script = write(tmp_path / "probe.py", PROBE)
    for interpreter in (["python"], ["python3", "-u"], [sys.executable]):
        plan = plans.plan_from_args(_ns("--horovod", "-np", "2", *interpreter, str(script), "--flag"))
        assert (plan.target, plan.target_args, plan.module) == (str(script), ["--flag"], False)
    write(tmp_path / "pkg" / "__init__.py", "")
    write(tmp_path / "pkg" / "train.py", "print('hi')\n")
    monkeypatch.chdir(tmp_path)
    plan = plans.plan_from_args(_ns("--horovod", "-np", "2", "python", "-m", "pkg.train", "x"))
    assert (plan.target, plan.target_args, plan.module) == ("pkg.train", ["x"], True)
    proc = _run("--horovod", "-np", "2", "python", str(script))
    assert proc.returncode == 0, outputs(proc)
    assert [r["rank"] for r in results(proc.stdout)] == ["0", "1"], outputs(proc)


def test_horovod_variables_on_one_node(tmp_path):
    script = write(tmp_path / "probe.py", PROBE)
    proc = _run("--horovod", "-np", "2", str(script))
    assert proc.returncode == 0, outputs(proc)
    rows = results(proc.stdout)
    assert [r["rank"] for r in rows] == ["0", "1"], outputs(proc)
    for rank, r in enumerate(rows):
        assert (r["HOROVOD_RANK"], r["HOROVOD_SIZE"], r["HOROVOD_LOCAL_RANK"], r["HOROVOD_LOCAL_SIZE"]) == \
            (str(rank), "2", str(rank), "2"), r
        assert (r["HOROVOD_CROSS_RANK"], r["HOROVOD_CROSS_SIZE"]) == ("0", "1"), r
        assert r["HOROVOD_HOSTNAME"] and r["path0"] == ALIAS and r["sum"] == "1.0", r
        assert r["impl"] == "ringtrain.horovod.optimizer"  # ringtrain's, not an installed Horovod


def test_example_as_two_nodes_on_loopback():
    proc = _run("--horovod", "-np", "2", "-H", "localhost:1,127.0.0.1:1", EXAMPLE, "--epochs", "1")
    assert proc.returncode == 0, outputs(proc)
    assert "2 worker(s)" in proc.stdout and "epoch 0:" in proc.stdout, outputs(proc)


def test_two_nodes_see_horovods_cross_topology(tmp_path):
    script = write(tmp_path / "probe.py", PROBE)
    proc = _run("--horovod", "-np", "2", "-H", "localhost:1,127.0.0.1:1", str(script))
    assert proc.returncode == 0, outputs(proc)
    rows = results(proc.stdout)
    assert [(r["rank"], r["cross_rank"], r["cross_size"], r["local_size"], r["local_rank"]) for r in rows] == \
        [("0", "0", "2", "1", "0"), ("1", "1", "2", "1", "0")], outputs(proc)
    assert [(r["HOROVOD_CROSS_RANK"], r["HOROVOD_CROSS_SIZE"], r["HOROVOD_LOCAL_SIZE"]) for r in rows] == \
        [("0", "2", "1"), ("1", "2", "1")]
    assert all(r["sum"] == "1.0" and r["size"] == "2" for r in rows)


def test_uneven_nodes_fill_in_order(tmp_path):
    # -np 3 over two 2-slot hosts: 2 + 1 processes, ranks 0-1 on node 0 (horovodrun's order).
    script = write(tmp_path / "probe.py", PROBE)
    proc = _run("--horovod", "-np", "3", "-H", "localhost:2,127.0.0.1:2", str(script))
    assert proc.returncode == 0, outputs(proc)
    rows = results(proc.stdout)
    got = [(r["rank"], r["HOROVOD_CROSS_RANK"], r["local_rank"], r["local_size"], r["cross_rank"], r["cross_size"])
           for r in rows]
    # Horovod's cross ranks: among the nodes that have this local rank (local rank 1: node 0 only)
    assert got == [("0", "0", "0", "2", "0", "2"), ("1", "0", "1", "2", "0", "1"),
                   ("2", "1", "0", "1", "1", "2")], outputs(proc)
    assert all(r["size"] == "3" and r["sum"] == "3.0" for r in rows)


FAIL_ON_NODE_1 = r"""
    import os, sys, time
    if os.environ["GROUP_RANK"] == "1":
        sys.exit(3)
    sys.stdout.write("RESULT rank=0 waiting=1\n"); sys.stdout.flush()
    time.sleep(200)  # node 0 never ends by itself: the launcher must stop it
"""


def test_a_failing_node_stops_the_others(tmp_path):
    script = write(tmp_path / "fail.py", FAIL_ON_NODE_1)
    start = time.monotonic()
    proc = _run("-np", "2", "-H", "localhost:1,127.0.0.1:1", str(script), timeout=120)
    assert proc.returncode == 1, outputs(proc)
    assert "node 1 (127.0.0.1) failed with exit code 1; the other nodes were stopped" in proc.stderr, outputs(proc)
    assert time.monotonic() - start < 90


def test_sigterm_stops_every_node(tmp_path):
    script = write(tmp_path / "wait.py", r"""
        import os, sys, time
        sys.stdout.write(f"READY {os.environ['GROUP_RANK']}\n"); sys.stdout.flush()
        time.sleep(200)
    """)
    proc = subprocess.Popen(ringtrain_cmd("run", "-H", "localhost:1,127.0.0.1:1", str(script)), env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        ready = set()
        while len(ready) < 2:
            line = proc.stdout.readline()
            assert line, outputs(subprocess.CompletedProcess(proc.args, proc.wait(), "", proc.stderr.read()))
            if line.startswith("READY"):
                ready.add(line.split()[1])
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "stopped by SIGTERM; stopping all 2 node(s)" in err


@pytest.mark.timeout(240)
def test_the_preempt_signal_to_a_host_list_launcher_preempts_every_node(tmp_path):
    # --preempt-signal USR1 with -H: every node's agent gets the flag (it was dropped: the nodes ran on, and USR1 to
    # the launcher only said "stacks: the job has not started yet"), and the launcher passes the signal on.
    script = write(tmp_path / "train.py", PREEMPTIBLE)
    command = ringtrain_cmd("run", "-np", "2", "-H", "localhost:1,127.0.0.1:1", "--preempt-signal", "USR1",
                            "--preempt-grace", "60", str(script))
    first, took = preempted_by(command, signal.SIGUSR1, tmp_path, _env())
    assert "ringtrain: got SIGUSR1: finishing this step" in first.stderr, outputs(first)
    assert preemption_problems(first, tmp_path, _env()) == []
    sys.stdout.write(f"\nUSR1 to a -H launcher -> exit 75, every node saved: {took:.2f} s\n")


def test_horovodruns_own_line_without_the_flag_runs_on_ringtraings_horovod():
    """Issue 31, item 11: `ringtrain run -np 2 -H localhost:2 python script.py` on a script that imports
    horovod.torch failed with ModuleNotFoundError; the line is horovodrun's, and no Horovod is installed: the
    script runs on ringtrain's Horovod, and the launcher says so once."""
    proc = _run("-np", "2", "-H", "localhost:2", "python", EXAMPLE, "--epochs", "1")
    assert proc.returncode == 0, outputs(proc)
    assert proc.stderr.count("it runs on ringtrain's Horovod API (as with --horovod)") >= 1, outputs(proc)
    assert "2 worker(s)" in proc.stdout, outputs(proc)
