"""Reading a script's --local_rank declaration, and the argv the worker entry builds. No processes."""

from __future__ import annotations

import os

import pytest
from _launch_util import write

from ringtrain.launcher import scripts, worker


@pytest.mark.parametrize(
    "source, expected",
    [
        ('parser.add_argument("--local_rank", type=int, default=0)', "--local_rank"),
        ("parser.add_argument('--local-rank', type=int)", "--local-rank"),
        ('p.add_argument(\n    "--local_rank",\n    type=int,\n)', "--local_rank"),
        ('parser.add_argument("--local-rank", "--local_rank", type=int)', "--local-rank"),
        ('parser.add_argument("-l", "--local_rank", type=int)', "--local_rank"),
        ('local_rank = int(os.environ["LOCAL_RANK"])', None),
        ('parser.add_argument("--rank", type=int)  # not --local_rank', None),
        ('print("--local_rank")', None),
        ("", None),
    ],
)
def test_local_rank_spelling(source, expected):
    assert scripts.local_rank_spelling(source) == expected


def test_module_file_finds_a_package_main(tmp_path, monkeypatch):
    write(tmp_path / "pkg_for_rt_test" / "__init__.py", "")
    main = write(tmp_path / "pkg_for_rt_test" / "__main__.py", "")
    monkeypatch.chdir(tmp_path)  # found from the current directory, like `python -m`
    assert os.path.samefile(scripts.module_file("pkg_for_rt_test"), main)


def test_worker_argv_puts_the_local_rank_right_after_the_script(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert worker._argv_for("t.py", "--local_rank", ["--", "x"]) == ["t.py", "--local_rank=3", "--", "x"]
    assert worker._argv_for("t.py", "none", ["--a", "1"]) == ["t.py", "--a", "1"]
