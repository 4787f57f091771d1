#!/usr/bin/env bash
# A real multi-node SLURM cluster on this machine: every compute node is a Linux network namespace with
# its own address on a private bridge, its own hostname (UTS namespace) and its own slurmd; slurmctld and
# a private munged run in the root namespace. All nodes share the filesystem, as cluster nodes share a
# parallel filesystem. Node loss, partitions and slow links are then real events.
#
#   netns_cluster.sh up        PREFIX [NODES]     # N >= 1 nodes (default 3): n1..nN; installs if needed
#   netns_cluster.sh status    PREFIX             # daemons, links, node states, queue
#   netns_cluster.sh down      PREFIX             # cancel jobs, kill every process of every node, remove
#                                                 # the namespaces, the bridge and this prefix's daemons
#   netns_cluster.sh exec      PREFIX NODE CMD..  # run CMD inside node NODE (its network and hostname)
#   netns_cluster.sh addr      PREFIX NODE        # the node's address
#   netns_cluster.sh pids      PREFIX NODE        # pids of every process inside the node
#   netns_cluster.sh crash     PREFIX NODE        # SIGKILL every process inside the node (slurmd too)
#   netns_cluster.sh boot      PREFIX NODE        # start the node's slurmd again (after a crash)
#   netns_cluster.sh partition PREFIX NODE        # cut the node's link (no RST: packets just vanish)
#   netns_cluster.sh heal      PREFIX NODE        # bring the link back
#   netns_cluster.sh slow      PREFIX NODE SPEC   # SPEC: delay=MS[,loss=PCT] (needs tc netem) or
#                                                 # rate=KBIT (tc tbf); exit 3 with the reason if missing
#   netns_cluster.sh fast      PREFIX NODE        # remove the slow-link qdisc
#
# NODE is a node name (n2) or number (2). Needs root, ip, nsenter, unshare and no systemd. Everything lives
# under PREFIX (config, state, spool, per-node logs PREFIX/log/slurmd-nI.log, pid files, munged socket);
# ports are picked free at the first `up`; namespace, bridge and veth names carry a tag derived from
# PREFIX and the subnet 10.213.K.0/24 is picked unused, so several prefixes can run side by side (and
# beside local_cluster.sh). Use it with `export SLURM_CONF=PREFIX/etc/slurm.conf` (or `source PREFIX/env.sh`).
#
# slurmd is started with `nsenter --net=... unshare --uts`, not `ip netns exec`: the latter remounts /sys,
# hides /sys/fs/cgroup, and slurmd dies with "Unable to initialize cgroup plugin".
#
# Exit codes: 0 ok; 3 this machine cannot do it (not root, no apt-get, install failed, a tool or kernel
# feature missing) -- callers may skip on 3; 1 anything else; 2 usage.
#
# Environment knobs: SLURM_NETNS_CPUS (CPUs each node advertises, default 8), SLURM_NETNS_SLURMD_TIMEOUT
# (SlurmdTimeout, default 10), SLURM_NETNS_KILL_WAIT (KillWait, default 10), SLURM_LOCAL_UP_TIMEOUT
# (seconds to wait for the nodes to be idle, default 60).
set -uo pipefail # not -e: every exit status below is looked at

# shellcheck source=cluster_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster_lib.sh"
LOG_TAG=netns_cluster
# Namespaces, links and qdiscs need ip/tc (iproute2); nsenter and unshare come with util-linux.
PACKAGES+=(iproute2)

usage() {
    echo "usage: $0 {up PREFIX [NODES]|down|status PREFIX|exec|addr|pids|crash|boot|partition|heal|fast PREFIX NODE [...]|slow PREFIX NODE SPEC}" >&2
    exit 2
}

[[ $# -ge 2 ]] || usage
ACTION=$1
PREFIX=$2
shift 2
case $ACTION in up | down | status | exec | addr | pids | crash | boot | partition | heal | slow | fast) ;; *) usage ;; esac
mkdir -p "$PREFIX" || die "cannot create $PREFIX"
PREFIX=$(cd "$PREFIX" && pwd -P) || die "cannot enter $PREFIX"

