"""One source for every per-rank step figure (issue 33, item 2): the table ``ringtrain run`` prints at the end,
``ring.stats()``, ranks.csv (and the titles of ranks.png, added up from it) and the timeline all come from the
activity's step times, and count optimizer steps — not micro-batches, not an extra one per epoch.

Before: the table counted a step per batch fetch (accumulation's micro-batches, and the empty fetch that ends each
epoch: 191 steps for 8 x 23), ranks.png averaged the logging intervals' own splits (wait 4 % / 8 % beside the
table's 0.0 % / 3.3 %), and the timeline left the first step out (23 for 24).
"""

from __future__ import annotations

import json
import os
import re

import pytest

from _launch_util import child_env, outputs, run_ringtrain, write

from ringtrain.launcher.report import whereabouts_lines
from ringtrain.liveness.records import Post, Whereabouts
from ringtrain.liveness.stall import per_rank_stats, per_rank_summary
from ringtrain.tracking import timeline
from ringtrain.tracking.plot import against_run_fastest, plot, run_totals
from ringtrain.tracking.table import read_rows
from ringtrain.tracking.timeline_plot import summary

EPOCHS, ACCUMULATE = 3, 3
STEPS = EPOCHS * 4  # 10 micro-batches per rank and epoch in windows of 3, 3, 3 and 1

SCRIPT = """
    import json, sys, time
    import torch, torch.nn.functional as F
    import ringtrain as rt

    ring = rt.Ring(device="cpu", seed=0, accumulate=%(accumulate)d, log_dir=sys.argv[1])
    net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    net, opt = ring.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    g = torch.Generator().manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(80, 8, generator=g), torch.randint(0, 2, (80,), generator=g))
    train = ring.loader(data, batch_size=4, shuffle=True)
    held_out = ring.loader(data, batch_size=16, exact=True)
    started, paused = time.monotonic(), 0.0
    for epoch in ring.epochs(%(epochs)d):
        for x, y in train:
            if ring.rank == 1:
                time.sleep(0.01)  # rank 1 computes longer: rank 0 waits for it in backward
            loss = F.cross_entropy(net(x), y)
            ring.backward(loss)
            opt.step()
            opt.zero_grad()
            if ring.sync_now:
                ring.log({"loss": loss})
        with torch.no_grad():
            correct = sum(int((net(x).argmax(1) == y).sum()) for x, y in held_out)
        time.sleep(0.5)  # an epoch's end (evaluation, saving): no step's time
        paused += 0.5
        ring.log({"correct": ring.all_reduce(torch.tensor(float(correct)), "sum")})
    wall = time.monotonic() - started
    stats = ring.stats()
    if ring.is_main:
        print("JOB " + json.dumps({"optimizer_steps": ring.optimizer_steps, "stats": stats, "wall": wall,
                                   "paused": paused}), flush=True)
    ring.close()
"""


def table_rows(text: str) -> dict[int, list[float]]:
    """The rows of ``ringtrain run``'s per-rank table: rank -> [steps, ms/step, data %, compute %, wait %]."""
    block = text[text.index("ringtrain: per-rank step times"):].splitlines()[2:]
    rows = {}
    for line in block:
        found = re.match(r"^\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", line)
        if not found:
            break
        rows[int(found[1])] = [float(v) for v in found.groups()[1:]]
    return rows


