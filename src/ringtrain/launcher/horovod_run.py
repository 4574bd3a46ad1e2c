"""``horovod.run(fn, args=(), kwargs=None, np=N, ...)``: Horovod's function launcher (horovod/runner/__init__.py).

Horovod's ``pytorch_mnist.py --num-proc 2`` calls ``horovod.run(main, args=(args,), np=2, hosts=...,
use_gloo=..., use_mpi=...)``: ``main(*args, **kwargs)`` runs in ``np`` processes and the list of their return
values comes back, indexed by rank. The ``horovod`` alias package (ringtrain/horovod/_alias) exports it as
``horovod.run``; ringtrain.horovod itself imports nothing of the launcher. Here the processes are started on this machine by ``ringtrain.launch``
(its environment contract, so ``hvd.init()`` finds its rank; failures named by rank, the others stopped).

Taken as Horovod takes them: ``num_proc``/``np``, ``hosts`` or ``hostfile`` naming only this machine (with
enough slots), ``use_gloo``, ``start_timeout``, ``disable_cache``, ``verbose``, ``ssh_port``,
``ssh_identity_file``, ``network_interfaces``/``network_interface`` (Gloo's and NCCL's interface).
Refused with a HINT: MPI (``use_mpi``, ``mpi_args``), other machines, the elastic ones (``min_num_proc``,
``max_num_proc``, ``host_discovery_script``, ``reset_limit``, ``cooldown_range``, ``slots``), ``output_filename``
and another ``executable``: for those, start the script with ``ringtrain run --horovod``.
"""

from __future__ import annotations

import functools
import os
import warnings

from ..errors import RingtrainError
from . import hosts as hostlist

_SCRIPT_HINT = ("start the script's training function with `ringtrain run --horovod -np N [-H hosts] "
                "[--min-np ... --host-discovery-script ...] script.py` instead (horovodrun's command line).")


def _refuse(given: dict) -> None:
    for name, value in given.items():
        if value is not None and value is not False:
            raise RingtrainError(f"horovod.run({name}={value!r}) is not something ringtrain's horovod.run can honour",
                                 "drop it (ringtrain runs on torch.distributed, without MPI)" if "mpi" in name
                                 else _SCRIPT_HINT)


def _slots_here(hosts: str | None, hostfile: str | None) -> int | None:
    """The slots the host list gives this machine; refuses other machines."""
    if hosts is None and hostfile is None:
        return None
    listed = hostlist.parse_host_list(hosts) if hosts is not None else hostlist.read_hostfile(hostfile)
    names = hostlist.local_names()
    away = [h.name for h in listed if not hostlist.is_local(h.name, names)]
    if away:
        raise RingtrainError(f"horovod.run(hosts=...) lists {', '.join(away)}, which is not this machine: "
                             "ringtrain's horovod.run starts processes here only", _SCRIPT_HINT)
    return sum(h.slots for h in listed)


def run(func, args=(), kwargs=None, num_proc=1, min_num_proc=None, max_num_proc=None, slots=None,
        reset_limit=None, cooldown_range=None, hosts=None, hostfile=None, host_discovery_script=None,
        start_timeout=None, ssh_port=None, ssh_identity_file=None, disable_cache=None, output_filename=None,
        verbose=None, use_gloo=None, use_mpi=None, mpi_args=None, network_interface=None,
        network_interfaces=None, executable=None, np=None, min_np=None, max_np=None):
    """Run ``func(*args, **kwargs)`` in ``num_proc`` processes here; return their results, by rank."""
    if network_interface:
        network_interfaces = network_interface.split(",")
        warnings.warn("network_interface is deprecated, use network_interfaces instead", DeprecationWarning)
    for old, new in (("np", "num_proc"), ("min_np", "min_num_proc"), ("max_np", "max_num_proc")):
        if locals()[old] is not None:
            warnings.warn(f"{old} is deprecated, use {new} instead", DeprecationWarning)
    num_proc = np if np is not None else num_proc
    min_num_proc = min_np if min_np is not None else min_num_proc
    max_num_proc = max_np if max_np is not None else max_num_proc
    if hosts is not None and hostfile is not None:
        raise ValueError("Argument hosts and hostfile only allow one provided.")  # Horovod's own words
    if use_gloo and use_mpi:
        raise ValueError("Argument use_gloo and use_mpi only allow one set True.")
    _refuse({"use_mpi": use_mpi, "mpi_args": mpi_args, "min_num_proc": min_num_proc, "max_num_proc": max_num_proc,
             "host_discovery_script": host_discovery_script, "reset_limit": reset_limit,
             "cooldown_range": cooldown_range, "slots": slots, "output_filename": output_filename,
             "executable": executable})
    here = _slots_here(hosts, hostfile)
    if here is not None and num_proc > here:
        raise RingtrainError(f"horovod.run(np={num_proc}) but the hosts give this machine {here} slot(s)",
                             f"lower np to {here} or give more slots (localhost:{num_proc}).")
    if network_interfaces:
        names = ",".join(network_interfaces)
        os.environ["GLOO_SOCKET_IFNAME"] = os.environ["NCCL_SOCKET_IFNAME"] = names  # the children inherit them
    if verbose:
        print(f"horovod.run: {num_proc} process(es) on this machine (ringtrain.launch)", flush=True)
    from .spawn import launch  # imports torch

    return launch(functools.partial(func, **(kwargs or {})), num_proc, tuple(args))
