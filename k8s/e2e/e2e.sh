#!/usr/bin/env bash
# `make k8s-e2e`: every overlay applied for real to a real control plane (cluster.sh: etcd,
# kube-apiserver, controller-manager, scheduler, kwok nodes), as docs/operations.md's
# "Deploy order" says, then asked what the controllers made of them (checks.py). Containers
# are not run: kwok nodes take pods and report them Ready without running them.
#
#   1. the operators' CRDs at the versions k8s/schemas/ is vendored from (prometheus-operator,
#      scylla-operator) and Strimzi's KafkaTopic CRD from its own generator (strimzi/crd.sh);
#   2. per overlay (every one in k8s/overlays/, each its own namespace), a namespace enforcing
#      the restricted Pod Security profile, the Secret, the apply-first Jobs (waited to
#      completion), then the rest;
#   3. the controllers' work: pods scheduled and Ready, claims Bound, HPA, PDBs, Services'
#      endpoints, NetworkPolicies, least RBAC, every CronJob's Job when triggered by hand;
#   4. an upgrade as the runbook orders it: Jobs again, readers first (count, then dedupe),
#      then the rest, each StatefulSet rolled once;
#   5. broken manifests the server must refuse, each for its own reason.
# K8S_E2E_KEEP=1 leaves the cluster up afterwards (`k8s/e2e/cluster.sh env` to reach it).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
source "$here/tools.sh"
source "$repo/k8s/check/tools.sh"
export KUBECONFIG=${LIKES_CACHE:-$HOME/.cache/likes}/k8s-e2e/kubeconfig KUBECTL=$KUBECTL_BIN
work=$(mktemp -d)
started=$SECONDS
step() { printf '\n== k8s-e2e: %s (+%ss)\n' "$*" "$((SECONDS - started))"; }
checks() { "$PY" "$here/checks.py" "$@"; }
finish() {
  local rc=$?
  ((rc == 0)) || echo "k8s-e2e: FAILED (the control plane's logs: ${LIKES_CACHE:-$HOME/.cache/likes}/k8s-e2e/logs)"
  [[ "${K8S_E2E_KEEP:-}" == 1 ]] || "$here/cluster.sh" down
  rm -rf "$work"
  exit "$rc"
}
trap finish EXIT

step "control plane ($K8S_VERSION, kwok $KWOK_VERSION, $("$ETCD" --version | head -1))"
"$here/cluster.sh" up

step "the operators' CRDs"
mod() { go mod download -json "$1" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["Dir"])'; }
po=$(mod github.com/prometheus-operator/prometheus-operator@v0.80.1)
so=$(GONOSUMDB=github.com/scylladb/scylla-operator mod github.com/scylladb/scylla-operator@v1.15.0)
for crd in "$po/example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml" \
  "$po/example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml" \
  "$so/pkg/api/scylla/v1/scylla.scylladb.com_scyllaclusters.yaml"; do
  kubectl apply --server-side -f "$crd"
done
"$here/strimzi/crd.sh" | kubectl apply --server-side -f -
kubectl wait --for=condition=Established --timeout=60s crd/prometheusrules.monitoring.coreos.com \
  crd/podmonitors.monitoring.coreos.com crd/scyllaclusters.scylla.scylladb.com crd/kafkatopics.kafka.strimzi.io

step "storage: a default StorageClass and static volumes, as a cluster's provisioner would give"
{
  cat <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: e2e-static
  annotations: { storageclass.kubernetes.io/is-default-class: "true" }
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: Immediate
EOF
  for i in $(seq 32); do
    printf -- '---\napiVersion: v1\nkind: PersistentVolume\nmetadata: { name: e2e-pv-%s }\n' "$i"
    printf 'spec: { storageClassName: e2e-static, capacity: { storage: 50Gi }, accessModes: [ReadWriteOnce], hostPath: { path: /tmp/e2e-pv-%s } }\n' "$i"
  done
} | kubectl apply -f - >/dev/null
echo "StorageClass e2e-static (default), 32 volumes of 50Gi"

build() { # overlay dir, output basename
  "$KUSTOMIZE" build --load-restrictor LoadRestrictionsNone "$1" >"$work/$2.yaml"
  "$PY" -c 'import json,sys,yaml; json.dump([d for d in yaml.safe_load_all(open(sys.argv[1])) if d], open(sys.argv[2],"w"))' \
    "$work/$2.yaml" "$work/$2.json"
}

namespace_of() { "$PY" -c 'import json,sys; print(next(d["metadata"]["namespace"] for d in json.load(open(sys.argv[1])) if d["kind"]=="Deployment"))' "$1"; }

