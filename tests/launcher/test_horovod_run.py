"""``horovod.run`` (ringtrain/launcher/horovod_run.py): what it refuses, before any process starts. A real run is in
tests/clients/test_clients.py (Horovod's pytorch_mnist.py --num-proc 2)."""

from __future__ import annotations

import pytest

from ringtrain.errors import RingtrainError
from ringtrain.launcher.horovod_run import run


def never(*args):
    raise AssertionError("no process may start")


@pytest.mark.parametrize("kwargs, words", [
    ({"use_mpi": True}, "use_mpi=True"),
    ({"min_num_proc": 1}, "min_num_proc=1"),
    ({"host_discovery_script": "./d.sh"}, "host_discovery_script"),
    ({"hosts": "localhost:1,192.0.2.7:1"}, "192.0.2.7, which is not this machine"),
    ({"num_proc": 3, "hosts": "localhost:2"}, "horovod.run(np=3) but the hosts give this machine 2 slot(s)"),
])
def test_what_it_cannot_do_is_refused_with_a_hint(kwargs, words):
    with pytest.raises(RingtrainError, match="HINT") as error:
        run(never, **kwargs)
    assert words in str(error.value)


def test_horovods_own_argument_errors():
    with pytest.raises(ValueError, match="hosts and hostfile"):
        run(never, hosts="localhost:1", hostfile="h.txt")
    with pytest.raises(ValueError, match="use_gloo and use_mpi"):
        run(never, use_gloo=True, use_mpi=True)


def test_the_alias_exports_it():
    import importlib.util
    import os
    import sys

    import ringtrain.horovod

    alias = os.path.join(os.path.dirname(ringtrain.horovod.__file__), "_alias")
    sys.path.insert(0, alias)
    try:
        spec = importlib.util.find_spec("horovod")
        assert spec is not None and spec.origin.startswith(alias)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        assert module.run is run and module.__version__ == "0.28.1"
    finally:
        sys.path.remove(alias)



def test_python_m_ringtrain_horovod(capsys, tmp_path):
    from ringtrain.horovod import __main__ as entry

    entry.main(["--path"])
    assert capsys.readouterr().out.strip() == entry.ALIAS
    for argv, words in (([], "HINT: give the Horovod script"), ([str(tmp_path / "nope.py")], "is not a file")):
        with pytest.raises(SystemExit) as exit_info:
            entry.main(argv)
        assert words in str(exit_info.value.code)
