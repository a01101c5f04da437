#!/usr/bin/env bash
# cohort-plan against measurement over a throttled network: every process on a host of its own (a network
# namespace), the hosts joined by a switch (a bridge), each host's link shaped to RATE each way (tc tbf on
# both ends of its veth), so that every process has the one link of bandwidth B the planner assumes. For
# each rate: the link measured by cohort-plan --measure-link between two hosts, then for ring allreduce on 2 and
# 4 workers and parameter servers 2+1, 2+2 and 4+2 (Fashion-MNIST's small CNN, batch 64, one thread each),
# and 4 workers on 2 hosts of 2 (hierarchical and flat ring allreduce; within a host, shared memory, measured
# as the link is), the predicted step time beside the measured one (the chief's epoch line, training steps
# only), and whether the strategy recommended for 4 workers on hosts of their own is the fastest measured.
# All processes share this machine's cores (--shared-cores).
# Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN), ip and tc (iproute2), unshare and nsenter (util-linux).
#   benchmarks/plan_check_link.sh [BUILD_DIR] [RATE ...]     (default rates: 100mbit 1000mbit; ~10 minutes)
set -euo pipefail
build=${1:-build}
shift || true
rates=("$@")
[ ${#rates[@]} -gt 0 ] || rates=(100mbit 1000mbit)
for tool in ip tc unshare nsenter python3; do command -v "$tool" >/dev/null || { echo "plan_check_link: no $tool"; exit 77; }; done
work=$(mktemp -d)
cleanup() {
  kill -9 $(jobs -p) 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
cores=$(nproc)
samples=${PLAN_CHECK_SAMPLES:-12000}
max_hosts=6  # 4 workers + 2 servers

# The switch, and the hosts 10.78.0.1 .. 10.78.0.6, each held open by a sleeping process.
unshare -n sleep 7200 &
switch=$!
sleep 0.2
in_switch() { nsenter -t "$switch" -n "$@"; }
in_switch ip link add br0 type bridge || { echo "plan_check_link: cannot make a bridge (root?)"; exit 77; }
in_switch ip link set br0 up
hosts=()
for i in $(seq 1 $max_hosts); do
  unshare -n sleep 7200 &
  hosts+=($!)
  sleep 0.1
  ip link add eth0 netns "${hosts[-1]}" type veth peer name port$i netns "$switch"
  nsenter -t "${hosts[-1]}" -n ip addr add "10.78.0.$i/24" dev eth0
  nsenter -t "${hosts[-1]}" -n ip link set eth0 up
  nsenter -t "${hosts[-1]}" -n ip link set lo up
  in_switch ip link set port$i master br0
  in_switch ip link set port$i up
done
shape() {  # RATE: every host's link, both ways
  local i
  for i in $(seq 1 $max_hosts); do
    nsenter -t "${hosts[$((i - 1))]}" -n tc qdisc replace dev eth0 root tbf rate "$1" burst 256kb latency 200ms
    in_switch tc qdisc replace dev port$i root tbf rate "$1" burst 256kb latency 200ms
  done
}

# Starts the job of `roles` ("chief", "worker", "worker", "ps", ...; TF_CONFIG's cluster), process i on
# host ${places[i]} (default: host i), with the settings in `settings`; waits for all and prints the chief's
# output file.
places=()
settings=()
run_job() {  # COMMAND...
  local cluster secret i pids=() where=()
  for i in "${!roles[@]}"; do where+=("${places[$i]:-$i}"); done
  cluster=$(python3 -c '
import json, sys
n = len(sys.argv) // 2
roles, where = sys.argv[1:n + 1], sys.argv[n + 1:]
cluster = {}
for i, role in enumerate(roles):
    cluster.setdefault(role, []).append("10.78.0.%d:%d" % (int(where[i]) + 1, 2300 + i))
print(json.dumps(cluster))' "${roles[@]}" "${where[@]}")
  secret=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
  declare -A index=()
  for i in "${!roles[@]}"; do
    local role=${roles[$i]}
    local task=${index[$role]:-0}
    index[$role]=$((task + 1))
    nsenter -t "${hosts[${where[$i]}]}" -n env TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"$role\", \"index\": $task}}" \
      COHORT_SECRET="$secret" OMP_NUM_THREADS=1 "${settings[@]}" timeout 600 "$@" >"$work/out-$i" 2>&1 &
    pids+=($!)
  done
  local failed=0
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || failed=1; done
  if [ $failed = 1 ]; then
    for i in "${!roles[@]}"; do echo "--- ${roles[$i]}: $(tail -3 "$work/out-$i")" >&2; done
    return 1
  fi
  cat "$work/out-0"
}

# A link as cohort-plan --measure-link measures it between the hosts of `places` (its two processes'), as
# "LATENCY BANDWIDTH" for the planner's options.
measure_link() {
  roles=(chief worker)
  run_job "$build/cohort-plan" --measure-link --model small_cnn --workers 2 --profile "$work/profile.json" |
    sed -n 's/.* measured \([0-9.]*\) MB\/s each way (the slower way), \([0-9.]*\) us per message$/\2us \1MB\/s/p'
}

"$build/cohort-plan" --model small_cnn --batch-size 64 --workers 1 --bandwidth 1Gbit --threads 1 --profile-steps 20 \
  --save-profile "$work/profile.json" >/dev/null
places=(0 0)
read -r host_latency host_bandwidth < <(measure_link)
echo "within a host (shared memory), measured: latency $host_latency, bandwidth $host_bandwidth"
for rate in "${rates[@]}"; do
  shape "$rate"
  places=()
  read -r latency bandwidth < <(measure_link)
  echo "link shaped to $rate each way, measured: latency $latency, bandwidth $bandwidth; $cores cores shared"
  plan() {  # WORKERS [WORKERS_PER_HOST]: the planner's JSON
    "$build/cohort-plan" --model small_cnn --batch-size 64 --workers "$1" --workers-per-host "${2:-1}" --max-servers 2 \
      --bandwidth "$bandwidth" --latency "$latency" --host-bandwidth "$host_bandwidth" --host-latency "$host_latency" \
      --shared-cores "$cores" --profile "$work/profile.json" --json
  }
  predicted() {  # WORKERS WORKERS_PER_HOST STRATEGY: its predicted ms per step
    plan "$1" "$2" | python3 -c "import json, sys; d = json.load(sys.stdin); print('%.2f' % (1e3 * next(p['step_seconds'] for p in d['predictions'] if p['strategy'] == sys.argv[1])))" "$3"
  }
  measured() {  # the chief's ms per training step of the job of `roles`
    run_job "$build/examples/fashion_mnist" --train-samples "$samples" --epochs 1 --batch-size 64 --threads 1 \
      --verbosity lines --lr-scaling none |
      sed -n 's/^ *[0-9]*\/[0-9]* \[=*\] - [0-9]*s \([0-9.]*\)\(m\?s\)\/step.*/\1 \2/p' | tail -1 |
      awk '{ print ($2 == "s" ? $1 * 1000 : $1) }'
  }
  printf "%-36s %12s %12s %8s\n" "setup ($rate)" "predicted ms" "measured ms" "ratio"
  rm -f "$work/measured"
  best_measured="" best_measured_ms=""
  row() {  # NAME WORKERS STRATEGY ROLES... (on the hosts of `places`, with `settings`, both reset after)
    local name=$1 workers=$2 strategy=$3 p m per_host=1
    shift 3
    roles=("$@")
    [ ${#places[@]} -gt 0 ] && per_host=2
    p=$(predicted "$workers" "$per_host" "$strategy")
    m=$(measured)
    places=() settings=()
    printf "%-36s %12s %12s %8s\n" "$name" "$p" "$m" "$(awk -v p="$p" -v m="$m" 'BEGIN { printf "%.2f", p / m }')"
    if [ "$workers" = 4 ] && [ "$per_host" = 1 ] && { [ -z "$best_measured_ms" ] || awk -v m="$m" -v b="$best_measured_ms" 'BEGIN { exit !(m < b) }'; }; then
      best_measured=$strategy best_measured_ms=$m
    fi
    echo "$workers|$strategy|$m" >>"$work/measured"
  }
  row "ring allreduce, 2 workers" 2 "ring allreduce" chief worker
  row "ring allreduce, 4 workers" 4 "ring allreduce" chief worker worker worker
  row "parameter servers, 2 workers + 1" 2 "parameter servers (1, size-balanced)" chief worker ps
  row "parameter servers, 2 workers + 2" 2 "parameter servers (2, size-balanced)" chief worker ps ps
  row "parameter servers, 4 workers + 2" 4 "parameter servers (2, size-balanced)" chief worker worker worker ps ps
  places=(0 0 1 1)
  row "hierarchical allreduce, 2 hosts x 2" 4 "hierarchical allreduce" chief worker worker worker
  places=(0 0 1 1) settings=(COHORT_HIERARCHICAL_ALLREDUCE=0)
  row "ring allreduce (flat), 2 hosts x 2" 4 "ring allreduce" chief worker worker worker
  recommended=$(plan 4 | python3 -c "import json, sys; print(json.load(sys.stdin)['recommended'])")
  case $recommended in
    "ring allreduce" | "recursive doubling") family="ring allreduce" ;;  # one strategy: small buckets take recursive doubling
    "parameter servers (2, size-balanced)") family=$recommended ;;
    *) family="" ;;
  esac
  chosen_ms=$(grep "^4|$family|" "$work/measured" | cut -d'|' -f3 || true)
  echo "recommended for 4 workers: $recommended; fastest measured of the 4-worker runs: $best_measured ($best_measured_ms ms)"
  if [ -n "$chosen_ms" ]; then
    awk -v c="$chosen_ms" -v b="$best_measured_ms" 'BEGIN { printf "the recommendation measured %.2f ms, %.2fx the fastest\n", c, c / b }'
  else
    echo "the recommendation is none of the setups measured here"
  fi
done
