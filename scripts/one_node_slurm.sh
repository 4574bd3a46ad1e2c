#!/usr/bin/env bash
# A Slurm cluster on this machine, for tests/cluster/ (and for trying examples/cluster/ by hand): its own munged,
# slurmctld and slurmd, every file under DIR, nothing in /etc touched, and nothing left running after `stop`.
#
#   scripts/one_node_slurm.sh check          why a cluster cannot be started here (exit 1), or nothing (exit 0)
#   scripts/one_node_slurm.sh start DIR      write DIR/slurm.conf, start the daemons, wait until every node is idle
#   SLURM_CONF=DIR/slurm.conf srun -N1 -n2 hostname
#   scripts/one_node_slurm.sh stop DIR       cancel the jobs, stop the daemons, end any process still using DIR
#
# The node is this host, CPUs=2 (override with CPUS=). A second slurmd for the same machine, named `localhost`,
# joins it where this host's name is not `localhost` and resolves (Slurm's "multiple slurmd" mode: each node its own
# Port=), so that `sbatch -N2` (examples/cluster/two_nodes.sbatch) runs for real: NODES=1 leaves it out. Ports: PORTS="CTLD
# NODE0 NODE1", or free ones picked here. Needs root (slurmd starts job steps as their user) and Debian's slurm-wlm
# and munge (`make test-cluster` installs them).
#
# What had to be chosen, and why (docs/benchmarks.md, "Real schedulers on one machine", has the run):
#   ProctrackType=proctrack/linuxproc, TaskPlugin=task/none: no cgroups (containers such as gVisor have none that
#     Slurm can use); linuxproc finds a step's processes through /proc's parent links, which is all that signals
#     (scancel --signal) and the end of a step need. JobAcctGatherType=none and no accounting database (no slurmdbd):
#     sacct does not work here; the tests read `scontrol show job` (MinJobAge keeps finished jobs for 10 minutes).
#   SelectType=select/cons_tres, CR_CPU: one task per CPU, so `srun -N1 -n2` fits one node of 2 CPUs.
#   AuthInfo cred_expire=5: a requeued job waits cred_expire + 1 seconds before it may start again (120 s by
#     default); SchedulerParameters sched_interval/bf_interval=1: it then starts within a second, not at the next
#     60 s pass. KillWait=5: SIGKILL follows SIGTERM 5 s after a time limit or `scancel` (30 s by default).
#   A private munged (its own key and socket in DIR, AuthInfo socket=): the machine's /etc/munge is left alone.
set -uo pipefail

cmd=${1:-}
dir=${2:-}

why_not() {  # bash builtins only: it answers with PATH emptied too (tests/cluster/test_cluster_setup.py)
    if [ "$EUID" != 0 ]; then echo "not root: slurmd must run as root to start job steps; run \`sudo make test-cluster\`"; return 1; fi
    local missing=() tool
    for tool in munged slurmctld slurmd srun sbatch scontrol scancel squeue sinfo; do
        command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "Slurm/munge not installed (not on PATH: ${missing[*]}): \`make test-cluster\` installs slurm-wlm and munge (Debian/Ubuntu, as root)"
        return 1
    fi
}

free_ports() {  # N free TCP ports, by binding port 0
    local py
    py=$(command -v python3 || command -v python) || { echo "no python3 to pick free ports: give PORTS=" >&2; return 1; }
    "$py" -c "
import socket, sys
held = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in held: s.bind(('127.0.0.1', 0))
print(' '.join(str(s.getsockname()[1]) for s in held))" "$1"
}

conf() { SLURM_CONF="$dir/slurm.conf" "$@"; }

