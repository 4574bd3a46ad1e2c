"""The `ringtrain` command's cheap paths: manuals, `env`, and arguments refused before anything starts."""

from __future__ import annotations

import os
import time

import pytest
from _launch_util import ALLREDUCE, outputs, run_ringtrain, write

from ringtrain import cli
from ringtrain.launcher import run


def test_top_level_help_lists_the_commands(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "run" in out and "env" in out


def test_unknown_command_exits_2_with_a_hint(capsys):
    assert cli.main(["runn"]) == 2
    assert "HINT:" in capsys.readouterr().err


def test_run_help_is_the_manual(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["run", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for section in ("Usage", "Examples", "Environment variables set for workers", "Failure modes", "--nproc-per-node"):
        assert section in out
    options = out.split("options:")[1].split("Usage")[0]
    assert "--nproc_per_node" not in options  # the alias works but stays out of the option list


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--nproc-per-node", "0"], "--nproc-per-node 0"),
        (["--nproc-per-node", "-3"], "--nproc-per-node -3"),
        (["--nproc-per-node", "many"], "'many'"),
        (["--node-rank", "2", "--nnodes", "2"], "--node-rank 2"),
        (["--nnodes", "3:2"], "--nnodes '3:2'"),
        (["--gpus", "0,x"], "--gpus '0,x'"),
        (["--gpus", "0,1", "--nproc-per-node", "3"], "--gpus lists only 2"),
        (["--master-port", "70000"], "--master-port 70000"),
        (["--timeout", "0"], "--timeout 0"),
        # Issue 37, item 9: numbers refused up front with a HINT, not by a traceback or torchelastic's assert later.
        (["--timeout", "100000000000000000000"], "--timeout 100000000000000000000: must be 1 to"),
        (["--monitor-interval", "0"], "--monitor-interval 0.0"),
        (["--monitor-interval", "-1"], "--monitor-interval -1.0"),
        (["--monitor-interval", "nan"], "--monitor-interval nan"),
        (["--monitor-interval", "inf"], "--monitor-interval inf"),
        (["--shutdown-timeout", "-1"], "--shutdown-timeout -1"),
        (["--nproc-per-node", ""], "--nproc-per-node '' is empty"),
    ],
)
def test_bad_arguments_exit_2_with_a_hint(tmp_path, capsys, argv, needle):
    script = write(tmp_path / "train.py", ALLREDUCE)
    assert run.main([*argv, str(script)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "HINT:" in err, err


@pytest.mark.parametrize("gpus", [[], ["--gpus", "0,1"]])
def test_nproc_gpu_without_a_gpu_is_refused_even_with_gpus_listed(tmp_path, capsys, monkeypatch, gpus):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # this machine, with or without a GPU
    script = write(tmp_path / "train.py", ALLREDUCE)
    assert run.main(["--nproc-per-node", "gpu", *gpus, str(script)]) == 2
    err = capsys.readouterr().err
    assert "torch sees no CUDA GPU here" in err and "HINT:" in err, err


def test_missing_script_and_module_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run.main(["--nproc-per-node", "2", "no_such_script.py"]) == 2
    err = capsys.readouterr().err
    assert "no_such_script.py" in err and "HINT:" in err
    assert run.main(["-m", "no_such_module_xyz"]) == 2
    err = capsys.readouterr().err
    assert "no_such_module_xyz" in err and "HINT:" in err


def test_unknown_flag_exits_2_with_a_hint(capsys):
    with pytest.raises(SystemExit) as exit_info:
        run.main(["--nproc", "2", "train.py"])  # abbreviations are refused, not guessed
    assert exit_info.value.code == 2
    assert "HINT:" in capsys.readouterr().err


@pytest.mark.timeout(60)
def test_bad_arguments_through_the_console_are_fast(tmp_path):
    start = time.monotonic()
    proc = run_ringtrain("run", "--nproc-per-node", "0", str(tmp_path / "missing.py"), timeout=45)
    assert proc.returncode == 2, outputs(proc)
    assert "HINT:" in proc.stderr and "Traceback" not in proc.stderr, outputs(proc)
    assert time.monotonic() - start < 30


@pytest.mark.timeout(60)
def test_env_reports_versions_and_backends():
    import torch

    proc = run_ringtrain("env", timeout=45)
    assert proc.returncode == 0, outputs(proc)
    assert torch.__version__ in proc.stdout
    assert "gloo" in proc.stdout
    assert "detected environment" in proc.stdout


@pytest.mark.parametrize("with_main", [False, True])
def test_a_folder_as_the_script_exits_2_with_a_hint(tmp_path, capsys, with_main):
    folder = tmp_path / "project"
    write(folder / "train.py", ALLREDUCE)
    if with_main:
        write(folder / "__main__.py", ALLREDUCE)
    assert run.main(["--nproc-per-node", "2", str(folder) + os.sep]) == 2
    err = capsys.readouterr().err
    assert "is a folder" in err and "HINT:" in err, err
    assert ("__main__.py" in err) == with_main, err


def test_a_log_dir_that_is_a_file_is_refused(tmp_path, capsys):
    script = write(tmp_path / "train.py", ALLREDUCE)
    (tmp_path / "logs").write_text("")
    assert run.main(["--log-dir", str(tmp_path / "logs"), str(script)]) == 2
    err = capsys.readouterr().err
    assert "is not a folder (a file is there)" in err and "HINT:" in err, err


@pytest.mark.parametrize("value", ["nan", "inf", "-5"])
def test_a_stall_warning_the_watchdog_could_never_fire_on_is_refused(tmp_path, capsys, monkeypatch, value):
    monkeypatch.setenv("RINGTRAIN_STALL_WARNING", value)
    script = write(tmp_path / "train.py", ALLREDUCE)
    assert run.main([str(script)]) == 2
    err = capsys.readouterr().err
    assert f"RINGTRAIN_STALL_WARNING={value!r}" in err and "HINT:" in err, err


def test_gpus_this_machine_lacks_are_refused(tmp_path, capsys, monkeypatch):
    from ringtrain.launcher import env_info

    monkeypatch.setattr(env_info, "cuda_gpus", lambda: 0)
    script = write(tmp_path / "train.py", ALLREDUCE)
    assert run.main(["--gpus", "0,1", "--nproc-per-node", "2", str(script)]) == 2
    err = capsys.readouterr().err
    assert "--gpus 0,1 names GPU(s) [0, 1], but torch sees no CUDA GPU here" in err and "HINT:" in err, err


def test_an_unreadable_script_is_refused(tmp_path, capsys, monkeypatch):
    import builtins

    script = write(tmp_path / "train.py", ALLREDUCE)
    real_open = builtins.open

    def denied(path, *args, **kwargs):  # root reads any file: the permission error is played
        if str(path) == str(script):
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", denied)
    assert run.main([str(script)]) == 2
    err = capsys.readouterr().err
    assert "cannot be read (Permission denied)" in err and "HINT: make it readable" in err, err
