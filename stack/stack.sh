#!/usr/bin/env bash
# The local stack: Apache Kafka (KRaft, one combined node) and Apache Cassandra (one node),
# from Maven Central jars, on 127.0.0.1 only. No Docker.
#
#   stack.sh up       fetch jars (cached), start both, wait until truly ready; idempotent
#   stack.sh down     stop exactly the processes `up` started (by pid file)
#   stack.sh up-regions / down-regions
#                     a second Cassandra cluster of two nodes, one per datacenter
#                     (region-a on $REGION_A_ADDRESS, region-b on $REGION_B_ADDRESS, same
#                     ports): the real two-DC store of docs/multi-region.md. Apart from
#                     `up`'s node, so both run at once; `down` leaves it alone.
#   stack.sh reset    down, then wipe both data dirs
#   stack.sh status   what runs, where the logs are
#   stack.sh fetch    only download the jars
#
# Environment (all optional):
#   LIKES_CACHE       jar cache and default state dir root   (~/.cache/likes)
#   LIKES_STACK_DIR   data, logs and pid files               ($LIKES_CACHE/stack)
#   KAFKA_PORT (9092) KAFKA_CONTROLLER_PORT (9093) CQL_PORT (9042) CASSANDRA_STORAGE_PORT (7000)
#   KAFKA_HEAP (512m) CASSANDRA_HEAP (1g) REGION_HEAP (768m, each regional node)
#   REGION_A_ADDRESS (127.0.0.2) REGION_B_ADDRESS (127.0.0.3)
set -euo pipefail

KAFKA_VERSION=4.1.1
CASSANDRA_VERSION=5.0.6

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${LIKES_CACHE:-$HOME/.cache/likes}"
STATE="${LIKES_STACK_DIR:-$CACHE/stack}"
KAFKA_PORT="${KAFKA_PORT:-9092}"
KAFKA_CONTROLLER_PORT="${KAFKA_CONTROLLER_PORT:-9093}"
CQL_PORT="${CQL_PORT:-9042}"
CASSANDRA_STORAGE_PORT="${CASSANDRA_STORAGE_PORT:-7000}"
KAFKA_HEAP="${KAFKA_HEAP:-512m}"
CASSANDRA_HEAP="${CASSANDRA_HEAP:-1g}"
REGION_HEAP="${REGION_HEAP:-768m}"
CLUSTER_HEAP="${CLUSTER_HEAP:-512m}"
REGION_A_ADDRESS="${REGION_A_ADDRESS:-127.0.0.2}"
REGION_B_ADDRESS="${REGION_B_ADDRESS:-127.0.0.3}"
KAFKA_JARS="$CACHE/jars/kafka-$KAFKA_VERSION"
CASSANDRA_JARS="$CACHE/jars/cassandra-$CASSANDRA_VERSION"

say() { printf 'stack: %s\n' "$*"; }
die() { printf 'stack: error: %s\n' "$*" >&2; exit 1; }

need_tools() {
  command -v java >/dev/null || die "java not found: install a Java 17 JDK (Debian: apt-get install openjdk-17-jdk-headless)"
  local major
  major="$(java -XshowSettings:properties -version 2>&1 | awk -F'= ' '/java.specification.version/ {print $2}')"
  [[ "$major" == 17 ]] || die "java $major found, Cassandra 5.0 and Kafka 4 here need Java 17 (put a Java 17 `java` first on PATH)"
  command -v python3 >/dev/null || die "python3 not found (used for readiness probes): apt-get install python3"
}

# Resolve one Maven profile of stack/pom.xml into a jar dir, once; later calls are instant.
fetch_profile() {
  local profile="$1" dest="$2"
  [[ -f "$dest/.complete" ]] && return 0
  command -v mvn >/dev/null || die "mvn not found: needed once to fetch jars (Debian: apt-get install maven)"
  say "fetching $profile jars from Maven Central into $dest (once)"
  rm -rf "$dest.tmp"
  if ! mvn -q -B -f "$HERE/pom.xml" -P"$profile" \
      -Dkafka.version="$KAFKA_VERSION" -Dcassandra.version="$CASSANDRA_VERSION" \
      dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$dest.tmp" \
      >"$CACHE/fetch-$profile.log" 2>&1; then
    tail -20 "$CACHE/fetch-$profile.log" >&2
    die "could not fetch $profile jars (full log: $CACHE/fetch-$profile.log)"
  fi
  touch "$dest.tmp/.complete"
  mv "$dest.tmp" "$dest"
}

