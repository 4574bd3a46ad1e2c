"""horovodrun's flags in ringtrain's terms (horovod_flags.py) and its elastic command line (discovery.py):
in-process, no workers."""

from __future__ import annotations

import pytest

from ringtrain.errors import RingtrainError
from ringtrain.parallel import contract
from ringtrain.launcher import discovery, horovod_flags, hosts, plan as plans, run

HERE = {"localhost", "127.0.0.1"}


def _ns(*argv):
    return run.build_parser().parse_args(list(argv))


def _script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return str(path)


def test_mapped_flags(tmp_path):
    script = _script(tmp_path)
    p = plans.plan_from_args(_ns("--gloo", "--disable-cache", "-np", "2", "--start-timeout", "45", "--reset-limit", "2",
                               "--timeline-filename", str(tmp_path / "tl" / "trace.json"), "python", script))
    assert (p.nproc, p.timeout, p.max_restarts) == ("2", 45, 2)
    assert p.timeline == str(tmp_path / "tl" / "trace.json")  # Horovod's form: the merged file's path
    with pytest.raises(RingtrainError, match="--start-timeout 45 and --timeout 50 disagree"):
        plans.plan_from_args(_ns("--start-timeout", "45", "--timeout", "50", script))


def test_variables_as_horovodrun_sets_them(tmp_path):
    ns = _ns("--fusion-threshold-mb", "4", "--cycle-time-ms", "2.5", "--autotune", "--no-hierarchical-allreduce",
             "--network-interface", "eth0", "--network-interface", "eth1", "--tcp", "--stall-check-warning-time-seconds",
             "20", _script(tmp_path))
    env, inert = horovod_flags.environment(ns)
    assert env == {"HOROVOD_FUSION_THRESHOLD": str(4 * 1024 * 1024), "HOROVOD_CYCLE_TIME": "2.5",
                   "HOROVOD_AUTOTUNE": "1", "HOROVOD_HIERARCHICAL_ALLREDUCE": "0",
                   "GLOO_SOCKET_IFNAME": "eth0,eth1", "NCCL_SOCKET_IFNAME": "eth0,eth1", "NCCL_IB_DISABLE": "1",
                   "RINGTRAIN_STALL_WARNING": "20"}
    # ringtrain's Horovod reads the fusion threshold only: --cycle-time-ms is said to change nothing (it claimed
    # to be read, and nothing read it)
    assert sorted(inert) == ["--autotune", "--cycle-time-ms", "--no-hierarchical-allreduce"]
    settings = {v.name: v.field for v in contract.VARIABLES}
    assert all(settings.get(name) for name in horovod_flags.USED_BY_RINGTRAIN), "a variable said to be read is not"
    assert horovod_flags.environment(_ns("--no-stall-check", "x.py"))[0] == {"RINGTRAIN_STALL_WARNING": "0"}
    assert plans.plan_from_args(_ns("--network-interfaces", "lo", _script(tmp_path))).environment == \
        {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}


def test_an_inert_knob_is_named_once(tmp_path, capsys):
    assert run.main(["--autotune", str(tmp_path / "missing.py")]) == 2
    err = capsys.readouterr().err
    assert err.count("--autotune sets the HOROVOD_* variable") == 1 and "missing.py" in err


def _discover(tmp_path, text: str, code: int = 0) -> str:
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\nprintf '{text}'\nexit {code}\n")
    script.chmod(0o755)
    return str(script)


def test_discovery_output():
    found = discovery.parse_hosts("a:2\n\nb\n a:2 \n", 3, "d.sh")
    assert [(h.name, h.slots) for h in found] == [("a", 2), ("b", 3)]
    with pytest.raises(RingtrainError, match="not host or host:slots"):
        discovery.parse_hosts("a:x\n", 1, "d.sh")


def test_elastic_command_line_becomes_nodes(tmp_path):
    script = _discover(tmp_path, "localhost:1\\n127.0.0.1:2\\n")
    ns = discovery.apply(_ns("--horovod", "-np", "2", "--min-np", "1", "--max-np", "4", "--host-discovery-script",
                             script, "python", _script(tmp_path)))
    assert (ns.hosts, ns.np, ns.elastic_nnodes) == ("localhost:1,127.0.0.1:2", 3, "1:2")
    nodes = hosts.nodes_from_args(ns, environ={}, names=HERE, nnodes=ns.elastic_nnodes)
    assert [n.argv[n.argv.index("--nnodes") + 1] for n in nodes] == ["1:2", "1:2"]
    capped = discovery.apply(_ns("-np", "2", "--max-np", "2", "--host-discovery-script", script, "x.py"))
    assert (capped.hosts, capped.np, capped.elastic_nnodes) == ("localhost:1,127.0.0.1:1", 2, "2:2")
    fixed = discovery.apply(_ns("-np", "2", "--min-np", "2", "-H", "localhost:1,127.0.0.1:1", "x.py"))
    assert (fixed.hosts, fixed.elastic_nnodes) == ("localhost:1,127.0.0.1:1", "2:2")
    assert discovery.apply(_ns("-np", "2", "x.py")).elastic_nnodes is None  # not elastic: as before


@pytest.mark.parametrize("argv, words", [
    (["-np", "3", "--start-timeout", "1"], "found localhost:2 (2 slot(s)) within --start-timeout 1 s"),
    (["-np", "2", "--min-np", "3"], "need 1 <= min <= np <= max"),
    (["-np", "2", "--nproc-per-node", "2"], "--nproc-per-node with an elastic"),
])
def test_elastic_mistakes_say_why(tmp_path, argv, words):
    script = _discover(tmp_path, "localhost:2\\n")
    with pytest.raises(RingtrainError, match="HINT") as error:
        discovery.apply(_ns(*argv, "--host-discovery-script", script, "x.py"))
    assert words in str(error.value)


def test_a_failing_discovery_script_and_a_lone_max_np(tmp_path):
    with pytest.raises(RingtrainError, match="exited with code 3"):
        discovery.apply(_ns("-np", "1", "--host-discovery-script", _discover(tmp_path, "", 3), "x.py"))
    with pytest.raises(RingtrainError, match="--max-np without --min-np"):
        discovery.apply(_ns("-np", "1", "--max-np", "2", "x.py"))
