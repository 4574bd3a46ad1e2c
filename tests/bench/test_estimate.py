"""How long a bench takes, said before it starts (issue 33, item 5): the README's CIFAR command sat at 0/70
runs after 600 s on a 2-core CPU, and --preset gpu's CPU alternative had an ETA of hours, with nothing said.

The estimate's arithmetic in-process; what the command says, from real `ringtrain bench` processes that are
stopped once they have said it (the long benches are never run to their end).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from _launch_util import child_env

from ringtrain.bench import estimate

# docs/performance.md's benches that train on a CPU (the --comm ones measure for seconds and say nothing up front).
LONG = ["--workload", "cifar-resnet18", "--nprocs", "1,2,4", "--precision", "32,bf16-mixed"]


class _Workload:
    global_batch, test = 64, range(100)


def test_the_total_is_every_run_at_its_share_of_the_cores():
    one = estimate.total_seconds(_Workload(), {1: ["ddp"]}, ["32"], repeats=1, warmup=0, timed=10,
                                 per_sample={"32": 0.001}, cores=2)
    # 10 steps x 64 samples x 1 ms + the test set's forward pass + one launch and one run
    assert one == pytest.approx(0.64 + 100 * 0.001 / 3 + estimate.LAUNCH_S + estimate.RUN_S)
    two = estimate.total_seconds(_Workload(), {2: ["ddp"]}, ["32"], 1, 0, 10, {"32": 0.001}, cores=2)
    assert two - one == pytest.approx(-0.32)  # two ranks on two cores: each trains half the samples
    four = estimate.total_seconds(_Workload(), {4: ["ddp"]}, ["32"], 1, 0, 10, {"32": 0.001}, cores=2)
    assert four == pytest.approx(two)  # four ranks on two cores are no faster than two


@pytest.mark.parametrize("seconds, said", [(5, "under a minute"), (170, "about 3 min"), (3 * 3600 + 600, "about 3 h 10 min"),
                                           (5 * 86400, "about 5 days")])
def test_words(seconds, said):
    assert estimate.words(seconds) == said


def _said_up_front(tmp_path, argv: list[str], timeout: float = 240) -> str:
    """What `ringtrain bench ARGV` says before its first run (its estimate and any HINT); then it is stopped."""
    proc = subprocess.Popen([sys.executable, "-m", "ringtrain", "bench", *argv, "--no-progress", "--out",
                             str(tmp_path / "out")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=child_env(), cwd=tmp_path, start_new_session=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + timeout
        for line in proc.stderr:
            lines.append(line)
            estimated = any("going by one step" in said for said in lines)
            long = any("It starts now" in said for said in lines)  # its HINT follows
            if estimated and (not long or line.startswith("HINT:")) or time.monotonic() > deadline:
                break
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the bench and the ranks it started
        proc.wait()
    return "".join(lines)


def _minutes(said: str) -> float:
    assert "going by one step" in said, said
    if "under a minute" in said:
        return 0.5
    minutes = re.search(r"about (\d+) min\b", said)
    hours = re.search(r"about (\d+) h", said)
    days = re.search(r"about (\d+) days", said)
    return int(days.group(1)) * 1440 if days else int(hours.group(1)) * 60 if hours else int(minutes.group(1))


@pytest.mark.timeout(600)
def test_a_long_cpu_bench_says_how_long_and_offers_a_quick_form_that_is(tmp_path):
    import torch

    said = _said_up_front(tmp_path, LONG)
    long = _minutes(said)
    assert long > 60 and "It starts now" in said, said
    quick = re.search(r"`(ringtrain bench [^`]*--quick)` takes (under a minute|about \d+ [^`]*?) here", said)
    assert quick, said
    offered = [quick.group(1)]
    if not torch.cuda.is_available():  # --preset gpu's refusal offers a CPU alternative too
        proc = subprocess.run([sys.executable, "-m", "ringtrain", "bench", "--preset", "gpu"], capture_output=True,
                              text=True, env=child_env(), cwd=tmp_path, timeout=120)
        assert proc.returncode == 2 and "HINT:" in proc.stderr, proc.stderr
        offered += re.findall(r"`(ringtrain bench [^`]*)`", proc.stderr.split("HINT:", 1)[1])
        assert len(offered) > 1, proc.stderr
    # Each quick form offered, when run, says it is minutes where the long one said hours (measured alike: on
    # an idle 2-core CPU the CIFAR quick form says about 2 min, the long one about 2 days; under a loaded
    # machine both grow).
    for command in offered:
        short = _said_up_front(tmp_path, command.split()[2:])
        assert _minutes(short) * 20 < long, (command, short, said)
