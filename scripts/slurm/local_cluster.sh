#!/usr/bin/env bash
# A real one-node Slurm cluster on this machine, for the Slurm tests and for trying the Slurm executor:
#
#   bash scripts/slurm/local_cluster.sh start    # (make slurm-local) install slurm-wlm + munge with apt when root,
#                                                # write /etc/slurm/slurm.conf, start munged, slurmctld, slurmd and
#                                                # wait until `sinfo` shows the node idle
#   bash scripts/slurm/local_cluster.sh stop     # (make slurm-stop) end the three daemons by their pids
#   bash scripts/slurm/local_cluster.sh status
#
# There is no systemd in our containers, so the daemons are started by hand. The configuration is written by this
# script only: an existing /etc/slurm/slurm.conf that it did not write (a real cluster's) is never touched.
# Choices that matter for the tests: proctrack/pgid (a job's leftover processes are killed with its process group),
# AuthInfo=cred_expire=10 and sched_interval/bf_interval=5 (a requeued job starts within seconds, not minutes),
# kill_invalid_depend (a job whose `afterok` input failed is cancelled instead of pending forever), MailProg=/bin/true.
set -euo pipefail

CONF_DIR=${SLURM_CONF_DIR:-/etc/slurm}
CONF=${CONF_DIR}/slurm.conf
STATE=${SLURM_LOCAL_STATE:-/var/lib/instella-slurm}
MARK="# written by instella-recipes scripts/slurm/local_cluster.sh"
HOST=$(hostname -s)

say() { echo "slurm-local: $*"; }

install_packages() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; then
        return 0
    fi
    if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
        say "slurm-wlm/munge are not installed and this is not root with apt; install them (apt-get install slurm-wlm munge)"
        return 1
    fi
    say "installing slurm-wlm and munge with apt"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
}

write_conf() {
    if [[ -f $CONF ]] && ! grep -qF "$MARK" "$CONF"; then
        say "$CONF exists and was not written by this script (a real cluster?); leaving it alone"
        return 1
    fi
    local cpus mem
    cpus=$(nproc)
    # RealMemory: what is free now, minus a margin, so slurmd never reports less than configured (node drained).
    mem=$(awk '/MemAvailable/ {print int($2 / 1024 * 0.9)}' /proc/meminfo)
    mkdir -p "$CONF_DIR" "$STATE/ctld" "$STATE/d"
    cat >"$CONF" <<EOF
$MARK
ClusterName=local
SlurmctldHost=${HOST}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=cred_expire=10
StateSaveLocation=${STATE}/ctld
SlurmdSpoolDir=${STATE}/d
SlurmctldPidFile=${STATE}/slurmctld.pid
SlurmdPidFile=${STATE}/slurmd.pid
SlurmctldLogFile=${STATE}/slurmctld.log
SlurmdLogFile=${STATE}/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=5,bf_interval=5,kill_invalid_depend
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
KillWait=10
MinJobAge=600
InactiveLimit=0
NodeName=${HOST} CPUs=${cpus} RealMemory=${mem} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
    say "wrote $CONF (CPUs=${cpus}, RealMemory=${mem} MB)"
}

pid_alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

start() {
    local t0=$SECONDS
    install_packages
    write_conf
    if ! pid_alive "$STATE/munged.pid"; then
        mkdir -p /run/munge /var/lib/munge /var/log/munge
        [[ -s /etc/munge/munge.key ]] || mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null \
            || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null
        chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
        chmod 0700 /etc/munge && chmod 0400 /etc/munge/munge.key
        runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid 2>/dev/null || /usr/sbin/munged --force
        for _ in $(seq 50); do [[ -s /run/munge/munged.pid ]] && break; sleep 0.1; done
        cp /run/munge/munged.pid "$STATE/munged.pid"
    fi
    pid_alive "$STATE/slurmctld.pid" || slurmctld -f "$CONF"
    pid_alive "$STATE/slurmd.pid" || slurmd -f "$CONF"
    for _ in $(seq 120); do
        state=$(sinfo -h -n "$HOST" -o %T 2>/dev/null || true)
        if [[ $state == idle* || $state == mix* || $state == alloc* ]]; then
            say "node ${HOST} ${state}; cluster up in $((SECONDS - t0)) s (logs: ${STATE}/*.log)"
            return 0
        fi
        if [[ $state == drain* || $state == down* ]]; then
            scontrol update nodename="$HOST" state=resume 2>/dev/null || true
        fi
        sleep 0.5
    done
    say "the node did not become idle within 60 s (state: '${state:-none}'); see ${STATE}/slurmctld.log, slurmd.log"
    return 1
}

stop() {
    for name in slurmd slurmctld munged; do
        if pid_alive "$STATE/$name.pid"; then
            pid=$(cat "$STATE/$name.pid")
            kill "$pid"
            for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
            say "stopped $name (pid $pid)"
        fi
        rm -f "$STATE/$name.pid"
    done
}

status() {
    for name in munged slurmctld slurmd; do
        if pid_alive "$STATE/$name.pid"; then echo "$name: running (pid $(cat "$STATE/$name.pid"))"; else echo "$name: stopped"; fi
    done
    sinfo 2>/dev/null || true
}

case ${1:-start} in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
