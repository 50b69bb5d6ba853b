#!/usr/bin/env bash
# What a fresh Debian machine lacks before `make demo` / `make test` / `.ci/run` can work.
# `make demo`, `make test` and `.ci/run` all call this one script, so CI proves the list.
#
#   stack/prereqs.sh            check; as root install what is missing (apt-get), else print
#                               the exact `apt-get install` line and exit 1
#   stack/prereqs.sh --check    only check (exit 1 and print the line if anything is missing)
#
# LIKES_SKIP_PREREQS=1 skips the check (e.g. a machine that is not Debian and has it all).
set -euo pipefail

[[ "${LIKES_SKIP_PREREQS:-}" == 1 ]] && exit 0
check_only=false
[[ "${1:-}" == --check ]] && check_only=true

# package: why (shown when it is installed)
declare -A why=(
  [libclang-dev]="the rocksdb crate generates its bindings with bindgen, which needs libclang"
  [build-essential]="a C/C++ compiler: RocksDB's C++ and librdkafka are built from source"
  [make]="the front door (Makefile) and librdkafka's build"
  [perl]="librdkafka's ./configure"
  [openjdk-17-jdk-headless]="Java 17 runs the local Kafka broker and Cassandra"
  [maven]="fetches the Kafka and Cassandra jars from Maven Central (stack/pom.xml)"
  [python3]="the stack's readiness probes (stack/probe.py)"
  [npm]="installs the buf CLI once, for \`make lint\`"
  [fonts-dejavu-core]="the font \`make bench\` labels its plots with"
)

need=()
has_pkg() { dpkg -s "$1" >/dev/null 2>&1; }
has_cmd() { command -v "$1" >/dev/null 2>&1; }
if has_cmd dpkg; then
  has_pkg libclang-dev || need+=(libclang-dev)
  has_pkg fonts-dejavu-core || need+=(fonts-dejavu-core)
else
  # Not Debian: look for the files instead of the packages.
  compgen -G "/usr/lib*/llvm-*/lib/libclang*.so*" >/dev/null \
    || compgen -G "/usr/lib*/libclang*.so*" >/dev/null || need+=(libclang-dev)
fi
has_cmd c++ || need+=(build-essential)
has_cmd make || need+=(make)
has_cmd perl || need+=(perl)
has_cmd javac || need+=(openjdk-17-jdk-headless)
has_cmd mvn || need+=(maven)
has_cmd python3 || need+=(python3)
has_cmd npm || need+=(npm)

rust_missing=false
if ! has_cmd cargo; then
  rust_missing=true
fi

if ((${#need[@]} == 0)) && ! $rust_missing; then
  exit 0
fi

if $rust_missing; then
  # Not installed for you: rustup installs per user, and picks the toolchain from
  # rust-toolchain files; one line does it.
  echo "prereqs: cargo not found. This project needs Rust 1.88 or newer from rustup:" >&2
  echo "  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y && . \"\$HOME/.cargo/env\"" >&2
fi

if ((${#need[@]})); then
  echo "prereqs: this machine lacks:" >&2
  for p in "${need[@]}"; do echo "  $p: ${why[$p]}" >&2; done
  line="apt-get install -y ${need[*]}"
  if $check_only || [[ $(id -u) -ne 0 ]] || ! has_cmd apt-get; then
    echo "prereqs: install them with:" >&2
    echo "  sudo $line" >&2
    echo "prereqs: (or set LIKES_SKIP_PREREQS=1 if they are installed some other way)" >&2
    exit 1
  fi
  echo "prereqs: installing them (running as root): $line" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
  echo "prereqs: installed ${need[*]}" >&2
fi

$rust_missing && exit 1
exit 0
