#!/usr/bin/env bash
# Builds the bench's peers (tools/peers) once per source change: the jar and its dependencies
# land in $LIKES_CACHE/peers (default ~/.cache/likes/peers). Prints the classpath on stdout.
# Needs Java 17 and Maven (stack/prereqs.sh stack); the Kafka version is the broker's.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${LIKES_CACHE:-$HOME/.cache/likes}/peers"
KAFKA_VERSION="$(sed -n 's/^KAFKA_VERSION=//p' "$HERE/../../stack/stack.sh")"
stamp="$(cat "$HERE/pom.xml" "$HERE"/src/main/java/likes/peer/*.java | sha256sum | cut -c1-16)-$KAFKA_VERSION"
if [[ ! -f "$CACHE/$stamp/.complete" ]]; then
  echo "peers: building the Kafka Streams peer (Kafka $KAFKA_VERSION) into $CACHE/$stamp" >&2
  rm -rf "${CACHE:?}"/*/ 2>/dev/null || true
  mkdir -p "$CACHE/$stamp"
  log="$CACHE/build-$stamp.log"
  if ! mvn -q -B -f "$HERE/pom.xml" -Dkafka.version="$KAFKA_VERSION" \
      -Dpeers.build="$CACHE/$stamp/target" \
      package dependency:copy-dependencies -DincludeScope=runtime \
      -DoutputDirectory="$CACHE/$stamp/lib" >"$log" 2>&1; then
    tail -30 "$log" >&2
    echo "peers: build failed (full log: $log)" >&2
    exit 1
  fi
  touch "$CACHE/$stamp/.complete"
fi
echo "$CACHE/$stamp/target/likes-peers-1.jar:$CACHE/$stamp/lib/*"
