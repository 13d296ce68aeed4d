#!/usr/bin/env bash
# Build the real control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, Kueue, KWOK, helm) from their upstream Go modules.
#
# Binaries land in ${NEXUS_CACHE:-~/.cache/nexus-admit}/bin/<key>/ where <key> hashes
# versions.env and this script: a warm cache returns at once, a cold one compiles.
# Prints the binary directory on the last line of stdout.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
e2e="$(dirname "$here")"
# shellcheck disable=SC1091
source "$e2e/versions.env"
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

cache_root="${NEXUS_CACHE:-$HOME/.cache/nexus-admit}"
key="$(cat "$e2e/versions.env" "$here/build.sh" | sha256sum | cut -c1-16)"
bin="$cache_root/bin/$key"
work="$cache_root/work/$key"
if [[ -f "$bin/.complete" ]]; then
  echo "$bin"
  exit 0
fi
mkdir -p "$bin" "$work"
log() { printf '[build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
started=$SECONDS

built() { [[ -x "$bin/$1" ]]; }
die() { log "FAILED to build $1"; exit 1; }

# --- Kubernetes: wrapper module with a replace line for every staging module ------
build_kubernetes() {
  local mod="$work/kubernetes"
  mkdir -p "$mod"
  local upstream_mod
  upstream_mod="$(go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')"
  {
    echo "module nexus-admit.local/e2e/kubernetes"
    echo "go 1.26.0"
    echo "require k8s.io/kubernetes $KUBERNETES_VERSION"
    # k8s.io/kubernetes replaces each staging module with ./staging/...; a dependent
    # module must point them at the published versions instead.
    grep -oE '^\s*k8s\.io/[a-z0-9-]+ => \./staging/src/k8s\.io/[a-z0-9-]+' "$upstream_mod" \
      | awk -v v="$KUBERNETES_STAGING_VERSION" '{print "replace " $1 " => " $1 " " v}'
  } > "$mod/go.mod"
  cat > "$mod/tools.go" <<'GO'
//go:build tools

package tools
GO
  local pkg="k8s.io/component-base/version" cgo="k8s.io/client-go/pkg/version"
  local major minor
  major="$(echo "${KUBERNETES_VERSION#v}" | cut -d. -f1)"
  minor="$(echo "${KUBERNETES_VERSION#v}" | cut -d. -f2)"
  local ld="-s -w"
  for p in "$pkg" "$cgo"; do
    ld+=" -X $p.gitVersion=$KUBERNETES_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor"
    ld+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z -X $p.gitCommit=0000000000000000000000000000000000000000"
  done
  for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    built "$cmd" && continue
    log "compiling $cmd $KUBERNETES_VERSION (cold builds take several minutes each)"
    (cd "$mod" && go build -trimpath -ldflags "$ld" -o "$bin/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd") || die "$cmd"
    mv "$bin/$cmd.tmp" "$bin/$cmd"
    log "done $cmd after $((SECONDS - started))s"
  done
}

# --- etcd: wrapper main around etcdmain -------------------------------------------
build_etcd() {
  built etcd && return
  local mod="$work/etcd"
  mkdir -p "$mod"
  printf 'module nexus-admit.local/e2e/etcd\ngo 1.26.0\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" > "$mod/go.mod"
  cat > "$mod/main.go" <<'GO'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
GO
  log "compiling etcd $ETCD_VERSION"
  (cd "$mod" && go build -trimpath -ldflags "-s -w" -o "$bin/etcd.tmp" .) || die etcd
  mv "$bin/etcd.tmp" "$bin/etcd"
  log "done etcd after $((SECONDS - started))s"
}

# --- plain `go build module/cmd@version` style builds via a wrapper module -----------
build_from_module() { # name module version package
  local name="$1" module="$2" version="$3" package="$4"
  built "$name" && return
  local mod="$work/$name"
  mkdir -p "$mod"
  printf 'module nexus-admit.local/e2e/%s\ngo 1.26.0\nrequire %s %s\n' "$name" "$module" "$version" > "$mod/go.mod"
  # Seed go.sum from the (checksum-verified) upstream module: some of its pinned
  # dependencies are not in the public checksum database (e.g. Kueue's scheduler-library).
  local updir
  updir="$(go mod download -json "$module@$version" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  [[ -f "$updir/go.sum" ]] && cp "$updir/go.sum" "$mod/go.sum" && chmod u+w "$mod/go.sum"
  log "compiling $name $version"
  (cd "$mod" && go build -trimpath -ldflags "-s -w $5" -o "$bin/$name.tmp" "$package") || die "$name"
  mv "$bin/$name.tmp" "$bin/$name"
  log "done $name after $((SECONDS - started))s"
}

# --- manifests shipped inside the Go modules (CRDs, webhooks, stages) ----------------
copy_manifests() {
  local kueue_dir kwok_dir
  kueue_dir="$(go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  kwok_dir="$(go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  rm -rf "$bin/manifests" && mkdir -p "$bin/manifests/kueue" "$bin/manifests/kwok"
  cp -r "$kueue_dir/config/components/crd/bases" "$bin/manifests/kueue/crd"
  cp -r "$kueue_dir/config/components/webhook" "$bin/manifests/kueue/webhook"
  cp -r "$kueue_dir/config/components/rbac" "$bin/manifests/kueue/rbac" 2>/dev/null || true
  cp -r "$kwok_dir/kustomize" "$bin/manifests/kwok/kustomize"
  # CRD patches that turn on Kueue's conversion webhook (applied by e2e/cluster.py).
  cp -r "$kueue_dir/config/components/crd/patches" "$bin/manifests/kueue/crd-patches"
  # NodeResourceTopology CRD (topology.node.k8s.io) shipped in its API module.
  local nrt_dir
  nrt_dir="$(go mod download -json "github.com/k8stopologyawareschedwg/noderesourcetopology-api@$NRT_API_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')"
  mkdir -p "$bin/manifests/nrt"
  cp "$nrt_dir/manifests/crd.yaml" "$bin/manifests/nrt/crd.yaml"
  chmod -R u+w "$bin/manifests"
}

build_etcd
build_kubernetes
build_from_module kueue sigs.k8s.io/kueue "$KUEUE_VERSION" sigs.k8s.io/kueue/cmd/kueue "-X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION"
build_from_module kwok sigs.k8s.io/kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"
build_from_module helm helm.sh/helm/v3 "$HELM_VERSION" helm.sh/helm/v3/cmd/helm "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
copy_manifests
cp "$e2e/versions.env" "$bin/versions.env"
touch "$bin/.complete"
log "control plane built in $((SECONDS - started))s into $bin"
echo "$bin"
