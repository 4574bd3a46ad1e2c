"""Remote hosts for real: a real sshd on 127.0.0.2, a key made here, and jobs whose node 1 starts over ssh.

Seed 001 runs ``horovodrun -np 2 -H ip1:1,ip2:1 python train.py``. Here ip1 is 127.0.0.1 (this
machine, started directly) and ip2 is 127.0.0.2, which ringtrain, like horovodrun, treats as
another host: node 1's agent is started by the ssh client, logs in to an OpenSSH server the
test runs on 127.0.0.2 (port and key given with --ssh-port/--ssh-identity-file), and the two
nodes train together. Every job must end with the parameters one process reaches on the
whole batch, computed here with plain torch.

The only thing the test adds to ssh is trust in the host key it made: an ``ssh`` first on
PATH runs the real /usr/bin/ssh with ``-F`` pointing at a config holding that key as the
only known host (StrictHostKeyChecking yes), so nothing in ~/.ssh is read or written.

Needs root (sshd's privilege separation), OpenSSH's sshd/ssh/ssh-keygen and a 127.0.0.2 that
can be bound (Linux); otherwise the tests skip and say why. `make test-hosts` installs
openssh-server and runs them. Everything listens on loopback only.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _launch_util import (
    PREEMPTIBLE,
    child_env,
    free_port,
    outputs,
    preempted_by,
    preemption_problems,
    ringtrain_cmd,
    write,
)

pytestmark = pytest.mark.timeout(150)

SSHD = shutil.which("sshd") or ("/usr/sbin/sshd" if os.path.exists("/usr/sbin/sshd") else None)
REMOTE = "127.0.0.2"
STEPS, BATCH, LR = 3, 16, 0.1  # optimizer steps of BATCH samples in all, over every rank

# The data and model, the same in the jobs and in the one-process reference below.
DATA = r"""
import torch
def make_data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 5, generator=g)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0], [0.0]]) + 0.1 * torch.randn(48, 1, generator=g)
    return x, y
def make_model():
    torch.manual_seed(0)
    return torch.nn.Linear(5, 1)
"""

# A Horovod script as the tutorials write it (seed 001's steps): init, DistributedSampler, wrap, broadcast.
HOROVOD_SCRIPT = DATA + r"""
import sys
import horovod.torch as hvd
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

hvd.init()
torch.set_num_threads(1)
x, y = make_data()
ds = TensorDataset(x, y)
sampler = DistributedSampler(ds, num_replicas=hvd.size(), rank=hvd.rank(), shuffle=False)
loader = DataLoader(ds, batch_size=%(batch)d // hvd.size(), sampler=sampler)
model = make_model()
optimizer = torch.optim.SGD(model.parameters(), lr=%(lr)r)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
for step, (xb, yb) in zip(range(%(steps)d), loader):
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(xb), yb).backward()
    optimizer.step()
params = ",".join(f"{v:.9e}" for v in torch.cat([p.detach().flatten() for p in model.parameters()]).tolist())
sys.stdout.write(f"RESULT rank={hvd.rank()} size={hvd.size()} cross_size={hvd.cross_size()} params={params}\n")
""" % {"batch": BATCH, "lr": LR, "steps": STEPS}

# The same training through rt.Ring, for `ringtrain run --nnodes 2` with node 1 started over ssh.
RING_SCRIPT = DATA + r"""
import sys
import ringtrain as rt
from torch.utils.data import TensorDataset

