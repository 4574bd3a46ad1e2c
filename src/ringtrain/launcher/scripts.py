"""Look at the user's script before launching it: where it is, and which ``--local_rank`` it wants.

Old launchers (``torch.distributed.launch`` without ``--use-env``) passed the local rank as
a command-line argument, so a generation of tutorials parse it strictly::

    parser.add_argument("--local_rank", type=int)
    args = parser.parse_args()

torch 2.0 changed the spelling it passes to ``--local-rank`` and scripts that declare only
``--local_rank`` die with "unrecognized arguments: --local-rank=0" (the "versionchanged::
2.0.0" note atop torch/distributed/run.py; reports such as XPixelGroup/BasicSR#626 and
microsoft/LoRA#79). Scripts written for torchrun read
``LOCAL_RANK`` from the environment instead and declare neither, so passing any spelling
to them is just as fatal. The only safe rule is to pass exactly the spelling the script
declares, and nothing when it declares none. Reading the source is a heuristic, but the
declaration is almost always a literal in an ``add_argument(`` call.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import sys

from ..errors import RingtrainError

DASHED = "--local-rank"
UNDERSCORED = "--local_rank"

# add_argument( ... "--local_rank" | '--local-rank' ...  -- the flag may sit on a later line
# of the call, after other option strings, but before the call's closing parenthesis.
_DECLARATION = re.compile(r"""add_argument\(\s*[^)]*?(['"])(--local[-_]rank)\1""")


def local_rank_spelling(source: str) -> str | None:
    """The ``--local_rank`` spelling a script's argparse declares: DASHED, UNDERSCORED or None.

    When both are declared (``add_argument("--local-rank", "--local_rank")``, what torch's
    docs recommend) the dashed one, which is what torchrun itself would pass.
    """
    found = {match.group(2) for match in _DECLARATION.finditer(source)}
    if DASHED in found:
        return DASHED
    if UNDERSCORED in found:
        return UNDERSCORED
    return None


# init_method="tcp://host:port" written as a literal (seed 004's `init_method='tcp://127.0.0.1:23456'`).
_TCP_INIT = re.compile(r"""init_method\s*=\s*(['"])tcp://(\[[^\]]+\]|[^:'"/]+):(\d+)\1""")


def imports_horovod(source: str) -> bool:
    """Does the script import Horovod (``import horovod.torch as hvd``, ``from horovod import ...``)?"""
    return re.search(r"^\s*(import\s+horovod\b|from\s+horovod(\.\w+)*\s+import\b)", source, re.M) is not None


def horovod_installed() -> bool:
    """A real Horovod in this environment (its own package, not ringtrain's alias)."""
    import importlib.util

    return importlib.util.find_spec("horovod") is not None


def tcp_rendezvous(source: str) -> tuple[str, int] | None:
    """The (host, port) of a literal ``init_method="tcp://host:port"`` in the script, if it has one.

    Under a torchrun-style launcher every worker joins the launcher's store as a client
    (``TORCHELASTIC_USE_AGENT_STORE``, also for ``tcp://``): at any other port nobody listens
    and the workers wait until their timeout. So the launcher hosts its store there.
    """
    found = {(m.group(2).strip("[]"), int(m.group(3))) for m in _TCP_INIT.finditer(source)}
    return found.pop() if len(found) == 1 else None


def read_source(path: str) -> str:
    """The text of ``path``, or "" when it is not readable text (a compiled module, a zip)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


_INTERPRETER = re.compile(r"^python(\d+(\.\d+)?)?$")
_HARMLESS_FLAGS = ("-u", "-B", "-O", "-OO", "-s", "-E")  # they change nothing ringtrain's workers rely on


def strip_interpreter(target: str, args: list[str], module: bool) -> tuple[str, list[str], bool]:
    """``python train.py a b`` -> ``train.py a b``; ``python -m pkg.mod a`` -> module ``pkg.mod a``.

    horovodrun takes a whole command (``horovodrun -np 2 python train.py``); ringtrain's workers
    already run under this interpreter, so a leading ``python``/``python3``/``python3.11`` or the
    path of an interpreter is dropped, with the interpreter flags that change nothing here.
    """
    if module or not (_INTERPRETER.match(os.path.basename(target)) or os.path.realpath(target) == os.path.realpath(sys.executable)):
        return target, args, module
    rest = list(args)
    while rest and rest[0] in _HARMLESS_FLAGS:
        rest.pop(0)
    if rest[:1] == ["-m"] and len(rest) > 1:
        return rest[1], rest[2:], True
    if not rest or rest[0].startswith("-"):
        raise RingtrainError(
            f"`{' '.join([target, *args])}`: after the interpreter, ringtrain expects a script or -m module",
            "write `ringtrain run [options] train.py args` (or `... python train.py args`, as with horovodrun).",
        )
    return rest[0], rest[1:], False


def check_script(path: str) -> str:
    """Fail early (exit code 2) when the script to launch does not exist or is a folder.

    A folder would otherwise reach every worker and fail there, once per rank, with
    runpy's ImportError ("can't find '__main__' module"). Even a folder that has a
    ``__main__.py`` is refused: the worker puts the script's parent folder on sys.path
    the way ``python script.py`` does, which is not what ``python DIR`` does, so the
    user names the file (or the package, with -m) and gets exactly what they asked for.
    """
    if os.path.isdir(path):
        main = os.path.join(path, "__main__.py")
        hint = (
            f"give the file to run: {main!r}, or run the package with -m from its parent folder."
            if os.path.isfile(main)
            else "give the path to the .py file to run inside it (e.g. train.py), or use -m for a module."
        )
        raise RingtrainError(f"training script {path!r} is a folder, not a file", hint)
    if not os.path.exists(path):
        raise RingtrainError(
            f"training script {path!r} does not exist (looked from {os.getcwd()})",
            "give the path to a .py file, relative to the current directory, or use -m for a module.",
        )
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as e:  # unreadable: every worker would fail with runpy's traceback
        raise RingtrainError(f"training script {path!r} cannot be read ({e.strerror or e})",
                             f"make it readable by this user (ls -l {path}; chmod u+r {path}).") from e
    return path


def check_program(target: str, module: bool) -> str:
    """``--no-python`` (torchrun's): the target is a program (a path, or a command on PATH) executed as it is."""
    if module:
        raise RingtrainError("--no-python with -m/--module: a module needs Python",
                             "give one of them (torchrun refuses both too).")
    if shutil.which(target) is None:
        raise RingtrainError(f"--no-python: {target!r} is neither an executable file nor a command on PATH",
                             "give the program's path (chmod +x it), or a command such as `--no-python bash train.sh`.")
    return target


def module_file(name: str) -> str | None:
    """The file ``python -m name`` would run, found the way the worker will look for it.

    Workers run modules with ``sys.path[0]`` = the current directory, like ``python -m``,
    so look there first. For a package, ``-m`` runs its ``__main__`` module. Returns None
    when the module exists but its source cannot be located (a namespace package, a
    compiled extension), or when importing a parent package fails: that error belongs in
    the workers' traceback, not here.
    """
    sys.path.insert(0, os.getcwd())
    try:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations is not None:
            spec = importlib.util.find_spec(name + ".__main__")
    except ModuleNotFoundError as e:
        raise _no_module(name) from e
    except Exception:  # a parent package failed to import: let the worker show its traceback
        return None
    finally:
        sys.path.pop(0)
    if spec is None:
        raise _no_module(name)
    return spec.origin if spec.origin and os.path.isfile(spec.origin) else None


def _no_module(name: str) -> RingtrainError:
    return RingtrainError(
        f"no module named {name!r} (searched the current directory {os.getcwd()} and sys.path)",
        "run from the directory that contains the package, or add it to PYTHONPATH; "
        "for a package, -m runs its __main__.py.",
    )
