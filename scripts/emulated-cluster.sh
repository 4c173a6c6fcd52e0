#!/usr/bin/env bash
# An emulated cluster on this one Linux machine: N "hosts", each a network namespace with one
# NIC (a veth into a switch namespace holding a bridge), every NIC shaped by a token-bucket
# qdisc to RATE in both directions (plus an optional netem delay), and Open MPI told to launch
# its daemons into the namespaces (plm_rsh_agent: `ip netns exec` instead of ssh) and to talk TCP
# over the hosts' subnet only. Nothing leaves the machine: the addresses live only inside
# namespaces this script creates, and `down` removes them. Needs root and iproute2 (`ip`, `tc`).
#
#   scripts/emulated-cluster.sh up N RATE [DELAY]   e.g. `up 2 500mbit` or `up 4 1gbit 1ms`
#   scripts/emulated-cluster.sh run CMD [ARGS...]    runs CMD on host 0 (where mpirun belongs)
#                                                    with EPO_CLUSTER_HOSTS=ip:slots,... set and
#                                                    the Open MPI settings exported
#   scripts/emulated-cluster.sh exec H CMD [ARGS...] runs CMD on host H
#   scripts/emulated-cluster.sh cut H | restore H    takes host H's NIC down / up (a cut link)
#   scripts/emulated-cluster.sh impair H [rate R] [loss P%] [delay T]
#                                                    degrades host H's NIC, both directions: a
#                                                    lower rate, random loss (nftables), a delay
#                                                    (netem, where the kernel has it); `impair H`
#                                                    alone puts the link back as `up` made it
#   scripts/emulated-cluster.sh kill H               kills every process on host H
#   scripts/emulated-cluster.sh status | down
#
# Example, 2 hosts x 1 rank over 500 Mbit/s links:
#   scripts/emulated-cluster.sh up 2 500mbit
#   scripts/emulated-cluster.sh run bash -c 'mpirun -H "$EPO_CLUSTER_HOSTS" -np 2 \
#       build/release/bin/epo train --model tiny-moe -ep 2 --max_steps 10'
#   scripts/emulated-cluster.sh down
# EPO_CLUSTER_SLOTS (default 1) sets the ranks each host takes in EPO_CLUSTER_HOSTS.
# EPO_CLUSTER_NAME (default epo) names the cluster: namespaces NAME-h0.., NAME-sw, state in
# /run/NAME-cluster; clusters of different names are independent (tests use their own).
# docs/emulated-cluster.md says what such a cluster does and does not tell you.
set -euo pipefail

self=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
name=${EPO_CLUSTER_NAME:-epo}
[[ $name =~ ^[a-z][a-z0-9]{0,7}$ ]] || { echo "emulated-cluster: EPO_CLUSTER_NAME='$name': 1-8 lower-case letters and digits" >&2; exit 1; }
state=/run/$name-cluster
prefix=$name-h
switch=$name-sw
subnet=10.77.0

die() {
    echo "emulated-cluster: $*" >&2
    exit 1
}
need() {
    [[ $(id -u) -eq 0 ]] || die "needs root (network namespaces)"
    command -v ip >/dev/null && command -v tc >/dev/null || die "needs iproute2 (apt-get install iproute2)"
}
# A rate tc takes, above zero: "500mbit", "1gbit", "2.5gbit" (tc itself prints its usage and
# fails on 0mbit, after part of the cluster was built).
valid_rate() {
    [[ $1 =~ ^([0-9]*\.?[0-9]+)[kmg]?bit$ ]] && awk -v r="${BASH_REMATCH[1]}" 'BEGIN { exit !(r > 0) }'
}
# The cluster is up once `up` wrote its link file, last: a state directory without it is a
# build that failed half-way (its rollback did not finish), which `down` removes.
num_hosts() {
    [[ -f $state/link ]] || {
        [[ -d $state ]] && die "a cluster build did not finish ($state); run 'down' to remove what it left"
        die "no cluster is up (scripts/emulated-cluster.sh up N RATE)"
    }
    wc -l <"$state/hosts"
}
host_ns() {  # host index -> namespace
    local h=$1
    [[ $h =~ ^[0-9]+$ ]] && ((h < $(num_hosts))) || die "no host '$h' (hosts 0..$(($(num_hosts) - 1)))"
    echo "$prefix$h"
}