fetch() {
  mkdir -p "$CACHE/jars"
  fetch_profile kafka "$KAFKA_JARS"
  fetch_profile cassandra "$CASSANDRA_JARS"
}

# A pid file counts only if its process is alive and is still the JVM we started: after a
# hard stop the pid may have been reused by something else.
pid_alive() {
  local pidfile="$1" pid main
  [[ -f "$pidfile" ]] || return 1
  pid="$(cat "$pidfile")"
  case "$(basename "$pidfile")" in
    kafka.pid | cluster-kafka-?.pid) main=kafka.Kafka ;;
    cassandra.pid | cassandra-region-?.pid | cluster-cassandra-?.pid) main=org.apache.cassandra.service.CassandraDaemon ;;
    *) return 1 ;;
  esac
  kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$main"
}

port_free() {
  local port="$1" what="$2" host="${3:-127.0.0.1}"
  if python3 "$HERE/probe.py" port "$host:$port" >/dev/null 2>&1; then
    printf 'stack: error: port %s (%s) is already taken by another process; free it or set the port variable (see stack/stack.sh)\n' "$port" "$what" >&2
    return 1
  fi
}

render() {  # template -> file, filling in the placeholders (the node's, when one is set)
  sed -e "s#@STATE@#$STATE#g" -e "s#@KAFKA_PORT@#$KAFKA_PORT#g" \
      -e "s#@CONTROLLER_PORT@#$KAFKA_CONTROLLER_PORT#g" -e "s#@CQL_PORT@#$CQL_PORT#g" \
      -e "s#@STORAGE_PORT@#$CASSANDRA_STORAGE_PORT#g" -e "s#@NODE_DIR@#${N_DIR:-}#g" \
      -e "s#@CLUSTER@#${N_CLUSTER:-}#g" -e "s#@ADDRESS@#${N_ADDRESS:-}#g" \
      -e "s#@TOKEN@#${N_TOKEN:-}#g" -e "s#@SEEDS@#${N_SEEDS:-}#g" -e "s#@SNITCH@#${N_SNITCH:-}#g" \
      "$1" >"$2"
}

# One Cassandra node of the stack: `cassandra` (up's), or `cassandra-region-a`/`-b` (the
# two-DC cluster: a node per datacenter, GossipingPropertyFileSnitch naming its DC; the
# tokens differ, and with one replica per DC every node holds every row).
node_conf() {
  N_DIR="$STATE/$1" N_LOGS="$STATE/logs/$1"
  case "$1" in
    cassandra)
      N_CLUSTER=likes-dev N_ADDRESS=127.0.0.1 N_TOKEN=0 N_SNITCH=SimpleSnitch N_DC=
      N_SEEDS="127.0.0.1:$CASSANDRA_STORAGE_PORT" N_HEAP=$CASSANDRA_HEAP ;;
    cluster-cassandra-[123])
      # The replicated stack (stack/cluster.sh): three nodes of one datacenter, RF 3. Every
      # node a seed: a node killed in a chaos run starts again while another may be cut off
      # (node isolation); with one seed, a restart during the seed's isolation failed its
      # shadow round ("Unable to gossip with any peers") and the CI run with it.
      local k=${1##*-} s=$CASSANDRA_STORAGE_PORT
      N_CLUSTER=likes-cluster N_SNITCH=SimpleSnitch N_DC= N_ADDRESS=127.0.2.$k
      N_SEEDS="127.0.2.1:$s,127.0.2.2:$s,127.0.2.3:$s" N_HEAP=$CLUSTER_HEAP
      N_TOKEN=$(( (k - 2) * 6148914691236517205 )) ;;
    cassandra-region-a | cassandra-region-b)
      N_CLUSTER=likes-regions N_SNITCH=GossipingPropertyFileSnitch N_DC=${1#cassandra-}
      N_SEEDS="$REGION_A_ADDRESS:$CASSANDRA_STORAGE_PORT" N_HEAP=$REGION_HEAP
      if [[ $1 == cassandra-region-a ]]; then N_ADDRESS=$REGION_A_ADDRESS N_TOKEN=0
      else N_ADDRESS=$REGION_B_ADDRESS N_TOKEN=4611686018427387904; fi ;;
    *) die "no cassandra node named $1" ;;
  esac
}

