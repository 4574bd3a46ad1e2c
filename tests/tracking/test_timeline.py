"""The timeline (issue 20): every rank's lane, each gradient bucket's all-reduce once per step, the
phases, the picture; Ring(timeline=), ringtrain run --timeline, hvd.start_timeline; bad folders."""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict

import pytest

from _launch_util import child_env, outputs, run_ringtrain, write  # noqa: E402

import _timeline_jobs as jobs  # noqa: E402
import ringtrain as rt  # noqa: E402
from ringtrain.tracking import timeline  # noqa: E402
from ringtrain.liveness.activity import Activity
from ringtrain.errors import RingtrainError  # noqa: E402
from ringtrain.tracking.timeline_plot import summary  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def load(path) -> dict:
    with open(path) as f:
        return json.load(f)


def lanes(trace: dict) -> dict[int, str]:
    return {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}


def buckets_by_step(trace: dict) -> dict[int, dict[int, list[int]]]:
    """rank -> step -> the bucket indices of that step's all-reduce events, in the order recorded."""
    out: dict[int, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e.get("cat") == "allreduce":
            out[e["pid"]][e["args"]["step"]].append(e["args"]["bucket"])
    return out


def phases(trace: dict, rank: int) -> Counter:
    return Counter(e["name"] for e in trace["traceEvents"] if e["ph"] == "X" and e["pid"] == rank and e.get("cat") == "phase")


def check_buckets(trace: dict, steps: int) -> int:
    """Every rank: one all-reduce event per bucket per step, the same buckets every step after the first
    (DDP rebuilds its buckets after the first iteration, in the order gradients arrived); returns their count."""
    per_rank = buckets_by_step(trace)
    assert sorted(per_rank) == [0, 1]
    counts = set()
    for rank, by_step in per_rank.items():
        assert len(by_step) == steps, (rank, sorted(by_step))
        for step, indices in by_step.items():
            assert sorted(indices) == list(range(len(indices))), (rank, step, indices)  # each bucket once
        later = {len(indices) for step, indices in by_step.items() if step != min(by_step)}
        assert len(later) == 1, (rank, dict(by_step))
        counts |= later
    assert len(counts) == 1
    (count,) = counts
    assert count >= 2, "the test model should have several gradient buckets"
    return count


@pytest.mark.timeout(240)
def test_ddp_timeline_has_every_rank_and_each_bucket_once_per_step(run_ranks, tmp_path):
    folder = tmp_path / "tl"
    assert run_ranks(jobs.train, str(folder)) == [{"rank": 0, "total": 2.0}, {"rank": 1, "total": 2.0}]
    assert sorted(os.listdir(folder)) == ["timeline.json", "timeline.png", "timeline.rank-0.json", "timeline.rank-1.json"]
    trace = load(folder / "timeline.json")
    assert sorted(lanes(trace)) == [0, 1] and lanes(trace)[1].startswith("rank 1")
    threads = {(e["pid"], e["args"]["name"]) for e in trace["traceEvents"] if e["name"] == "thread_name"}
    assert {(r, lane) for r in (0, 1) for lane in ("main thread", "gradient all-reduce")} <= threads
    check_buckets(trace, jobs.STEPS)
    for rank in (0, 1):
        seen = phases(trace, rank)
        for phase in ("data", "forward", "backward", "optimizer"):
            assert seen[phase] >= jobs.STEPS, (rank, seen)
        user = [e for e in trace["traceEvents"] if e["pid"] == rank and e.get("cat") == "collective"]
        assert any(e["name"].startswith("all_reduce(op=sum") for e in user)
    # bucket ends inside their step's backward (DDP waits for them there): the ends are measured in the
    # chain DDP waits on, not late
    for rank in (0, 1):
        backward = {e["args"]["step"]: e["ts"] + e["dur"] for e in trace["traceEvents"]
                    if e["pid"] == rank and e["name"] == "backward"}
        for e in trace["traceEvents"]:
            if e["pid"] == rank and e.get("cat") == "allreduce":
                assert e["ts"] + e["dur"] <= backward[e["args"]["step"]] + 1.0, e
    with open(folder / "timeline.png", "rb") as f:
        assert f.read(8) == PNG
    stats = summary(timeline.read_parts(str(folder), "timeline"))
    assert stats[0]["steps"] == jobs.STEPS and 0.0 <= stats[0]["hidden_pct"] <= 100.0  # every step (issue 33: one fewer)
    assert stats[0]["table"]["steps"] == jobs.STEPS  # the run's table, from the same step times


@pytest.mark.timeout(240)
def test_fp16_hook_is_timed_and_horovod_start_timeline(run_ranks, tmp_path):
    run_ranks(jobs.train, str(tmp_path / "fp16"), "fp16")
    trace = load(tmp_path / "fp16" / "timeline.json")
    check_buckets(trace, jobs.STEPS)
    hooks = {e["args"]["hook"] for e in trace["traceEvents"] if e.get("cat") == "allreduce"}
    assert hooks == {"fp16_hook"}

    path = tmp_path / "hvd" / "trace.json"
    buckets = run_ranks(jobs.horovod, str(path))
    assert buckets[0] >= 2
    assert sorted(os.listdir(path.parent)) == ["trace.json", "trace.png", "trace.rank-0.json", "trace.rank-1.json"]
    trace = load(path)
    assert sorted(lanes(trace)) == [0, 1]
    for rank, by_step in buckets_by_step(trace).items():
        assert len(by_step) == jobs.STEPS
        assert all(sorted(indices) == list(range(buckets[0])) for indices in by_step.values()), dict(by_step)
        assert phases(trace, rank)["optimizer"] == jobs.STEPS


SCRIPT = """
    import torch, torch.nn.functional as F
    import ringtrain as rt
    ring = rt.Ring(device="cpu", seed=0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(16, 2))
    net, opt = ring.setup(net, torch.optim.SGD(net.parameters(), lr=0.1), bucket_cap_mb=0.0001)
    data = torch.utils.data.TensorDataset(torch.randn(32, 8), torch.randint(0, 2, (32,)))
    for epoch in ring.epochs(1):
        for x, y in ring.loader(data, batch_size=4):
            ring.backward(F.cross_entropy(net(x), y))
            opt.step(); opt.zero_grad()
"""


@pytest.mark.timeout(240)
def test_ringtrain_run_timeline(tmp_path):
    script = write(tmp_path / "train.py", SCRIPT)
    folder = tmp_path / "out"
    proc = run_ringtrain("run", "--nproc-per-node", "2", "--timeline", str(folder), str(script), timeout=200,
                         env=child_env(), cwd=tmp_path)
    assert proc.returncode == 0, outputs(proc)
    assert "timeline of 2 rank(s)" in proc.stderr, outputs(proc)
    # The rank that merged at exit drew no picture; the launcher drew it: no line asks the user to draw it.
    assert "draws it" not in proc.stderr and "timeline.png" in proc.stderr, outputs(proc)
    trace = load(folder / "timeline.json")
    assert sorted(lanes(trace)) == [0, 1]
    check_buckets(trace, 4)
    assert (folder / "timeline.png").exists()


def test_bad_folder_is_named_with_a_hint(tmp_path):
    afile = tmp_path / "not-a-folder"
    afile.write_text("x")
    with pytest.raises(RingtrainError, match="is a file, not a folder") as caught:
        rt.Ring(device="cpu", timeline=str(afile))
    assert "HINT:" in str(caught.value)
    write(tmp_path / "train.py", "print('never run')\n")
    proc = run_ringtrain("run", "--timeline", str(afile), "train.py", cwd=tmp_path)
    assert proc.returncode == 2 and "--timeline" in proc.stderr and "HINT:" in proc.stderr, outputs(proc)


def test_off_costs_nothing_and_registers_no_hook():
    assert Activity().recorder is None
    assert timeline.comm_hook(None, None) is None
    sentinel = object()
    assert timeline.comm_hook(sentinel, None) is sentinel


def test_memory_is_bounded_and_missing_ranks_are_named(tmp_path, capsys):
    recorder = timeline.Recorder(str(tmp_path), "timeline", 0, 2, "job", keep_steps=3, merge=True)
    for _ in range(10):
        recorder.enter("data", 1.0)
        recorder.enter("forward", 2.0)
        recorder.leave("optimizer")
        recorder.step_done(1.0, 0.5, 2.0)  # a ring's optimizer step ends the step (Activity.step_ends)
    recorder.enter("data", 3.0)  # the next step's fetch: kept with the last steps
    recorder.close()  # rank 1 never wrote its part: nothing merged at close
    part = load(tmp_path / "timeline.rank-0.json")
    assert part["dropped_steps"] == 7 and {e[5] for e in part["events"]} == {7, 8, 9, 10}  # 3 + the one in progress
    assert [t[0] for t in part["step_times"]] == [7, 8, 9] and part["step_times"][0][3:] == [1.0, 0.5, 2.0]
    assert not (tmp_path / "timeline.json").exists()
    assert timeline.main([str(tmp_path), "--no-png"]) == 0
    assert "no part from rank(s) 1" in capsys.readouterr().err
    assert load(tmp_path / "timeline.json")["traceEvents"]
    assert timeline.main([str(tmp_path / "nothing-here")]) == 2


def synthetic_part(steps: int = 3) -> dict:
    """One rank's part, by hand: each 100 ms step fetches, computes forward and backward, and its one bucket's
    all-reduce starts when backward computed its last gradient (so none of it is hidden) and ends 8 ms later, inside
    backward (DDP waits for it there); the last step holds an evaluation (a phase of its own colour)."""
    events, step_times = [], []
    for i in range(steps):
        t = 0.1 * i
        events += [["data", "phase", 0, t, t + 0.005, i, None], ["forward", "phase", 0, t + 0.005, t + 0.02, i, None],
                   ["backward", "phase", 0, t + 0.02, t + 0.06, i, None],
                   ["all-reduce bucket 0", "allreduce", 1, t + 0.05, t + 0.058, i,
                    {"bucket": 0, "bytes": 400, "hook": "allreduce_hook"}],
                   ["optimizer", "phase", 0, t + 0.06, t + 0.065, i, None]]
        step_times.append([i, t, t + 0.1, 5.0, 45.0, 100.0])
    events.append(["evaluation", "phase", 0, 0.1 * steps - 0.03, 0.1 * steps - 0.01, steps - 1, None])
    return {"rank": 0, "world_size": 1, "events": events, "step_times": step_times,
            "times": {"steps": float(steps), "total_data": 5.0 * steps, "total_sync": 45.0 * steps,
                      "total_step": 100.0 * steps, "data": 5.0, "sync": 45.0, "step": 100.0}}


def test_the_gantt_names_every_colour_it_uses_and_draws_the_wait_the_bars_count():
    """Issue 33, item 8: the Gantt drew a yellow phase (an evaluation) that its picture's legend did not name, and
    backward's green bar ran under the buckets' all-reduce while the bars above said "0 % hidden under backward"."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    from ringtrain.tracking.timeline_plot import COLORS, figure

    parts = {0: synthetic_part()}
    stats = summary(parts)[0]
    assert stats["hidden_pct"] == 0.0 and stats["all-reduce, not hidden"] == pytest.approx(8.0)
    assert stats["steps"] == 3 and stats["step"] == pytest.approx(100.0) and stats["table"]["steps"] == 3
    fig = figure(parts)
    _, gantt = fig.axes
    drawn = {to_hex(p.get_facecolor()) for p in gantt.patches}
    named = {to_hex(h.get_facecolor()) for h in gantt.get_legend().legend_handles}
    assert COLORS["evaluation"] in drawn and drawn <= named, drawn - named
    waits = [p for p in gantt.patches if to_hex(p.get_facecolor()) == COLORS["all-reduce, not hidden"]
             and abs(p.get_y() + p.get_height() / 2) < 0.3]  # on rank 0's main-thread lane
    assert sum(p.get_width() for p in waits) == pytest.approx(3 * 8.0)  # ms: each step's wait, as the bars count it
    plt.close(fig)
