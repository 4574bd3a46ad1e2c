"""The launcher -> worker contract (parallel/contract.py): one reader, one writer, one table, keywords over it."""

from __future__ import annotations

import dataclasses
import re
import signal
from pathlib import Path

import pytest

from ringtrain.errors import RingtrainError
from ringtrain.parallel import contract, contract_page
from ringtrain.parallel.contract import Settings

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_an_empty_environment_reads_as_the_defaults():
    assert contract.read({}) == Settings()
    assert Settings().preempt_grace == contract.DEFAULT_GRACE and Settings().stall_warning == 60.0
    assert contract.read({"RINGTRAIN_STALL_WARNING": "", "RINGTRAIN_TIMELINE": ""}) == Settings()  # empty: unset


def test_the_reader_types_each_variable():
    got = contract.read({"RINGTRAIN_TIMELINE": "/t", "RINGTRAIN_PREEMPT_SIGNAL": "usr1", "RINGTRAIN_PREEMPT_GRACE": "90",
                         "RINGTRAIN_STALL_WARNING": "off", "RINGTRAIN_DEBUG_COLLECTIVES": "1",
                         "RINGTRAIN_HVD_CHECKS": "false", "HOROVOD_FUSION_THRESHOLD": "1024",
                         "RINGTRAIN_LAUNCHER_PID": "42", "RINGTRAIN_CHECK_RESUME": "/c"})
    assert got.timeline == "/t" and got.preempt_signal == "SIGUSR1" and got.preempt_signum == signal.SIGUSR1
    assert got.preempt_grace == 90.0 and got.stall_warning is None and got.debug_collectives == 60.0
    assert got.hvd_checks is False and got.fusion_threshold == 1024 and got.launcher_pid == 42
    assert got.check_resume == "/c"
    assert contract.read({"RINGTRAIN_DEBUG_COLLECTIVES": "120"}).debug_collectives == 120.0
    assert contract.read({"RINGTRAIN_STALL_WARNING": "0"}).stall_warning is None


@pytest.mark.parametrize("name, value", [
    ("RINGTRAIN_PREEMPT_GRACE", "soon"), ("RINGTRAIN_PREEMPT_GRACE", "-1"), ("RINGTRAIN_PREEMPT_SIGNAL", "KILL"),
    ("RINGTRAIN_PREEMPT_SIGNAL", "SIGNOPE"), ("RINGTRAIN_STALL_WARNING", "nan"), ("RINGTRAIN_STALL_WARNING", "soon"),
    ("RINGTRAIN_DEBUG_COLLECTIVES", "maybe"), ("RINGTRAIN_HVD_CHECKS", "perhaps"),
    ("HOROVOD_FUSION_THRESHOLD", "lots"), ("RINGTRAIN_LAUNCHER_PID", "x"),
])
def test_the_reader_names_a_bad_variable_and_its_value(name, value):
    with pytest.raises(RingtrainError) as caught:
        contract.read({name: value})
    text = str(caught.value)
    assert f"{name}={value!r}" in text
    assert text.splitlines()[-1].startswith("HINT: ")