# wait_ready NAME PIDFILE LOG TIMEOUT PROBE-ARGS...
wait_ready() {
  local name="$1" pidfile="$2" log="$3" timeout="$4"; shift 4
  local start=$SECONDS out
  while ((SECONDS - start < timeout)); do
    if out="$(python3 "$HERE/probe.py" "$@" 2>/dev/null)"; then
      say "$out (ready after $((SECONDS - start)) s)"
      return 0
    fi
    if ! pid_alive "$pidfile"; then
      say "$name exited during start; last lines of $log:" >&2
      tail -30 "$log" >&2 || true
      return 1
    fi
    sleep 1
  done
  say "$name not ready after ${timeout} s; last lines of $log:" >&2
  tail -30 "$log" >&2 || true
  return 1
}

start_kafka() {
  local pidfile="$STATE/kafka.pid" log="$STATE/logs/kafka/stdout.log"
  if pid_alive "$pidfile"; then say "kafka already running (pid $(cat "$pidfile"))"; return 0; fi
  port_free "$KAFKA_PORT" kafka || return 1
  port_free "$KAFKA_CONTROLLER_PORT" "kafka controller" || return 1
  mkdir -p "$STATE/kafka" "$STATE/logs/kafka"
  render "$HERE/kafka/server.properties" "$STATE/kafka/server.properties"
  local cp="$KAFKA_JARS/*"
  if [[ ! -f "$STATE/kafka/data/meta.properties" ]]; then
    local cluster_id
    cluster_id="$(python3 -c 'import base64,uuid;print(base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode())')"
    java -cp "$cp" -Dlog4j2.configurationFile="$HERE/kafka/log4j2.properties" \
      -Dkafka.logs.dir="$STATE/logs/kafka" kafka.tools.StorageTool format \
      -t "$cluster_id" -c "$STATE/kafka/server.properties" >"$STATE/logs/kafka/format.log" 2>&1 \
      || { cat "$STATE/logs/kafka/format.log" >&2; say "kafka storage format failed" >&2; return 1; }
    say "kafka storage formatted (cluster $cluster_id)"
  fi
  STARTED+=(kafka)
  setsid nohup java -Xms"$KAFKA_HEAP" -Xmx"$KAFKA_HEAP" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
    -Djava.awt.headless=true -Dlog4j2.configurationFile="$HERE/kafka/log4j2.properties" \
    -Dkafka.logs.dir="$STATE/logs/kafka" -cp "$cp" kafka.Kafka "$STATE/kafka/server.properties" \
    >"$log" 2>&1 </dev/null &
  echo $! >"$pidfile"
  say "kafka starting (pid $!), log: $STATE/logs/kafka/server.log"
}

cassandra_jvm_opts() {
  cat <<OPTS
-Xms$N_HEAP
-Xmx$N_HEAP
-Xss512k
-XX:+UseG1GC
-XX:+ParallelRefProcEnabled
-XX:MaxTenuringThreshold=1
-XX:G1HeapRegionSize=16m
-XX:MaxGCPauseMillis=300
-XX:+ExitOnOutOfMemoryError
-XX:HeapDumpPath=$N_LOGS
-javaagent:$CASSANDRA_JARS/jamm-0.4.0.jar
-Djava.awt.headless=true
-Dcassandra-foreground=yes
-Dcassandra.config=file://$N_DIR/cassandra.yaml
-Dcassandra.storagedir=$N_DIR
-Dcassandra.logdir=$N_LOGS
-Dlogback.configurationFile=$HERE/cassandra/logback.xml
-Dcassandra.skip_wait_for_gossip_to_settle=0
-Dcassandra.ring_delay_ms=1000
-Djdk.attach.allowAttachSelf=true
-Dio.netty.tryReflectionSetAccessible=true
-Dio.netty.allocator.useCacheForAllThreads=true
-Dio.netty.allocator.maxOrder=11
OPTS
  [[ -z "$N_DC" ]] || echo "-Dcassandra-rackdc.properties=file://$N_DIR/cassandra-rackdc.properties"
  cat "$HERE/cassandra/jvm17.options"
}