ETC=$PREFIX/etc
CONF=$ETC/slurm.conf
STATE_ENV=$PREFIX/cluster.env # NODES, TAG, SUBNET: fixed at the first `up`
LOGDIR=$PREFIX/log
RUN=$PREFIX/run
MUNGE_DIR=$PREFIX/munge
MUNGE_SOCKET=$MUNGE_DIR/munge.socket.2
export SLURM_CONF=$CONF

# ---------------------------------------------------------------- naming
load_state() {
    [[ -s $STATE_ENV ]] || die "$PREFIX holds no cluster (run: $0 up $PREFIX)"
    # shellcheck source=/dev/null
    source "$STATE_ENV" || die "cannot read $STATE_ENV"
}

ns_name() { echo "ts${TAG}n$1"; }    # network namespace of node i
veth_name() { echo "ts${TAG}v$1"; }  # its root-side veth end (the node side is eth0)
bridge_name() { echo "ts${TAG}br"; } # <= 15 characters
node_addr() { echo "${SUBNET}.$((10 + $1))"; }
bridge_addr() { echo "${SUBNET}.1"; }

node_index() { # n2 | 2 -> 2, validated against NODES
    local i=${1#n}
    [[ $i =~ ^[0-9]+$ ]] && ((i >= 1 && i <= NODES)) || die "no node '$1' (nodes: n1..n$NODES)"
    echo "$i"
}

subnet_in_use() { ip -o -4 addr show 2>/dev/null | grep -q " $1\."; }

new_state() { # pick a tag and an unused 10.213.K.0/24 for this prefix
    local nodes=$1 tag k
    [[ $nodes =~ ^[0-9]+$ ]] && ((nodes >= 1 && nodes <= 40)) || die "NODES must be 1..40, got '$nodes'"
    tag=$(printf '%s' "$PREFIX" | cksum | awk '{printf "%04x", $1 % 65536}')
    for k in $(seq $((RANDOM % 200 + 20)) 254) $(seq 20 254); do
        subnet_in_use "10.213.$k" || break
    done
    subnet_in_use "10.213.$k" && die "no free 10.213.K.0/24 subnet"
    printf 'NODES=%s\nTAG=%s\nSUBNET=%s\n' "$nodes" "$tag" "10.213.$k" >"$STATE_ENV.tmp" &&
        mv "$STATE_ENV.tmp" "$STATE_ENV" || die "cannot write $STATE_ENV"
}

# ---------------------------------------------------------------- network
net_up() {
    local br i ns veth
    br=$(bridge_name)
    if ! ip link show "$br" >/dev/null 2>&1; then
        ip link add "$br" type bridge || die "cannot create bridge $br"
        ip addr add "$(bridge_addr)/24" dev "$br" || die "cannot address bridge $br"
    fi
    ip link set "$br" up || die "cannot bring up $br"
    for i in $(seq 1 "$NODES"); do
        ns=$(ns_name "$i")
        veth=$(veth_name "$i")
        if [[ ! -e /run/netns/$ns ]]; then
            ip netns add "$ns" || die "cannot create namespace $ns"
        fi
        if ! ip link show "$veth" >/dev/null 2>&1; then
            ip link add "$veth" type veth peer name eth0 netns "$ns" || die "cannot create veth $veth"
            ip -n "$ns" addr add "$(node_addr "$i")/24" dev eth0 || die "cannot address n$i"
        fi
        ip link set "$veth" master "$br" up || die "cannot attach $veth to $br"
        ip -n "$ns" link set eth0 up || die "cannot bring up eth0 of n$i"
        ip -n "$ns" link set lo up || die "cannot bring up lo of n$i"
    done
}

net_down() {
    local i ns veth
    for i in $(seq 1 "$NODES"); do
        ns=$(ns_name "$i")
        veth=$(veth_name "$i")
        ip link show "$veth" >/dev/null 2>&1 && { ip link del "$veth" || log "cannot delete $veth"; }
        [[ -e /run/netns/$ns ]] && { ip netns del "$ns" || log "cannot delete namespace $ns"; }
    done
    ip link show "$(bridge_name)" >/dev/null 2>&1 && { ip link del "$(bridge_name)" || log "cannot delete bridge"; }
    return 0
}

in_node() { # i CMD...: run CMD in node i's network namespace under its own hostname
    local i=$1
    shift
    nsenter --net="/run/netns/$(ns_name "$i")" unshare --uts \
        sh -c 'hostname "$0" && exec "$@"' "n$i" "$@"
}

node_pids() { ip netns pids "$(ns_name "$1")" 2>/dev/null; }

kill_node() { # SIGKILL every process in node i until none is left (a fork may race the first pass)
    local i=$1 round pids
    for round in $(seq 1 20); do
        pids=$(node_pids "$i")
        [[ -z $pids ]] && return 0
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null || : # some may have exited meanwhile: the next round checks
        sleep 0.05
    done
    pids=$(node_pids "$i")
    [[ -z $pids ]] || die "processes survive in n$i after 20 rounds of SIGKILL: $pids"
}

# ---------------------------------------------------------------- config and daemons
write_config() {
    [[ -s $CONF ]] && return 0 # keep an existing config (and its ports): `up` is idempotent
    local ctld_port slurmd_port mem_mib i nodes_lines=""
    ctld_port=$(pick_port) || exit 1
    slurmd_port=$(pick_port "$ctld_port") || exit 1
    mem_mib=$(awk '/^MemTotal:/ {printf "%d", $2 / 1024 * 0.9}' /proc/meminfo)
    for i in $(seq 1 "$NODES"); do
        nodes_lines+="NodeName=n$i NodeAddr=$(node_addr "$i") NodeHostname=n$i CPUs=${SLURM_NETNS_CPUS:-8} RealMemory=$mem_mib State=UNKNOWN"$'\n'
    done
    mkdir -p "$ETC" || die "cannot create $ETC"
    cat >"$CONF.tmp" <<CONF || die "cannot write $CONF"
# Generated by scripts/slurm/netns_cluster.sh: $NODES namespace nodes on $(bridge_name) ($SUBNET.0/24), Slurm 22.05.
ClusterName=truestep-netns
SlurmctldHost=$(hostname -s)($(bridge_addr))
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
$(common_slurm_conf)
StateSaveLocation=$PREFIX/state
SlurmdSpoolDir=$PREFIX/spool/slurmd-%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOGDIR/slurmctld.log
SlurmdLogFile=$LOGDIR/slurmd-%n.log
# A node that stops answering is declared DOWN after SlurmdTimeout (plus up to a ping cycle); its jobs
# are requeued (--requeue). The default, 300 s, would make every node-loss test wait minutes.
SlurmdTimeout=${SLURM_NETNS_SLURMD_TIMEOUT:-10}
MessageTimeout=5
KillWait=${SLURM_NETNS_KILL_WAIT:-10}
${nodes_lines}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=high  Nodes=ALL MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
CONF
    mv "$CONF.tmp" "$CONF" || die "cannot write $CONF"
    printf 'export SLURM_CONF=%q\n' "$CONF" >"$PREFIX/env.sh" || die "cannot write $PREFIX/env.sh"
    log "wrote $CONF ($NODES nodes, slurmctld port $ctld_port, slurmd port $slurmd_port)"
}

start_slurmctld() {
    pid_alive "$RUN/slurmctld.pid" && return 0
    /usr/sbin/slurmctld -f "$CONF" || die "slurmctld failed to start"
}

start_slurmd() { # node i; slurmd daemonizes inside the node
    local i=$1
    pid_alive "$RUN/slurmd-n$i.pid" && return 0
    mkdir -p "$PREFIX/spool/slurmd-n$i" || die "cannot create the spool of n$i"
    in_node "$i" /usr/sbin/slurmd -f "$CONF" -N "n$i" || die "slurmd of n$i failed to start (log: $LOGDIR/slurmd-n$i.log)"
}

node_state() { sinfo -h -n "n$1" -o %T 2>/dev/null | head -n1; }

wait_idle() { # nodes...: wait (bounded) until each is idle, resuming it once if SLURM holds it down
    local timeout=${SLURM_LOCAL_UP_TIMEOUT:-60} t0=$SECONDS i state pending resumed=" "
    while ((SECONDS - t0 < timeout)); do
        pending=""
        for i in "$@"; do
            state=$(node_state "$i")
            case $state in
            idle | mixed | allocated) continue ;;
            down* | drain*)
                if [[ $resumed != *" $i "* ]] && scontrol ping >/dev/null 2>&1; then
                    scontrol update NodeName="n$i" State=RESUME >/dev/null 2>&1 && resumed+="$i "
                fi
                ;;
            esac
            pending+=" n$i(${state:-no answer})"
        done
        [[ -z $pending ]] && return 0
        daemon_gone "$RUN/slurmctld.pid" && {
            tail -n 25 "$LOGDIR/slurmctld.log" >&2
            die "slurmctld exited (log: $LOGDIR/slurmctld.log)"
        }
        sleep 0.2
    done
    for i in "$@"; do tail -n 15 "$LOGDIR/slurmd-n$i.log" >&2 2>/dev/null; done
    die "not idle after ${timeout}s:$pending"
}

