"""ringtrain run: start a training script as N processes per node, on one machine or many.

Usage
-----

    ringtrain run [options] script.py [script args ...]
    ringtrain run [options] -m package.module [module args ...]

Everything after the script (or module) name is passed to it untouched. Each process
(a "worker") runs the script as ``python script.py args`` would, with the variables
below telling it its place in the job. ``ringtrain run`` is torchrun's elastic agent
(``torch.distributed.run``) with safer defaults: a free port on a single node, a
rendezvous (and Gloo) that listen on loopback only when the job is on one machine, a
timeout on joining, restarts that start from a clean store, workers that die with the
launcher, both spellings of ``--local_rank`` for old scripts, and a short report naming
the rank that failed first.

Examples
--------

One node, 4 workers (one per GPU with NCCL, or 4 CPU processes with Gloo)::

    ringtrain run --nproc-per-node 4 train.py --epochs 10

One worker per GPU, only on GPUs 2 and 3 (workers see them as cuda:0 and cuda:1)::

    ringtrain run --nproc-per-node gpu --gpus 2,3 train.py

Two nodes with 8 workers each: run the same command on both, changing only
``--node-rank``; ``--master-addr`` is node 0's address, reachable from node 1::

    # on 10.0.0.1
    ringtrain run --nnodes 2 --node-rank 0 --nproc-per-node 8 \\
        --master-addr 10.0.0.1 --master-port 29500 train.py
    # on the other node
    ringtrain run --nnodes 2 --node-rank 1 --nproc-per-node 8 \\
        --master-addr 10.0.0.1 --master-port 29500 train.py

A module, as ``python -m`` would run it (found from the current directory and PYTHONPATH)::

    ringtrain run --nproc-per-node 2 -m mypkg.train --lr 0.1

A legacy script written for ``python -m torch.distributed.launch``, which parses
``--local_rank`` (or ``--local-rank``) with a strict ``parse_args()``, runs unchanged::

    ringtrain run --nproc-per-node 2 old_train.py

ringtrain reads the script and passes ``--local_rank=N`` or ``--local-rank=N`` (right
after the script name) only if the script declares that spelling in ``add_argument``,
and nothing to scripts that read ``LOCAL_RANK`` from the environment. (Plain torchrun
passes nothing; torch.distributed.launch always passes ``--local-rank``, which breaks
scripts declaring only ``--local_rank``: "unrecognized arguments: --local-rank=0".)

Elastic jobs (``--nnodes MIN:MAX``, equal ends too: ``--nnodes 2:2``) use torchrun's c10d rendezvous on
``--master-addr:--master-port`` (or ``--rdzv-endpoint``); ``--node-rank`` is then ignored: the
rendezvous numbers the nodes, so every node runs the same command. The job starts once MIN
nodes have joined and no more arrived for ``--timeout``/2 seconds (at most 30)::

    ringtrain run --nnodes 1:4 --nproc-per-node 8 --max-restarts 3 \\
        --master-addr 10.0.0.1 --master-port 29500 train.py

A node that joins a running elastic job (up to MAX) is admitted at the next round: every
agent stops its workers and starts them again at the new world size (this restart does
not count against ``--max-restarts``), and the script resumes from its newest checkpoint
(see "Restarts and resuming"); the joining node waits up to ``--timeout`` for that round.
A node beyond MAX is kept as a spare, past ``--timeout`` (torch's rule): it says so every
10 s, joins when a node leaves, and exits 1 with the reason if the job ends first.

torchrun's flags
----------------

Every flag of ``torchrun`` and ``python -m torch.distributed.launch`` (torch 2.13) is taken, in both
spellings and with the abbreviations their parser takes (``--nnode=1`` for ``--nnodes``; an
abbreviation of several flags, such as ``--nproc``, is refused), so a tutorial's command line runs with
``torchrun`` replaced by ``ringtrain run``::

    ringtrain run --standalone --nproc_per_node=2 multigpu_torchrun.py 50 10
    ringtrain run --nnodes=2 --nproc_per_node=4 --rdzv_id=456 --rdzv_backend=c10d \\
        --rdzv_endpoint=10.0.0.1:29603 multinode.py 50 10          # on every node
    ringtrain run --nnode=1 --node_rank=0 --nproc_per_node=2 example.py

* ``--standalone``: one node, a free port on this machine (what ringtrain does anyway with one node);
  explicit rendezvous flags are ignored, as torchrun ignores them.
* ``--rdzv-backend static`` (the default): fixed node ranks, the store on node 0;
  ``--rdzv-endpoint HOST:PORT`` replaces ``--master-addr``/``--master-port``. ``c10d`` (or ``etcd``,
  ``etcd-v2``): nodes join by rendezvous at ``--rdzv-endpoint`` (port 29400 when left out), as with
  ``--nnodes MIN:MAX``. ``--rdzv-id`` is the job's id (``TORCHELASTIC_RUN_ID``); ``--rdzv-conf K=V,...``
  goes to the rendezvous over ringtrain's settings (``join_timeout``, ``last_call_timeout``: from
  ``--timeout``).
* ``--monitor-interval``, ``--start-method``, ``--event-log-handler``, ``--role``, ``-r/--redirects``,
  ``-t/--tee`` (with ``--log-dir``), ``--local-ranks-filter``, ``--duplicate-stdout-filters``,
  ``--duplicate-stderr-filters``, ``--local-addr``, ``--logs-specs``, ``--numa-binding``,
  ``--signals-to-handle`` (not SIGUSR1: ringtrain's stack request), ``--shutdown-timeout``,
  ``--virtual-local-rank``: handed to torchrun's agent as given; they mean what torchrun says.
* ``--no-python``: the target is a program (``--no-python bash train.sh``), executed in each worker as
  it is; ``--run-path`` is what ringtrain's worker always does (``runpy.run_path``); ``--use-env`` changes
  nothing (``LOCAL_RANK`` is always set, and ``--local_rank``/``--local-rank`` is passed only to scripts that
  declare it).
* A flag left out is read from ``PET_<NAME>`` where torchrun reads one (``PET_NNODES``,
  ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR``, ``PET_RDZV_ENDPOINT``, ...: what
  Kubeflow's PyTorchJob sets), so ``ringtrain run train.py`` takes torchrun's place there too.

Horovod scripts
---------------

A script written for Horovod (``import horovod.torch as hvd``) runs unchanged with
``--horovod``; Horovod itself is not needed (its last release does not build against
current PyTorch). ringtrain's ``horovod`` package, a re-export of ``ringtrain.horovod``,
is put first on the workers' ``PYTHONPATH``: the name resolves for the workers (and the
processes they start) only, and nothing is installed. The flags of ``horovodrun`` work
too, with or without ``--horovod``::

    ringtrain run --horovod -np 4 train.py                  # horovodrun -np 4 train.py: 4 processes here
    ringtrain run --horovod -np 8 -H node1:4,node2:4 train.py
    ringtrain run --horovod -np 8 --hostfile hosts.txt train.py
    ringtrain run --horovod -np 2 -H localhost:1,127.0.0.1:1 train.py   # two nodes on this machine
    ringtrain run --horovod -np 8 -H node1:4,node2:4 --ssh-port 2222 --ssh-identity-file ~/.ssh/cluster train.py

* ``-np N``: processes in the whole job (default with a host list: every slot). Alone it
  is ``--nproc-per-node N``, one node.
* ``-H host1:N1,host2:N2`` (``--hosts``; ``host`` alone has 1 slot, IPv6 as ``[::1]:2``) or
  ``--hostfile FILE`` with lines ``host slots=N`` (``#`` comments and blank lines skipped):
  the nodes, in order; the first host is node 0 (the master). The ``-np`` processes fill
  the hosts' slots in that order, as horovodrun does (``-np 3 -H a:2,b:2`` runs 2 on ``a``
  and 1 on ``b``, ranks 0-1 on ``a``); nodes may run different numbers of processes.
  ``--nproc-per-node``, ``--nnodes`` and ``--node-rank`` come from the list and cannot be
  given with it.
* One command starts one ``ringtrain run`` agent per host (``--nnodes K --node-rank i``),
  waits for all, and exits with the first failing node's exit code after stopping the
  others; Ctrl-C or SIGTERM stops every node. Nodes print to this terminal.
* This machine starts its node here, without ssh: ``localhost``, ``127.0.0.1``, ``::1``,
  its host name (short or fully qualified) and the addresses that name resolves to. When
  every host is this machine, the nodes meet on 127.0.0.1 on a free port (a way to try a
  multi-node job on one machine: each node's local ranks start at 0, on the same GPUs).
* Every other host is started over ssh, other loopback addresses included, as horovodrun
  does: ``-H 127.0.0.1:1,127.0.0.2:1`` runs node 1 over ssh to 127.0.0.2 (this machine, if an
  sshd listens there), which tries the ssh path of a multi-node job on one machine. The command:
  ``ssh -o BatchMode=yes -tt -o StrictHostKeyChecking=accept-new [-p PORT] [-i FILE] HOST 'cd CWD &&
  exec env VARS PYTHON -m ringtrain run --nnodes K --node-rank i --master-addr FIRST_HOST
  --master-port P ... train.py args'``, with ``-p``/``-i`` from ``--ssh-port``/``--ssh-identity-file``
  (horovodrun's flags; ssh's own defaults and ``~/.ssh/config`` apply otherwise). This needs
  passwordless ssh from here to every host (BatchMode: never a password prompt). Host keys:
  a host never connected to before has its key learnt (added to ``~/.ssh/known_hosts``), and
  a host whose key changed since is refused (OpenSSH's ``accept-new``; horovodrun turns
  checking off and accepts both). ``--ssh-strict-host-keys`` drops ``accept-new``: ssh's own
  setting then applies, by default refusing a host whose key is not yet known (connect to it
  once with plain ssh first). It also needs the same current directory, script, ``PYTHON``
  (this interpreter's absolute path: the same virtual environment) and ringtrain on every
  host. ``-tt`` makes a stopped launcher hang up the remote agents, which then stop their
  workers. VARS are this shell's
  ``PYTHONPATH``, ``LD_LIBRARY_PATH``, ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``,
  ``CUDA_VISIBLE_DEVICES`` and ``NCCL_*``, ``GLOO_*``, ``TORCH_*``, ``HOROVOD_*``,
  ``RINGTRAIN_*``; set anything else in the hosts' login environment. The first host is
  the master: the other nodes reach it by its name as listed (so it cannot be
  ``localhost`` when other hosts are other machines), or by ``--master-addr``; the port is
  ``--master-port`` (default 29500, or a free one when every host is this machine), open
  between the hosts. ``--gpus``,
  ``--max-restarts``, ``--timeout`` and ``--log-dir`` apply to every node.

Every other flag of ``horovodrun`` (horovod 0.28.1) is taken too:

* ``--gloo`` (what ringtrain runs: torch.distributed's Gloo, NCCL for GPU tensors), ``--disable-cache``
  (nothing is cached), ``--tcp`` (``NCCL_IB_DISABLE=1``), ``--start-timeout S`` (= ``--timeout S``),
  ``--network-interface(s)`` (``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``), ``--timeline-filename
  FILE.json`` (= ``--timeline FILE.json``), ``--no-stall-check`` / ``--stall-check-warning-time-seconds S``
  (``RINGTRAIN_STALL_WARNING``), ``--reset-limit K`` (= ``--max-restarts K``), ``--verbose`` (prints the
  rendezvous and the variables set), ``-v`` (versions); abbreviations as horovodrun's parser takes them
  (``--slots 4`` for ``--slots-per-host 4``).
* Horovod's tuning and logging knobs (``--fusion-threshold-mb``, ``--cycle-time-ms``, ``--autotune``,
  ``--hierarchical-allreduce``, ``--log-level``, ...) set the ``HOROVOD_*`` variable horovodrun sets;
  ringtrain's Horovod reads the fusion threshold and cycle time, and says so for the others, which tune
  Horovod's C++ core.
* Refused, each with a HINT: ``--mpi``, ``--jsrun``, ``--mpi-args``, ``--binding-args``,
  ``--output-filename`` (use ``--log-dir DIR --tee 3``), ``--config-file``, ``--check-build``,
  ``--blacklist-cooldown-range``, ``--prefix-output-with-timestamp``.

Elastic Horovod (``--min-np``, ``--max-np``, ``--host-discovery-script``, ``--slots-per-host``,
``--elastic-timeout``)::

    ringtrain run --horovod -np 2 --min-np 1 --max-np 4 --host-discovery-script ./discover.sh \\
        python pytorch_mnist_elastic.py

The script prints the hosts, ``host`` or ``host:slots`` per line; it is asked (every second, up to
``--start-timeout``, 30 s) until the hosts have ``-np`` slots. The job then runs ``-np`` processes or more,
up to ``--max-np`` and the slots found, one node per host as with ``-H``, the nodes meeting in torchrun's
elastic rendezvous. ``hvd.elastic.run`` recovers from a failed collective every process survives; a
worker that dies restarts every worker (``--reset-limit``), and the script starts again from the top.
A host the script starts to print while the job runs is not added to it.

``horovod.run(fn, args=(), kwargs=None, np=N, ...)`` (Horovod's ``pytorch_mnist.py --num-proc 2``) runs
``fn`` in N processes on this machine and returns their results, by rank. Outside ``ringtrain run``,
``horovod`` is importable with ``python -m ringtrain.horovod pytorch_mnist.py --num-proc 2``, or
``PYTHONPATH=$(python -m ringtrain.horovod --path) python pytorch_mnist.py --num-proc 2``.

Restarts and resuming
---------------------

With ``--max-restarts K``, a worker that fails makes the agent stop every worker of its
node and start them all again, up to K times (an elastic job also restarts its workers
when nodes join or leave). ``TORCHELASTIC_RESTART_COUNT`` tells the script which attempt
it is. The script runs again from the top, so it must resume by itself;
``ringtrain.Ring(checkpoint_dir="ckpt", save_every=N)`` does that in ``ring.setup`` from the
newest complete checkpoint (printing ``ringtrain: resumed from ...``): model, optimizer,
gradient scaler, epoch and step, each rank's RNG, and the position inside the epoch of
every ``ring.loader``. The run then ends with the parameters an uninterrupted run would
have, every sample trained on as often; the steps after that checkpoint (fewer than N)
are done again.

Each attempt's workers get a new, empty store (``MASTER_PORT`` changes from the second
attempt on): torchrun 2.13 hands restarted workers the previous attempt's store, where
they can read a dead peer's address and fail to connect (see rendezvous.py).

When the world size changes on restart (an elastic job restarting with another number
of nodes, or a job resumed with another ``--nproc-per-node``), ``ring.setup`` still loads
the newest checkpoint, and:

* model, optimizer, gradient scaler, epoch and optimizer-step count are restored as saved;
* each rank's RNG state is restored only if the world size is unchanged (the states are
  per rank); otherwise every rank keeps the stream ``Ring(seed=s)`` gave it (s + rank):
  deterministic, but not the stream an uninterrupted run would have drawn;
* the data is re-sharded deterministically: an epoch's order depends only on the seed
  and the epoch, and rank r of W takes every W-th sample of it. A checkpoint records,
  with each loader's position, how many samples of the epoch's order all ranks had
  trained together (P = batches x B x W_old). Resumed on another number of ranks, the
  rest of that epoch's order (from position P on) is sharded across the new ranks, so no
  sample of the epoch is skipped or trained twice (tests/test_faults.py shows it); only
  DistributedSampler's wrap-around padding of the last batch differs. This holds for the
  loaders ``ring.loader`` shards itself; a sampler you pass is resumed per rank;
* the global batch becomes per-device batch x new world size x accumulation: adjust the
  learning rate yourself if that matters.

Environment variables set for workers
-------------------------------------

The torchrun contract, so ``dist.init_process_group(backend)`` (``env://``) and
``ringtrain.Ring`` work with no arguments:

* ``RANK``, ``WORLD_SIZE`` - global rank of this worker, and number of workers in the job.
* ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` - rank among, and number of, workers on this node.
  Use ``LOCAL_RANK`` as the GPU index.
* ``GROUP_RANK`` - this node's rank (``--node-rank``). Also ``ROLE_RANK``, ``ROLE_WORLD_SIZE``.
* ``MASTER_ADDR``, ``MASTER_PORT`` - where the job's TCPStore runs. It is hosted by the
  ``ringtrain run`` process of node 0 (``TORCHELASTIC_USE_AGENT_STORE=True``): workers
  join it as clients, they must not open their own store on that port.
* ``TORCHELASTIC_RUN_ID``, ``TORCHELASTIC_RESTART_COUNT``, ``TORCHELASTIC_MAX_RESTARTS``,
  ``TORCHELASTIC_ERROR_FILE`` (where a worker's traceback is written for the report).
* ``OMP_NUM_THREADS=1`` when it is unset and there is more than one worker per node, as
  torchrun does (with the same warning); set it yourself to tune CPU threads.
* ``CUDA_VISIBLE_DEVICES`` when ``--gpus`` is given.
* ``RINGTRAIN_TIMELINE`` (the folder) when ``--timeline DIR`` is given.
* With ``--horovod``, Horovod's variables, from the ones above: ``HOROVOD_RANK`` (=
  ``RANK``), ``HOROVOD_SIZE`` (``WORLD_SIZE``), ``HOROVOD_LOCAL_RANK`` (``LOCAL_RANK``),
  ``HOROVOD_LOCAL_SIZE`` (``LOCAL_WORLD_SIZE``), ``HOROVOD_CROSS_RANK`` (``GROUP_RANK``, the
  node rank), ``HOROVOD_CROSS_SIZE`` (the number of nodes), ``HOROVOD_HOSTNAME`` (this
  machine's host name); and ``PYTHONPATH`` starts with ringtrain's ``horovod`` alias. With
  uneven slots Horovod counts cross rank and size only over the nodes that have this
  local rank: ``hvd.cross_rank()``/``hvd.cross_size()`` give those.
* ``GLOO_SOCKET_IFNAME`` = the loopback interface (``lo``) when the job is on one machine
  (a loopback ``--master-addr``) and it is unset, so that Gloo listens on
  127.0.0.1 only instead of the address the host name resolves to.
* For elastic jobs, the agent runs with ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` unless it
  is set: rank 0's worker then hosts the workers' store (a new one for every attempt),
  and ``TORCHELASTIC_USE_AGENT_STORE`` is ``False``.

Seeing where a step goes
------------------------

``--timeline DIR`` sets ``RINGTRAIN_TIMELINE=DIR`` for the workers: every ring (and ``hvd.init()``)
records its rank's steps — data wait, forward, backward, each gradient bucket's all-reduce (start,
end, bytes), optimizer step, checkpoint, the ring's collectives — and writes its part,
``DIR/timeline.rank-R.json``, when it closes; nobody waits for anybody. The last rank to finish merges
the parts into ``DIR/timeline.json`` (one Chrome trace, a lane per rank: open it in
https://ui.perfetto.dev or chrome://tracing) and ``DIR/timeline.png`` (per rank, the mean ms per step
in data, forward, backward, all-reduce not hidden, optimizer, and how much of the all-reduce hid
under backward; the last steps as a Gantt chart). If a rank died, ``ringtrain run`` merges after the
job and names the ranks that left no part; ``ringtrain timeline DIR`` merges by hand. The last
1,000 steps of each rank are kept. Scripts that do not train through a ring or ``hvd`` record
nothing. Off, nothing is recorded and DDP keeps its built-in all-reduce; ranks on several hosts are
as aligned as the hosts' clocks.

Failure modes
-------------

1. A worker raises an exception or exits non-zero: the agent stops every worker on its
   node, ringtrain prints which rank failed first (global and local rank, host, exit
   code or signal) with its traceback, and exits 1. The processes a failed worker started
   itself (its process group) are stopped too, whether the worker ended by itself or was
   killed by a signal, so none holds the launcher's output open. Workers on other nodes find their
   peers gone; their next collective fails and their nodes exit too. With
   ``--max-restarts K`` the node's workers are restarted up to K times first (your
   script must resume from its checkpoint).
2. A worker killed by a signal (the OOM killer, a segfault): reported with the signal
   name; check ``dmesg``.
3. The master is unreachable (wrong ``--master-addr``, firewall, node 0 not started):
   every 10 s a non-zero node prints what it waits for and why ("waiting for node 0 at
   10.0.0.1:29500 to answer (connection refused), 20 s of --timeout 300"); after
   ``--timeout`` seconds it names the address and exits 1. A failure that comes before the
   timeout says what happened instead (the address does not resolve, the connection was
   refused, the port is taken) and after how long.
4. Nodes that never arrive: every node prints, every 10 s, how many are missing
   ("waiting for 1 of 2 nodes at 10.0.0.1:29500, 20 s of --timeout 300"; an elastic job:
   "waiting for the nodes of the elastic job ..."); node 0 exits 1 after ``--timeout``
   seconds.
5. ``--master-port`` already in use on node 0: an error naming the port, before any
   worker starts. On a single node, omit ``--master-port`` and a free one is picked.
6. Wrong arguments (``--nproc-per-node 0``, ``--node-rank`` >= ``--nnodes``, a missing
   script, ``--gpus`` not a list of integers, a bad ``-H`` or hostfile, ``-np`` above the
   hosts' slots, ``-np`` and ``--nproc-per-node`` disagreeing, ``--nnodes`` above 65,536,
   more ranks than torch can number) and what this machine cannot run (on node 0 of a
   fixed-size job, a ``--master-addr`` that is not one of this machine's addresses, or more
   nodes than ``ulimit -n`` lets node 0 connect to): exit code 2 and a HINT, before anything
   starts. More than 4 workers per usable CPU core (or per visible GPU) start, after a
   warning.
7. Ctrl-C or SIGTERM to ``ringtrain run``: forwarded to the workers, which are stopped;
   exit code 128 + the signal number. With a host list, forwarded to every node's agent
   (remote ones through their ssh connection).
8. ``ringtrain run`` itself killed (``kill -9``, the OOM killer): on Linux its workers
   are killed with it (``PR_SET_PDEATHSIG``), so none is left holding a GPU or waiting in
   a collective. Processes the workers started themselves get no such signal.
9. A rank waiting in a collective when a peer dies or raises is stopped with the rest
   (failure mode 1), within seconds. A hang *inside* training with every rank alive (a
   data loader that never returns, a stopped process, a collective some ranks never call)
   is reported once a rank has waited ``stall_warning`` seconds (default 60;
   ``RINGTRAIN_STALL_WARNING=S`` for scripts without a ring): one report naming who waits,
   who has not arrived, where (file:line and Python stack) and who does not answer, again
   at growing intervals. The job goes on until the process group's own timeout
   (``init_process_group(timeout=...)`` or ``Ring(timeout=...)``; 30 minutes by default),
   and then the report blames the rank that never arrived, not the one that waited.
   ``kill -USR1`` on ``ringtrain run`` (``ringtrain stacks``) makes every rank print its
   stacks, prefixed ``[rank N]``, without stopping the job.
10. With a host list, a node that fails (or an ssh that cannot log in: exit 255, with a
    HINT) makes ``ringtrain run`` stop the other nodes and exit with that node's code.

A job that ends well prints, on node 0, each rank's steps, ms/step and how much of a step went to
waiting for data, computing and waiting for the other ranks (scripts that train through a ring).

Exit codes: 0 success, 1 a worker or the rendezvous failed, 2 wrong arguments,
128+N stopped by signal N.

Security
--------

torch.distributed has no authentication and no encryption. Anyone who can reach the
job's ports can join the rendezvous store, read and write its keys, or connect to the
workers' Gloo/NCCL sockets, and the objects ranks exchange (``all_gather_object``,
``broadcast_object_list``) are unpickled, which can run code. On one machine (the
default ``--master-addr 127.0.0.1``), ``ringtrain run`` listens on 127.0.0.1 only: the
store on loopback, and Gloo on loopback through ``GLOO_SOCKET_IFNAME`` (every local process
can still connect); a one-node job given another ``--master-addr`` listens on every
interface, and ``ringtrain run`` warns. A multi-node job must listen on an address the
other nodes reach, and so does every worker's Gloo/NCCL socket: run multi-node jobs
(and elastic ones, whose c10d stores listen on every interface even with a loopback
``--master-addr``) only on a trusted network — a private cluster network or VPN, with
the ports firewalled from everything else. Jobs started
with ``-H``/``--hostfile`` are no exception: ssh authenticates and encrypts only the
start of each node's agent, not the job's own connections (Horovod's are no different).
Several "nodes" on this machine (``-H localhost:1,127.0.0.1:1``) stay on loopback.

What a store client cannot do is end the job or choose whom the report blames: every post
on the liveness board (a rank's failure, finish, hello, whereabouts, stack; an agent's post of
a worker killed by a signal) is sealed with an HMAC under the job's secret, and a post
without the job's seal is ignored, with one line naming its key. The secret reaches the
workers through the environment only (``RINGTRAIN_JOB_SECRET``; never a command line, never
the store): made here for a one-node job (and for every node of a ``-H`` job on this
machine); for several nodes, set the same ``RINGTRAIN_JOB_SECRET`` on each, or
``RINGTRAIN_JOB_SECRET_FILE`` (a file holding it: the only form forwarded to ssh hosts).
Without one, a multi-node job runs unsealed, with a warning: secrets made per node could
not check one another's posts. The seal does not hide the keys (anyone who reaches the store
reads them), stop a client from deleting or overwriting real posts, or protect Gloo/NCCL
traffic and pickled objects; processes of the same user can read the secret from
``/proc``. README.md, "Security", has the whole threat model.

Checkpoints are read with ``weights_only=True``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field

from ..errors import RingtrainError
from . import discovery, flags, horovod_flags, hosts, preflight, scripts, torchrun_flags
from .flags import DEFAULT_TIMEOUT, NPROC_WORDS
from .hosts import TORCHRUN_DEFAULT_PORT
from .ports import LOOPBACK, is_loopback

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
# The largest published torch.distributed jobs ran on 16,384 GPUs, 2,048 nodes (Llama 3,
# arXiv:2407.21783); the largest clusters hold about 100,000 GPUs (12,500 nodes of 8). 65,536
# leaves room above any real job and refuses a typo (an extra digit) before anything waits on it.
MAX_NODES = 65536
MAX_RANKS = 2**31 - 1  # ranks and world sizes are 32-bit ints in torch.distributed's C++ core


def build_parser() -> argparse.ArgumentParser:
    return flags.build_parser(__doc__)


@dataclass
class Plan:
    """What to launch, validated. Everything torchrun needs comes from here."""

    nproc: str  # a positive integer as text, or "auto" / "cpu" / "gpu" for torchrun to count
    nnodes: str
    max_nodes: int
    elastic: bool
    node_rank: int
    master_addr: str
    master_port: int | None
    gpus: list[int] | None
    max_restarts: int
    log_dir: str | None
    timeout: int
    module: bool
    target: str
    target_args: list[str] = field(default_factory=list)
    local_rank_arg: str | None = None  # "--local_rank" / "--local-rank" if the script declares it
    horovod: bool = False  # workers get the `horovod` alias and HOROVOD_* (worker.py --horovod)
    timeline: str | None = None  # --timeline's folder, or FILE.json (checked), merged here after the job
    rdzv_backend: str | None = None  # an elastic job's torchrun backend (c10d, etcd...); None: ringtrain's static one
    rdzv_id: str | None = None  # --rdzv-id: the run id (TORCHELASTIC_RUN_ID)
    rdzv_conf: dict = field(default_factory=dict)  # --rdzv-conf, over ringtrain's defaults
    no_python: bool = False  # --no-python: the target is a program, executed as it is
    torchrun: dict = field(default_factory=dict)  # torchrun's flags passed to its agent as given (torchrun_flags.py)
    environment: dict = field(default_factory=dict)  # variables for the workers from horovodrun's flags
    verbose: bool = False  # horovodrun's --verbose: say what is started


def _parse_gpus(text: str) -> list[int]:
    items = [item.strip() for item in text.split(",")]
    if not items or not all(item.isdigit() for item in items):
        raise RingtrainError(
            f"--gpus {text!r} is not a comma-separated list of GPU indices",
            "write the indices as nvidia-smi lists them, e.g. --gpus 0,1 (not 'cuda:0').",
        )
    return [int(item) for item in items]


def _parse_nnodes(text: str) -> tuple[int, int]:
    parts = text.split(":")
    try:
        low, high = (int(parts[0]), int(parts[0])) if len(parts) == 1 else (int(parts[0]), int(parts[1]))
    except (ValueError, IndexError) as e:
        raise RingtrainError(f"--nnodes {text!r} is neither N nor MIN:MAX", "e.g. --nnodes 2 or --nnodes 1:4.") from e
    if len(parts) > 2 or not 1 <= low <= high:
        raise RingtrainError(f"--nnodes {text!r} is not a valid node count", "use N >= 1, or MIN:MAX with 1 <= MIN <= MAX.")
    if high > MAX_NODES:
        raise RingtrainError(f"--nnodes {text!r}: more than {MAX_NODES:,} nodes, more than any torch.distributed job "
                             "has run on", "check the number (an extra digit?): give the number of machines in the job.")
    return low, high


def _resolve_nproc(text: str, gpus: list[int] | None) -> str:
    if text == "gpu":
        import torch

        if not torch.cuda.is_available():  # with --gpus too: 2 CPU processes are not what was asked
            listed = f" --gpus {','.join(map(str, gpus))}" if gpus is not None else ""
            raise RingtrainError(
                f"--nproc-per-node gpu{listed}, but torch sees no CUDA GPU here",
                "give a number (--nproc-per-node 2) or 'cpu'; run `ringtrain env` to see what torch finds.",
            )
    if text in ("gpu", "auto") and gpus is not None:
        return str(len(gpus))  # one worker per GPU the user listed
    if text == "gpu":
        return text
    if text in NPROC_WORDS:
        return text
    try:
        n = int(text)
    except ValueError as e:
        raise RingtrainError(f"--nproc-per-node {text!r} is not a number", "use a positive integer or one of: auto, gpu, cpu.") from e
    if n < 1:
        raise RingtrainError(f"--nproc-per-node {n}: a node needs at least one worker", "use --nproc-per-node 1 or more.")
    if gpus is not None and n > len(gpus):
        raise RingtrainError(
            f"--nproc-per-node {n} workers but --gpus lists only {len(gpus)} GPU(s)",
            "list one GPU per worker, or use --nproc-per-node gpu to start one worker per listed GPU.",
        )
    return str(n)


def _nproc_text(ns: argparse.Namespace) -> str:
    """--nproc-per-node, or -np for a single node (horovodrun's `-np N` on this machine)."""
    np = getattr(ns, "np", None)
    if np is None:
        return ns.nproc_per_node or "1"
    if np < 1:
        raise RingtrainError(f"-np {np}: a job needs at least one process", "use -np 1 or more.")
    if ns.nproc_per_node is not None and ns.nproc_per_node != str(np):
        raise RingtrainError(
            f"-np {np} and --nproc-per-node {ns.nproc_per_node} disagree: without -H/--hostfile, -np is the "
            "number of processes on this one node",
            "give only one of them (or -H host:N,... to spread -np over several nodes).",
        )
    if (ns.nnodes or "1") != "1":
        raise RingtrainError(f"-np {np} with --nnodes {ns.nnodes}: -np counts processes of the whole job",
                             "use --nproc-per-node per node with --nnodes, or -np with -H/--hostfile.")
    return str(np)


def _script_rendezvous(ns: argparse.Namespace, tcp: tuple[str, int] | None, elastic: bool) -> int | None:
    """The master port, when the script names its own ``init_method="tcp://host:port"``: the store goes there."""
    if tcp is None or elastic:
        return ns.master_port
    host, port = tcp
    where = f"init_method='tcp://{host}:{port}'"
    if ns.master_port is not None and ns.master_port != port:
        raise RingtrainError(
            f"the script rendezvouses at {where} but --master-port is {ns.master_port}: its workers would wait "
            "for a store nobody runs",
            f"drop --master-port (ringtrain hosts the store at {port}), give --master-port {port}, or write "
            "init_method='env://' in the script.",
        )
    if not (is_loopback(host) or host in (ns.master_addr, "localhost")):
        raise RingtrainError(
            f"the script rendezvouses at {where} but the job's store is on --master-addr {ns.master_addr}",
            f"pass --master-addr {host} (node 0's address), or write init_method='env://' in the script.",
        )
    if ns.max_restarts:
        raise RingtrainError(
            f"--max-restarts {ns.max_restarts} with a script that rendezvouses at the fixed address {where}: "
            "restarted workers would meet in the failed attempt's store",
            "write init_method='env://' (or leave it out) in the script, so each attempt gets a fresh store.",
        )
    return port


def plan_from_args(ns: argparse.Namespace) -> Plan:
    """Validate the command line. Raises RingtrainError (exit code 2) before anything starts."""
    ns = torchrun_flags.apply(horovod_flags.apply(ns))  # the tools' flags in ringtrain's terms
    for name, default in (("nnodes", "1"), ("node_rank", 0), ("master_addr", LOOPBACK), ("timeout", DEFAULT_TIMEOUT)):
        if getattr(ns, name, None) is None:
            setattr(ns, name, default)
    gpus = _parse_gpus(ns.gpus) if ns.gpus is not None else None
    nproc = _resolve_nproc(_nproc_text(ns), gpus)
    _, max_nodes = _parse_nnodes(ns.nnodes)
    if nproc.isdigit() and int(nproc) * max_nodes > MAX_RANKS:
        raise RingtrainError(f"--nproc-per-node {nproc} x --nnodes {ns.nnodes}: more ranks than torch.distributed can "
                             f"number ({MAX_RANKS:,})", "give the number of workers on each node (e.g. one per GPU).")
    if not 0 <= ns.node_rank < max_nodes:
        raise RingtrainError(
            f"--node-rank {ns.node_rank} with --nnodes {ns.nnodes}: node ranks are 0..{max_nodes - 1}",
            "number the nodes from 0 (the master) to nnodes-1, each node a different rank.",
        )
    if ns.master_port is not None and not 1 <= ns.master_port <= 65535:
        raise RingtrainError(f"--master-port {ns.master_port} is not a TCP port", "use 1..65535, or omit it on a single node.")
    if ns.timeout < 1:
        raise RingtrainError(f"--timeout {ns.timeout}: must be at least 1 second", "e.g. --timeout 300.")
    if ns.max_restarts < 0:
        raise RingtrainError(f"--max-restarts {ns.max_restarts} is negative", "use 0 (no restarts) or more.")
    no_python = getattr(ns, "no_python", False)
    if no_python:
        ns.script = scripts.check_program(ns.script, ns.module)
        source = ""
    else:
        # horovodrun's command form: `-np 2 python train.py` (or `python -m pkg.mod`).
        ns.script, ns.script_args, ns.module = scripts.strip_interpreter(ns.script, list(ns.script_args), ns.module)
        if ns.module:
            source_file = scripts.module_file(ns.script)
        else:
            source_file = scripts.check_script(ns.script)
        source = scripts.read_source(source_file) if source_file else ""
    spelling = scripts.local_rank_spelling(source)
    master_port = _script_rendezvous(ns, scripts.tcp_rendezvous(source), ns.elastic)
    timeline = getattr(ns, "timeline", None)
    if timeline is not None:
        from ..timeline import check_target  # no torch: --help and argument errors stay fast

        folder, name = check_target(timeline, "--timeline")
        timeline = os.path.join(folder, f"{name}.json") if timeline.endswith(".json") else folder
    environment = horovod_flags.environment(ns)[0]
    return Plan(
        nproc=nproc,
        nnodes=ns.nnodes,
        max_nodes=max_nodes,
        elastic=ns.elastic,
        node_rank=ns.node_rank,
        master_addr=ns.master_addr,
        master_port=master_port,
        gpus=gpus,
        max_restarts=ns.max_restarts,
        log_dir=ns.log_dir,
        timeout=ns.timeout,
        module=ns.module,
        target=ns.script,
        target_args=list(ns.script_args),
        local_rank_arg=spelling,
        horovod=getattr(ns, "horovod", False),
        timeline=timeline,
        rdzv_backend=ns.rdzv_backend,
        rdzv_id=getattr(ns, "rdzv_id", None),
        rdzv_conf=ns.rdzv_conf,
        no_python=no_python,
        torchrun=torchrun_flags.passthrough_values(ns),
        environment=environment,
        verbose=bool(getattr(ns, "verbose", False)),
    )


def torchrun_argv(plan: Plan, port: int) -> list[str]:
    """The command line torchrun's own parser gets, so its defaults and checks all apply.

    It ends with the worker entry point only: the script's arguments never go through
    torchrun's parser (see ``torchrun_args``).
    """
    from .rendezvous import BACKEND
    from .waiting import ELASTIC

    argv = ["--nnodes", plan.nnodes, "--nproc-per-node", plan.nproc, "--max-restarts", str(plan.max_restarts)]
    bare = plan.master_addr.strip("[]")
    host = f"[{bare}]" if ":" in bare else bare  # an IPv6 address goes in brackets
    if plan.elastic:
        # Membership by rendezvous (torch/distributed/run.py, "Elastic"); torch's c10d backend is
        # wrapped so that it says what it waits for (waiting.py). Once MIN nodes are in, c10d
        # waits last_call_timeout (30 s by default) for more; keep that inside --timeout or every join
        # would time out. The user's --rdzv-conf wins.
        last_call = min(30, max(1, plan.timeout // 2))
        conf = {"join_timeout": plan.timeout, "last_call_timeout": last_call, **plan.rdzv_conf}
        backend = plan.rdzv_backend or "c10d"
        argv += ["--rdzv-backend", ELASTIC if backend == "c10d" else backend, "--rdzv-endpoint", f"{host}:{port}",
                 "--rdzv-id", plan.rdzv_id or f"ringtrain-{port}"]
    else:
        # torchrun's static rendezvous (explicit node ranks, node 0 hosts the store, a bounded
        # wait for the other nodes), but with an empty store for each restart: rendezvous.py.
        conf = {"timeout": plan.timeout, **plan.rdzv_conf, "rank": plan.node_rank}
        argv += ["--rdzv-backend", BACKEND, "--rdzv-endpoint", f"{host}:{port}"]
        if plan.rdzv_id:
            argv += ["--rdzv-id", plan.rdzv_id]
    argv += ["--rdzv-conf", ",".join(f"{k}={v}" for k, v in conf.items())]
    if plan.log_dir:
        argv += ["--log-dir", plan.log_dir]
    argv += torchrun_flags.passthrough_argv(plan.torchrun)
    return argv + [WORKER]


def torchrun_args(plan: Plan, port: int):
    """torchrun's parsed arguments, with the worker's (and so the script's) arguments set directly.

    Letting torchrun's parser see the script's arguments breaks scripts: argparse resolves
    abbreviations of its own options even inside the REMAINDER that would swallow them,
    so a script option such as ``--log`` or ``--master`` stopped plain torchrun with
    "ambiguous option: --log could match --log-dir, --logs-specs" (argparse classifies
    every ``--x`` string before it assigns any to the REMAINDER).
    """
    import torch.distributed.run as torchrun

    args = torchrun.parse_args(torchrun_argv(plan, port))
    mode = "exec" if plan.no_python else "module" if plan.module else "path"
    # worker.py's arguments; this process (the agent) is the workers' parent.
    args.training_script_args = [*(["--horovod"] if plan.horovod else []), mode, plan.local_rank_arg or "none",
                                 str(os.getpid()), plan.target, *plan.target_args]
    return args


def _say_plan(plan: Plan, args) -> None:
    """horovodrun's --verbose: what starts, where the processes meet, the variables set for them."""
    rendezvous = f"{args.rdzv_backend} at {args.rdzv_endpoint} ({'elastic' if plan.elastic else 'fixed nodes'})"
    print(f"ringtrain run: node {plan.node_rank} of {plan.nnodes}, {plan.nproc} worker(s) running "
          f"{' '.join([plan.target, *plan.target_args])}; rendezvous {rendezvous}", file=sys.stderr)
    for key in sorted({**plan.environment, **({"RINGTRAIN_TIMELINE": plan.timeline} if plan.timeline else {})}):
        print(f"ringtrain run:   {key}={os.environ[key]}", file=sys.stderr)


def execute(plan: Plan) -> int:
    """Run the job through torchrun's agent in this process; return the exit code."""
    from ..seal import SECRET_ENV, job_secret

    # The board's seal (seal.py): the workers inherit the job's secret through the environment only.
    secret, unsealed = job_secret(multi_node=plan.max_nodes > 1)
    if unsealed:
        print(unsealed, file=sys.stderr, flush=True)
    previous = os.environ.get(SECRET_ENV)
    if secret is not None:
        os.environ[SECRET_ENV] = secret  # for the workers, and this agent's own reads of the board
    try:
        return _execute(plan)
    finally:
        if previous is None:
            os.environ.pop(SECRET_ENV, None)


def _execute(plan: Plan) -> int:
    # torch is imported here, not at module level: `--help` and argument errors stay fast.
    import torch.distributed.run as torchrun
    from torch.distributed import DistError
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError

    from ..failures import stop_leftover_groups
    from . import rendezvous, waiting
    from .ports import host_store, is_loopback, keep_gloo_on_loopback
    from ..board import job_board
    from . import exits
    from .report import first_cause, format_child_failure, remove_native_dumps, run_summary
    from .stacks import StackRequests

    rendezvous.register()
    waiting.register_elastic()
    started = time.monotonic()
    if plan.max_nodes == 1 and not is_loopback(plan.master_addr):
        print(f"ringtrain run: warning: --master-addr {plan.master_addr} is not a loopback address: this one-node "
              "job's store (and Gloo) listen on every interface, where any machine that reaches them can read the "
              "job's keys and connect to its ranks.\nHINT: leave --master-addr out (127.0.0.1) unless another "
              "node must join; see README.md, \"Security\".", file=sys.stderr, flush=True)

    store = None  # node 0's TCPStore, held open until the job ends
    port = plan.master_port
    if not plan.elastic and plan.node_rank == 0:
        # A single node with no port given gets a free one (port 0); several nodes default to
        # torchrun's 29500 so that every node computes the same port.
        wanted = port if port is not None else (0 if plan.max_nodes == 1 else TORCHRUN_DEFAULT_PORT)
        store, port = host_store(plan.master_addr, wanted, plan.timeout)
    elif port is None:
        port = TORCHRUN_DEFAULT_PORT
    if plan.gpus is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, plan.gpus))
    if is_loopback(plan.master_addr):
        # Only this machine can reach a loopback master: every node is here (several with -H
        # localhost:1,127.0.0.1:1), so Gloo need not listen anywhere else.
        keep_gloo_on_loopback(os.environ)  # the workers inherit this process's environment
    if plan.elastic:
        # c10d's agent shares one TCPStore with the workers of every round, and restarted
        # workers read the dead round's keys (rendezvous.py; pytorch/pytorch#135712): with
        # sharing off, each round's workers get a store of their own on a new port.
        os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")

    if plan.timeline is not None:
        os.environ["RINGTRAIN_TIMELINE"] = plan.timeline  # a ring (or hvd.init) in each worker records there
    os.environ.update(plan.environment)  # horovodrun's flags, as the variables it sets
    args = torchrun_args(plan, port)
    if plan.verbose:
        _say_plan(plan, args)
    # kill -USR1 on this process (ringtrain stacks): every rank prints its stack (stacks.py).
    requests = StackRequests((plan.master_addr, port), store)
    requests.install()
    try:
        # run(), not main(): main's @record would print torchelastic's own failure summary.
        torchrun.run(args)
    except ChildFailedError as e:
        # A worker killed by a signal had no say: what it started may live on (failures.py).
        stop_leftover_groups(failure.pid for failure in e.failures.values())
        # ...nor could it tell the ranks on other machines: this agent does (exits.py).
        silent = exits.unspoken(e.failures, first_cause(e.failures)[0])
        board = None
        if not plan.elastic:  # the last attempt's board: after a restart, in that restart's own store
            attempt_store, attempt_port = rendezvous.workers_store(store, port)
            if silent or attempt_store is not None:
                board = job_board(attempt_store, (plan.master_addr.strip("[]"), attempt_port))
                exits.tell_job(board, silent)
        print(format_child_failure(e, plan.node_rank, board if board is not None else job_board(store)),
              file=sys.stderr, flush=True)
        if store is not None and plan.max_nodes > 1:
            exits.hold_store(board, set(e.failures))
        return 1
    except SignalException as e:
        print(f"ringtrain run: stopped by {e.sigval.name}; all workers on this node were stopped.", file=sys.stderr)
        return 128 + int(e.sigval)
    except (DistError, RendezvousError) as e:
        raise waiting.rendezvous_failure(
            node_rank=plan.node_rank, elastic=plan.elastic, nnodes=plan.nnodes, max_nodes=plan.max_nodes,
            master_addr=plan.master_addr, port=port, timeout=plan.timeout, error=e,
            seconds=time.monotonic() - started) from e
    finally:
        requests.uninstall()
        remove_native_dumps()
        if plan.timeline is not None:
            from ..timeline import merge_after_job

            merge_after_job(plan.timeline)  # unless the last worker did; a rank that died has no part
    final_store = store if plan.elastic else rendezvous.workers_store(store, port)[0]  # after restarts, the last's
    summary = run_summary(job_board(final_store))
    if summary:
        print(summary, file=sys.stderr)
    del store
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        ns = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
        ns = discovery.apply(horovod_flags.apply(ns))  # an elastic horovodrun line becomes a host list
        for flag in horovod_flags.environment(ns)[1]:
            print(f"ringtrain run: {flag} sets the HOROVOD_* variable horovodrun sets; ringtrain's Horovod does "
                  "not read it (it tunes Horovod's C++ core).", file=sys.stderr)
        if ns.hosts is not None or ns.hostfile is not None:
            nodes = hosts.nodes_from_args(ns, plan_from_args, nnodes=ns.elastic_nnodes)
            os.environ.update(horovod_flags.environment(ns)[0])  # every agent's workers (ssh: forwarded)
            for name in [name for name in os.environ if name.startswith("PET_")]:
                del os.environ[name]  # read here already: the agents get their place as flags, nothing else
    except RingtrainError as e:
        print(f"ringtrain run: {e}", file=sys.stderr)
        return 2
    if ns.hosts is not None or ns.hostfile is not None:
        return hosts.run_nodes(nodes)
    try:
        plan = plan_from_args(ns)
        warnings = preflight.check(plan)  # against this machine: here, not in plan_from_args, which -H runs elsewhere
    except RingtrainError as e:
        print(f"ringtrain run: {e}", file=sys.stderr)
        return 2
    for warning in warnings:
        print(f"ringtrain run: {warning}", file=sys.stderr, flush=True)
    try:
        return execute(plan)
    except RingtrainError as e:
        print(f"ringtrain run: {e}", file=sys.stderr)
        return 1
