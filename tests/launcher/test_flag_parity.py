"""Every option of torch's own launchers is taken by ``ringtrain run`` with torch's meaning, or refused with a
HINT from an explicit list: built from ``torch.distributed.run.get_args_parser()`` itself, so the next torch
cannot add or change a flag without this failing. The same for horovodrun's option list (horovod 0.28.1).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys

import pytest
import torch.distributed.run as torchrun

from ringtrain.errors import RingtrainError
from ringtrain.launcher import agent, flags, horovod_flags, plan as plans, run, torchrun_flags, waiting

PORT = 29999


def torch_parser(launch: bool = False) -> argparse.ArgumentParser:
    parser = torchrun.get_args_parser()
    if launch:  # torch/distributed/launch.py parse_args: torchrun's parser plus --use-env
        parser.add_argument("--use-env", "--use_env", default=False, action="store_true")
    return parser


def options(parser) -> dict:
    """option string -> its action, for every optional argument but --help."""
    return {s: a for a in parser._actions if a.option_strings and a.dest != "help" for s in a.option_strings}


def takes_value(action) -> bool:
    return action.nargs != 0


# A valid value for every torch option that takes one; a new one must be added here (and classified).
SAMPLES = {
    "nnodes": "1:2", "nproc_per_node": "2", "rdzv_backend": "c10d", "rdzv_endpoint": "127.0.0.1:29411",
    "rdzv_id": "job7", "rdzv_conf": "join_timeout=77", "max_restarts": "2", "monitor_interval": "0.5",
    "start_method": "fork", "event_log_handler": "console", "role": "trainer", "log_dir": "LOGS", "redirects": "3",
    "tee": "0:3", "local_ranks_filter": "0,1", "duplicate_stdout_filters": "a,,b,c",
    "duplicate_stderr_filters": "x", "node_rank": "0", "master_addr": "127.0.0.1", "master_port": "29412",
    "local_addr": "127.0.0.1", "logs_specs": "mine", "numa_binding": "socket", "signals_to_handle": "SIGTERM,SIGINT",
    "shutdown_timeout": "7",
}


def _plan(argv: list):
    return plans.plan_from_args(run.build_parser().parse_args(argv))


def _script(tmp_path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return str(path)


def _ours_and_torchs(option: str, action, tmp_path) -> tuple:
    script = _script(tmp_path)
    value = [SAMPLES[action.dest].replace("LOGS", str(tmp_path))] if takes_value(action) else []
    # --no-python: a program; -m: a module
    target = [{"no_python": sys.executable, "module": "timeit"}.get(action.dest, script)]
    plan = _plan([option, *value, *target])
    ours = agent.torchrun_args(plan, PORT)
    theirs = torch_parser(launch=True).parse_args([option, *value, *target])
    return plan, ours, theirs


# What ringtrain's own (not passed-through) torch options mean, checked on the Plan and on what torchrun gets.
MEANING = {
    "nnodes": lambda plan, ours, theirs: plan.nnodes == theirs.nnodes and plan.elastic and ours.nnodes == "1:2",
    "nproc_per_node": lambda plan, ours, theirs: ours.nproc_per_node == theirs.nproc_per_node,
    # c10d is torch's own backend wrapped so that it says what it waits for (launcher/waiting.py)
    "rdzv_backend": lambda plan, ours, theirs: plan.elastic and ours.rdzv_backend == (
        waiting.ELASTIC if theirs.rdzv_backend == "c10d" else theirs.rdzv_backend),
    "rdzv_endpoint": lambda plan, ours, theirs: (plan.master_addr, plan.master_port) == ("127.0.0.1", 29411),
    "rdzv_id": lambda plan, ours, theirs: ours.rdzv_id == theirs.rdzv_id,
    "rdzv_conf": lambda plan, ours, theirs: "join_timeout=77" in ours.rdzv_conf.split(","),
    "standalone": lambda plan, ours, theirs: plan.nnodes == "1" and plan.master_port is None and not plan.elastic,
    "max_restarts": lambda plan, ours, theirs: ours.max_restarts == theirs.max_restarts,
    "module": lambda plan, ours, theirs: plan.module,
    "no_python": lambda plan, ours, theirs: plan.no_python and ours.training_script_args[0] == "exec",
    "run_path": lambda plan, ours, theirs: not plan.module and not plan.no_python,  # runpy.run_path: the default
    "log_dir": lambda plan, ours, theirs: ours.log_dir == theirs.log_dir,
    "node_rank": lambda plan, ours, theirs: plan.node_rank == theirs.node_rank,
    "master_addr": lambda plan, ours, theirs: plan.master_addr == theirs.master_addr,
    "master_port": lambda plan, ours, theirs: plan.master_port == theirs.master_port,
    "use_env": lambda plan, ours, theirs: True,  # accepted; LOCAL_RANK is always in the environment
}


def test_the_option_list_is_torchs():
    assert set(flags.TORCHRUN_OPTIONS) == {"-h", "--help", *options(torch_parser())}
    assert set(flags.LAUNCH_OPTIONS) == {"-h", "--help", *options(torch_parser(launch=True))}


def test_every_torch_option_is_classified():
    dests = {a.dest for a in options(torch_parser(launch=True)).values()}
    classified = set(MEANING) | set(torchrun_flags.PASS_THROUGH_DESTS) | \
        {a.dest for s, a in options(torch_parser(launch=True)).items() if s in torchrun_flags.REFUSED}
    assert dests - classified == set(), "a torch option ringtrain run neither maps, passes on, nor refuses"
    needs = {a.dest for a in options(torch_parser()).values() if takes_value(a)}
    assert needs <= set(SAMPLES), "give the new option a sample value here"


@pytest.mark.parametrize("option", sorted(options(torch_parser(launch=True))))
def test_every_torch_option_means_what_it_means_to_torch(option, tmp_path):
    action = options(torch_parser(launch=True))[option]
    if option in torchrun_flags.REFUSED:
        with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(io.StringIO()) as err:
            _plan([option, *([SAMPLES[action.dest]] if takes_value(action) else []), _script(tmp_path)])
        assert exit_info.value.code == 2 and torchrun_flags.REFUSED[option] in err.getvalue()
        return
    plan, ours, theirs = _ours_and_torchs(option, action, tmp_path)
    if action.dest in torchrun_flags.PASS_THROUGH_DESTS:
        # handed to torchrun's agent: what its own parser made of it, exactly
        assert getattr(ours, action.dest) == getattr(theirs, action.dest), option
    else:
        assert MEANING[action.dest](plan, ours, theirs), (option, plan)


@pytest.mark.parametrize("action", [a for a in dict.fromkeys(options(torch_parser()).values())
                                    if type(a).__name__ in ("env", "check_env")], ids=lambda a: a.dest)
def test_torchruns_pet_variables_stand_for_their_flags(action, tmp_path, monkeypatch):
    """torchrun reads a left-out flag from PET_<DEST> (Kubeflow's PyTorchJob sets PET_NNODES, ...): so does
    ringtrain run, with the same meaning."""
    assert action.dest in (*flags.PET_SWITCHES, *flags.PET_VALUES)
    value = SAMPLES[action.dest].replace("LOGS", str(tmp_path)) if takes_value(action) else "1"
    monkeypatch.setenv(f"PET_{action.dest.upper()}", value)
    target = [{"no_python": sys.executable, "module": "timeit"}.get(action.dest, _script(tmp_path))]
    plan = _plan(target)
    ours, theirs = agent.torchrun_args(plan, PORT), torch_parser().parse_args(target)
    if action.dest in torchrun_flags.PASS_THROUGH_DESTS:
        assert getattr(ours, action.dest) == getattr(theirs, action.dest)
    else:
        assert MEANING[action.dest](plan, ours, theirs), plan


def _torch_outcome(parser, word: str, action) -> str | None:
    """The option torch's parser takes ``word`` for (None: it refuses it)."""
    argv = [word, SAMPLES.get(action.dest, "1")] if takes_value(action) else [word]
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            parsed = parser.parse_args([*argv, "x.py"])
        except SystemExit:
            return None
    defaults = parser.parse_args(["x.py"])
    changed = [k for k, v in vars(parsed).items() if getattr(defaults, k) != v]
    return changed[0] if changed else action.dest  # a store_true given its default: still that option


def test_abbreviations_are_torchs_and_only_torchs():
    """Every prefix of every torch option: taken for the same option as torch takes it, or refused (as torch
    does, or because a ringtrain/horovodrun flag starts with it too: then the refusal names both)."""
    parser = torch_parser(launch=True)
    table = options(parser)
    vocabulary = run.build_parser().vocabulary
    ours_only = set(vocabulary.takes) - set(table) - {"-h", "--help"}
    checked = 0
    for option, action in table.items():
        if not option.startswith("--"):
            continue
        for end in range(3, len(option)):
            word = option[:end]
            if word in table:
                continue
            theirs = _torch_outcome(parser, word, action)
            try:
                mine = vocabulary.resolve(word)
            except RingtrainError as e:
                assert "HINT:" in str(e)
                assert theirs is None or any(o.startswith(word) for o in ours_only), (word, theirs, str(e))
                continue
            finally:
                checked += 1
            if theirs is None:
                assert mine is None or mine not in table, (word, mine)  # torch refuses: never torch's meaning
            else:
                assert mine is not None and table[mine].dest == theirs, (word, mine, theirs)
    assert checked > 500


@pytest.mark.parametrize("argv, words", [
    (["--nproc", "2"], ["ambiguous option: --nproc", "--nproc-per-node", "HINT:"]),
    (["--t", "3"], ["ambiguous option: --t", "--tee", "--timeout", "HINT:"]),
    (["--mpi"], ["--mpi", "HINT: drop --mpi"]),
    (["--output-filename", "out"], ["HINT: use --log-dir DIR --tee 3"]),
    (["--config-file", "c.yaml"], ["HINT: give the settings as flags"]),
])
def test_ambiguous_and_refused_flags_exit_2_with_a_hint(argv, words, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run.main([*argv, _script(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert all(word in err for word in words), err


@pytest.mark.parametrize("option", horovod_flags.HOROVODRUN_OPTIONS)
def test_every_horovodrun_option_is_taken_or_refused_with_a_hint(option, tmp_path):
    parser = run.build_parser()
    if option in ("-h", "--help", "-v", "--version"):
        with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stdout(io.StringIO()) as out:
            parser.parse_args([option])
        assert exit_info.value.code == 0 and ("ringtrain" in out.getvalue())
        return
    refused = next((strings for strings, _, _ in horovod_flags._REFUSED_FLAGS if option in strings), None)
    takes = parser.vocabulary.takes[option]
    argv = [option, *([{"--log-level": "INFO"}.get(option, "1")] * takes), _script(tmp_path)]
    if refused:
        with pytest.raises(SystemExit) as exit_info, contextlib.redirect_stderr(io.StringIO()) as err:
            parser.parse_args(argv)
        hint = horovod_flags.REFUSED.get(refused[0]) or horovod_flags.REFUSED[refused[-1]]
        assert exit_info.value.code == 2 and f"HINT: {hint}" in err.getvalue()
    else:
        ns = parser.parse_args(argv)
        assert ns.script == argv[-1]


def test_horovodruns_abbreviations():
    vocabulary = run.build_parser().vocabulary
    assert vocabulary.resolve("--slots") == "--slots-per-host"  # `horovodrun --slots 4`, as its argparse takes it
    assert vocabulary.resolve("--host-disc") == "--host-discovery-script"
    assert vocabulary.resolve("--nnode") == "--nnodes"
    with pytest.raises(RingtrainError, match="ambiguous"):
        vocabulary.resolve("--min")  # --min-np, --min-num-proc


def test_help_lists_every_flag(capsys):
    with pytest.raises(SystemExit):
        run.main(["--help"])
    manual = capsys.readouterr().out
    shown = [o for o in (*flags.LAUNCH_OPTIONS, *horovod_flags.HOROVODRUN_OPTIONS) if "_" not in o]
    assert [o for o in shown if f"{o} " not in manual and f"{o}," not in manual and f"{o}\n" not in manual] == []