# Cassandra 5 keeps a paxos state file per LWT table and keeps it after the table is dropped;
# at start it lists that directory once per live table, so the files of thousands of dropped
# test keyspaces made every start (and every restart in the kill tests and chaos runs) take
# 100-150 s instead of a few. Deleted before a start: the files of tables already unknown when
# written (UNKNOWN-UNKNOWN-*) and of namespaces whose run has exited (`<base>_<pid>_<ms>_<n>`,
# the rule of `likes-tools prune`); a live run's keyspace, the demo's and an operator's stay.
prune_paxos_state() {
  local dir="$N_DIR/data/system/_paxos_repair_state" f base ks n=0
  [[ -d "$dir" ]] || return 0
  local -A gone=()
  for f in "$dir"/*; do
    base="${f##*/}"
    ks="${base%%-*}"
    if [[ "$ks" == UNKNOWN ]]; then
      :
    elif [[ "$ks" =~ ^.+_([1-9][0-9]{0,6})_(0|[1-9][0-9]{0,7})_(0|[1-9][0-9]*)$ ]]; then
      local pid="${BASH_REMATCH[1]}"
      [[ -n "${gone[$pid]:-}" ]] || { [[ -e "/proc/$pid" ]] && gone[$pid]=no || gone[$pid]=yes; }
      [[ "${gone[$pid]}" == yes ]] || continue
    else
      continue
    fi
    rm -f -- "$f" && n=$((n + 1))
  done
  ((n == 0)) || say "${name:-cassandra}: deleted $n paxos state files of dropped or left-behind test keyspaces"
}

