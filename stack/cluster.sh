#!/usr/bin/env bash
# The replicated stack for the chaos runs that need one (docs/testing.md, "The replicated
# stack"): three Kafka nodes in KRaft mode (each broker and controller; RF 3,
# min.insync.replicas 2) and a three-node Cassandra ring (RF 3), each node on a loopback
# address of its own with the usual ports, each killable alone. Apart from `make up`'s stack,
# which stays the default for `make demo` and `make test`; both can run at once.
#
#   cluster.sh up        start what is down, wait until every node serves; idempotent
#   cluster.sh start NODE  start one node (after a kill) and wait until it serves
#   cluster.sh down      stop every node (by pid file)
#   cluster.sh reset     down, then wipe the cluster's data
#   cluster.sh status    what runs, with its address and resident memory
#
#   kafka:     cluster-kafka-1..3      127.0.1.1..3:9092 (controllers :9093)
#   cassandra: cluster-cassandra-1..3  127.0.2.1..3:9042 (storage :7000)
#
# Environment: LIKES_CACHE, LIKES_STACK_DIR as stack.sh; CLUSTER_KAFKA_HEAP (384m),
# CLUSTER_HEAP (512m, each Cassandra node).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=stack.sh
source "$HERE/stack.sh"

CLUSTER_KAFKA_HEAP="${CLUSTER_KAFKA_HEAP:-384m}"
NODES=(1 2 3)
VOTERS="1@127.0.1.1:9093,2@127.0.1.2:9093,3@127.0.1.3:9093"

start_cluster_kafka() {  # k
  local k="$1" name="cluster-kafka-$1" dir="$STATE/cluster-kafka-$1"
  local pidfile="$STATE/$name.pid" logs="$STATE/logs/$name"
  if pid_alive "$pidfile"; then return 0; fi
  port_free 9092 "$name" "127.0.1.$k" || return 1
  mkdir -p "$dir" "$logs"
  sed -e "s#@NODE_ID@#$k#g" -e "s#@ADDRESS@#127.0.1.$k#g" -e "s#@VOTERS@#$VOTERS#g" \
      -e "s#@DATA@#$dir/data#g" "$HERE/kafka/cluster.properties" >"$dir/server.properties"
  local cp="$KAFKA_JARS/*"
  if [[ ! -f "$dir/data/meta.properties" ]]; then
    # One cluster id for the three nodes, made once.
    local idfile="$STATE/cluster-kafka.id"
    [[ -f "$idfile" ]] || python3 -c 'import base64,uuid;print(base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode())' >"$idfile"
    java -cp "$cp" -Dlog4j2.configurationFile="$HERE/kafka/log4j2.properties" \
      -Dkafka.logs.dir="$logs" kafka.tools.StorageTool format -t "$(cat "$idfile")" \
      -c "$dir/server.properties" >"$logs/format.log" 2>&1 \
      || { cat "$logs/format.log" >&2; say "$name storage format failed" >&2; return 1; }
  fi
  STARTED+=("$name")
  # C1 only: a broker killed in a chaos run starts again on a box busy with the run; the
  # top-tier compiler's work made that start take up to a minute at load average 27.
  setsid nohup java -Xms"$CLUSTER_KAFKA_HEAP" -Xmx"$CLUSTER_KAFKA_HEAP" -XX:+UseG1GC \
    -XX:MaxGCPauseMillis=20 -XX:TieredStopAtLevel=1 -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$HERE/kafka/log4j2.properties" -Dkafka.logs.dir="$logs" \
    -cp "$cp" kafka.Kafka "$dir/server.properties" >"$logs/stdout.log" 2>&1 </dev/null &
  echo $! >"$pidfile"
  say "$name starting (pid $!) on 127.0.1.$k:9092"
}