deploy() { # overlay name
  local overlay=$1 ns
  build "$repo/k8s/overlays/$overlay" "$overlay"
  ns=$(namespace_of "$work/$overlay.json")
  step "$overlay: namespace $ns enforcing Pod Security 'restricted'; the Secret"
  kubectl create namespace "$ns"
  kubectl label namespace "$ns" pod-security.kubernetes.io/enforce=restricted \
    pod-security.kubernetes.io/enforce-version=latest pod-security.kubernetes.io/warn=restricted
  kubectl -n "$ns" create secret generic likes-secrets \
    --from-literal=session-key="$(openssl rand -hex 32)" --from-literal=admin-token="$(openssl rand -hex 16)"
  if grep -q 'secretName: likes-api-tls' "$work/$overlay.yaml"; then
    # The region overlays serve HTTPS (components/region-tls): a self-signed certificate,
    # its own CA, stands for the one cert-manager would write.
    openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj "/CN=likes-api" \
      -keyout "$work/$overlay-tls.key" -out "$work/$overlay-tls.crt" 2>/dev/null
    kubectl -n "$ns" create secret generic likes-api-tls --from-file=tls.crt="$work/$overlay-tls.crt" \
      --from-file=tls.key="$work/$overlay-tls.key" --from-file=ca.crt="$work/$overlay-tls.crt"
  fi

  step "$overlay: the apply-first Jobs and what they need, then wait (docs/operations.md, Deploy order)"
  kubectl apply -l likes/apply-first=true -f "$work/$overlay.yaml"
  kubectl -n "$ns" wait --for=condition=complete --timeout=120s job/likes-migrate job/likes-topics

  step "$overlay: the rest"
  # Warnings (a Pod Security warning above all) fail the run: restricted must hold with none.
  kubectl apply -f "$work/$overlay.yaml" 2>"$work/warnings"
  if grep -i 'warning' "$work/warnings"; then echo "k8s-e2e: $overlay: the server warned"; exit 1; fi
  for w in $(kubectl -n "$ns" get deploy,sts -o name); do
    kubectl -n "$ns" rollout status "$w" --timeout=180s
  done
  # The HPA raises the API to its minReplicas on its first pass (no metrics needed for that).
  kubectl -n "$ns" wait --for=condition=AbleToScale --timeout=60s hpa/likes-api
  kubectl -n "$ns" rollout status deploy/likes-api --timeout=120s
  # The disruption controller's count and the EndpointSlices trail the pods by a moment.
  sleep 3

  step "$overlay: what the controllers made of it"
  checks "$ns" "$work/$overlay.json" workloads
  checks "$ns" "$work/$overlay.json" policies
  checks "$ns" "$work/$overlay.json" rbac

  step "$overlay: every CronJob triggered by hand creates its Job, which completes"
  for cj in $(kubectl -n "$ns" get cronjobs -o jsonpath='{.items[*].metadata.name}'); do
    kubectl -n "$ns" create job "e2e-$cj" --from="cronjob/$cj"
    kubectl -n "$ns" wait --for=condition=complete --timeout=60s "job/e2e-$cj"
  done
}