start_cassandra() {  # [node name]
  local name="${1:-cassandra}"
  node_conf "$name"
  local pidfile="$STATE/$name.pid" log="$N_LOGS/stdout.log"
  if pid_alive "$pidfile"; then say "$name already running (pid $(cat "$pidfile"))"; return 0; fi
  port_free "$CQL_PORT" "$name CQL" "$N_ADDRESS" || return 1
  port_free "$CASSANDRA_STORAGE_PORT" "$name storage" "$N_ADDRESS" || return 1
  mkdir -p "$N_DIR" "$N_LOGS"
  prune_paxos_state
  render "$HERE/cassandra/cassandra.yaml" "$N_DIR/cassandra.yaml"
  [[ -z "$N_DC" ]] || printf 'dc=%s\nrack=rack1\n' "$N_DC" >"$N_DIR/cassandra-rackdc.properties"
  local opts=()
  while IFS= read -r line; do
    [[ -z "$line" || "$line" == \#* ]] || opts+=("$line")
  done < <(cassandra_jvm_opts)
  STARTED+=("$name")
  setsid nohup java "${opts[@]}" -cp "$CASSANDRA_JARS/*" org.apache.cassandra.service.CassandraDaemon \
    >"$log" 2>&1 </dev/null &
  echo $! >"$pidfile"
  say "$name starting (pid $!), log: $N_LOGS/system.log"
}

stop_one() {
  local name="$1" pidfile="$STATE/$1.pid"
  if ! pid_alive "$pidfile"; then rm -f "$pidfile"; say "$name not running"; return 0; fi
  local pid; pid="$(cat "$pidfile")"
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  if kill -0 "$pid" 2>/dev/null; then
    say "$name (pid $pid) ignored SIGTERM for 30 s; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do sleep 0.2; done
  fi
  rm -f "$pidfile"
  say "$name stopped (pid $pid)"
}

STARTED=()
# On any failure, stop only what this call started: nothing is left half-started, and a
# service that was already running before the call is left alone.
abort_up() {
  local name
  for name in "${STARTED[@]}"; do stop_one "$name"; done
  die "$1"
}

up() {
  need_tools
  mkdir -p "$STATE/logs"
  fetch
  local started=$SECONDS
  # Started side by side: Cassandra's start is the long pole.
  start_cassandra || abort_up "cassandra did not start"
  start_kafka || abort_up "kafka did not start; stopped what this call started"
  # A broker loads every partition before it answers: ~15 ms each on this kind of box, so
  # thousands left by failed test runs take minutes (`make stack-prune` deletes them).
  local partitions
  partitions="$(find "$STATE/kafka/data" -mindepth 1 -maxdepth 1 -type d 2>/dev/null | wc -l)"
  ((partitions < 1000)) || say "kafka holds $partitions partitions: its start is slow; \`make stack-prune\` deletes what test runs left"
  wait_ready kafka "$STATE/kafka.pid" "$STATE/logs/kafka/server.log" $((90 + partitions / 40)) kafka "127.0.0.1:$KAFKA_PORT" \
    || abort_up "kafka did not become ready; stopped what this call started"
  wait_ready cassandra "$STATE/cassandra.pid" "$STATE/logs/cassandra/system.log" 240 cql "127.0.0.1:$CQL_PORT" \
    || abort_up "cassandra did not become ready; stopped what this call started"
  say "up in $((SECONDS - started)) s: kafka 127.0.0.1:$KAFKA_PORT, cql 127.0.0.1:$CQL_PORT; logs under $STATE/logs"
}

# The two-DC cluster, one node per region: a, then b (b joins through a's gossip), then
# the check that a sees both datacenters.
up_regions() {
  need_tools
  mkdir -p "$STATE/logs"
  fetch
  local started=$SECONDS name addr
  for name in cassandra-region-a cassandra-region-b; do
    node_conf "$name"
    addr=$N_ADDRESS
    start_cassandra "$name" || abort_up "$name did not start"
    wait_ready "$name" "$STATE/$name.pid" "$N_LOGS/system.log" 240 cql "$addr:$CQL_PORT" \
      || abort_up "$name did not become ready; stopped what this call started"
  done
  wait_ready cassandra-region-a "$STATE/cassandra-region-a.pid" "$STATE/logs/cassandra-region-a/system.log" 60 \
    dcs "$REGION_A_ADDRESS:$CQL_PORT" || abort_up "the two regions' nodes do not see each other"
  say "regions up in $((SECONDS - started)) s: region-a cql $REGION_A_ADDRESS:$CQL_PORT, region-b cql $REGION_B_ADDRESS:$CQL_PORT (heap $REGION_HEAP each)"
}

down_regions() {
  stop_one cassandra-region-b
  stop_one cassandra-region-a
}

# The processes `make demo` leaves up for a look (pid files under $STATE/demo), stopped
# first so nothing is left talking to a stack that goes away. A pid counts only while it
# still runs `likes`.
stop_demo() {
  local f pid
  for f in "$STATE"/demo/*.pid; do
    [[ -f "$f" ]] || continue
    pid="$(cat "$f")"
    if tr '\0' ' ' 2>/dev/null < "/proc/$pid/cmdline" | grep -q likes; then
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      kill -KILL "$pid" 2>/dev/null || true
      say "stopped demo $(basename "$f" .pid) (pid $pid)"
    fi
    rm -f "$f"
  done
}

down() {
  stop_demo
  stop_one kafka
  stop_one cassandra
}

reset() {
  down
  down_regions
  rm -rf "$STATE/kafka" "$STATE/cassandra" "$STATE/demo" "$STATE"/cassandra-region-?
  say "wiped kafka and cassandra data under $STATE"
}

status() {
  for name in kafka cassandra cassandra-region-a cassandra-region-b; do
    [[ $name != cassandra-region-* || -f "$STATE/$name.pid" ]] || continue
    if pid_alive "$STATE/$name.pid"; then say "$name running (pid $(cat "$STATE/$name.pid"))"
    else say "$name stopped"; fi
  done
  say "logs: $STATE/logs/kafka/server.log, $STATE/logs/cassandra/system.log"
}

# Exit 0 when both services run (for callers that stop only what they started).
running() {
  pid_alive "$STATE/kafka.pid" && pid_alive "$STATE/cassandra.pid"
}

# Sourced by stack/cluster.sh for its functions: no verb to run then.
[[ "${BASH_SOURCE[0]}" == "$0" ]] || return 0

case "${1:-}" in
  up) up ;;
  up-regions) up_regions ;;
  down-regions) down_regions ;;
  running) running ;;
  down) down ;;
  reset) reset ;;
  status) status ;;
  fetch) need_tools; fetch ;;
  *) echo "usage: $0 up|down|reset|status|running|fetch|up-regions|down-regions" >&2; exit 2 ;;
esac
