# shellcheck shell=bash
# Shared by local_cluster.sh (one node) and netns_cluster.sh (N namespace nodes): logging, package
# install, free ports, this prefix's own munged, and starting/stopping daemons by pid file.
# Sourced, not run. The caller sets PREFIX, LOGDIR, RUN, MUNGE_DIR, MUNGE_SOCKET and LOG_TAG first.

PACKAGES=(slurmctld slurmd slurm-client munge)
EXIT_UNSUPPORTED=3

log() { printf '%s %s: %s\n' "$(date +%H:%M:%S)" "${LOG_TAG:-cluster}" "$*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}
unsupported() {
    log "CANNOT RUN SLURM HERE: $*"
    exit "$EXIT_UNSUPPORTED"
}
unavailable() { # a tool or kernel feature this machine lacks (not SLURM itself); callers may skip on 3
    log "NOT AVAILABLE HERE: $*"
    exit "$EXIT_UNSUPPORTED"
}

pid_alive() { # pidfile -> 0 if the process in it is alive and is the daemon the file is named after
    local pid name state
    [[ -s $1 ]] || return 1
    pid=$(cat "$1" 2>/dev/null) || return 1
    name=$(basename "$1" .pid)
    name=${name%%-*} # slurmd-n1.pid -> slurmd
    [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
    [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$name" ]] || return 1 # a reused pid
    # A killed daemon stays a zombie until something reaps it (PID 1 of a container may take its time).
    state=$(sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "/proc/$pid/status" 2>/dev/null)
    [[ -n $state && $state != Z && $state != X ]]
}

daemon_gone() { # pidfile -> 0 if the daemon stays not alive over a second (its pid file can be caught
    # empty or naming its pre-daemonize parent while it starts: one look is not proof that it exited)
    local try
    for try in 1 2 3 4 5; do
        pid_alive "$1" && return 1
        sleep 0.2
    done
    return 0
}

install_packages() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    [[ $(id -u) -eq 0 ]] || unsupported "not root and packages missing: ${missing[*]}"
    command -v apt-get >/dev/null || unsupported "no apt-get to install: ${missing[*]}"
    log "installing ${missing[*]} (apt-get update + install, ~15 s)"
    local t0=$SECONDS
    # policy-rc.d may deny starting services during install: harmless, we start the daemons ourselves.
    if ! DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 update -qq >"$PREFIX/apt.log" 2>&1; then
        tail -n 20 "$PREFIX/apt.log" >&2
        unsupported "apt-get update failed (log: $PREFIX/apt.log)"
    fi
    if ! DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 install -y -qq --no-install-recommends "${PACKAGES[@]}" \
        >>"$PREFIX/apt.log" 2>&1; then
        tail -n 20 "$PREFIX/apt.log" >&2
        unsupported "apt-get install failed (log: $PREFIX/apt.log)"
    fi
    log "installed in $((SECONDS - t0)) s"
}

require_slurm() { # install if needed, then refuse (exit 3) what cannot work here
    local bin
    install_packages
    for bin in /usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/munged; do
        [[ -x $bin ]] || unsupported "$bin missing after install"
    done
    [[ $(id -u) -eq 0 ]] || unsupported "must run as root (SlurmdUser=root launches jobs)"
}

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

pick_port() { # a currently free TCP port in 20000-59999, not equal to $1
    local p i
    for i in $(seq 1 200); do
        p=$((20000 + (RANDOM * 32768 + RANDOM) % 40000))
        [[ $p != "${1:-}" ]] && port_free "$p" && {
            echo "$p"
            return 0
        }
    done
    die "no free TCP port found"
}

start_munged() { # this prefix's own munged on $MUNGE_SOCKET (the system key)
    if pid_alive "$RUN/munged.pid" && munge -S "$MUNGE_SOCKET" -n </dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1; then
        return 0
    fi
    [[ -r /etc/munge/munge.key ]] || die "/etc/munge/munge.key missing (the munge package creates it)"
    id munge >/dev/null 2>&1 || die "no 'munge' user (the munge package creates it)"
    # munged refuses directories that others can write to, and must be able to reach its files.
    chmod 0755 "$PREFIX"
    mkdir -p "$MUNGE_DIR"
    chown munge:munge "$MUNGE_DIR"
    chmod 0755 "$MUNGE_DIR"
    rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
    runuser -u munge -- /usr/sbin/munged --socket="$MUNGE_SOCKET" --key-file=/etc/munge/munge.key \
        --log-file="$MUNGE_DIR/munged.log" --pid-file="$MUNGE_DIR/munged.pid" \
        --seed-file="$MUNGE_DIR/munged.seed" ||
        die "munged failed to start: $(tail -n 5 "$MUNGE_DIR/munged.log" 2>/dev/null)"
    ln -sf "$MUNGE_DIR/munged.pid" "$RUN/munged.pid"
    ln -sf "$MUNGE_DIR/munged.log" "$LOGDIR/munged.log"
    local i
    for i in $(seq 1 50); do
        munge -S "$MUNGE_SOCKET" -n </dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    die "munged does not answer on $MUNGE_SOCKET"
}

stop_pidfile() { # name pidfile: TERM, wait up to 10 s, then KILL
    local name=$1 pidfile=$2 pid i
    pid_alive "$pidfile" || return 0
    pid=$(cat "$pidfile")
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || {
            log "stopped $name (pid $pid)"
            return 0
        }
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    log "killed $name (pid $pid) after 10 s"
}

cancel_all_jobs() { # scancel every job of this cluster and wait (bounded) until the queue is empty
    local jobs i
    jobs=$(squeue -h -o %i 2>/dev/null | tr '\n' ' ' || true)
    [[ -n ${jobs// /} ]] || return 0
    log "cancelling jobs: $jobs"
    # shellcheck disable=SC2086
    scancel $jobs 2>/dev/null || true
    for i in $(seq 1 75); do # KillWait=10: give the jobs' processes time to go
        [[ -z $(squeue -h -o %i 2>/dev/null) ]] && return 0
        sleep 0.2
    done
    log "jobs still queued after 15 s: $(squeue -h -o '%i %T' 2>/dev/null | tr '\n' ' ')"
}

common_slurm_conf() { # the slurm.conf lines both clusters share; the caller writes names, ports, paths, nodes
    cat <<CONF
SlurmUser=root
SlurmdUser=root
# 22.05 has no auth/slurm: MUNGE, through this prefix's own munged socket.
# cred_expire=5 (the minimum): a requeued job waits cred_expire+1 s before it may start again.
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=5
SlurmctldDebug=info
SlurmdDebug=info
# No cgroups, no accounting database (read job state with scontrol show job, not sacct).
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Let a node advertise more CPUs than it has cores, so several jobs fit at once.
SlurmdParameters=config_overrides
SchedulerParameters=sched_interval=1
ReturnToService=2
JobRequeue=1
MinJobAge=600
InactiveLimit=0
# Preemption: a job in a higher PriorityTier partition requeues the jobs it needs room from.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
# Send the job's own --signal when it is preempted (only meaningful with GraceTime). Must be here, not
# in SchedulerParameters (silently ignored there).
SlurmctldParameters=preempt_send_user_signal
CONF
}