ring = rt.Ring(device="cpu")
torch.set_num_threads(1)
x, y = make_data()
model = make_model()
model, optimizer = ring.setup(model, torch.optim.SGD(model.parameters(), lr=%(lr)r))
loader = ring.loader(TensorDataset(x, y), batch_size=%(batch)d // ring.world_size)
for step, (xb, yb) in zip(range(%(steps)d), loader):
    ring.backward(torch.nn.functional.mse_loss(model(xb), yb))
    optimizer.step()
    optimizer.zero_grad()
params = ",".join(f"{v:.9e}" for v in torch.cat([p.detach().flatten() for p in model.parameters()]).tolist())
sys.stdout.write(f"RESULT rank={ring.rank} size={ring.world_size} node={ring.node_rank} params={params}\n")
""" % {"batch": BATCH, "lr": LR, "steps": STEPS}


def one_process_parameters() -> list:
    """Plain torch, one process, the whole batch per step: what every job must reach."""
    scope: dict = {}
    exec(DATA, scope)  # noqa: S102 - the test's own source text
    x, y = scope["make_data"]()
    model = scope["make_model"]()
    optimizer = __import__("torch").optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        optimizer.zero_grad()
        xb, yb = x[step * BATCH:(step + 1) * BATCH], y[step * BATCH:(step + 1) * BATCH]
        __import__("torch").nn.functional.mse_loss(model(xb), yb).backward()
        optimizer.step()
    return [v for p in model.parameters() for v in p.detach().flatten().tolist()]


def _why_not() -> str | None:
    if not sys.platform.startswith("linux"):
        return "needs Linux (127.0.0.2 answers on the loopback interface only there)"
    if os.geteuid() != 0:
        return "sshd for the test must run as root (privilege separation); run `sudo make test-hosts`"
    missing = [tool for tool, path in (("sshd", SSHD), ("ssh", shutil.which("ssh")),
                                       ("ssh-keygen", shutil.which("ssh-keygen"))) if not path]
    if missing:
        return f"OpenSSH's {', '.join(missing)} not installed: `make test-hosts` installs openssh-server and runs this"
    try:
        socket.create_server((REMOTE, 0)).close()
    except OSError as e:
        return f"cannot listen on {REMOTE}: {e}"
    return None


def _port_on(address: str) -> int:
    with socket.create_server((address, 0)) as s:
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    """An sshd on 127.0.0.2 that accepts one key, which only this test has; stopped at the end."""
    why = _why_not()
    if why:
        pytest.skip(why)
    d = tmp_path_factory.mktemp("ssh")
    for name in ("host_key", "id_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"ringtrain-test-{name}",
                        "-f", str(d / name)], check=True, timeout=30)
    shutil.copy(d / "id_key.pub", d / "authorized_keys")
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege-separation directory (Debian's service makes it)
    port = _port_on(REMOTE)
    log = open(d / "sshd.log", "w")
    proc = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", "/dev/null", "-p", str(port), "-h", str(d / "host_key"),
         "-o", f"ListenAddress={REMOTE}", "-o", f"AuthorizedKeysFile={d / 'authorized_keys'}",
         "-o", "StrictModes=no",  # the key lies in a temporary folder, not a 0700 ~/.ssh
         "-o", "PasswordAuthentication=no", "-o", "KbdInteractiveAuthentication=no", "-o", "UsePAM=no",
         "-o", "PermitRootLogin=prohibit-password", "-o", "PidFile=none"],
        stdout=log, stderr=subprocess.STDOUT)
    (d / "known_hosts").write_text(f"[{REMOTE}]:{port} {(d / 'host_key.pub').read_text()}")
    (d / "ssh_config").write_text(f"UserKnownHostsFile {d / 'known_hosts'}\nGlobalKnownHostsFile /dev/null\n"
                                  "StrictHostKeyChecking yes\nIdentitiesOnly yes\n")
    shim = write(d / "bin" / "ssh", f"#!/bin/sh\nexec {shutil.which('ssh')} -F {d / 'ssh_config'} \"$@\"\n")
    shim.chmod(0o755)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection((REMOTE, port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.skip(f"sshd did not start: {(d / 'sshd.log').read_text()[-1000:]}")
                time.sleep(0.1)
        yield {"dir": d, "port": port, "key": str(d / "id_key"), "path": f"{d / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _rows(stdout: str) -> list:
    # Node 1's lines come through ssh's terminal: "\r\n" line ends.
    rows = [dict(kv.split("=", 1) for kv in line.strip().split()[1:])
            for line in stdout.splitlines() if line.strip().startswith("RESULT ")]
    return sorted(rows, key=lambda r: int(r["rank"]))


def _assert_one_process_parameters(rows: list, report: str) -> None:
    expected = one_process_parameters()
    assert [r["rank"] for r in rows] == ["0", "1"], report
    for r in rows:
        got = [float(v) for v in r["params"].split(",")]
        assert got == pytest.approx(expected, rel=1e-5, abs=1e-6), report


def _job(sshd, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = child_env(PATH=sshd["path"])
    env = {k: v for k, v in env.items() if not k.startswith("HOROVOD_")}
    return subprocess.run(ringtrain_cmd("run", *args), capture_output=True, text=True, timeout=120, env=env, cwd=cwd)


def test_horovodrun_hosts_with_a_node_over_ssh(sshd, tmp_path):
    script = write(tmp_path / "train.py", HOROVOD_SCRIPT)
    proc = _job(sshd, "--horovod", "-np", "2", "-H", f"127.0.0.1:1,{REMOTE}:1", "--ssh-port", str(sshd["port"]),
                "--ssh-identity-file", sshd["key"], "python", str(script), cwd=tmp_path)
    assert proc.returncode == 0, outputs(proc)
    rows = _rows(proc.stdout)
    assert all(r["size"] == "2" and r["cross_size"] == "2" for r in rows), outputs(proc)  # two nodes of one
    _assert_one_process_parameters(rows, outputs(proc))
    log = (sshd["dir"] / "sshd.log").read_text()
    assert re.search(r"Accepted publickey for \S+ from 127\.0\.0\.1", log), log  # node 1 really came through sshd


def test_hostfile_with_a_node_over_ssh(sshd, tmp_path):
    script = write(tmp_path / "train.py", HOROVOD_SCRIPT)
    hostfile = write(tmp_path / "hosts", f"# seed 001's two machines, on one\n127.0.0.1 slots=1\n{REMOTE} slots=1\n")
    proc = _job(sshd, "--horovod", "--hostfile", str(hostfile), "--ssh_port", str(sshd["port"]),
                "--ssh_identity_file", sshd["key"], str(script), cwd=tmp_path)
    assert proc.returncode == 0, outputs(proc)
    _assert_one_process_parameters(_rows(proc.stdout), outputs(proc))


def test_nnodes_with_node_1_started_over_ssh(sshd, tmp_path):
    # The torchrun form: the same `ringtrain run --nnodes 2` on each node, node 1's typed in an ssh session.
    script = write(tmp_path / "train.py", RING_SCRIPT)
    port = free_port()
    env = child_env(PATH=sshd["path"])

    def node(rank: int) -> list:
        return [sys.executable, "-m", "ringtrain", "run", "--nnodes", "2", "--node-rank", str(rank),
                "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port),
                "--timeout", "60", str(script)]

    remote = " ".join(["cd", str(tmp_path), "&&", "exec", "env", f"PYTHONPATH={env['PYTHONPATH']}",
                       "OMP_NUM_THREADS=1", *node(1)])
    ssh = ["ssh", "-o", "BatchMode=yes", "-tt", "-p", str(sshd["port"]), "-i", sshd["key"], REMOTE, remote]
    node0 = subprocess.Popen(node(0), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    node1 = subprocess.Popen(ssh, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env, cwd=tmp_path)
    try:
        out1, err1 = node1.communicate(timeout=120)
        out0, err0 = node0.communicate(timeout=60)
    finally:
        for proc in (node0, node1):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    report = f"--- node 0 ({node0.returncode})\n{out0}\n{err0}\n--- node 1 over ssh ({node1.returncode})\n{out1}\n{err1}"
    assert node0.returncode == 0 and node1.returncode == 0, report
    rows = _rows(out0 + out1)
    assert [(r["size"], r["node"]) for r in rows] == [("2", "0"), ("2", "1")], report
    _assert_one_process_parameters(rows, report)


# --- host keys: accept-new by default, ssh's own checking with --ssh-strict-host-keys ------------------


def _client(sshd, d: Path, known: str) -> dict:
    """An ssh client whose only known-hosts file is ``d/known_hosts`` holding ``known``, checking strictly
    by its own configuration (as ssh's default with BatchMode): what ringtrain adds decides."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "known_hosts").write_text(known)
    (d / "ssh_config").write_text(f"UserKnownHostsFile {d / 'known_hosts'}\nGlobalKnownHostsFile /dev/null\n"
                                  "StrictHostKeyChecking yes\nIdentitiesOnly yes\n")
    shim = write(d / "bin" / "ssh", f"#!/bin/sh\nexec {shutil.which('ssh')} -F {d / 'ssh_config'} \"$@\"\n")
    shim.chmod(0o755)
    return {**sshd, "path": f"{d / 'bin'}{os.pathsep}{os.environ['PATH']}"}


def _hosts_job(client, script: Path, *extra: str) -> subprocess.CompletedProcess:
    return _job(client, "--horovod", "-np", "2", "-H", f"127.0.0.1:1,{REMOTE}:1", "--ssh-port", str(client["port"]),
                "--ssh-identity-file", client["key"], *extra, str(script), cwd=script.parent)


def test_a_host_never_connected_to_is_learnt_and_joins(sshd, tmp_path):
    client = _client(sshd, tmp_path / "client", known="")
    proc = _hosts_job(client, write(tmp_path / "train.py", HOROVOD_SCRIPT))
    assert proc.returncode == 0, outputs(proc)
    _assert_one_process_parameters(_rows(proc.stdout), outputs(proc))
    learnt = (tmp_path / "client" / "known_hosts").read_text()
    assert (sshd["dir"] / "host_key.pub").read_text().split()[1] in learnt  # the host's real key, now known


def test_strict_host_keys_refuse_a_host_never_connected_to(sshd, tmp_path):
    client = _client(sshd, tmp_path / "client", known="")
    proc = _hosts_job(client, write(tmp_path / "train.py", HOROVOD_SCRIPT), "--ssh-strict-host-keys")
    assert proc.returncode == 255, outputs(proc)
    assert f"node 1 ({REMOTE}, over ssh): ssh failed (exit 255)" in proc.stderr, outputs(proc)
    assert "HINT:" in proc.stderr and "host's key is known" in proc.stderr, outputs(proc)
    assert (tmp_path / "client" / "known_hosts").read_text() == ""  # nothing learnt


def test_a_changed_host_key_is_refused(sshd, tmp_path):
    # known_hosts holds another key for the host: a machine in its place, or a re-installed one.
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True, timeout=30)
    known = f"[{REMOTE}]:{sshd['port']} {(tmp_path / 'other_key.pub').read_text()}"
    client = _client(sshd, tmp_path / "client", known=known)
    proc = _hosts_job(client, write(tmp_path / "train.py", HOROVOD_SCRIPT))
    assert proc.returncode == 255, outputs(proc)
    assert "HINT:" in proc.stderr and "host key changed" in proc.stderr, outputs(proc)
    assert (tmp_path / "client" / "known_hosts").read_text() == known  # not replaced
    assert "RESULT" not in proc.stdout


def test_the_job_secret_never_goes_on_an_ssh_command_line_but_its_file_does(tmp_path):
    from ringtrain.errors import RingtrainError
    from ringtrain.launcher.host_list import Host
    from ringtrain.launcher.hosts import forwarded_environment, plan_nodes, sealing_environment

    environ = {"RINGTRAIN_JOB_SECRET": "do-not-show", "RINGTRAIN_JOB_SECRET_FILE": "/shared/secret", "PATH": "/bin"}
    assert forwarded_environment(environ) == {"RINGTRAIN_JOB_SECRET_FILE": "/shared/secret"}
    nodes = plan_nodes([Host("localhost", 1), Host("far-away", 1)], master_addr="10.0.0.1", master_port=29500,
                       options=[], target=["train.py"], python="python", cwd="/", environ=environ, names={"localhost"})
    assert not any("do-not-show" in word for node in nodes for word in node.argv)
    with pytest.raises(RingtrainError, match="RINGTRAIN_JOB_SECRET_FILE"):
        sealing_environment(nodes, environ)  # the secret alone could not reach far-away: refused up front
    assert sealing_environment(nodes, {"RINGTRAIN_JOB_SECRET_FILE": "/shared/secret"}) is None
    # Every node here: one secret made for all the agents, through their environment.
    here = [n for n in nodes if n.local]
    made = sealing_environment(here, {"PATH": "/bin"})
    assert made["PATH"] == "/bin" and len(made["RINGTRAIN_JOB_SECRET"]) == 64
    assert sealing_environment(here, {"RINGTRAIN_JOB_SECRET": "mine"}) is None  # the user's own is kept


# --- preemption of a job with a node over ssh (issue 32) ----------------------------------------------------------



def test_sigterm_to_the_launcher_preempts_the_node_over_ssh_too(sshd, tmp_path):
    # A scheduler (or a user) signals the launcher on the head node: the node over ssh must not be merely hung up
    # (its ranks would leave unsaved) but preempted like the local one, so that the job exits 75 with one
    # checkpoint of one step, and the same command resumes from it.
    script = write(tmp_path / "train.py", PREEMPTIBLE)
    command = ringtrain_cmd("run", "-np", "2", "-H", f"127.0.0.1:1,{REMOTE}:1", "--ssh-port", str(sshd["port"]),
                            "--ssh-identity-file", sshd["key"], str(script))
    env = child_env(PATH=sshd["path"])
    first, took = preempted_by(command, signal.SIGTERM, tmp_path, env)
    assert preemption_problems(first, tmp_path, env) == []
    sys.stdout.write(f"\nSIGTERM to the launcher -> exit 75 with the node over ssh saved: {took:.2f} s\n")


def test_a_rank_that_raises_ends_the_job_in_seconds_with_a_node_over_ssh(sshd, tmp_path):
    # The launcher stops the other nodes with SIGTERM, over ssh too: a node that takes it for a preemption must still
    # end at once when its peer is gone, not wait out a grace period or a timeout.
    raises = '    if ring.rank == 0 and step == 6:\n        raise ValueError("bad batch at step 6")\n'
    pause = "    time.sleep(0.05)\n"
    script = write(tmp_path / "train.py", PREEMPTIBLE.replace(pause, raises + pause))
    start = time.monotonic()
    proc = _job(sshd, "-np", "2", "-H", f"127.0.0.1:1,{REMOTE}:1", "--ssh-port", str(sshd["port"]),
                "--ssh-identity-file", sshd["key"], str(script), cwd=tmp_path)
    took = time.monotonic() - start
    assert proc.returncode == 1, outputs(proc)
    assert "ValueError: bad batch at step 6" in proc.stderr, outputs(proc)
    # the node the launcher sees end first is named (either: node 1 fails at once, naming rank 0's error)
    assert "failed with exit code 1; the other nodes were stopped" in proc.stderr, outputs(proc)
    assert not list(tmp_path.glob("ckpt/step-*")), outputs(proc)  # a failure is no preemption: nothing saved
    sys.stdout.write(f"\na rank raising with a node over ssh: the job ended {took:.1f} s after its launch\n")