@pytest.mark.timeout(300)
def test_the_table_ranks_csv_and_the_timeline_say_the_same_and_count_optimizer_steps(tmp_path):
    script = write(tmp_path / "train.py", SCRIPT % {"accumulate": ACCUMULATE, "epochs": EPOCHS})
    log, tl = tmp_path / "log", tmp_path / "tl"
    proc = run_ringtrain("run", "--nproc-per-node", "2", "--timeline", str(tl), str(script), str(log),
                         timeout=280, env=child_env(), cwd=tmp_path)
    assert proc.returncode == 0, outputs(proc)
    text = proc.stdout + proc.stderr
    job = json.loads(next(line[4:] for line in proc.stdout.splitlines() if line.startswith("JOB ")))
    assert job["optimizer_steps"] == STEPS

    # 1. the launcher's table: optimizer steps on every rank, and ring.stats()'s figures
    table = table_rows(text)
    stats = {int(r): s for r, s in job["stats"].items()}
    assert sorted(table) == sorted(stats) == [0, 1], text
    for rank, (steps, ms, data, compute, wait) in table.items():
        mine = stats[rank]
        assert steps == mine["steps"] == STEPS, (rank, table, stats)
        assert [ms, data, compute, wait] == pytest.approx(
            [mine["ms_per_step"], mine["data_pct"], mine["compute_pct"], mine["wait_pct"]], abs=0.051)
    assert stats[0]["wait_pct"] > stats[1]["wait_pct"]  # rank 0 waits for the slower rank 1
    # the epochs' ends (0.5 s each: evaluation, saving) are no step's
    assert sum(s["ms_per_step"] * s["steps"] for s in stats.values()) / 2 <= 1e3 * (job["wall"] - job["paused"]) + 50

    # 2. ranks.csv: its rows add up to the same figures (the titles of ranks.png are computed so)
    _, rows = read_rows(str(log / "ranks.csv"))
    numbers = [{k: float(v) if v not in ("", None) else None for k, v in row.items()} for row in rows]
    from_csv = per_rank_stats(run_totals(numbers))
    for rank, mine in stats.items():
        assert from_csv[rank]["steps"] == STEPS
        for key in ("ms_per_step", "data_pct", "compute_pct", "wait_pct"):
            assert from_csv[rank][key] == pytest.approx(mine[key], abs=0.01), (rank, key, from_csv, stats)
    # ... and ranks.png's red bands add up to the title's wait: measured against the run's fastest rank
    by_rank: dict[int, list[dict]] = {}
    for row in numbers:
        by_rank.setdefault(int(row["rank"]), []).append(row)
    against_run_fastest(by_rank, run_totals(numbers))
    for rank, values in by_rank.items():
        band = 100 * sum(v["wait_ms"] * v["steps"] for v in values) / sum(v["ms_per_step"] * v["steps"] for v in values)
        assert band == pytest.approx(stats[rank]["wait_pct"], abs=2.0), (rank, band, stats[rank])
    assert sorted(os.path.basename(p) for p in plot(str(log))) == ["curves.png", "ranks.png"]

    # 3. the timeline: every step, the table's figures, and bars that add up to the table's ms/step
    parts = timeline.read_parts(str(tl), "timeline")
    figures = summary(parts)
    for rank, mine in stats.items():
        row = figures[rank]
        assert row["steps"] == row["table"]["steps"] == STEPS, (rank, row)
        for key in ("ms_per_step", "data_pct", "compute_pct", "wait_pct"):
            assert row["table"][key] == pytest.approx(mine[key], abs=1e-6), (rank, key)
        assert row["step"] == pytest.approx(mine["ms_per_step"], rel=1e-4)  # bars summed in another order: float rounding
    assert per_rank_summary({r: p["times"] for r, p in parts.items()}) in text  # the very table the run printed
    assert (tl / "timeline.png").exists()


class Board:
    """What the launcher's report reads of the job's board: every rank's last whereabouts and its post."""

    def __init__(self, views: dict[int, Whereabouts], posts: dict[int, Post]):
        self.views, self.posts = views, posts

    def whereabouts(self) -> dict[int, Whereabouts]:
        return self.views

    def read(self) -> dict[int, Post]:
        return self.posts


def test_where_the_ranks_were_last_seen_says_how_old_each_word_is():
    """Issue 33, item 2: after a kill -9 the report put rank 0 at step 69 and rank 1 at step 63 — positions two
    DDP ranks cannot have — without a word: rank 1's was its last word, published before it ran on and died."""
    where = dict(pid=1, host="h", hostname="h", site="train.py:40")
    views = {0: Whereabouts(rank=0, beat=100.9, step=68, phase="backward", waiting="backward (gradient all-reduce)",
                            **where),
             1: Whereabouts(rank=1, beat=99.3, step=62, phase="forward", **where)}
    posts = {0: Post(rank=0, state="failed", reason="stopped: rank 1 was killed", time=101.0, cause="peer"),
             1: Post(rank=1, state="failed", reason="by SIGKILL", time=100.2)}
    lines = whereabouts_lines(Board(views, posts))
    assert "  rank 0: in backward (gradient all-reduce) at train.py:40 (step 69; 0.1 s before its end)" in lines
    assert "  rank 1: in its forward step at train.py:40 (step 63; 0.9 s before its end)" in lines
    assert any("at most one step apart" in line for line in lines), lines
    close = {r: Whereabouts(**{**v.__dict__, "step": 62}) for r, v in views.items()}
    assert not any("at most one step apart" in line for line in whereabouts_lines(Board(close, {})))
