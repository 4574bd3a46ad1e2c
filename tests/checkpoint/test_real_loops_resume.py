"""Issue 36, "Done when": the step loops real GPT scripts have (tests/helpers/_prefetch_jobs.py: nanoGPT's prefetch,
build-nanogpt's shard-walking loader with a position per rank), converted with ``ring.batches`` / ``ring.keep``,
killed with SIGKILL at a random backward under ``--max-restarts 1``, end bitwise equal to the uninterrupted run —
DDP and FSDP — and say that the resume checked itself; without the conversion's line, the resumed run names the
step where it parts from the run it continues. One kill point each here; ten each in ``make test-stress``."""

from __future__ import annotations

import json
import random
import re
import subprocess

import pytest
import torch
from _launch_util import HELPERS, child_env, outputs, ringtrain_cmd

JOB = f"{HELPERS}/_prefetch_jobs.py"
BACKWARDS = 2 * 12  # ACCUM x STEPS of _prefetch_jobs, per rank


def _run(out, loop: str, strategy: str, *options: str) -> dict:
    command = ringtrain_cmd("run", "--nproc-per-node", "2", "--max-restarts", "1", JOB, "--out", str(out),
                            "--loop", loop, "--strategy", strategy, *options)
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240, env=child_env())
    assert proc.returncode == 0, outputs(proc)
    losses = [json.loads((out / f"losses.rank{r}.json").read_text()) for r in range(2)]
    return {"params": torch.load(out / "params.pt"), "losses": losses, "proc": proc, "text": proc.stdout + proc.stderr}


def _same(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


_REFERENCES: dict[tuple[str, str], dict] = {}


@pytest.fixture
def reference(tmp_path_factory):
    """The uninterrupted run of a loop under a strategy (made once per module and kept)."""
    def get(loop: str, strategy: str) -> dict:
        if (loop, strategy) not in _REFERENCES:
            _REFERENCES[loop, strategy] = _run(tmp_path_factory.mktemp(f"{loop}-{strategy}"), loop, strategy)
        return _REFERENCES[loop, strategy]
    return get


def _killed(tmp_path, loop: str, strategy: str, kill_at: int, reference, *options: str) -> tuple[dict, list[str]]:
    got = _run(tmp_path, loop, strategy, "--kill-at", str(kill_at), *options)
    whole = reference(loop, strategy)
    found = [] if _same(got["params"], whole["params"]) else [f"kill at backward {kill_at}: params differ"]
    for rank in range(2):  # what each rank's loop did after its checkpoint, evaluations included
        mine, all_ = got["losses"][rank], whole["losses"][rank]
        if mine != all_[len(all_) - len(mine):]:
            found.append(f"kill at backward {kill_at}, rank {rank}: losses differ")
    return got, found


def _resumed_step(text: str) -> int:
    resumed = re.search(r"resumed from \S+ \((?:epoch \S+, )?step (\d+)\)", text)
    assert resumed, text
    return int(resumed[1])


@pytest.mark.timeout(900)
@pytest.mark.parametrize("loop,strategy", [("prefetch", "ddp"), ("shards", "fsdp")])
def test_a_converted_real_loop_killed_at_random_resumes_bitwise_and_says_it_checked(loop, strategy, tmp_path,
                                                                                    reference):
    kill_at = random.Random(f"{loop}-{strategy}").randint(8, BACKWARDS - 2)
    got, found = _killed(tmp_path, loop, strategy, kill_at, reference)
    assert found == [], "\n".join(found) + "\n" + outputs(got["proc"])
    assert "not the run it continues" not in got["text"], outputs(got["proc"])
    assert "resume checked" in got["text"], outputs(got["proc"])


@pytest.mark.timeout(900)
@pytest.mark.parametrize("loop,strategy", [("prefetch", "ddp"), ("shards", "ddp")])
def test_without_the_conversion_line_the_resumed_run_names_the_step_it_parts_at(loop, strategy, tmp_path, reference):
    kill_at = 16  # after the checkpoint of step 6 (save_every=3), before the one of step 9
    got, found = _killed(tmp_path, loop, strategy, kill_at, reference, "--plain")
    assert found, "the unconverted loop resumed exactly: the test shows nothing"
    step = _resumed_step(got["text"])
    warned = re.search(r"rank (\d): this resumed run is not the run it continues: at step (\d+)", got["text"])
    assert warned, outputs(got["proc"])
    assert int(warned[2]) == step, (warned[0], step)
    assert "ring.batches" in got["text"] and "ring.keep" in got["text"]


@pytest.mark.stress
@pytest.mark.timeout(7200)
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
@pytest.mark.parametrize("loop", ["prefetch", "shards"])
def test_ten_random_kill_points_each_resume_bitwise(loop, strategy, tmp_path, reference):
    found = []
    for kill_at in random.Random(f"ten-{loop}-{strategy}").sample(range(2, BACKWARDS), 10):
        got, differ = _killed(tmp_path / f"kill{kill_at}", loop, strategy, kill_at, reference)
        found += differ + [f"kill at {kill_at}: false alarm"] * ("not the run it continues" in got["text"])
    assert found == [], "\n".join(found)


@pytest.mark.timeout(300)
def test_a_finished_job_run_again_says_nothing_is_left_to_train(tmp_path):
    first = _run(tmp_path, "shards", "ddp")
    assert "nothing is left to train" not in first["text"]
    again = _run(tmp_path, "shards", "ddp")
    assert "step-000000012.pt is at the end of this run (step 12 of ring.steps(12)): nothing is left to train" \
        in again["text"], outputs(again["proc"])
