#!/usr/bin/env bash
# Helm for the chart in helm/kafka-delay-sidecar: built from source with the Go module proxy
# (`go install`, ~3-4 minutes on 2 cores the first time) into $KDS_CACHE/bin, skipped when the
# pinned version is already there. Then lints and renders the chart with its default values and
# every ci/*.yaml values file; any failure fails the setup.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
export KDS_CACHE=${KDS_CACHE:-$HOME/.cache/kafka-delay-sidecar}
HELM_VERSION=${HELM_VERSION:-v3.19.0}
# What the official release build stamps in (helm's Makefile): the version, and the Kubernetes
# version `helm lint` / `helm template` assume without a cluster (client-go v0.34 -> 1.34).
# Without these a `go install` build believes it talks to Kubernetes 1.20.
K8S_MAJOR=1
K8S_MINOR=34
bin="$KDS_CACHE/bin"
helm="$bin/helm"
chart="$root/helm/kafka-delay-sidecar"

have=$("$helm" version --template '{{.Version}}' 2>/dev/null || true)
if [ "$have" != "$HELM_VERSION" ]; then
  go=$(command -v go || echo /usr/local/go/bin/go)
  [ -x "$go" ] || { echo "setup(helm): Go is required to build helm (go not found)" >&2; exit 1; }
  mkdir -p "$bin"
  echo "setup(helm): building helm $HELM_VERSION into $bin (first time: several minutes)" >&2
  pkg=helm.sh/helm/v3
  ldflags="-s -w -X $pkg/internal/version.version=$HELM_VERSION"
  ldflags+=" -X $pkg/internal/version.gitTreeState=clean"
  ldflags+=" -X $pkg/pkg/lint/rules.k8sVersionMajor=$K8S_MAJOR -X $pkg/pkg/lint/rules.k8sVersionMinor=$K8S_MINOR"
  ldflags+=" -X $pkg/pkg/chartutil.k8sVersionMajor=$K8S_MAJOR -X $pkg/pkg/chartutil.k8sVersionMinor=$K8S_MINOR"
  # GOPATH, GOMODCACHE and GOCACHE stay Go's defaults (outside the repo).
  CGO_ENABLED=0 GOBIN="$bin" "$go" install -ldflags "$ldflags" "$pkg/cmd/helm@$HELM_VERSION"
  have=$("$helm" version --template '{{.Version}}')
  [ "$have" = "$HELM_VERSION" ] || { echo "setup(helm): built helm reports $have, wanted $HELM_VERSION" >&2; exit 1; }
fi

# Lint and render: defaults, then every CI values file.
cd "$root"
fail=0
for values in "" "$chart"/ci/*.yaml; do
  args=()
  label=defaults
  if [ -n "$values" ]; then
    args=(--values "$values")
    label=${values#"$root/"}
  fi
  if ! out=$("$helm" lint --strict "$chart" "${args[@]}" 2>&1); then
    echo "setup(helm): helm lint --strict failed ($label):" >&2
    echo "$out" >&2
    fail=1
  fi
  if ! out=$("$helm" template kds "$chart" "${args[@]}" 2>&1 >/dev/null); then
    echo "setup(helm): helm template failed ($label):" >&2
    echo "$out" >&2
    fail=1
  fi
done
[ "$fail" = 0 ] || exit 1
echo "setup(helm): $HELM_VERSION; chart lints and renders (defaults + $(ls "$chart"/ci/*.yaml | wc -l) ci values files)" >&2
