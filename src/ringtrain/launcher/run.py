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

Preemption
----------

SIGTERM to ``ringtrain run`` (a scheduler taking the machines back) is passed to every worker; a ring
with a ``checkpoint_dir`` saves the step it is at and exits 75, and ``ringtrain run`` then exits 75
(EX_TEMPFAIL) with ``preempted ... at step N``: run the same command again to resume there.
``--preempt-signal USR1`` adds a signal sent ahead of the end (Slurm's ``--signal=USR1@90``; the stack
request moves to SIGUSR2); ``--preempt-grace SECONDS`` is the time left before SIGKILL (rings warn when a
checkpoint takes longer; the agent waits this long for the workers). See docs/failures.md, "Preemption".

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

A loop that draws its own batches resumes exactly when what it holds across a checkpoint is
in it: a batch drawn before the checkpoint and trained after it (a prefetch) through
``get_batch = ring.batches(get_batch)``, a loader object of the script's own (with
``state_dict``/``load_state_dict``) through ``ring.keep(loader)``, other per-rank values in
``ring.extras``. Every rank records the losses it trained on beside the checkpoints; a resumed
run compares its own as it reaches those steps and names the first one that differs
(``this resumed run is not the run it continues: at step N ...``), or says ``resume checked``.
``--check-resume STEP`` proves it for a script: the job runs to its end, then again from its
checkpoint of STEP (the rings save into a folder of the check's, every step), and every loss and
checkpoint past STEP is compared bitwise: ``exact`` (exit 0), or the first step and tensor that
differ (exit 1)::

    ringtrain run --nproc-per-node 2 --check-resume 5 train.py

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
  sample of the epoch is skipped or trained twice (tests/checkpoint/test_faults.py shows it); only
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
* ringtrain's own variables (``RINGTRAIN_TIMELINE`` with ``--timeline DIR``, the preemption signal and grace,
  the marks folder, the stall warning, the job's secret and the agent's nonce, ...): every variable ringtrain
  sets or reads is in one table, docs/environment.md, generated from the launcher contract
  (``ringtrain.parallel.contract.VARIABLES``).
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
``/proc``. docs/security.md has the whole threat model.

Checkpoints are read with ``weights_only=True``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from ..errors import RingtrainError
from ..parallel import contract
from . import check_resume, discovery, flags, horovod_flags, hosts, preflight
from .agent import execute
from .plan import plan_from_args


def build_parser() -> argparse.ArgumentParser:
    return flags.build_parser(__doc__)


def _not_started_yet(signum, frame) -> None:
    print("ringtrain run: stacks: the job has not started yet; nothing to ask.", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    # `ringtrain stacks` (kill -USR1) before the job's own handler is in place: said, rather than SIGUSR1's default
    # action, which would end this launcher before it started anything.
    if hasattr(signal, "SIGUSR1") and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, _not_started_yet)
    try:
        ns = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
        ns = discovery.apply(horovod_flags.apply(ns))  # an elastic horovodrun line becomes a host list
        for flag in horovod_flags.environment(ns)[1]:
            print(f"ringtrain run: {flag} sets the HOROVOD_* variable horovodrun sets; ringtrain's Horovod does "
                  "not read it (it tunes Horovod's C++ core).", file=sys.stderr)
        if ns.check_resume is not None and (ns.hosts is not None or ns.hostfile is not None):
            raise RingtrainError("--check-resume runs the job twice on this machine; it takes no -H/--hostfile",
                                 "check the script's resume on one node (e.g. --nproc-per-node 2), then run it on many.")
        if ns.hosts is not None or ns.hostfile is not None:
            nodes = hosts.nodes_from_args(ns, nnodes=ns.elastic_nnodes)
            os.environ.update(horovod_flags.environment(ns)[0])  # every agent's workers (ssh: forwarded)
            for name in [name for name in os.environ if name.startswith("PET_")]:
                del os.environ[name]  # read here already: the agents get their place as flags, nothing else
    except RingtrainError as e:
        print(f"ringtrain run: {e}", file=sys.stderr)
        return 2
    if ns.hosts is not None or ns.hostfile is not None:
        return hosts.run_nodes(nodes, preempt_signal=contract.signal_of(ns.preempt_signal, "--preempt-signal")
                               if ns.preempt_signal else None)
    try:
        check_resume.check_step(ns.check_resume)
        plan = plan_from_args(ns)
        warnings = preflight.check(plan)  # against this machine: here, not in plan_from_args, which -H runs elsewhere
    except RingtrainError as e:
        print(f"ringtrain run: {e}", file=sys.stderr)
        return 2
    for warning in warnings:
        print(f"ringtrain run: {warning}", file=sys.stderr, flush=True)
    try:
        if ns.check_resume is not None:
            return check_resume.run(plan, ns.check_resume, execute)
        return execute(plan)
    except RingtrainError as e:
        print(f"ringtrain run: {e}", file=sys.stderr)
        return 1