up() {
    need
    local n=${1:?usage: up N RATE [DELAY]} rate=${2:?usage: up N RATE [DELAY]} delay=${3:-}
    [[ $n =~ ^[0-9]+$ ]] && ((n >= 1 && n <= 64)) || die "N = '$n': give 1 to 64 hosts"
    valid_rate "$rate" || die "RATE = '$rate': give a tc rate above zero, such as 500mbit or 1gbit"
    [[ -z $delay || $delay =~ ^[0-9.]+(us|ms)$ ]] || die "DELAY = '$delay': give e.g. 1ms or 200us"
    [[ -z $delay ]] || have_netem || die "DELAY needs the kernel's netem qdisc, which this one lacks (CONFIG_NET_SCH_NETEM); leave DELAY out here"
    [[ ! -d $state ]] || die "a cluster is already up, or a build of one did not finish ($state); run 'down' first"
    mkdir -p "$state"
    # All or nothing: a step that fails removes what the earlier ones built.
    trap '[[ -f $state/link ]] || { echo "emulated-cluster: up failed; removing what it built" >&2; down >/dev/null; }' EXIT
    ip netns add $switch
    ip -n $switch link add br0 type bridge
    ip -n $switch link set br0 up
    : >"$state/hosts"
    for ((h = 0; h < n; ++h)); do
        local ns=$prefix$h addr=$subnet.$((h + 1))
        ip netns add "$ns"
        ip link add eth0 netns "$ns" type veth peer name "p$h" netns $switch
        ip -n $switch link set "p$h" master br0 up
        ip -n "$ns" addr add "$addr/24" dev eth0
        ip -n "$ns" link set lo up
        ip -n "$ns" link set eth0 up
        # The NIC: RATE out of the host (its egress) and into it (the switch port's egress).
        shape "$ns" eth0 "$rate" "$delay"
        shape $switch "p$h" "$rate" ""
        echo "$addr $ns $(host_cpus "$h" "$n")" >>"$state/hosts"
    done
    cat >"$state/agent" <<EOF
#!/bin/sh
# Open MPI's remote-launch agent for the emulated cluster: runs the daemon's command line in the
# namespace of the host it names, on that host's cores, as ssh would run it on that host.
host=\$1
shift
ns=\$(awk -v h="\$host" '\$1 == h {print \$2}' "$state/hosts")
cpus=\$(awk -v h="\$host" '\$1 == h {print \$3}' "$state/hosts")
[ -n "\$ns" ] || { echo "emulated-cluster agent: unknown host \$host" >&2; exit 1; }
exec ip netns exec "\$ns" unshare --uts taskset -c "\$cpus" \\
    /bin/sh -c 'hostname "\$1" && exec /bin/sh -c "\$2"' sh "\$ns" "\$*"
EOF
    chmod +x "$state/agent"
    echo "$rate ${delay:-0}" >"$state/link"  # last: the cluster is up
    trap - EXIT
    echo "emulated-cluster: $n hosts ($subnet.1-$subnet.$n), each NIC $rate${delay:+, delay $delay}"
}

# The cores host H of N owns (a taskset list). Every host's Open MPI daemon sees the whole
# machine, so without this each one bound its first rank to core 0 and all hosts' ranks shared
# that one core (measured: 2 hosts x 1 rank, both on core 0, compute 1.6-2x slower than the
# same ranks on one host). With N <= cores the cores are split evenly; with more hosts than cores
# host H shares core H mod cores. Each host's processes run under taskset with that list, and
# Open MPI is told not to bind (its binding ignores the daemon's affinity and rebinds to core 0).
# Each host also gets its own host name (a UTS namespace named like its network namespace): Open
# MPI names its shared-memory segments after the host name, the job and the local rank, in the
# /dev/shm all hosts share, so with one name for all two hosts' local rank 0 mapped one file (a
# segfault in mca_btl_vader at start-up with 2 ranks per host).
host_cpus() {
    local h=$1 n=$2 ids=() range part
    # The CPUs this script may use (Cpus_allowed_list, e.g. "0-1" or "0,2-3"), one id each.
    range=$(awk '/^Cpus_allowed_list/ {print $2}' /proc/self/status)
    for part in ${range//,/ }; do
        if [[ $part == *-* ]]; then ids+=($(seq "${part%-*}" "${part#*-}")); else ids+=("$part"); fi
    done
    local cores=${#ids[@]}
    if ((n <= cores)); then
        local first=$((h * cores / n)) last=$(((h + 1) * cores / n)) list=()
        for ((c = first; c < last; ++c)); do list+=("${ids[c]}"); done
        local IFS=,
        echo "${list[*]}"
    else
        echo "${ids[h % cores]}"
    fi
}

shape() {  # NS DEV RATE DELAY: tbf at RATE (burst for ~1 ms at that rate), netem first if DELAY
    local ns=$1 dev=$2 rate=$3 delay=$4 parent="root"
    if [[ -n $delay ]]; then
        ip netns exec "$ns" tc qdisc add dev "$dev" root handle 1: netem delay "$delay" limit 100000
        parent="parent 1:"
    fi
    ip netns exec "$ns" tc qdisc add dev "$dev" $parent handle 2: tbf rate "$rate" burst 256kb \
        latency 400ms
}

impair() {  # H [rate R] [loss P%] [delay T]: degrade host H's NIC, both directions
    local h=${1:?usage: impair H [rate R] [loss P%] [delay T]} ns rate delay loss=""
    ns=$(host_ns "$h")
    shift
    read -r rate delay <"$state/link"
    [[ $delay != 0 ]] || delay=""
    while (($# > 0)); do
        case $1 in
            rate) rate=${2:?impair: rate needs a value}
                  valid_rate "$rate" || die "impair: rate '$rate': give a rate above zero, e.g. 20mbit" ;;
            loss) loss=${2:?impair: loss needs a value}
                  [[ $loss =~ ^([0-9]|[1-9][0-9])%$ ]] || die "impair: loss '$loss': give 0% to 99%" ;;
            delay) delay=${2:?impair: delay needs a value}
                   [[ $delay =~ ^[0-9.]+(us|ms)$ ]] || die "impair: delay '$delay': give e.g. 20ms" ;;
            *) die "impair: '$1': give rate R, loss P% or delay T" ;;
        esac
        shift 2
    done
    [[ -z $delay ]] || have_netem || die "impair: delay needs the kernel's netem qdisc, which this one lacks (CONFIG_NET_SCH_NETEM); use rate and loss here"
    [[ -z $loss || $loss == 0% ]] || command -v nft >/dev/null ||
        die "impair: loss needs nftables (apt-get install nftables, or scripts/setup.sh)"
    ip netns exec "$ns" tc qdisc del dev eth0 root 2>/dev/null || true
    ip netns exec $switch tc qdisc del dev "p$h" root 2>/dev/null || true
    shape "$ns" eth0 "$rate" "$delay"
    shape $switch "p$h" "$rate" "$delay"
    # Loss: packets dropped at random in the host, on their way out and on their way in.
    ip netns exec "$ns" nft delete table inet epo_impair 2>/dev/null || true
    if [[ -n $loss && $loss != 0% ]]; then
        local p=${loss%\%}
        ip netns exec "$ns" nft -f - <<RULES
table inet epo_impair {
    chain out { type filter hook output priority 0; numgen random mod 100 < $p drop; }
    chain in { type filter hook input priority 0; numgen random mod 100 < $p drop; }
}
RULES
    fi
}