# ---------------------------------------------------------------- actions
cmd_up() {
    local t0=$SECONDS i
    require_slurm
    for tool in ip nsenter unshare; do
        command -v "$tool" >/dev/null || unavailable "'$tool' is missing"
    done
    if [[ ! -s $STATE_ENV ]]; then
        new_state "${1:-3}"
    elif [[ -n ${1:-} ]]; then
        load_state
        [[ $1 == "$NODES" ]] || die "$PREFIX already holds a $NODES-node cluster (asked for $1)"
    fi
    load_state
    mkdir -p "$LOGDIR" "$RUN" "$PREFIX/state" "$PREFIX/spool" || die "cannot create directories in $PREFIX"
    if ! ip netns add "ts${TAG}probe" 2>/dev/null; then
        unavailable "cannot create network namespaces (ip netns add failed)"
    fi
    ip netns del "ts${TAG}probe" || die "cannot delete the probe namespace"
    net_up
    write_config
    start_munged
    start_slurmctld
    for i in $(seq 1 "$NODES"); do start_slurmd "$i"; done
    wait_idle $(seq 1 "$NODES")
    log "cluster up in $((SECONDS - t0)) s: $NODES nodes on $(bridge_name) $SUBNET.0/24: $(sinfo -h -N -o '%N=%T' | sort -u | tr '\n' ' ')"
    log "use:  export SLURM_CONF=$CONF   (or: source $PREFIX/env.sh); logs: $LOGDIR"
}

