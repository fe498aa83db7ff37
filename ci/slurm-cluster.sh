#!/usr/bin/env bash
# A real one-node SLURM cluster on this machine, for the workflow's cluster tests (and for a
# developer who wants to try `snakemake --profile workflow/profiles/slurm` locally).
#   ci/slurm-cluster.sh install   Debian packages: slurm-wlm, slurmdbd, munge, mariadb-server (root)
#   ci/slurm-cluster.sh start     munged, MariaDB, slurmdbd, slurmctld, slurmd; registers the cluster
#   ci/slurm-cluster.sh stop      everything down again
# Known to work on Debian 12 (SLURM 22.05): no cgroup.conf, proctrack/linuxproc, task/none,
# select/cons_tres; accounting through slurmdbd on MariaDB (the Snakemake plugin polls sacct).
set -euo pipefail
CLUSTER=andrea
HOST=$(hostname -s)
ETC=/etc/slurm
LOG=/var/log/slurm

install() {
  export DEBIAN_FRONTEND=noninteractive
  if ! command -v slurmctld >/dev/null || ! command -v slurmdbd >/dev/null || ! command -v mariadbd >/dev/null; then
    apt-get update -qq
    apt-get install -y -qq slurm-wlm slurmdbd munge mariadb-server >/dev/null
  fi
}

wait_for() {  # wait_for SECONDS COMMAND...
  local n=$1; shift
  for _ in $(seq "$n"); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done
  echo "timed out waiting for: $*" >&2
  return 1
}

start() {
  mkdir -p $ETC $LOG /run/slurm /var/spool/slurmd /var/spool/slurmctld /run/munge /run/mysqld
  chown munge:munge /run/munge 2>/dev/null || true
  chown mysql:mysql /run/mysqld 2>/dev/null || true
  [ -s /etc/munge/munge.key ] || { mungekey --create --force 2>/dev/null || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
  # check daemons by asking them, not with pgrep: a killed daemon can linger as a zombie
  munge -n >/dev/null 2>&1 || runuser -u munge -- /usr/sbin/munged --force  # --force: reuse a stale socket
  wait_for 20 munge -n

  mysqladmin ping >/dev/null 2>&1 || (mysqld_safe --user=mysql >/dev/null 2>&1 &)
  wait_for 60 mysqladmin ping
  mysql -e "CREATE DATABASE IF NOT EXISTS slurm_acct_db; CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"

  local cpus mem
  cpus=$(nproc)
  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
  cat > $ETC/slurm.conf <<CONF
ClusterName=$CLUSTER
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
MinJobAge=600
KillWait=30
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
AccountingStoreFlags=job_comment
SlurmctldPidFile=/run/slurm/slurmctld.pid
SlurmdPidFile=/run/slurm/slurmd.pid
SlurmdSpoolDir=/var/spool/slurmd
StateSaveLocation=/var/spool/slurmctld
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=cpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
  cat > $ETC/slurmdbd.conf <<CONF
AuthType=auth/munge
DbdHost=$HOST
DbdAddr=127.0.0.1
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
LogFile=$LOG/slurmdbd.log
PidFile=/run/slurm/slurmdbd.pid
CONF
  chmod 600 $ETC/slurmdbd.conf
  sacctmgr -n list cluster >/dev/null 2>&1 || slurmdbd
  wait_for 60 sacctmgr -n list cluster
  sacctmgr -i -Q add cluster $CLUSTER >/dev/null 2>&1 || true
  scontrol ping 2>/dev/null | grep -q UP || slurmctld
  wait_for 30 bash -c "scontrol ping | grep -q UP"
  pgrep -x -r R,S,D slurmd >/dev/null 2>&1 || slurmd
  wait_for 60 bash -c "sinfo -h -o %T | grep -qE 'idle|mixed|alloc'"
  scontrol update nodename=$HOST state=resume >/dev/null 2>&1 || true
  sinfo
}

stop() {
  scontrol shutdown >/dev/null 2>&1 || true
  pkill -x slurmd || true
  pkill -x slurmctld || true
  pkill -x slurmdbd || true
  mysqladmin shutdown >/dev/null 2>&1 || true
  pkill -x munged || true
}

"${1:?usage: $0 install|start|stop}"
