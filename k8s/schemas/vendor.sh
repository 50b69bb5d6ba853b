#!/usr/bin/env bash
# Re-derives the vendored CRD schemas of this folder from the operators' own CRD manifests,
# as their Go modules publish them on the Go module proxy (a package registry; pinned here).
# `make k8s-check` validates the prod overlay's custom resources against these files.
#   k8s/schemas/vendor.sh   (needs go; writes <kind>-<version>.json)
set -euo pipefail
cd "$(dirname "$0")"
export GOPATH=${GOPATH:-$HOME/.cache/likes/tools/gopath} GOFLAGS=-mod=mod
# scylla-operator's go.mod is not in the checksum database: the proxy's zip is taken as is.
export GONOSUMDB=github.com/scylladb/scylla-operator
fetch() { go mod download -json "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])'; }
extract() { # CRD yaml, version name, output
  "${PY:-${LIKES_CACHE:-$HOME/.cache/likes}/tools/venv/bin/python}" - "$@" <<'PY'
import json, sys, yaml
crd = yaml.safe_load(open(sys.argv[1]))
v = next(v for v in crd["spec"]["versions"] if v["name"] == sys.argv[2])
schema = v["schema"]["openAPIV3Schema"]
schema["$comment"] = f"openAPIV3Schema of {crd['metadata']['name']} {sys.argv[2]}, from {sys.argv[4]}"
json.dump(schema, open(sys.argv[3], "w"), indent=1, sort_keys=True)
PY
}
po=$(fetch github.com/prometheus-operator/prometheus-operator@v0.80.1)
extract "$po/example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml" v1 \
  prometheusrule-v1.json "github.com/prometheus-operator/prometheus-operator@v0.80.1"
extract "$po/example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml" v1 \
  podmonitor-v1.json "github.com/prometheus-operator/prometheus-operator@v0.80.1"
so=$(fetch github.com/scylladb/scylla-operator@v1.15.0)
extract "$so/pkg/api/scylla/v1/scylla.scylladb.com_scyllaclusters.yaml" v1 \
  scyllacluster-v1.json "github.com/scylladb/scylla-operator@v1.15.0"
ls -l ./*.json