cmd_down() {
    local i
    [[ -s $STATE_ENV ]] || {
        log "nothing to stop in $PREFIX"
        return 0
    }
    load_state
    if [[ -s $CONF ]] && pid_alive "$RUN/slurmctld.pid"; then
        for i in $(seq 1 "$NODES"); do # a partitioned or slowed node could not take part in the teardown
            [[ -e /run/netns/$(ns_name "$i") ]] || continue
            ip link set "$(veth_name "$i")" up || log "cannot bring the link of n$i up"
            unslow "$i" || log "cannot remove the slow-link qdisc of n$i"
        done
        cancel_all_jobs
    fi
    for i in $(seq 1 "$NODES"); do
        [[ -e /run/netns/$(ns_name "$i") ]] && kill_node "$i"
    done
    stop_pidfile slurmctld "$RUN/slurmctld.pid"
    stop_pidfile munged "$RUN/munged.pid"
    net_down
    log "down: $PREFIX"
}

cmd_status() {
    local i rc=0 link
    load_state
    for name in munged slurmctld; do
        if pid_alive "$RUN/$name.pid"; then echo "$name: running (pid $(cat "$RUN/$name.pid"))"; else
            echo "$name: not running"
            rc=1
        fi
    done
    for i in $(seq 1 "$NODES"); do
        link=$(ip -o link show "$(veth_name "$i")" 2>/dev/null | grep -o 'state [A-Z]*' || echo "no link")
        echo "n$i $(node_addr "$i") ($(ns_name "$i"), $link): slurmd $(pid_alive "$RUN/slurmd-n$i.pid" && echo running || echo stopped), $(node_pids "$i" | wc -l) processes"
    done
    if ((rc == 0)); then
        sinfo -N || rc=1
        squeue || rc=1
    fi
    echo "export SLURM_CONF=$CONF"
    return $rc
}

