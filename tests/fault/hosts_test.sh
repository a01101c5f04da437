#!/usr/bin/env bash
# Two hosts made of network namespaces joined by a veth pair (addresses exist inside the namespaces only):
# host A runs the chief and ps 0, host B worker 0 and ps 1, a 2 + 2 parameter-server job on Fashion-MNIST.
# 1. The link is throttled to 8 Mbit/s (tc tbf), so that the 1.6 MB dense kernel takes ~1.6 s to cross it,
#    longer than the 1 s peer timeout: the job still completes (a peer is alive while its bytes arrive).
# 2. The link is cut mid-training: every process ends within seconds, each naming a process of the other
#    host.
# 3. A ring-allreduce job of 2 workers per host runs the hierarchical allreduce and learns.
# Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), ip, tc, unshare and nsenter; exits 77 (skipped) saying why
# when they are missing. Nothing outlives the test: each namespace lives as long as one sleeping process.
#   usage: hosts_test.sh FASHION_MNIST_EXAMPLE
set -uo pipefail
example=$1
skip() { echo "hosts test skipped: $*"; exit 77; }
command -v ip >/dev/null || skip "no ip command (Debian package iproute2)"
command -v tc >/dev/null || skip "no tc command (Debian package iproute2)"
command -v unshare >/dev/null && command -v nsenter >/dev/null || skip "no unshare or nsenter (util-linux)"
address_a=10.77.0.1 address_b=10.77.0.2
work=$(mktemp -d)
cleanup() {
  kill -9 $(jobs -p) 2>/dev/null
  wait 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
# Each host is a network namespace held open by a sleeping process (no named namespaces: nothing is mounted).
unshare -n sleep 3600 2>"$work/why" &
host_a=$!
unshare -n sleep 3600 2>>"$work/why" &
host_b=$!
sleep 0.3
kill -0 "$host_a" 2>/dev/null && kill -0 "$host_b" 2>/dev/null || skip "cannot make a network namespace: $(cat "$work/why")"
in_a() { nsenter -t "$host_a" -n "$@"; }
in_b() { nsenter -t "$host_b" -n "$@"; }
ip link add veth-a netns "$host_a" type veth peer name veth-b netns "$host_b" 2>"$work/why" ||
  skip "cannot make a veth pair between the namespaces: $(cat "$work/why")"
in_a ip addr add "$address_a/24" dev veth-a && in_b ip addr add "$address_b/24" dev veth-b || skip "cannot address the veth ends"
in_a ip link set lo up && in_b ip link set lo up
in_a ip link set veth-a up && in_b ip link set veth-b up

fail() {
  echo "FAIL: $*"
  for f in "$work"/out-*; do echo "--- $f"; tail -15 "$f"; done
  exit 1
}

# Starts the job of `cluster` (TF_CONFIG's cluster) with processes `names` (the first half on host A, the
# rest on host B); sets pids[] in that order. Default: chief 0, ps 0 (host A), worker 0, ps 1 (host B).
names=("chief 0" "ps 0" "worker 0" "ps 1")
cluster="\"chief\": [\"$address_a:2222\"], \"worker\": [\"$address_b:2222\"], \"ps\": [\"$address_a:2223\", \"$address_b:2223\"]"
start_job() {
  local secret
  secret=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  pids=()
  local i=0 name
  for name in "${names[@]}"; do
    local role=${name% *} index=${name#* } host=$host_a
    [ $i -ge $(( ${#names[@]} / 2 )) ] && host=$host_b
    nsenter -t "$host" -n env TF_CONFIG="{\"cluster\": {$cluster}, \"task\": {\"type\": \"$role\", \"index\": $index}}" \
      COHORT_SECRET="$secret" OMP_NUM_THREADS=1 "$@" >"$work/out-$i" 2>&1 &
    pids+=($!)
    i=$((i + 1))
  done
}

# 1. A slow link: every frame of the dense kernel takes longer than the peer timeout.
in_a tc qdisc add dev veth-a root tbf rate 8mbit burst 64kbit latency 2s && in_b tc qdisc add dev veth-b root tbf rate 8mbit burst 64kbit latency 2s ||
  skip "tc cannot shape the link"
export COHORT_PEER_TIMEOUT=1s COHORT_HEARTBEAT_INTERVAL=200ms COHORT_CONNECT_TIMEOUT=30s
start=$SECONDS
start_job "$example" --train-samples 256 --batch-size 64 --max-steps 3 --epochs 1 --threads 1
for i in 0 1 2 3; do
  wait "${pids[$i]}" || fail "${names[$i]} failed on the slow link"
done
grep -q 'test accuracy' "$work/out-0" || fail "the chief did not finish"
echo "slow link: the job completed in $((SECONDS - start)) s"
in_a tc qdisc del dev veth-a root && in_b tc qdisc del dev veth-b root

# 2. A cut link: both sides end within the peer timeout and name the other side.
export COHORT_PEER_TIMEOUT=2s
start_job "$example" --train-samples 20000 --batch-size 32 --epochs 1 --threads 1
for _ in $(seq 1 600); do grep -q 'Epoch 1/1' "$work/out-0" 2>/dev/null && break; sleep 0.1; done
grep -q 'Epoch 1/1' "$work/out-0" || fail "the job did not start training"
sleep 1
in_a ip link set veth-a down
cut_at=$SECONDS
for i in 0 1 2 3; do
  waited=0
  while kill -0 "${pids[$i]}" 2>/dev/null && [ $waited -lt 200 ]; do sleep 0.1; waited=$((waited + 1)); done
  kill -0 "${pids[$i]}" 2>/dev/null && fail "${names[$i]} still runs 20 s after the cut"
  wait "${pids[$i]}" && fail "${names[$i]} succeeded although the link was cut"
done
took=$((SECONDS - cut_at))
grep -q 'lost \(worker 0\|ps 1\)' "$work/out-0" || fail "the chief (host A) did not name a process of host B"
grep -q 'lost \(chief 0\|ps 0\)' "$work/out-2" || fail "worker 0 (host B) did not name a process of host A"
echo "cut link: every process ended within $took s, naming the other host"
in_a ip link set veth-a up

# 3. Ring allreduce over 2 hosts x 2 workers: hierarchical (one rank per host crosses the link), and it learns.
export COHORT_PEER_TIMEOUT=10s
names=("chief 0" "worker 0" "worker 1" "worker 2")
cluster="\"chief\": [\"$address_a:2222\"], \"worker\": [\"$address_a:2223\", \"$address_b:2222\", \"$address_b:2223\"]"
start_job "$example" --train-samples 2048 --batch-size 32 --max-steps 16 --epochs 1 --threads 1 --lr-scaling none
for i in 0 1 2 3; do
  wait "${pids[$i]}" || fail "${names[$i]} failed in the hierarchical allreduce job"
done
grep -q 'hierarchical allreduce over the hosts' "$work/out-0" || fail "the chief did not choose the hierarchical allreduce"
grep -q "strategy 'hierarchical ring-allreduce'" "$work/out-0" || fail "the strategy is not the hierarchical ring"
grep -q 'test accuracy: 0\.[3-9]' "$work/out-0" || fail "the hierarchical allreduce job did not learn"
echo "hierarchical allreduce: 2 hosts x 2 workers trained"
echo "hosts test passed"
