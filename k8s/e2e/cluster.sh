#!/usr/bin/env bash
# A Kubernetes control plane on 127.0.0.1 for `make k8s-e2e`: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and kwok with three fake nodes. Nothing runs a
# container: kwok marks the pods the scheduler binds Running and Ready, and a Job's pods
# Succeeded, so every controller above it does its real work.
#
#   k8s/e2e/cluster.sh up      generate certificates and a token, start what is down, wait
#   k8s/e2e/cluster.sh down    stop exactly the processes `up` started (their pid files)
#   k8s/e2e/cluster.sh env     print `export KUBECONFIG=...` for a shell
#
# State, logs and pid files: ${LIKES_CACHE:-~/.cache/likes}/k8s-e2e (wiped by `up`).
# Ports: etcd 23790/23800, kube-apiserver 16443, controller-manager 10357, scheduler 10359,
# kwok 10247 (K8S_E2E_PORT_BASE shifts them all).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${LIKES_CACHE:-$HOME/.cache/likes}/k8s-e2e
export KUBECONFIG=$dir/kubeconfig
shift_by=${K8S_E2E_PORT_BASE:-0}
etcd_port=$((23790 + shift_by)) etcd_peer=$((23800 + shift_by))
api_port=$((16443 + shift_by)) kcm_port=$((10357 + shift_by)) sched_port=$((10359 + shift_by))
kwok_port=$((10247 + shift_by))
nodes=${K8S_E2E_NODES:-3}

log() { echo "cluster: $*" >&2; }

stop() { # name
  local pidfile=$dir/$1.pid pid
  [[ -f "$pidfile" ]] || return 0
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
    log "$1 stopped (pid $pid)"
  fi
  rm -f "$pidfile"
}

down() {
  # Reverse order: nothing writes to etcd after it is gone.
  for name in kwok kube-scheduler kube-controller-manager kube-apiserver etcd; do stop "$name"; done
}

start() { # name, command...
  local name=$1
  shift
  "$@" >"$dir/logs/$name.log" 2>&1 &
  echo $! >"$dir/$name.pid"
  log "$name started (pid $!, log $dir/logs/$name.log)"
}

wait_for() { # what, seconds, command...
  local what=$1 secs=$2
  shift 2
  for _ in $(seq $((secs * 2))); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  log "$what not ready after ${secs}s; the log's tail:"
  tail -n 30 "$dir/logs/$what.log" >&2 || true
  return 1
}

certificates() {
  local pki=$dir/pki
  mkdir -p "$pki"
  openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=likes-e2e-ca" \
    -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
  openssl req -newkey rsa:2048 -nodes -subj "/CN=kube-apiserver" \
    -keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes.default.svc\n' >"$pki/san.ext"
  openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
    -CAcreateserial -days 2 -extfile "$pki/san.ext" -out "$pki/apiserver.crt" 2>/dev/null
  openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  # One static token in system:masters, for this throwaway cluster's admin and controllers.
  token=$(openssl rand -hex 24)
  echo "$token,likes-e2e-admin,likes-e2e-admin,system:masters" >"$pki/tokens.csv"
  cat >"$KUBECONFIG" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: e2e
    cluster: { server: "https://127.0.0.1:$api_port", certificate-authority: "$pki/ca.crt" }
users:
  - name: admin
    user: { token: "$token" }
contexts:
  - name: e2e
    context: { cluster: e2e, user: admin }
current-context: e2e
EOF
  chmod 600 "$KUBECONFIG" "$pki/tokens.csv"
}

kwok_config() {
  # kwok's own stages (kwokctl's defaults): nodes come up and heartbeat; pods become Ready,
  # a Job's pods complete, a deleted pod goes.
  local s=$KWOK_SRC/kustomize/stage
  for f in "$s/node/fast/node-initialize.yaml" "$s/node/heartbeat/node-heartbeat.yaml" \
    "$s/pod/fast/pod-ready.yaml" "$s/pod/fast/pod-complete.yaml" "$s/pod/fast/pod-delete.yaml"; do
    echo "---"
    cat "$f"
  done
}

nodes_yaml() {
  for i in $(seq "$nodes"); do
    cat <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-$i
  annotations: { kwok.x-k8s.io/node: fake, node.alpha.kubernetes.io/ttl: "0" }
  labels:
    kubernetes.io/hostname: kwok-node-$i
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
    topology.kubernetes.io/zone: zone-$(((i - 1) % 3 + 1))
status:
  allocatable: { cpu: "32", memory: 128Gi, pods: "110" }
  capacity: { cpu: "32", memory: 128Gi, pods: "110" }
EOF
  done
}

up() {
  source "$here/tools.sh"
  down
  rm -rf "$dir"
  mkdir -p "$dir/logs"
  certificates
  local pki=$dir/pki

  start etcd "$ETCD" --name e2e --data-dir "$dir/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "e2e=http://127.0.0.1:$etcd_peer" --quota-backend-bytes 1073741824
  wait_for etcd 30 curl -sf "http://127.0.0.1:$etcd_port/health"

  # --allow-privileged as kubeadm's clusters have it: Pod Security, not this flag, is what
  # must refuse a privileged pod in the likes namespaces.
  start kube-apiserver "$K8S_BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$api_port" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" --token-auth-file "$pki/tokens.csv" \
    --authorization-mode Node,RBAC \
    --service-account-issuer https://kubernetes.default.svc \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --service-cluster-ip-range 10.96.0.0/16 \
    --allow-privileged=true --enable-priority-and-fairness=false --profiling=false
  wait_for kube-apiserver 120 "$KUBECTL_BIN" --kubeconfig "$KUBECONFIG" get --raw /readyz

  start kube-controller-manager "$K8S_BIN/kube-controller-manager" \
    --kubeconfig "$KUBECONFIG" --authentication-kubeconfig "$KUBECONFIG" \
    --authorization-kubeconfig "$KUBECONFIG" \
    --bind-address 127.0.0.1 --secure-port "$kcm_port" --leader-elect=false \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
    --controllers '*,-nodeipam' --concurrent-statefulset-syncs 5 --profiling=false
  start kube-scheduler "$K8S_BIN/kube-scheduler" \
    --kubeconfig "$KUBECONFIG" --authentication-kubeconfig "$KUBECONFIG" \
    --authorization-kubeconfig "$KUBECONFIG" \
    --bind-address 127.0.0.1 --secure-port "$sched_port" --leader-elect=false --profiling=false

  kwok_config >"$dir/kwok.yaml"
  start kwok "$KWOK" --kubeconfig "$KUBECONFIG" --config "$dir/kwok.yaml" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
    --cidr 10.244.0.1/16 --node-ip 127.0.0.1 --server-address "127.0.0.1:$kwok_port"

  nodes_yaml | kubectl apply -f - >/dev/null
  wait_for kube-controller-manager 90 curl -skf "https://127.0.0.1:$kcm_port/healthz"
  wait_for kube-scheduler 90 curl -skf "https://127.0.0.1:$sched_port/healthz"
  wait_for kwok 90 kubectl wait --for=condition=Ready node --all --timeout=1s
  # The default ServiceAccount exists once the controllers run; pods need it to be admitted.
  wait_for kube-controller-manager 60 kubectl -n default get serviceaccount default
  log "up: $(kubectl get nodes --no-headers | wc -l) kwok nodes Ready; KUBECONFIG=$KUBECONFIG"
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  env) echo "export KUBECONFIG=$KUBECONFIG" ;;
  *) echo "usage: $0 up|down|env" >&2; exit 2 ;;
esac
