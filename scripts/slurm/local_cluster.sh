#!/usr/bin/env bash
# A real Slurm cluster of N nodes on this one machine (Debian's slurm-wlm + munge, root, no systemd):
#
#   bash scripts/slurm/local_cluster.sh start [N]   # (make slurm-local NODES=N, default 1) install slurm-wlm + munge
#                                                   # with apt when missing and root, write slurm.conf, start the
#                                                   # daemons, wait until `sinfo` shows every node idle
#   bash scripts/slurm/local_cluster.sh stop        # (make slurm-stop) end every daemon it started, by pid, and
#                                                   # whatever still runs on its nodes
#   bash scripts/slurm/local_cluster.sh status
#   bash scripts/slurm/local_cluster.sh kill-node K # SIGKILL every process of node nK (slurmd, munged, job steps,
#                                                   # their tasks): a node lost; slurmctld notices after SlurmdTimeout
#   bash scripts/slurm/local_cluster.sh start-node K  # bring node nK back (it returns to service when it registers)
#   bash scripts/slurm/local_cluster.sh install     # only the packages (what `make test` needs)
#
# Each node nK is a `slurmd -N nK` inside its own UTS + mount namespace (`unshare --mount --uts`), as on a real
# cluster where every node is its own machine:
# - hostname nK and loopback address 127.0.0.(K+1) (its NodeAddr); an /etc/hosts bind-mounted inside the namespace
#   names every node, so `n1` resolves inside jobs (MASTER_ADDR, gloo's own address);
# - its own Port= (every slurmd listens on all addresses of the one network namespace);
# - its own munged: slurmctld sends the same job credential to every node of a job, and one munged decoding it
#   twice answers "Job credential replayed". Every munged uses the cluster's key; the socket path in slurm.conf
#   (AuthInfo=socket=...) is the controller's munged outside the nodes and, bind-mounted over it, the node's own inside.
# Only loopback addresses are used. The daemons are started by hand and ended by their pids (no systemd).
#
# Where it lives:
# - default: the machine's cluster, /etc/slurm/slurm.conf (so plain `sinfo`/`sbatch` find it) and
#   /var/lib/instella-slurm, ports 6817 (slurmctld) and 6817+K (node K). A slurm.conf this script did not write (a
#   real cluster's) is never touched.
# - SLURM_LOCAL_DIR=DIR: a private cluster, everything (slurm.conf, state, logs, munge key and sockets) under DIR,
#   ports chosen free by the OS, a cluster name of its own; clients need SLURM_CONF=DIR/slurm.conf. The tests start
#   one per run (tests/helpers/slurm_cluster.py), so two runs of the suite on one host never share a controller, port, node
#   or state directory, and a test that kills a node cannot hit another run's jobs.
#
# Choices that matter for the tests: proctrack/pgid (a job's leftover processes are killed with its process group),
# AuthInfo cred_expire=10 and sched_interval/bf_interval=5 (a requeued job starts within seconds, not minutes),
# SlurmdTimeout (SLURM_LOCAL_SLURMD_TIMEOUT, default 20 s: a lost node is marked DOWN and its jobs requeued after
# this long), kill_invalid_depend (a job whose `afterok` input failed is cancelled instead of pending forever),
# ReturnToService=2 (a node that comes back is used again), MailProg=/bin/true.
set -euo pipefail

PRIVATE=${SLURM_LOCAL_DIR:+1}
if [[ -n $PRIVATE ]]; then
    STATE=$(mkdir -p "$SLURM_LOCAL_DIR" && cd "$SLURM_LOCAL_DIR" && pwd)
    CONF=$STATE/slurm.conf
else
    STATE=${SLURM_LOCAL_STATE:-/var/lib/instella-slurm}
    CONF=${SLURM_CONF_DIR:-/etc/slurm}/slurm.conf
fi
MARK="# written by instella-recipes scripts/slurm/local_cluster.sh"
HOST=$(hostname -s)
SOCKET_DIR=$STATE/munge  # munged's socket: the controller's here, each node's bind-mounted over it in its namespace
SLURMD_TIMEOUT=${SLURM_LOCAL_SLURMD_TIMEOUT:-20}
export SLURM_CONF=$CONF

say() { echo "slurm-local: $*"; }

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
        && command -v unshare >/dev/null; then
        return 0
    fi
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
        say "slurm-wlm/munge are not installed and this is not root with apt; install them (apt-get install slurm-wlm munge)"
        return 1
    fi
    say "installing slurm-wlm and munge with apt"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge util-linux >/dev/null
}

node_count() { cat "$STATE/nodes" 2>/dev/null || echo 0; }

free_ports() {  # N distinct ports free now (held open together, so the OS gives N different ones)
    python3 -c 'import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"
}

