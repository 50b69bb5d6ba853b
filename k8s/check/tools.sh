# The pinned tools of `make k8s-check` and `make alerts-check`, installed once under
# ~/.cache/likes/tools from the package registries (sourced by k8s-check.sh):
#   kustomize (Go module proxy), kubernetes-validate and checkov (PyPI, in a venv),
#   @kubernetes-models/strimzi-kafka-operator (npm). promtool is Debian's (package
#   prometheus; stack/prereqs.sh deploy).
KUSTOMIZE_VERSION=v5.7.1
KVALIDATE_VERSION=1.37.0
CHECKOV_VERSION=3.3.30
STRIMZI_MODELS_VERSION=1.0.1
tools=${LIKES_CACHE:-$HOME/.cache/likes}/tools
KUSTOMIZE=$tools/bin/kustomize
PY=$tools/venv/bin/python
KVALIDATE=$tools/venv/bin/kubernetes-validate
CHECKOV=$tools/venv/bin/checkov
NPM_TOOLS=$tools/npm
mkdir -p "$tools"
if ! "$KUSTOMIZE" version 2>/dev/null | grep -q "$KUSTOMIZE_VERSION"; then
  # kustomize's go.mod needs Go 1.22.7 or newer; Debian 12's golang-go is 1.19.
  gov=$(go env GOVERSION 2>/dev/null | sed 's/^go//')
  IFS=. read -r gomaj gomin _ <<<"${gov:-0.0}"
  if ((gomaj < 1 || (gomaj == 1 && gomin < 22))); then
    echo "tools: kustomize $KUSTOMIZE_VERSION needs Go >= 1.22.7 to install; this machine has '${gov:-none}'." >&2
    echo "tools: install Go from bookworm-backports (apt-get install -t bookworm-backports golang-go)," >&2
    echo "tools: or put a kustomize $KUSTOMIZE_VERSION binary at $KUSTOMIZE" >&2
    exit 1
  fi
  echo "tools: installing kustomize $KUSTOMIZE_VERSION (go install)"
  GOBIN=$tools/bin GOFLAGS=-mod=mod go install "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION"
fi
if ! "$PY" -m pip show checkov 2>/dev/null | grep -q "^Version: $CHECKOV_VERSION$" ||
  ! "$PY" -m pip show kubernetes-validate 2>/dev/null | grep -q "^Version: $KVALIDATE_VERSION$"; then
  echo "tools: installing checkov $CHECKOV_VERSION and kubernetes-validate $KVALIDATE_VERSION (pip, venv)"
  python3 -m venv "$tools/venv"
  "$tools/venv/bin/pip" install --quiet --disable-pip-version-check \
    "checkov==$CHECKOV_VERSION" "kubernetes-validate==$KVALIDATE_VERSION"
fi
if [[ ! -f "$NPM_TOOLS/node_modules/@kubernetes-models/strimzi-kafka-operator/package.json" ]] ||
  ! grep -q "\"version\": \"$STRIMZI_MODELS_VERSION\"" \
    "$NPM_TOOLS/node_modules/@kubernetes-models/strimzi-kafka-operator/package.json"; then
  echo "tools: installing @kubernetes-models/strimzi-kafka-operator $STRIMZI_MODELS_VERSION (npm)"
  npm install --silent --no-audit --no-fund --prefix "$NPM_TOOLS" \
    "@kubernetes-models/strimzi-kafka-operator@$STRIMZI_MODELS_VERSION"
fi