unslow() { # node i: remove a netem/tbf root qdisc if there is one
    local qdisc
    qdisc=$(ip netns exec "$(ns_name "$1")" tc qdisc show dev eth0 root) || return 1
    [[ $qdisc == *netem* || $qdisc == *tbf* ]] || return 0
    ip netns exec "$(ns_name "$1")" tc qdisc del dev eth0 root
}

cmd_slow() {
    local i=$1 spec=$2 ns delay="" loss="" rate="" part err
    ns=$(ns_name "$i")
    for part in ${spec//,/ }; do
        case $part in
        delay=*) delay=${part#delay=} ;;
        loss=*) loss=${part#loss=} ;;
        rate=*) rate=${part#rate=} ;;
        *) die "slow link spec '$spec': use delay=MS[,loss=PCT] or rate=KBIT" ;;
        esac
    done
    if [[ -n $delay || -n $loss ]]; then
        [[ -z $rate ]] || die "slow link spec '$spec': delay/loss and rate do not combine"
        local args=(netem)
        [[ -n $delay ]] && args+=(delay "${delay}ms")
        [[ -n $loss ]] && args+=(loss "${loss}%")
        if ! err=$(ip netns exec "$ns" tc qdisc replace dev eth0 root "${args[@]}" 2>&1); then
            [[ $err == *"qdisc kind is unknown"* ]] &&
                unavailable "this kernel has no netem qdisc (sch_netem): delay/loss cannot be emulated ($err)"
            die "tc netem on n$i failed: $err"
        fi
    elif [[ -n $rate ]]; then
        if ! err=$(ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate "${rate}kbit" burst 16kb latency 1s 2>&1); then
            [[ $err == *"qdisc kind is unknown"* ]] && unavailable "this kernel has no tbf qdisc ($err)"
            die "tc tbf on n$i failed: $err"
        fi
    else
        die "slow link spec '$spec': use delay=MS[,loss=PCT] or rate=KBIT"
    fi
    log "n$i: slow link $spec"
}

case $ACTION in
up) cmd_up "$@" ;;
down) cmd_down ;;
status) cmd_status ;;
*)
    load_state
    [[ $# -ge 1 ]] || usage
    I=$(node_index "$1") || exit 1
    shift
    case $ACTION in
    exec)
        [[ $# -ge 1 ]] || usage
        in_node "$I" "$@"
        ;;
    addr) node_addr "$I" ;;
    pids) node_pids "$I" ;;
    crash)
        kill_node "$I"
        log "n$I crashed: every process in $(ns_name "$I") SIGKILLed"
        ;;
    boot)
        start_slurmd "$I"
        wait_idle "$I"
        log "n$I booted"
        ;;
    partition)
        ip link set "$(veth_name "$I")" down || die "cannot take the link of n$I down"
        log "n$I partitioned (link down)"
        ;;
    heal)
        ip link set "$(veth_name "$I")" up || die "cannot bring the link of n$I up"
        log "n$I link up"
        ;;
    slow)
        [[ $# -eq 1 ]] || usage
        cmd_slow "$I" "$1"
        ;;
    fast)
        unslow "$I" || die "cannot remove the slow-link qdisc of n$I"
        log "n$I: link at full speed"
        ;;
    esac
    ;;
esac