write_conf() {
    local nodes=$1 cpus mem ports ctld_port k
    if [[ -f $CONF ]] && ! grep -qF "$MARK" "$CONF"; then
        say "$CONF exists and was not written by this script (a real cluster?); leaving it alone"
        return 1
    fi
    cpus=$(nproc)
    # RealMemory: what is free now, minus a margin, so slurmd never reports less than configured (node drained).
    # Every node reports the whole machine: the nodes share it.
    mem=$(awk '/MemAvailable/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
    if [[ -n $PRIVATE ]]; then
        read -r -a ports <<<"$(free_ports $((nodes + 1)))"
        ctld_port=${ports[0]}
    else
        ctld_port=6817
        for ((k = 1; k <= nodes; k++)); do ports[k]=$((6817 + k)); done
    fi
    mkdir -p "$(dirname "$CONF")" "$STATE/ctld"
    {
        echo "$MARK"
        echo "ClusterName=${PRIVATE:+t$$}${PRIVATE:-local}"
        cat <<EOF
SlurmctldHost=${HOST}(127.0.0.1)
SlurmctldPort=${ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=10,socket=${SOCKET_DIR}/munge.socket.2
StateSaveLocation=${STATE}/ctld
SlurmdSpoolDir=${STATE}/%n/spool
SlurmctldPidFile=${STATE}/slurmctld.pid
SlurmdPidFile=${STATE}/%n/slurmd.pid
SlurmctldLogFile=${STATE}/slurmctld.log
SlurmdLogFile=${STATE}/%n/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmdTimeout=${SLURMD_TIMEOUT}
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=5,bf_interval=5,kill_invalid_depend
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
KillWait=10
MinJobAge=600
InactiveLimit=0
EOF
        for ((k = 1; k <= nodes; k++)); do
            echo "NodeName=n${k} NodeAddr=127.0.0.$((k + 1)) Port=${ports[k]} CPUs=${cpus} RealMemory=${mem} State=UNKNOWN"
        done
        echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
    } >"$CONF"
    {
        cat /etc/hosts
        for ((k = 1; k <= nodes; k++)); do echo "127.0.0.$((k + 1)) n${k}"; done
    } >"$STATE/hosts"
    echo "$nodes" >"$STATE/nodes"
    say "wrote $CONF ($nodes node(s), CPUs=${cpus} and RealMemory=${mem} MB each)"
}

pid_alive() {  # the pid in file $1 runs (a zombie, killed but not yet reaped, does not)
    local pid state
    [[ -f $1 ]] && pid=$(cat "$1") && kill -0 "$pid" 2>/dev/null || return 1
    state=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1)
    [[ -n $state && $state != Z ]]
}

wait_for_file() { for _ in $(seq 100); do [[ -s $1 ]] && return 0; sleep 0.1; done; return 1; }

start_munged() {  # start_munged DIR: a munged with the cluster key, its socket in SOCKET_DIR, its files in DIR
    local dir=$1
    pid_alive "$dir/munged.pid" && return 0
    mkdir -p "$dir"
    /usr/sbin/munged --force --key-file="$STATE/munge.key" --socket="$SOCKET_DIR/munge.socket.2" \
        --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munged.seed"
    wait_for_file "$dir/munged.pid"
}

munge_key() {
    [[ -s $STATE/munge.key ]] && return 0
    (umask 077 && dd if=/dev/urandom bs=1 count=1024 of="$STATE/munge.key" 2>/dev/null)
}

start_node() {  # a slurmd -N nK (and its munged) in a UTS + mount namespace of its own
    local k=$1 dir=$STATE/n$1 left
    if pid_alive "$dir/slurmd.pid"; then return 0; fi
    # Only its slurmd died: what is left of the node (its munged, job steps) is ended first, by pid, so the node
    # comes back whole in a new namespace; a second munged would otherwise start and the first run on untracked.
    left=$(node_pids "$k")
    if [[ -n $left ]]; then
        say "node n$k: slurmd is gone; ending what is left of the node ($(echo $left | wc -w) process(es)) first"
        kill_node "$k" >/dev/null
    fi
    mkdir -p "$dir/spool" "$dir/munge"
    chmod 0755 "$dir/munge"
    # shellcheck disable=SC2016
    unshare --mount --uts --propagation private -- bash -c '
        set -e
        hostname "$1"
        mount --bind "$2/hosts" /etc/hosts
        mount --bind "$3/munge" "$4"
        /usr/sbin/munged --force --key-file="$2/munge.key" --socket="$4/munge.socket.2" \
            --pid-file="$3/munged.pid" --log-file="$3/munged.log" --seed-file="$3/munged.seed"
        slurmd -f "$5" -N "$1"
    ' node "n$k" "$STATE" "$dir" "$SOCKET_DIR" "$CONF"
    wait_for_file "$dir/slurmd.pid"
    readlink "/proc/$(cat "$dir/slurmd.pid")/ns/uts" >"$dir/namespace"
}

node_pids() {  # every process in node K's UTS namespace
    local ns
    ns=$(cat "$STATE/n$1/namespace" 2>/dev/null) || return 0
    for p in /proc/[0-9]*; do
        [[ $(readlink "$p/ns/uts" 2>/dev/null) == "$ns" ]] && echo "${p#/proc/}"
    done
    return 0
}

kill_node() {
    local pids
    pids=$(node_pids "$1")
    # shellcheck disable=SC2086
    [[ -n $pids ]] && kill -9 $pids 2>/dev/null
    for _ in $(seq 50); do [[ -z $(node_pids "$1") ]] && break; sleep 0.1; done  # gone before a restart
    rm -f "$STATE/n$1/slurmd.pid" "$STATE/n$1/munged.pid"
    say "node n$1: killed $(echo $pids | wc -w) process(es)"
}

wait_idle() {  # until every node answers (idle, mixed or allocated), resuming any that came up down/drained
    local nodes=$1 t0=$2 state=""
    for _ in $(seq 120); do
        state=$(sinfo -h -N -o "%N %T" 2>/dev/null || true)
        if [[ $(grep -cE " (idle|mix|alloc)" <<<"$state") -ge $nodes ]]; then
            say "$nodes node(s) up in $((SECONDS - t0)) s; SLURM_CONF=$CONF (logs: ${STATE}/*.log, ${STATE}/n*/*.log)"
            return 0
        fi
        for node in $(awk '$2 ~ /^(drain|down)/ {print $1}' <<<"$state"); do
            scontrol update nodename="$node" state=resume 2>/dev/null || true
        done
        sleep 0.5
    done
    say "the nodes did not all become idle within 60 s ('${state:-no answer}'); see ${STATE}/slurmctld.log, n*/slurmd.log"
    return 1
}

start() {
    local nodes=${1:-1} t0=$SECONDS
    [[ $nodes =~ ^[1-9][0-9]*$ && $nodes -le 200 ]] || { say "NODES must be 1-200, got '$nodes'"; return 2; }
    install_packages
    if pid_alive "$STATE/slurmctld.pid" && [[ $(node_count) != "$nodes" ]]; then
        say "a cluster this script started is running in $STATE with $(node_count) node(s) (0: an earlier version's);" \
            "stop it first (make slurm-stop)"
        return 1
    fi
    mkdir -p "$STATE" "$SOCKET_DIR"
    chmod 0755 "$STATE" "$SOCKET_DIR"
    pid_alive "$STATE/slurmctld.pid" || write_conf "$nodes"
    munge_key
    start_munged "$STATE/ctl"
    pid_alive "$STATE/slurmctld.pid" || slurmctld -f "$CONF"
    for ((k = 1; k <= nodes; k++)); do start_node "$k"; done
    wait_idle "$nodes" "$t0"
}

stop_pid() {  # stop_pid FILE NAME: SIGTERM, wait up to 5 s, then SIGKILL
    local pid
    pid_alive "$1" || { rm -f "$1"; return 0; }
    pid=$(cat "$1")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$1"
    say "stopped $2 (pid $pid)"
}

stop() {
    local k
    for ((k = 1; k <= $(node_count); k++)); do
        stop_pid "$STATE/n$k/slurmd.pid" "slurmd n$k"
        kill_node "$k" >/dev/null  # its munged, and job steps left behind (slurmd does not end them)
    done
    stop_pid "$STATE/slurmctld.pid" slurmctld
    stop_pid "$STATE/ctl/munged.pid" munged
    # an earlier version of this script ran one slurmd and munged outside namespaces
    stop_pid "$STATE/slurmd.pid" slurmd
    stop_pid "$STATE/munged.pid" munged
}

status() {
    pid_alive "$STATE/slurmctld.pid" && echo "slurmctld: running (pid $(cat "$STATE/slurmctld.pid"))" \
        || echo "slurmctld: stopped"
    for ((k = 1; k <= $(node_count); k++)); do
        pid_alive "$STATE/n$k/slurmd.pid" && echo "n$k: slurmd running (pid $(cat "$STATE/n$k/slurmd.pid"))" \
            || echo "n$k: slurmd stopped"
        pid_alive "$STATE/n$k/munged.pid" && echo "n$k: munged running (pid $(cat "$STATE/n$k/munged.pid"))" \
            || echo "n$k: munged stopped"
    done
    sinfo 2>/dev/null || true
}

case ${1:-start} in
    start) start "${2:-${NODES:-1}}" ;;
    stop) stop ;;
    status) status ;;
    install) install_packages ;;
    kill-node) kill_node "${2:?kill-node K}" ;;
    start-node) start_node "${2:?start-node K}" && say "node n$2 started" ;;
    *) echo "usage: $0 start [N]|stop|status|install|kill-node K|start-node K" >&2; exit 2 ;;
esac