def test_the_job_is_named_by_torchrun_else_slurm():
    assert contract.read({"TORCHELASTIC_RUN_ID": "abc", "SLURM_JOB_ID": "7"}).job == "torchrun abc"
    assert contract.read({"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "7"}).job == "Slurm job 7"
    assert contract.read({"SLURM_JOB_ID": "7"}).slurm_job == "7"
    assert contract.read({}).job is None


def test_writer_then_reader_round_trips():
    settings = Settings(timeline="/t", preempt_signal="SIGUSR1", preempt_grace=90.0, marks="/m", stall_warning=None,
                        debug_collectives=5.0, hvd_checks=False, fusion_threshold=1 << 20, job_secret="s",
                        job_secret_file="/f", agent_nonce="n", launcher_pid=42, check_resume="/c",
                        horovod_timeline="/h.json")
    environ = contract.to_environ(settings)
    assert contract.read(environ) == settings
    assert contract.to_environ(Settings()) == {}  # the defaults need no variable
    assert contract.to_environ(stall_warning=None) == {"RINGTRAIN_STALL_WARNING": "0"}  # None: never
    assert contract.to_environ(marks="/m", timeline=None) == {"RINGTRAIN_PREEMPTED_DIR": "/m"}  # None: left out
    assert contract.read(contract.to_environ(preempt_grace=2.5)).preempt_grace == 2.5


def test_the_writer_refuses_what_it_does_not_write():
    with pytest.raises(RingtrainError, match="no field"):
        contract.to_environ(nope=1)
    with pytest.raises(RingtrainError, match="TORCHELASTIC_RUN_ID"):
        contract.to_environ(run_id="x")  # torchrun's
    assert contract.to_environ(Settings(run_id="x", slurm_job="7")) == {}


def test_keywords_override_the_environment_in_one_place():
    environment = contract.read({"RINGTRAIN_PREEMPT_SIGNAL": "SIGUSR1", "RINGTRAIN_STALL_WARNING": "30",
                                 "RINGTRAIN_TIMELINE": "/env"})
    kept = contract.override(environment, timeline=None, preempt_signal=None, preempt_grace=None,
                             stall_warning="default", debug_collectives=False)
    assert kept == environment  # keywords at their defaults: the environment's values
    given = contract.override(environment, timeline="/kw", preempt_signal=signal.SIGHUP, preempt_grace=5,
                              stall_warning=None, debug_collectives=True)
    assert (given.timeline, given.preempt_signal, given.preempt_grace) == ("/kw", "SIGHUP", 5.0)
    assert given.stall_warning is None and given.debug_collectives == contract.DEBUG_COLLECTIVES_S
    assert contract.override(environment, stall_warning=12).stall_warning == 12.0
    assert contract.override(environment, debug_collectives=7).debug_collectives == 7.0


@pytest.mark.parametrize("keyword, value, said", [
    ("preempt_signal", "KILL", "Ring(preempt_signal=...)"), ("preempt_grace", 0, "Ring(preempt_grace=...)"),
    ("stall_warning", float("nan"), "Ring(stall_warning=...)"), ("stall_warning", True, "Ring(stall_warning=...)"),
    ("debug_collectives", "yes", "Ring(debug_collectives=...)"),
])
def test_a_bad_keyword_is_named(keyword, value, said):
    with pytest.raises(RingtrainError) as caught:
        contract.override(Settings(), **{keyword: value})
    assert said in str(caught.value) and "\nHINT: " in str(caught.value)


def test_the_table_covers_every_field_once():
    fields = [f.name for f in dataclasses.fields(Settings)]
    assert sorted(v.field for v in contract.VARIABLES if v.field) == sorted(fields)
    assert len({v.name for v in contract.VARIABLES}) == len(contract.VARIABLES)
    others = [v for v in contract.VARIABLES if v.field is None]  # other tools' variables: listed, never read here
    assert others and all(v.write is None for v in others)
    assert contract.read({"CUDA_VISIBLE_DEVICES": "0", "OMP_NUM_THREADS": "lots"}) == Settings()
    for v in contract.VARIABLES:
        assert v.meaning and v.set_by and v.type and v.default, v.name


def test_every_ringtrain_variable_named_in_src_is_in_the_table():
    """A RINGTRAIN_* name that src/ spells out is a variable of the contract (no second, undocumented one)."""
    src = Path(contract.__file__).resolve().parents[1]
    named = set()
    for path in src.rglob("*.py"):
        named |= set(re.findall(r"\bRINGTRAIN_[A-Z_]+[A-Z]\b", path.read_text()))
    assert named - {v.name for v in contract.VARIABLES} == set()


@pytest.mark.parametrize("language, page", [("en", "environment.md"), ("zh-CN", "environment.zh-CN.md")])
def test_the_docs_page_is_generated_from_the_table(language, page):
    assert (DOCS / page).read_text() == contract_page.environment_page(language), (
        f"docs/{page} is out of date: python -m ringtrain.parallel.contract {language} > docs/{page}")


def test_exported_sets_the_variables_for_the_block_and_puts_back_what_was_there():
    environ = {"RINGTRAIN_TIMELINE": "/before", "PATH": "/bin"}
    with contract.exported(contract.to_environ(timeline="/job", marks="/m"), environ):
        assert contract.read(environ).timeline == "/job" and contract.read(environ).marks == "/m"
    assert environ == {"RINGTRAIN_TIMELINE": "/before", "PATH": "/bin"}
    with pytest.raises(KeyError), contract.exported({"RINGTRAIN_PREEMPTED_DIR": "/m"}, environ):
        raise KeyError("the job failed")
    assert "RINGTRAIN_PREEMPTED_DIR" not in environ  # put back on an error too


def test_the_marks_folder_holds_each_ranks_step_and_the_agents_word(tmp_path):
    contract.mark(0, 7, str(tmp_path))
    contract.mark(1, 8, str(tmp_path))
    contract.mark(2, 9, None)  # no agent: nothing written
    (tmp_path / contract.SIGNALLED).write_text("15")
    assert contract.marked(str(tmp_path)) == {0: 7, 1: 8} and contract.marked(None) == {}


def test_the_launchers_flags_reach_the_workers_settings_through_the_contract(tmp_path):
    """--preempt-signal and --stall-warning, from the command line to what a worker's ring reads."""
    from ringtrain.launcher import plan as plans, run

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    argv = ["--preempt-signal", "USR1", "--stall-check-warning-time-seconds", "20", str(script)]
    plan = plans.plan_from_args(run.build_parser().parse_args(argv))
    workers = contract.read(plan.environment)  # what the agent exports (contract.exported) and a worker reads
    assert workers.preempt_signal == "SIGUSR1" and workers.stall_warning == 20.0
    ring = contract.override(workers, stall_warning=5)  # Ring(stall_warning=5) wins in the worker
    assert ring.stall_warning == 5.0 and ring.preempt_signal == "SIGUSR1"