have_netem() {  # whether this kernel has the netem qdisc (delay)
    local probe=$name-netem ok=1
    ip netns add $probe 2>/dev/null || return 1
    ip netns exec $probe tc qdisc add dev lo root netem delay 1ms 2>/dev/null && ok=0
    ip netns del $probe
    return $ok
}

run_on() {  # NS CMD...: with the Open MPI settings for the cluster, on that host's cores
    local ns=$1
    shift
    local slots=${EPO_CLUSTER_SLOTS:-1} hosts cpus
    hosts=$(awk -v s="$slots" '{printf "%s%s:%s", (NR > 1 ? "," : ""), $1, s}' "$state/hosts")
    cpus=$(awk -v ns="$ns" '$2 == ns {print $3}' "$state/hosts")
    # scripts/mpi_env.sh: run as root, oversubscribe, give up on a silent host within ~25 s.
    source "$(dirname "${BASH_SOURCE[0]}")/mpi_env.sh"
    ip netns exec "$ns" unshare --uts taskset -c "$cpus" "$self" _named "$ns" env \
        EPO_CLUSTER_HOSTS="$hosts" \
        OMPI_MCA_plm_rsh_agent="$state/agent" \
        OMPI_MCA_hwloc_base_binding_policy=none \
        OMPI_MCA_btl="self,vader,tcp" \
        OMPI_MCA_btl_tcp_if_include="$subnet.0/24" \
        OMPI_MCA_oob_tcp_if_include="$subnet.0/24" \
        "$@"
}

down() {
    [[ -d $state ]] || { echo "emulated-cluster: nothing to remove"; return 0; }
    for ns in $(ip netns list | awk '{print $1}' | grep -E "^($prefix[0-9]+|$switch)$" || true); do
        ip netns pids "$ns" | xargs -r kill -9 2>/dev/null || true
        ip netns del "$ns"
    done
    rm -rf "$state"
    echo "emulated-cluster: removed"
}

cmd=${1:-}
shift || true
case $cmd in
    _named) hostname "$1" && shift && exec "$@" ;;  # run_on's inside step: name the host, run
    up) up "$@" ;;
    run) num_hosts >/dev/null; run_on "${prefix}0" "$@" ;;
    exec) ns=$(host_ns "${1:?usage: exec H CMD}"); shift; run_on "$ns" "$@" ;;
    # The namespace first, in this shell: a bad host ends the script here (inside "$(...)" the
    # error would only end the substitution, and ip would run with an empty name).
    cut) ns=$(host_ns "${1:?usage: cut H}"); ip -n "$ns" link set eth0 down ;;
    restore) ns=$(host_ns "${1:?usage: restore H}"); ip -n "$ns" link set eth0 up ;;
    impair) impair "$@" ;;
    kill) ns=$(host_ns "${1:?usage: kill H}"); ip netns pids "$ns" | xargs -r kill -9 ;;
    status)
        num_hosts >/dev/null
        echo "link: $(cat "$state/link") (rate, delay)"
        cat "$state/hosts"
        ;;
    down) down ;;
    *) die "usage: up N RATE [DELAY] | run CMD | exec H CMD | cut H | restore H | impair H [rate R] [loss P%] [delay T] | kill H | status | down" ;;
esac
