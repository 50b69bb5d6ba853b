# The pinned control plane of `make k8s-e2e`, built once and cached under
# ~/.cache/likes/tools (sourced by cluster.sh and e2e.sh):
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubectl: k8s.io/kubernetes
#     $K8S_VERSION from the Go module proxy (the module in controlplane/; its go.mod says why
#     every staging module is pinned by a replace), and etcd at the version that release
#     requires (controlplane/etcd/main.go says why not Debian's);
#   kwok $KWOK_VERSION (sigs.k8s.io/kwok, go install): nodes that take pods without running
#     them, and the kwok stages it plays (its own, from the same module).
K8S_VERSION=v1.36.3
KWOK_VERSION=v0.8.0
tools=${LIKES_CACHE:-$HOME/.cache/likes}/tools
K8S_BIN=$tools/k8s-$K8S_VERSION/bin
KUBECTL_BIN=$K8S_BIN/kubectl
ETCD=$K8S_BIN/etcd
KWOK=$tools/kwok-$KWOK_VERSION/bin/kwok
here_tools=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# The control plane's go.mod needs Go 1.26; the go command fetches a newer toolchain from the
# module proxy by itself, but only from Go 1.21 on (Debian 12's golang-go is 1.19).
go_at_least() {
  local v maj min
  v=$(go env GOVERSION 2>/dev/null | sed 's/^go//')
  IFS=. read -r maj min _ <<<"${v:-0.0}"
  ((maj > $1 || (maj == $1 && min >= $2)))
}
if ! go_at_least 1 21; then
  echo "k8s-e2e: the control plane builds with Go >= 1.21 (it then fetches Go 1.26 itself);" >&2
  echo "k8s-e2e: this machine has '$(go env GOVERSION 2>/dev/null || echo none)'. Install Go from" >&2
  echo "k8s-e2e: bookworm-backports (apt-get install -t bookworm-backports golang-go)." >&2
  exit 1
fi
export GOTOOLCHAIN=${GOTOOLCHAIN:-auto} GOFLAGS=-mod=mod

# What `make` in kubernetes stamps in (hack/lib/version.sh): the servers' compatibility
# version and kubectl's version skew checks read it.
version_ldflags() {
  local v=$K8S_VERSION minor
  minor=$(cut -d. -f2 <<<"$v")
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    printf -- '-X %s.gitVersion=%s -X %s.gitMajor=1 -X %s.gitMinor=%s -X %s.gitTreeState=clean ' \
      "$pkg" "$v" "$pkg" "$pkg" "$minor" "$pkg"
  done
}
stamp=$K8S_BIN/.built-from
want_stamp=$(cat "$here_tools/controlplane/go.mod" "$here_tools/controlplane/go.sum" \
  "$here_tools"/controlplane/*/main.go | sha256sum | cut -c1-16)
if [[ "$(cat "$stamp" 2>/dev/null)" != "$want_stamp" ]]; then
  echo "k8s-e2e: building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, etcd" \
    "$K8S_VERSION (Go module proxy; a few minutes the first time)" >&2
  mkdir -p "$K8S_BIN"
  (cd "$here_tools/controlplane" &&
    go build -ldflags "$(version_ldflags)" -o "$K8S_BIN/" ./kube-apiserver ./kube-controller-manager ./kube-scheduler ./kubectl ./etcd)
  echo "$want_stamp" >"$stamp"
fi
if [[ ! -x "$KWOK" ]]; then
  echo "k8s-e2e: installing kwok $KWOK_VERSION (go install)" >&2
  GOBIN=$(dirname "$KWOK") go install "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
fi
# kwok's stages ship in its module: node-initialize and heartbeat, pod ready/complete/delete.
KWOK_SRC=$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION
[[ -d "$KWOK_SRC/kustomize/stage" ]] || go mod download "sigs.k8s.io/kwok@$KWOK_VERSION"
kubectl() { "$KUBECTL_BIN" --kubeconfig "$KUBECONFIG" "$@"; }