upgrade() { # overlay name: the runbook's Upgrading, with a new image tag
  local overlay=$1 ns image
  ns=$(namespace_of "$work/$overlay.json")
  cp -r "$repo/k8s" "$work/k8s-next"
  image=$("$PY" -c 'import json,sys; print(next(d["spec"]["template"]["spec"]["containers"][0]["image"] for d in json.load(open(sys.argv[1])) if d["kind"]=="StatefulSet"))' "$work/$overlay.json")
  image=${image%:*}:0.1.1-e2e
  step "$overlay: upgrade to $image, readers first"
  kubectl -n "$ns" delete job likes-migrate likes-topics --ignore-not-found
  (cd "$work/k8s-next/overlays/$overlay" && "$KUSTOMIZE" edit set image "likes=$image")
  # The copy reads config/ and topology/ from beside k8s/.
  ln -s "$repo/config" "$repo/topology" "$work/"
  build "$work/k8s-next/overlays/$overlay" "$overlay-next"
  kubectl apply -l likes/apply-first=true -f "$work/$overlay-next.yaml"
  kubectl -n "$ns" wait --for=condition=complete --timeout=120s job/likes-migrate job/likes-topics
  local gen_dedupe gen_count
  kubectl -n "$ns" set image statefulset/likes-count "count=$image"
  kubectl -n "$ns" rollout status statefulset/likes-count --timeout=180s
  images() { kubectl -n "$ns" get pods -l "app.kubernetes.io/name=$1" -o jsonpath='{.items[*].spec.containers[0].image}'; }
  [[ " $(images likes-dedupe) $(images likes-api) " != *"$image"* ]] ||
    { echo "k8s-e2e: statefulset/likes-count rolled, and a writer already runs $image"; exit 1; }
  kubectl -n "$ns" set image statefulset/likes-dedupe "dedupe=$image"
  kubectl -n "$ns" rollout status statefulset/likes-dedupe --timeout=240s
  [[ " $(images likes-api) " != *"$image"* ]] ||
    { echo "k8s-e2e: the API runs $image before the stages rolled"; exit 1; }
  gen_count=$(kubectl -n "$ns" get sts likes-count -o jsonpath='{.metadata.generation}')
  gen_dedupe=$(kubectl -n "$ns" get sts likes-dedupe -o jsonpath='{.metadata.generation}')
  kubectl apply -f "$work/$overlay-next.yaml"
  kubectl -n "$ns" rollout status deploy/likes-api --timeout=180s
  kubectl -n "$ns" rollout status deploy/likes-relay --timeout=180s
  # The final apply must not roll the StatefulSets a second time: what `set image` left is
  # what the manifests say.
  [[ "$(kubectl -n "$ns" get sts likes-count -o jsonpath='{.metadata.generation}')" == "$gen_count" &&
    "$(kubectl -n "$ns" get sts likes-dedupe -o jsonpath='{.metadata.generation}')" == "$gen_dedupe" ]] ||
    { echo "k8s-e2e: the apply after the readers-first roll changed a StatefulSet again"; exit 1; }
  local stale
  stale=$(kubectl -n "$ns" get pods --field-selector=status.phase=Running \
    -o jsonpath='{range .items[*]}{.metadata.name}={.spec.containers[0].image}{"\n"}{end}' | grep -v "=$image$" || true)
  [[ -z "$stale" ]] || { echo "k8s-e2e: pods still on the old image: $stale"; exit 1; }
  kubectl -n "$ns" get cronjobs -o jsonpath='{.items[*].spec.jobTemplate.spec.template.spec.containers[0].image}' |
    tr ' ' '\n' | grep -qv "^$image$" && { echo "k8s-e2e: a CronJob kept the old image"; exit 1; }
  echo "upgrade: count, then dedupe, then the rest; every pod and CronJob on $image; each StatefulSet rolled once"
}

refused() { # what, expected reason (grep -E), manifest file
  local out
  if out=$(kubectl apply --dry-run=server --validate=strict -f "$3" 2>&1); then
    echo "k8s-e2e: the server accepted $1"; exit 1
  fi
  grep -Eq "$2" <<<"$out" || { echo "k8s-e2e: $1 was refused for another reason: $out"; exit 1; }
  echo "refused, as it must be: $1: $(grep -Eo "$2.{0,80}" <<<"$out" | head -1)"
}

broken() {
  local ns
  ns=$(namespace_of "$work/dev.json")
  step "broken manifests the server refuses"
  "$PY" - "$work/dev.json" "$work" <<'PY'
import copy, json, sys
docs, out = json.load(open(sys.argv[1])), sys.argv[2]
api = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "likes-api")
cron = next(d for d in docs if d["kind"] == "CronJob")
d = copy.deepcopy(api); c = d["spec"]["template"]["spec"]["containers"][0]
c["imagePulPolicy"] = c.pop("imagePullPolicy")
json.dump(d, open(f"{out}/misspelt.json", "w"))
pod = {"apiVersion": "v1", "kind": "Pod",
       "metadata": {"name": "likes-api-privileged", "namespace": api["metadata"]["namespace"]},
       "spec": copy.deepcopy(api["spec"]["template"]["spec"])}
pod["spec"]["containers"][0]["securityContext"] = {"privileged": True}
json.dump(pod, open(f"{out}/privileged.json", "w"))
d = copy.deepcopy(cron); d["spec"]["schedule"] = "61 * * * *"
json.dump(d, open(f"{out}/schedule.json", "w"))
PY
  refused "a misspelt field (imagePulPolicy)" 'unknown field "spec.template.spec.containers\[0\].imagePulPolicy"' "$work/misspelt.json"
  refused "a privileged container in namespace $ns" 'violates PodSecurity "restricted:latest"' "$work/privileged.json"
  refused "a CronJob schedule that does not parse (61 * * * *)" 'spec.schedule: Invalid value' "$work/schedule.json"
}

# Every overlay, each into its own namespace (a region's overlay too, once it exists).
seen=" "
for dir in "$repo"/k8s/overlays/*/; do
  overlay=$(basename "$dir")
  build "$dir" "$overlay"
  ns=$(namespace_of "$work/$overlay.json")
  [[ "$seen" != *" $ns "* ]] ||
    { echo "k8s-e2e: overlay $overlay deploys into namespace $ns, as another overlay does"; exit 1; }
  seen+="$ns "
  deploy "$overlay"
done
upgrade prod
broken
step "OK in $((SECONDS - started)) s"
