"""Preemption (issue 32, loop/preempt.py): a scheduler's signal becomes a checkpoint at the step the job is at and
exit 75. The parts in one process here; two ranks through ``ringtrain run`` (the launcher's SIGTERM, one rank's
signal, --preempt-signal USR1; DDP and FSDP) in tests/loop/test_steps_restart.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import types

import pytest
import torch
from _launch_util import HELPERS, child_env, outputs

import ringtrain as rt
from ringtrain.errors import RingtrainError
from ringtrain.launcher import plan as plans, report, run, stacks
from ringtrain.liveness import dump, membership, procs
from ringtrain.loop import preempt
from ringtrain.parallel import contract

JOB = os.path.join(HELPERS, "_steps_jobs.py")


@pytest.mark.parametrize("given, want", [(None, None), ("SIGUSR1", signal.SIGUSR1), ("usr1", signal.SIGUSR1),
                                         (signal.SIGUSR1, signal.SIGUSR1), ("10", signal.SIGUSR1),
                                         ("TERM", signal.SIGTERM), ("SIGHUP", signal.SIGHUP)])
def test_signal_names(given, want):
    assert preempt.signal_of(given) == want


@pytest.mark.parametrize("given", ["KILL", "SIGSTOP", "INT", "USR2", "NOPE", "99999"])
def test_signals_that_cannot_preempt_are_refused_with_a_hint(given):
    with pytest.raises(RingtrainError, match=r"not a signal a scheduler preempts with(.|\n)*HINT: .*SIGUSR1"):
        preempt.signal_of(given)


@pytest.mark.parametrize("grace", [0, -3, True, "30", float("inf")])
def test_a_grace_that_is_not_seconds_is_refused(grace):
    with pytest.raises(RingtrainError, match="HINT: give the seconds"):
        preempt.check_grace(grace)


def test_preemption_options_need_a_checkpoint_dir():
    with pytest.raises(RingtrainError, match=r"preempt_signal, requeue without a checkpoint_dir(.|\n)*HINT: .*"
                                             r"checkpoint_dir="):
        rt.Ring(preempt_signal="USR1", requeue=True)
    settings = contract.read({})
    assert preempt.of(None, settings, False) is None  # no folder, no options: SIGTERM ends the process
    with_variables = contract.read({"RINGTRAIN_PREEMPT_SIGNAL": "SIGUSR1"})
    assert preempt.of(None, with_variables, False) is None  # ringtrain run's variables ask nothing of a ring without one


def test_the_launchers_variables_are_the_defaults(tmp_path):
    settings = contract.read({"RINGTRAIN_PREEMPT_SIGNAL": "SIGUSR1", "RINGTRAIN_PREEMPT_GRACE": "90",
                              "RINGTRAIN_PREEMPTED_DIR": str(tmp_path), "SLURM_JOB_ID": "7"})
    taken = preempt.of(str(tmp_path), settings, False)
    assert taken.signals == [signal.SIGTERM, signal.SIGUSR1] and taken.grace == 90.0
    assert (taken.marks, taken.slurm_job) == (str(tmp_path), "7")
    assert preempt.of(str(tmp_path), contract.read({}), False).grace == preempt.DEFAULT_GRACE
    with pytest.raises(RingtrainError, match="RINGTRAIN_PREEMPT_GRACE"):
        contract.read({"RINGTRAIN_PREEMPT_GRACE": "soon"})
    with pytest.raises(RingtrainError, match="RINGTRAIN_PREEMPT_SIGNAL"):
        contract.read({"RINGTRAIN_PREEMPT_SIGNAL": "KILL"})
    # the ring's keywords win over the variables (contract.override, where Ring decides)
    kept = preempt.of(str(tmp_path), contract.override(settings, preempt_signal="HUP", preempt_grace=5), False)
    assert kept.signals == [signal.SIGTERM, signal.SIGHUP] and kept.grace == 5.0


def test_a_signal_is_only_noted_and_a_second_changes_nothing(capsys, monkeypatch):
    # A process that has not left (an earlier test's membership may have): the signal is a preemption's
    monkeypatch.setattr(membership, "_ACTIVE", None)
    monkeypatch.setattr(membership, "_LAST", None)
    before = signal.getsignal(signal.SIGTERM)
    taken = preempt.Preemption()
    assert taken.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs at the next bytecode: the process goes on
        os.kill(os.getpid(), signal.SIGTERM)
        assert taken.requested == signal.SIGTERM
        assert taken.due(world_size=1)
    finally:
        taken.uninstall()
    assert signal.getsignal(signal.SIGTERM) == before
    assert capsys.readouterr().err.count("got SIGTERM: finishing this step") == 1


STALE = """
import os, signal
from ringtrain.liveness import membership
from ringtrain.loop import preempt
a, b = preempt.Preemption(), preempt.Preemption()
a.install(); b.install()      # two rings in one process, closed in the order they were made:
a.uninstall(); b.uninstall()  # b puts back a's note, which a no longer answers for
membership._LAST = object()   # this process has left (posted how it ends)
os.kill(os.getpid(), signal.SIGTERM)
print("still here")
"""


def test_a_stale_note_left_in_place_ends_the_process_instead_of_recursing():
    # In the suite's process: a ring never closed left its note as SIGTERM's handler, and the note of a process
    # that has left re-raised the signal into itself until RecursionError.
    proc = subprocess.run([sys.executable, "-c", STALE], capture_output=True, text=True, timeout=60, env=child_env())
    assert proc.returncode == -signal.SIGTERM, outputs(proc)
    assert "RecursionError" not in proc.stderr and "still here" not in proc.stdout


def test_stacks_move_to_usr2_where_usr1_preempts(monkeypatch, tmp_path):
    assert dump.stack_signal(None) == signal.SIGUSR1
    assert dump.stack_signal("USR1") == dump.stack_signal("SIGUSR1") == signal.SIGUSR2
    assert dump.stack_signal("SIGTERM") == signal.SIGUSR1
    assert dump.stack_signal(contract.read({"RINGTRAIN_PREEMPT_SIGNAL": "usr1"}).preempt_signal) == signal.SIGUSR2
    assert stacks.StackRequests(("127.0.0.1", 1),
                                settings=contract.read({"RINGTRAIN_PREEMPT_SIGNAL": "SIGUSR1"})).signum == signal.SIGUSR2
    assert stacks.StackRequests(("127.0.0.1", 1)).signum == signal.SIGUSR1
    # ringtrain stacks PID reads the launcher's command line
    launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "--preempt-signal", "USR1"])
    try:
        deadline = time.monotonic() + 20  # until the child has exec'd (before, /proc shows pytest's command line)
        while "--preempt-signal" not in procs.command_line(launcher.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stacks.preempt_signal_of(launcher.pid) == "USR1"
    finally:
        launcher.kill()
        launcher.wait()
    assert stacks.preempt_signal_of(os.getpid()) is None


def _plan(tmp_path, *argv):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    return plans.plan_from_args(run.build_parser().parse_args([*argv, str(script)]))


def test_launcher_flags_reach_torchruns_agent_and_the_workers(tmp_path):
    plan = _plan(tmp_path, "--preempt-signal", "USR1", "--preempt-grace", "90")
    assert plan.preempt_signal == "SIGUSR1"
    assert plan.torchrun["signals_to_handle"] == "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
    assert plan.torchrun["shutdown_timeout"] == 90
    assert plan.environment == {"RINGTRAIN_PREEMPT_SIGNAL": "SIGUSR1", "RINGTRAIN_PREEMPT_GRACE": "90"}
    assert contract.read(plan.environment).preempt_signal == "SIGUSR1"  # what the workers' rings read
    given = _plan(tmp_path, "--preempt-signal", "SIGUSR1", "--signals-to-handle", "SIGTERM,SIGUSR1",
                  "--shutdown-timeout", "12", "--preempt-grace", "60")
    assert given.torchrun["signals_to_handle"] == "SIGTERM,SIGUSR1" and given.torchrun["shutdown_timeout"] == 12
    plain = _plan(tmp_path)
    assert plain.preempt_signal is None and plain.environment == {} and plain.torchrun["signals_to_handle"] is None


@pytest.mark.parametrize("argv, needle", [(["--preempt-signal", "KILL"], "--preempt-signal got 'KILL'"),
                                          (["--preempt-grace", "0"], "--preempt-grace got 0.0"),
                                          (["--signals-to-handle", "SIGTERM,SIGUSR1"], "--preempt-signal USR1")])
def test_bad_preemption_flags_exit_2_with_a_hint(tmp_path, capsys, argv, needle):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    assert run.main([*argv, str(script)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "HINT:" in err, err


def test_the_launchers_last_line_names_a_preemption_only_when_its_workers_saved_and_left(tmp_path):
    preempt.mark(0, 7, str(tmp_path))
    preempt.mark(1, 7, str(tmp_path))
    preempt.mark(2, 7, None)  # no agent: nothing written
    (tmp_path / contract.SIGNALLED).write_text("15")  # the agent's own word is no rank's mark
    marks = preempt.marked(str(tmp_path))
    assert marks == {0: 7, 1: 7}
    said = report.preempted(marks, signame="SIGTERM")
    assert said.startswith("ringtrain run: preempted by SIGTERM at step 7: every rank saved") and "exit 75" in said
    assert report.preempted({}) is None and report.preempted(preempt.marked(None)) is None
    exits = {0: types.SimpleNamespace(exitcode=75), 1: types.SimpleNamespace(exitcode=75)}
    assert "exit 75" in report.preempted(marks, exits)
    assert report.preempted(marks, {**exits, 1: types.SimpleNamespace(exitcode=1)}) is None  # one failed


def test_a_sigterm_under_ringtrain_run_is_a_preemption_only_when_the_agent_was_signalled(tmp_path):
    # torchrun's agent stops its workers with SIGTERM for its own reasons (a failure, a restart, a node joining):
    # those must end them at once. ringtrain run's agent writes SIGNALLED when a signal reached it.
    assert not preempt.agent_signalled(str(tmp_path), wait_s=0.1)
    (tmp_path / preempt.SIGNALLED).write_text("15")
    assert preempt.agent_signalled(str(tmp_path), wait_s=0.1)
    assert preempt.agent_signalled(None, wait_s=0.1)  # no agent to ask (torchrun, srun, one process): a preemption


def _one_process(out, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, JOB, "--out", str(out), "--save-every", "1000", *options],
                          capture_output=True, text=True, timeout=120, env=child_env())


@pytest.mark.timeout(300)
def test_one_process_answers_sigterm_with_a_checkpoint_and_exit_75_then_resumes_bitwise(tmp_path):
    whole = _one_process(tmp_path / "whole")
    assert whole.returncode == 0, outputs(whole)
    got = _one_process(tmp_path / "cut", "--preempt-at", "9", "--preempt-how", "self")
    assert got.returncode == preempt.EXIT_CODE, outputs(got)
    # One process has no agreement to wait for: the next safe point (the top of the next step) saves.
    assert "ringtrain: preempted (SIGTERM) at step 3" in got.stderr + got.stdout, outputs(got)
    again = _one_process(tmp_path / "cut", "--preempt-at", "9", "--preempt-how", "self")
    assert again.returncode == 0, outputs(again)
    assert "resumed from" in again.stdout + again.stderr
    a, b = torch.load(tmp_path / "whole" / "params.pt"), torch.load(tmp_path / "cut" / "params.pt")
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def test_a_checkpoint_slower_than_the_grace_is_said_once(tmp_path, capsys):
    before = signal.getsignal(signal.SIGTERM)
    ring = rt.Ring(seed=0, checkpoint_dir=str(tmp_path), save_every=1, preempt_grace=1e-9)
    model = torch.nn.Linear(3, 1)
    model, opt = ring.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for _ in ring.steps(3):
        ring.backward(model(torch.ones(2, 3)).sum())
        opt.step()
        opt.zero_grad()
    ring.close()
    said = capsys.readouterr()
    text = said.out + said.err
    assert text.count("longer than the 1e-09 s a preemption leaves before SIGKILL") == 1, text
    assert signal.getsignal(signal.SIGTERM) == before  # close() gave SIGTERM back
