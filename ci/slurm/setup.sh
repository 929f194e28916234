#!/usr/bin/env bash
# A one-node Slurm on this machine, for testing deploy/slurm/skyriver.sbatch (root; idempotent).
#   ci/slurm/setup.sh          install slurmctld, slurmd and munge (Debian), configure, start
#   ci/slurm/setup.sh stop     stop the daemons this script started
# The node advertises 8 CPUs whatever the machine has (config_overrides), so several jobs and
# several tasks per job fit; one slurmd per host (Debian's Slurm is built without
# --enable-multiple-slurmd), so a job has one node and its tasks share it.
set -euo pipefail
conf_dir=/etc/slurm
node=$(hostname -s)

stop() {
    for daemon in slurmd slurmctld; do
        if [ -f "/run/$daemon.pid" ]; then
            kill "$(cat "/run/$daemon.pid")" 2>/dev/null || true
            rm -f "/run/$daemon.pid"
        fi
    done
}

if [ "${1:-}" = stop ]; then
    stop
    exit 0
fi

if ! command -v slurmctld >/dev/null 2>&1 || ! command -v slurmd >/dev/null 2>&1 \
    || ! command -v munged >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge \
        || { apt-get update && apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge; }
fi

# munge: a key, then the daemon.
if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1 count=1024 status=none
fi
chown munge:munge /etc/munge/munge.key 2>/dev/null || true
chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    pkill_pidfile=/run/munge/munged.pid
    [ -f "$pkill_pidfile" ] && kill "$(cat "$pkill_pidfile")" 2>/dev/null || true
    runuser -u munge -- munged --force 2>/dev/null || munged --force
    for _ in $(seq 50); do munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
fi

memory_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
mkdir -p "$conf_dir" /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
cat > "$conf_dir/slurm.conf.new" <<CONF
# Written by ci/slurm/setup.sh: one node, this machine.
ClusterName=skyriver
SlurmctldHost=$node
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=5
InactiveLimit=0
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
NodeName=$node CPUs=8 RealMemory=$memory_mb State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
changed=1
if [ -f "$conf_dir/slurm.conf" ] && cmp -s "$conf_dir/slurm.conf" "$conf_dir/slurm.conf.new"; then
    changed=0
fi
mv "$conf_dir/slurm.conf.new" "$conf_dir/slurm.conf"
if [ "$changed" = 1 ]; then
    stop
fi

running() { [ -f "/run/$1.pid" ] && kill -0 "$(cat "/run/$1.pid")" 2>/dev/null; }
running slurmctld || slurmctld
running slurmd || slurmd
for _ in $(seq 100); do
    state=$(sinfo -h -n "$node" -o %T 2>/dev/null || true)
    case "$state" in
        idle*|mixed*|allocated*) echo "slurm: node $node $state"; exit 0 ;;
        down*|drain*) scontrol update nodename="$node" state=resume 2>/dev/null || true ;;
    esac
    sleep 0.2
done
echo "slurm: node $node did not become idle (state: ${state:-unknown}); see /var/log/slurm/" >&2
exit 1
