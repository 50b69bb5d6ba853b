#!/usr/bin/env bash
# What a fresh Debian machine lacks before `make` can work. `make up`, `make build` (so
# `make demo` and `make test`), `make lint`, `make bench` and `.ci/run` all call this one
# script, each naming what it needs, so CI proves the list.
#
#   stack/prereqs.sh [--check] [GROUP...]
#     GROUP: stack (run Kafka and Cassandra), build (compile the crate), lint (buf),
#            bench (the report's plots), deploy (make image, k8s-check, alerts-check),
#            k8s (make k8s-e2e: a control plane on this machine),
#            chaos (make chaos-cluster: the checker's Go, nft for partitions);
#            none given: stack build
#     as root, installs what is missing (apt-get) and says what each package is for;
#     otherwise, or with --check, prints the exact `apt-get install` line and exits 1
#
# LIKES_SKIP_PREREQS=1 skips the check (a machine that has it all some other way).
set -euo pipefail

[[ "${LIKES_SKIP_PREREQS:-}" == 1 ]] && exit 0
check_only=false
groups=()
for a in "$@"; do
  case "$a" in
    --check) check_only=true ;;
    stack | build | lint | bench | deploy | k8s | chaos) groups+=("$a") ;;
    *) echo "usage: $0 [--check] [stack|build|lint|bench|deploy|k8s|chaos]..." >&2; exit 2 ;;
  esac
done
((${#groups[@]})) || groups=(stack build)
wants() { [[ " ${groups[*]} " == *" $1 "* ]]; }

# package: why (shown when it is missing)
declare -A why=(
  [libclang-dev]="the rocksdb crate generates its bindings with bindgen, which needs libclang"
  [build-essential]="a C/C++ compiler: librdkafka is built from source (RocksDB comes prebuilt, stack/rocksdb.sh)"
  [make]="the front door (Makefile) and librdkafka's build"
  [perl]="librdkafka's ./configure"
  [openjdk-17-jdk-headless]="Java 17 runs the local Kafka broker and Cassandra"
  [maven]="fetches the Kafka and Cassandra jars and the prebuilt RocksDB from Maven Central (stack/pom.xml, stack/rocksdb.sh)"
  [python3]="the stack's readiness probes (stack/probe.py)"
  [npm]="installs the buf CLI once, for \`make lint\`"
  [fonts-dejavu-core]="the font \`make bench\` labels its plots with"
  [buildah]="builds the image without a Docker engine (\`make image\`)"
  [podman]="runs the built image as a container (\`make image\`'s smoke run)"
  [prometheus]="promtool, which checks and unit-tests the alert rules (\`make alerts-check\`)"
  [golang-go]="installs kustomize from the Go module proxy (\`make k8s-check\`)"
  [python3-venv]="a venv for kubernetes-validate and checkov from PyPI (\`make k8s-check\`)"
  [curl]="the image smoke run asks /healthz with it"
  [openssl]="the e2e control plane's certificates and token (\`make k8s-e2e\`)"
  [nftables]="nft: the chaos runs' partitions drop one process's packets to the nodes (\`make chaos-cluster\`)"
  [runc]="the OCI runtime podman falls back to where crun cannot run (cgroup v1, no CAP_SYS_RESOURCE)"
)

need=()
has_pkg() { dpkg -s "$1" >/dev/null 2>&1; }
has_cmd() { command -v "$1" >/dev/null 2>&1; }
has_libclang() {
  if has_cmd dpkg; then has_pkg libclang-dev; else
    # Not Debian: look for the library instead of the package.
    compgen -G "/usr/lib*/llvm-*/lib/libclang*.so*" >/dev/null \
      || compgen -G "/usr/lib*/libclang*.so*" >/dev/null
  fi
}
if wants stack; then
  has_cmd javac || need+=(openjdk-17-jdk-headless)
  has_cmd mvn || need+=(maven)
  has_cmd python3 || need+=(python3)
fi
rust_missing=false
if wants build; then
  has_libclang || need+=(libclang-dev)
  has_cmd c++ || need+=(build-essential)
  has_cmd make || need+=(make)
  has_cmd perl || need+=(perl)
  # stack/rocksdb.sh: mvn fetches the prebuilt RocksDB, python3 unpacks it
  has_cmd mvn || need+=(maven)
  has_cmd java || need+=(openjdk-17-jdk-headless)
  has_cmd python3 || need+=(python3)
  has_cmd cargo || rust_missing=true
fi
if wants lint; then
  has_cmd npm || need+=(npm)
fi
if wants chaos; then
  # tools/linearizability, the chaos runs' history checker, is Go.
  has_cmd go || need+=(golang-go)
  has_cmd nft || need+=(nftables)
fi
if wants deploy; then
  has_cmd buildah || need+=(buildah)
  has_cmd podman || need+=(podman)
  has_cmd promtool || need+=(prometheus)
  has_cmd go || need+=(golang-go)
  has_cmd npm || need+=(npm)
  python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
  has_cmd curl || need+=(curl)
  has_cmd runc || need+=(runc)
fi
if wants k8s; then
  has_cmd openssl || need+=(openssl)
  has_cmd go || need+=(golang-go)
  has_cmd mvn || need+=(maven)
  has_cmd curl || need+=(curl)
  python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
fi
if wants bench; then
  { has_cmd dpkg && has_pkg fonts-dejavu-core; } || [[ -n "${LIKES_PLOT_FONT:-}" ]] \
    || need+=(fonts-dejavu-core)
fi

# One package named by two groups is installed once.
if ((${#need[@]})); then mapfile -t need < <(printf '%s\n' "${need[@]}" | awk '!seen[$0]++'); fi
if ((${#need[@]} == 0)) && ! $rust_missing; then
  exit 0
fi

if $rust_missing; then
  # Not installed for you: rustup installs per user; one line does it.
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