start() {
    why_not >&2 || return 1
    [ -n "$dir" ] || { echo "usage: $0 start DIR" >&2; return 2; }
    mkdir -p "$dir" && dir=$(cd "$dir" && pwd)
    # munged refuses a socket in a folder that others cannot search (it checks the path), and a key others can read.
    chmod 755 "$dir"
    mkdir -p "$dir/munge" "$dir/state" "$dir/spool" "$dir/log"
    chmod 755 "$dir/munge"
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none && chmod 400 "$dir/munge/munge.key"
    local host nodes ports
    host=$(hostname -s)
    # Every node name must resolve: a job's master is the first name of its node list.
    nodes=()
    [ "$host" != localhost ] && getent hosts "$host" >/dev/null && nodes=("$host")
    if [ "${NODES:-2}" = 2 ] || [ ${#nodes[@]} = 0 ]; then nodes+=(localhost); fi
    read -r -a ports <<< "${PORTS:-$(free_ports 3)}"
    [ ${#ports[@]} -ge 3 ] || { echo "PORTS needs 3 ports: slurmctld's and each slurmd's" >&2; return 2; }
    {
        echo "# Written by scripts/one_node_slurm.sh: a cluster on this machine, every file under $dir."
        echo "ClusterName=ringtrain"
        echo "SlurmctldHost=$host(127.0.0.1)"
        echo "SlurmUser=root"
        echo "SlurmdUser=root"
        echo "SlurmctldPort=${ports[0]}"
        echo "SlurmdPort=${ports[1]}"
        echo "AuthType=auth/munge"
        echo "CredType=cred/munge"
        echo "AuthInfo=socket=$dir/munge/munge.socket,cred_expire=5"
        echo "StateSaveLocation=$dir/state"
        echo "SlurmdSpoolDir=$dir/spool/%n"
        echo "SlurmctldPidFile=$dir/slurmctld.pid"
        echo "SlurmdPidFile=$dir/slurmd-%n.pid"
        echo "SlurmctldLogFile=$dir/log/slurmctld.log"
        echo "SlurmdLogFile=$dir/log/slurmd-%n.log"
        echo "ProctrackType=proctrack/linuxproc"
        echo "TaskPlugin=task/none"
        echo "JobAcctGatherType=jobacct_gather/none"
        echo "AccountingStorageType=accounting_storage/none"
        echo "JobCompType=jobcomp/none"
        echo "MpiDefault=none"
        echo "SelectType=select/cons_tres"
        echo "SelectTypeParameters=CR_CPU"
        echo "SchedulerType=sched/backfill"
        echo "SchedulerParameters=sched_interval=1,bf_interval=1"
        echo "ReturnToService=2"
        echo "KillWait=5"
        echo "MinJobAge=600"
        local i=0
        for node in "${nodes[@]}"; do
            echo "NodeName=$node NodeAddr=127.0.0.1 Port=${ports[$((i + 1))]} CPUs=${CPUS:-2} RealMemory=1000 State=UNKNOWN"
            i=$((i + 1))
        done
        echo "PartitionName=ringtrain Nodes=$(IFS=,; echo "${nodes[*]}") Default=YES MaxTime=INFINITE State=UP"
    } > "$dir/slurm.conf"
    munged --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" --pid-file="$dir/munge/munged.pid" \
        --log-file="$dir/log/munged.log" --seed-file="$dir/munge/munged.seed" || { fail "munged did not start"; return 1; }
    slurmctld -f "$dir/slurm.conf" -i || { fail "slurmctld did not start"; return 1; }
    for node in "${nodes[@]}"; do
        slurmd -f "$dir/slurm.conf" -N "$node" || { fail "slurmd ($node) did not start"; return 1; }
    done
    local deadline=$((SECONDS + ${WAIT:-60})) states
    while :; do
        states=$(conf sinfo -h -N -o '%t' 2>/dev/null | sort | uniq -c | tr -s ' \n' ' ')
        [ "$states" = " ${#nodes[@]} idle " ] && break
        if [ "$SECONDS" -ge "$deadline" ]; then
            fail "the nodes are not idle after ${WAIT:-60} s (sinfo: ${states:-no answer})"
            return 1
        fi
        sleep 0.2
    done
    echo "SLURM_CONF=$dir/slurm.conf"
}

fail() {  # a start that went wrong: say what, show the logs' ends, stop what did start
    echo "one_node_slurm: $1" >&2
    for log in "$dir"/log/*.log; do
        [ -f "$log" ] && { echo "--- $log" >&2; tail -n 15 "$log" >&2; }
    done
    stop >&2
}

alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

stop_pids() {  # SIGTERM to the processes the pid FILES name, together; up to 10 s, then SIGKILL
    local pids=() pid file
    for file in "$@"; do
        pid=$(cat "$file" 2>/dev/null) && alive "$pid" && kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
    done
    local left=()
    for _ in $(seq 1 50); do
        left=()
        for pid in "${pids[@]}"; do alive "$pid" && left+=("$pid"); done
        [ ${#left[@]} = 0 ] && return 0
        sleep 0.2
    done
    echo "one_node_slurm: ${left[*]} still running 10 s after SIGTERM: SIGKILL" >&2
    kill -KILL "${left[@]}" 2>/dev/null
}

ancestors() {  # this script and the processes it was started from: never ended here
    local pid=$$
    while [ -n "$pid" ] && [ "$pid" != 0 ]; do
        echo "$pid"
        pid=$(awk '/^PPid:/ {print $2}' "/proc/$pid/status" 2>/dev/null)
    done
}

users_of_dir() {  # processes that use DIR: a job's task (SLURM_JOB_ID and this SLURM_CONF), a slurmstepd (its socket)
    local p pid skip environ
    skip=" $(ancestors | tr '\n' ' ') "
    for p in /proc/[0-9]*; do
        pid=${p#/proc/}
        case "$skip" in *" $pid "*) continue ;; esac
        environ=$(tr '\0' '\n' 2>/dev/null < "$p/environ") || continue
        if { grep -qxF "SLURM_CONF=$dir/slurm.conf" <<< "$environ" && grep -q '^SLURM_JOB_ID=' <<< "$environ"; } ||
            ls -l "$p/fd" 2>/dev/null | grep -qF "$dir/"; then
            echo "$pid"
        fi
    done
}

stop() {
    [ -n "$dir" ] && [ -d "$dir" ] || { echo "usage: $0 stop DIR (a folder \`start\` made)" >&2; return 2; }
    dir=$(cd "$dir" && pwd)
    if [ -f "$dir/slurmctld.pid" ] && alive "$(cat "$dir/slurmctld.pid")"; then
        local jobs
        jobs=$(conf squeue -h -o %i 2>/dev/null | tr '\n' ' ')
        if [ -n "${jobs// /}" ]; then
            conf scancel $jobs 2>/dev/null
            for _ in $(seq 1 75); do [ -z "$(conf squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
        fi
    fi
    # Together: each takes about 2 s to go, and none needs another to (the jobs are gone already).
    stop_pids "$dir"/slurmd-*.pid "$dir/slurmctld.pid" "$dir/munge/munged.pid"
    local left
    left=$(users_of_dir | tr '\n' ' ')
    if [ -n "${left// /}" ]; then
        echo "one_node_slurm: processes still using $dir after the daemons stopped: $left- SIGKILL" >&2
        kill -KILL $left 2>/dev/null
    fi
    return 0
}

case "$cmd" in
    check) why_not ;;
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 check | start DIR | stop DIR" >&2; exit 2 ;;
esac