cluster_up() {
  need_tools
  mkdir -p "$STATE/logs"
  fetch
  local started=$SECONDS k
  # The seed Cassandra node first (the others gossip through it), the brokers meanwhile.
  start_cassandra cluster-cassandra-1 || abort_up "cluster-cassandra-1 did not start"
  for k in "${NODES[@]}"; do
    start_cluster_kafka "$k" || abort_up "cluster-kafka-$k did not start"
  done
  wait_ready cluster-cassandra-1 "$STATE/cluster-cassandra-1.pid" \
    "$STATE/logs/cluster-cassandra-1/system.log" 300 cql "127.0.2.1:$CQL_PORT" \
    || abort_up "cluster-cassandra-1 did not become ready"
  for k in 2 3; do
    start_cassandra "cluster-cassandra-$k" || abort_up "cluster-cassandra-$k did not start"
  done
  for k in "${NODES[@]}"; do
    PROBE_BROKERS=3 wait_ready "cluster-kafka-$k" "$STATE/cluster-kafka-$k.pid" \
      "$STATE/logs/cluster-kafka-$k/server.log" 180 kafka "127.0.1.$k:9092" \
      || abort_up "cluster-kafka-$k did not become ready"
  done
  for k in 2 3; do
    wait_ready "cluster-cassandra-$k" "$STATE/cluster-cassandra-$k.pid" \
      "$STATE/logs/cluster-cassandra-$k/system.log" 300 cql "127.0.2.$k:$CQL_PORT" \
      || abort_up "cluster-cassandra-$k did not become ready"
  done
  PROBE_NODES=3 wait_ready cluster-cassandra-1 "$STATE/cluster-cassandra-1.pid" \
    "$STATE/logs/cluster-cassandra-1/system.log" 120 nodes "127.0.2.1:$CQL_PORT" \
    || abort_up "the three Cassandra nodes do not see each other"
  say "cluster up in $((SECONDS - started)) s: kafka 127.0.1.1-3:9092, cql 127.0.2.1-3:9042"
}

cluster_start() {  # node name
  local name="$1" k="${1##*-}"
  STARTED=()
  case "$name" in
    cluster-kafka-[123])
      start_cluster_kafka "$k" || abort_up "$name did not start"
      PROBE_BROKERS=3 wait_ready "$name" "$STATE/$name.pid" "$STATE/logs/$name/server.log" 180 \
        kafka "127.0.1.$k:9092" || abort_up "$name did not become ready" ;;
    cluster-cassandra-[123])
      start_cassandra "$name" || abort_up "$name did not start"
      wait_ready "$name" "$STATE/$name.pid" "$STATE/logs/$name/system.log" 300 \
        cql "127.0.2.$k:$CQL_PORT" || abort_up "$name did not become ready" ;;
    *) die "no node named $name (cluster-kafka-1..3, cluster-cassandra-1..3)" ;;
  esac
}

# The six nodes stopped side by side: one after another took 62 s in CI (each waits for its
# JVM's exit). The data is thrown away or kept whole either way.
cluster_down() {
  local k
  for k in "${NODES[@]}"; do
    stop_one "cluster-kafka-$k" &
    stop_one "cluster-cassandra-$k" &
  done
  wait
}

cluster_status() {
  local name pid k
  for k in "${NODES[@]}"; do
    for name in "cluster-kafka-$k" "cluster-cassandra-$k"; do
      if pid_alive "$STATE/$name.pid"; then
        pid="$(cat "$STATE/$name.pid")"
        say "$name running (pid $pid, RSS $(awk '/VmRSS/ {print $2 / 1024 " MiB"}' "/proc/$pid/status"))"
      else
        say "$name stopped"
      fi
    done
  done
}

case "${1:-}" in
  up) cluster_up ;;
  start) need_tools; cluster_start "${2:?cluster.sh start NODE}" ;;
  down) cluster_down ;;
  reset) cluster_down; rm -rf "$STATE"/cluster-kafka-? "$STATE"/cluster-cassandra-? "$STATE/cluster-kafka.id"; say "wiped the cluster's data" ;;
  status) cluster_status ;;
  *) echo "usage: $0 up|start NODE|down|reset|status" >&2; exit 2 ;;
esac
