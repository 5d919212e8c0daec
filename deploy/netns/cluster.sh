#!/usr/bin/env bash
# Emulated multi-host cluster on one machine: K network namespaces psrv-h0..psrv-h{K-1}, each
# with its own address 10.77.0.(10+i), joined by veth pairs psrv-vI/psrv-pI to the bridge psrvbr0
# (10.77.0.1).
#
#   sudo deploy/netns/cluster.sh up K [RATE]   # RATE caps each host's egress (tc tbf), e.g. 1gbit
#   sudo deploy/netns/cluster.sh rate I [RATE] # cap host I's egress alone (no RATE: remove its cap)
#   sudo deploy/netns/cluster.sh exec I CMD... # run CMD on host I
#   sudo deploy/netns/cluster.sh down          # remove everything `up` made
#
# Each host gets its own /etc/hosts naming every emulated address, as IPv4 and as IPv4-mapped IPv6,
# and a resolv.conf whose nameserver (127.0.0.1, none there) fails at once (/etc/netns/NAME/, which
# `ip netns exec` mounts over /etc/): the hosts reach no DNS server, and a reverse lookup of a peer's
# address (gloo's rendezvous makes one per connection) waited 10 s for the resolver each time.
#
# A psrv process on host I, scraped by a Prometheus in the root namespace (docs/deploy.md section 2 has
# the whole recipe and its targets.json): /metrics must listen on the host's address, not its loopback,
#   sudo deploy/netns/cluster.sh exec 1 .venv/bin/psrv worker --servers tcp://10.77.0.10:5555 --mode sync \
#       --metrics-port 9200 --metrics-host 0.0.0.0 --metrics-linger 3 ...
#
# Several clusters side by side: the environment names one (defaults: the names above), and every
# command acts on that one alone; `psrv run --bandwidth` (experiments/launcher/netns.py) picks a free set per run.
#   PSRV_NETNS_PREFIX  namespace prefix (psrv-h: hosts psrv-h0, psrv-h1, ...)
#   PSRV_NETNS_BRIDGE  the bridge (psrvbr0)
#   PSRV_NETNS_SUBNET  the /24's first three octets (10.77.0: the bridge .1, host I .(10+I))
#   PSRV_NETNS_VETH    the veths' prefix (psrv-: host I's are psrv-vI on the bridge, psrv-pI before it moves)
# Interface names are at most 15 characters: the bridge, and the veths with K-1's digits.
#
# Idempotent: `up` again adds missing hosts and resets the caps. Needs root, iproute2 and, for
# RATE, the tbf qdisc (netem is not required). docs/deploy.md walks through a run on it.
set -euo pipefail

BRIDGE=${PSRV_NETNS_BRIDGE:-psrvbr0}
PREFIX=${PSRV_NETNS_SUBNET:-10.77.0}
NS_PREFIX=${PSRV_NETNS_PREFIX:-psrv-h}
VETH=${PSRV_NETNS_VETH:-psrv-}

die() { echo "cluster.sh: $*" >&2; exit 1; }

check_names() {
  [[ $NS_PREFIX =~ ^[A-Za-z0-9_-]+$ && $VETH =~ ^[A-Za-z0-9_-]+$ && $BRIDGE =~ ^[A-Za-z0-9_-]{1,15}$ ]] ||
    die "PSRV_NETNS_PREFIX, PSRV_NETNS_VETH and PSRV_NETNS_BRIDGE take letters, digits, - and _ (a bridge at most 15)"
  [[ $PREFIX =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || die "PSRV_NETNS_SUBNET must look like 10.77.0; got '$PREFIX'"
}

ns_name() { echo "$NS_PREFIX$1"; }

# tbf's burst must hold at least one timer tick of traffic: take 10 ms worth, at least 32 KiB.
burst_for() {
  local rate=$1 num unit bytes
  [[ $rate =~ ^([0-9]+)(bit|kbit|mbit|gbit)$ ]] || die "RATE must look like 100mbit or 1gbit; got '$rate'"
  num=${BASH_REMATCH[1]} unit=${BASH_REMATCH[2]}
  case $unit in
    bit) bytes=$((num / 8)) ;;
    kbit) bytes=$((num * 1000 / 8)) ;;
    mbit) bytes=$((num * 1000000 / 8)) ;;
    gbit) bytes=$((num * 1000000000 / 8)) ;;
  esac
  bytes=$((bytes / 100))
  echo $((bytes > 32768 ? bytes : 32768))
}

