#!/usr/bin/env bash
# RocksDB for the build, prebuilt: the shared library inside Maven Central's
# org.rocksdb:rocksdbjni jar (the build Kafka Streams and Flink run), fetched once, checked
# against a pinned checksum, cached, and linked by every cargo build of this repository
# (docs/building.md). It exports RocksDB's whole C API, so the rocksdb crate links it in
# place of compiling RocksDB's C++ (15-22 minutes on 2 cores; this takes seconds).
#
#   stack/rocksdb.sh          fetch once; point ./.rocksdb (named by .cargo/config.toml) at it
#   stack/rocksdb.sh --dir    print the cached library's directory (fetching it if need be)
#
# The version is the one librocksdb-sys bundles (Cargo.lock: librocksdb-sys 0.19.0+11.8.1),
# so the crate's headers and bindings describe this library exactly. A platform the jar has
# no library for builds the bundled RocksDB from source: ROCKSDB_COMPILE=1 (docs/building.md).
#
# Environment: LIKES_CACHE (~/.cache/likes). Needs mvn (Debian: maven) and python3.
set -euo pipefail

ROCKSDB_VERSION=11.8.1
JAR_SHA256=628ed387887f4a431df480857954df2a28b4389bfe24858ccdec611cabf65dbf

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
CACHE="${LIKES_CACHE:-$HOME/.cache/likes}"

say() { printf 'rocksdb: %s\n' "$*" >&2; }
die() { printf 'rocksdb: error: %s\n' "$*" >&2; exit 1; }

libc=gnu
case "$(ldd --version 2>&1 || true)" in *musl* | *MUSL*) libc=musl ;; esac
case "$(uname -s)-$(uname -m)-$libc" in
  Linux-x86_64-gnu) member=librocksdbjni-linux64.so ;;
  Linux-x86_64-musl) member=librocksdbjni-linux64-musl.so ;;
  Linux-aarch64-gnu) member=librocksdbjni-linux-aarch64.so ;;
  Linux-aarch64-musl) member=librocksdbjni-linux-aarch64-musl.so ;;
  *) die "rocksdbjni $ROCKSDB_VERSION has no library for $(uname -sm) ($libc); build RocksDB from source instead: ROCKSDB_COMPILE=1 make build (docs/building.md)" ;;
esac
dir="$CACHE/rocksdb/$ROCKSDB_VERSION-${member#librocksdbjni-}"
dir="${dir%.so}"

if [[ ! -f "$dir/.complete" ]]; then
  command -v mvn >/dev/null || die "mvn not found: needed once to fetch RocksDB (Debian: apt-get install maven; or run stack/prereqs.sh build)"
  say "fetching org.rocksdb:rocksdbjni:$ROCKSDB_VERSION from Maven Central into $dir (once)"
  rm -rf "$dir.tmp"
  mkdir -p "$dir.tmp"
  log="$dir.tmp/fetch.log"
  if ! mvn -q -B dependency:copy -Dartifact="org.rocksdb:rocksdbjni:$ROCKSDB_VERSION" \
      -DoutputDirectory="$dir.tmp" >"$log" 2>&1; then
    tail -20 "$log" >&2
    die "could not fetch rocksdbjni $ROCKSDB_VERSION (full log: $log)"
  fi
  jar="$dir.tmp/rocksdbjni-$ROCKSDB_VERSION.jar"
  sum="$(sha256sum "$jar" | cut -d' ' -f1)"
  [[ "$sum" == "$JAR_SHA256" ]] \
    || die "rocksdbjni-$ROCKSDB_VERSION.jar has sha256 $sum, expected $JAR_SHA256: refusing it (delete ~/.m2/repository/org/rocksdb and try again)"
  python3 - "$jar" "$member" "$dir.tmp/librocksdb.so" <<'EOF'
import shutil, sys, zipfile
jar, member, out = sys.argv[1:]
with zipfile.ZipFile(jar) as z, z.open(member) as src, open(out, "wb") as dst:
    shutil.copyfileobj(src, dst)
EOF
  chmod 0755 "$dir.tmp/librocksdb.so"
  rm -f "$jar"
  printf '%s\n' "$ROCKSDB_VERSION" >"$dir.tmp/VERSION"
  touch "$dir.tmp/.complete"
  rm -rf "$dir"
  mv "$dir.tmp" "$dir"
  say "cached $dir/librocksdb.so ($(du -h "$dir/librocksdb.so" | cut -f1), from $member)"
fi

if [[ "${1:-}" == --dir ]]; then
  printf '%s\n' "$dir"
  exit 0
fi
# The path .cargo/config.toml gives the rocksdb crate (ROCKSDB_LIB_DIR): a link into the cache,
# so a plain `cargo build` in this clone links the cached library too.
if [[ "$(readlink "$ROOT/.rocksdb" 2>/dev/null)" != "$dir" ]]; then
  ln -sfn "$dir" "$ROOT/.rocksdb"
fi
