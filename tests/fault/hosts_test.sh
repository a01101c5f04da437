#!/usr/bin/env bash
# Two hosts made of network namespaces joined by a veth pair (addresses exist inside the namespaces only):
# host A runs the chief and ps 0, host B worker 0 and ps 1, a 2 + 2 parameter-server job on Fashion-MNIST.
# 1. The link is throttled to 8 Mbit/s (tc tbf), so that the 1.6 MB dense kernel takes ~1.6 s to cross it,
#    longer than the 1 s peer timeout: the job still completes (a peer is alive while its bytes arrive).
# 2. The link is cut mid-training: every process ends within seconds, each naming a process of the other
#    host.
# Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), ip and tc; exits 77 (skipped) saying why when they are
# missing.
#   usage: hosts_test.sh FASHION_MNIST_EXAMPLE
set -uo pipefail
example=$1
skip() { echo "hosts test skipped: $*"; exit 77; }
command -v ip >/dev/null || skip "no ip command (Debian package iproute2)"
command -v tc >/dev/null || skip "no tc command (Debian package iproute2)"
a=cohort-a-$$ b=cohort-b-$$ address_a=10.77.0.1 address_b=10.77.0.2
work=$(mktemp -d)
cleanup() {
  kill -9 $(jobs -p) 2>/dev/null
  ip netns del "$a" 2>/dev/null
  ip netns del "$b" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$a" 2>"$work/why" || skip "cannot make a network namespace: $(cat "$work/why")"
ip netns add "$b" || skip "cannot make a second network namespace"
ip link add "veth-$$a" type veth peer name "veth-$$b" 2>"$work/why" || skip "cannot make a veth pair: $(cat "$work/why")"
ip link set "veth-$$a" netns "$a" && ip link set "veth-$$b" netns "$b" || skip "cannot move the veth ends"
ip -n "$a" addr add "$address_a/24" dev "veth-$$a"
ip -n "$b" addr add "$address_b/24" dev "veth-$$b"
for ns in "$a" "$b"; do ip -n "$ns" link set lo up; done
ip -n "$a" link set "veth-$$a" up
ip -n "$b" link set "veth-$$b" up

fail() {
  echo "FAIL: $*"
  for f in "$work"/out-*; do echo "--- $f"; tail -15 "$f"; done
  exit 1
}

# Starts the job; sets pids[] in the order chief 0, ps 0 (host A), worker 0, ps 1 (host B).
names=("chief 0" "ps 0" "worker 0" "ps 1")
start_job() {
  local cluster="\"chief\": [\"$address_a:2222\"], \"worker\": [\"$address_b:2222\"], \"ps\": [\"$address_a:2223\", \"$address_b:2223\"]"
  local secret
  secret=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  pids=()
  local i=0 name
  for name in "${names[@]}"; do
    local role=${name% *} index=${name#* } ns=$a
    [ $i -ge 2 ] && ns=$b
    ip netns exec "$ns" env TF_CONFIG="{\"cluster\": {$cluster}, \"task\": {\"type\": \"$role\", \"index\": $index}}" \
      COHORT_SECRET="$secret" OMP_NUM_THREADS=1 "$@" >"$work/out-$i" 2>&1 &
    pids+=($!)
    i=$((i + 1))
  done
}

# 1. A slow link: every frame of the dense kernel takes longer than the peer timeout.
for ns in "$a" "$b"; do
  dev="veth-$$a"; [ "$ns" = "$b" ] && dev="veth-$$b"
  ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate 8mbit burst 64kbit latency 2s ||
    skip "tc cannot shape the link"
done
export COHORT_PEER_TIMEOUT=1s COHORT_HEARTBEAT_INTERVAL=200ms COHORT_CONNECT_TIMEOUT=30s
start=$SECONDS
start_job "$example" --train-samples 256 --batch-size 64 --max-steps 3 --epochs 1 --threads 1
for i in 0 1 2 3; do
  wait "${pids[$i]}" || fail "${names[$i]} failed on the slow link"
done
grep -q 'test accuracy' "$work/out-0" || fail "the chief did not finish"
echo "slow link: the job completed in $((SECONDS - start)) s"
for ns in "$a" "$b"; do
  dev="veth-$$a"; [ "$ns" = "$b" ] && dev="veth-$$b"
  ip netns exec "$ns" tc qdisc del dev "$dev" root
done

# 2. A cut link: both sides end within the peer timeout and name the other side.
export COHORT_PEER_TIMEOUT=2s
start_job "$example" --train-samples 20000 --batch-size 32 --epochs 1 --threads 1
for _ in $(seq 1 600); do grep -q 'Epoch 1/1' "$work/out-0" 2>/dev/null && break; sleep 0.1; done
grep -q 'Epoch 1/1' "$work/out-0" || fail "the job did not start training"
sleep 1
ip -n "$a" link set "veth-$$a" down
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
echo "hosts test passed"