# With br_netfilter loaded, bridged frames pass the iptables FORWARD chain, which may drop them
# (Docker sets its policy to DROP): let traffic between the emulated hosts through.
forward_rule() {
  local action=$1
  command -v iptables >/dev/null || return 0
  if [[ $action == add ]]; then
    iptables -w -C FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT 2>/dev/null ||
      iptables -w -I FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT 2>/dev/null || true
  else
    while iptables -w -D FORWARD -i "$BRIDGE" -o "$BRIDGE" -j ACCEPT 2>/dev/null; do :; done
  fi
}

up() {
  local k=${1:-} rate=${2:-} i ns veth peer
  if ! [[ $k =~ ^[0-9]+$ ]] || ((k < 1 || k > 200)); then
    die "usage: $0 up K [RATE] with 1 <= K <= 200"
  fi
  [[ -z $rate ]] || burst_for "$rate" >/dev/null  # check RATE before making anything
  ((${#VETH} + 1 + ${#k} <= 15)) || die "veth names ${VETH}v$((k - 1)) are over 15 characters: shorten PSRV_NETNS_VETH"
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
  fi
  ip addr replace "$PREFIX.1/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  forward_rule add
  for ((i = 0; i < k; i++)); do
    ns=$(ns_name "$i") veth=${VETH}v$i peer=${VETH}p$i
    [[ -e /run/netns/$ns ]] || ip netns add "$ns"
    if ! ip -n "$ns" link show eth0 >/dev/null 2>&1; then
      ip link del "$veth" 2>/dev/null || true  # a half-made pair from an interrupted run
      ip link add "$veth" type veth peer name "$peer"
      ip link set "$peer" netns "$ns"
      ip -n "$ns" link set "$peer" name eth0
    fi
    ip link set "$veth" master "$BRIDGE" up
    ip -n "$ns" addr replace "$PREFIX.$((10 + i))/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    ip -n "$ns" route replace default via "$PREFIX.1"
    set_cap "$ns" "$rate"
    write_hosts "$ns" "$k"
    echo "$ns $PREFIX.$((10 + i))${rate:+ egress $rate}"
  done
}

# Cap namespace $1's egress at RATE $2 with tbf, or remove its cap when $2 is empty.
write_hosts() {
  local ns=$1 k=$2 j
  mkdir -p "/etc/netns/$ns"
  {
    cat /etc/hosts
    echo "$PREFIX.1 ${NS_PREFIX}bridge"
    for ((j = 0; j < k; j++)); do
      echo "$PREFIX.$((10 + j)) $(ns_name "$j")"
      echo "::ffff:$PREFIX.$((10 + j)) $(ns_name "$j")"
    done
  } >"/etc/netns/$ns/hosts"
  echo "nameserver 127.0.0.1" >"/etc/netns/$ns/resolv.conf"
}

set_cap() {
  local ns=$1 rate=${2:-}
  if [[ -n $rate ]]; then
    ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate "$rate" burst "$(burst_for "$rate")" latency 50ms
  else
    ip netns exec "$ns" tc qdisc del dev eth0 root 2>/dev/null || true
  fi
}

rate() {
  local i=${1:-} rate=${2:-} ns
  [[ $i =~ ^[0-9]+$ ]] || die "usage: $0 rate I [RATE]"
  ns=$(ns_name "$i")
  [[ -e /run/netns/$ns ]] || die "no host $i: run '$0 up K' first"
  [[ -z $rate ]] || burst_for "$rate" >/dev/null
  set_cap "$ns" "$rate"
  echo "$ns egress ${rate:-uncapped}"
}

down() {
  local ns link
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^${NS_PREFIX}[0-9]+$" || true); do
    ip netns del "$ns"  # takes its end of the veth pair, and so the pair, with it
  done
  rm -rf /etc/netns/"$NS_PREFIX"[0-9]*  # the hosts and resolv.conf files `up` wrote
  rmdir /etc/netns 2>/dev/null || true  # (if nothing else is there)
  for link in $(ip -o link show | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E "^${VETH}[vp][0-9]+\$" || true); do
    ip link del "$link" 2>/dev/null || true
  done
  forward_rule del
  if ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link del "$BRIDGE"
  fi
}

run_on() {
  local i=${1:-}
  if ! [[ $i =~ ^[0-9]+$ ]] || (($# < 2)); then
    die "usage: $0 exec I CMD [ARGS...]"
  fi
  [[ -e /run/netns/$(ns_name "$i") ]] || die "no host $i: run '$0 up K' first"
  shift
  exec ip netns exec "$(ns_name "$i")" "$@"
}

[[ $(id -u) == 0 ]] || die "must run as root (network namespaces and bridges need CAP_NET_ADMIN)"
check_names
cmd=${1:-}
shift || true
case $cmd in
  up) up "$@" ;;
  rate) rate "$@" ;;
  down) down ;;
  exec) run_on "$@" ;;
  *) die "usage: $0 up K [RATE] | rate I [RATE] | down | exec I CMD..." ;;
esac
