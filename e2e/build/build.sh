#!/usr/bin/env bash
# Build the real control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, Kueue, KWOK, helm) and the workload controllers Kueue integrates
# with (JobSet, LeaderWorkerSet, Kubeflow Trainer, KubeRay, MPI operator) from their
# upstream Go modules, at the versions pinned in e2e/versions.env.
#
# Each component is cached on its own, in
#   ${NEXUS_CACHE:-~/.cache/nexus-admit}/bin/<component>-<version>-<recipe hash>/
# where the recipe hash covers that component's build function and pinned versions only:
# adding or bumping one controller rebuilds that controller and nothing else. The
# components are then gathered, as symlinks, into
#   bin/set-<hash of the component directories>/
# (binaries at its top, manifests/<component>/ beside them), which is what e2e/cluster.py
# runs from. A warm cache returns at once. Prints that directory on the last line of stdout.
#
# A controller whose version variable is empty or absent in versions.env is not built
# (and e2e/cluster.py then neither runs it nor enables its Kueue integration).
# NEXUS_E2E_BUILD_ONLY: see below.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
e2e="$(dirname "$here")"
# shellcheck disable=SC1091
source "$e2e/versions.env"
# NEXUS_E2E_KUBERNETES=oldest: the same plane on the oldest Kubernetes the README promises
# (a Kubernetes component and a set of their own; every other component is shared)
case "${NEXUS_E2E_KUBERNETES:-}" in
  "" | newest) ;;
  oldest)
    KUBERNETES_VERSION="$KUBERNETES_OLDEST_VERSION"
    KUBERNETES_STAGING_VERSION="$KUBERNETES_OLDEST_STAGING_VERSION" ;;
  *) echo "NEXUS_E2E_KUBERNETES must be newest or oldest, not ${NEXUS_E2E_KUBERNETES}" >&2; exit 2 ;;
esac
export GOTOOLCHAIN=local GOFLAGS=-mod=mod CGO_ENABLED=0

cache_root="${NEXUS_CACHE:-$HOME/.cache/nexus-admit}"
log() { printf '[build %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }
started=$SECONDS

module_dir() { # module@version -> its directory in the module cache (downloads it)
  go mod download -json "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])'
}

# go_build <work dir> <module> <version> <package> <output> [ldflags]: build a main package
# of an upstream module through a wrapper module that requires it, so that the upstream
# go.mod decides every dependency version (as `go install module/cmd@version` would).
go_build() {
  local mod="$1" module="$2" version="$3" package="$4" output="$5" ldflags="${6:-}"
  mkdir -p "$mod"
  printf 'module nexus-admit.local/e2e/%s\ngo 1.26.0\nrequire %s %s\n' \
    "$(basename "$mod")" "$module" "$version" > "$mod/go.mod"
  # Seed go.sum from the (checksum-verified) upstream module: some of its pinned
  # dependencies are not in the public checksum database (e.g. Kueue's scheduler-library).
  local updir
  updir="$(module_dir "$module@$version")"
  if [[ -f "$updir/go.sum" ]]; then
    cp "$updir/go.sum" "$mod/go.sum" && chmod u+w "$mod/go.sum"
  fi
  local t0=$SECONDS
  log "compiling $(basename "$output") ($module $version)"
  (cd "$mod" && go build -trimpath -ldflags "-s -w $ldflags" -o "$output.tmp" "$package") \
    || die "go build $package ($module $version)"
  mv "$output.tmp" "$output"
  log "done $(basename "$output") in $((SECONDS - t0))s ($(du -m "$output" | cut -f1) MiB)"
}

# copy_tree <src> <dst>: a manifest directory out of the read-only module cache
copy_tree() {
  mkdir -p "$(dirname "$2")"
  cp -r "$1" "$2"
  chmod -R u+w "$2"
}

# ------------------------------------------------------------------- component recipes
# recipe_<component> <out dir> <work dir>: put binaries in <out>, manifests in
# <out>/manifests/<component>/. Each recipe's text is part of its cache key.

recipe_etcd() {
  local out="$1" mod="$2/etcd"
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
  (cd "$mod" && go build -trimpath -ldflags "-s -w" -o "$out/etcd" .) || die etcd
}

# Kubernetes: a wrapper module with a replace line for every staging module
recipe_kubernetes() {
  local out="$1" mod="$2/kubernetes"
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
    [[ -x "$out/$cmd" ]] && continue # a build interrupted after this binary resumes here
    local t0=$SECONDS
    log "compiling $cmd $KUBERNETES_VERSION (cold builds take several minutes each)"
    (cd "$mod" && go build -trimpath -ldflags "$ld" -o "$out/$cmd.tmp" "k8s.io/kubernetes/cmd/$cmd") || die "$cmd"
    mv "$out/$cmd.tmp" "$out/$cmd"
    log "done $cmd in $((SECONDS - t0))s"
  done
}

recipe_kueue() {
  local out="$1"
  go_build "$2/kueue" sigs.k8s.io/kueue "$KUEUE_VERSION" sigs.k8s.io/kueue/cmd/kueue "$out/kueue" \
    "-X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION"
  local src
  src="$(module_dir "sigs.k8s.io/kueue@$KUEUE_VERSION")/config/components"
  copy_tree "$src/crd/bases" "$out/manifests/kueue/crd"
  copy_tree "$src/webhook" "$out/manifests/kueue/webhook"
  copy_tree "$src/rbac" "$out/manifests/kueue/rbac"
  # CRD patches that turn on Kueue's conversion webhook (applied by e2e/cluster.py)
  copy_tree "$src/crd/patches" "$out/manifests/kueue/crd-patches"
}

recipe_kwok() {
  local out="$1"
  go_build "$2/kwok" sigs.k8s.io/kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok "$out/kwok" \
    "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"
  copy_tree "$(module_dir "sigs.k8s.io/kwok@$KWOK_VERSION")/kustomize" "$out/manifests/kwok/kustomize"
}

recipe_helm() {
  # As helm's Makefile builds a release: without --kube-version, templates and the chart's
  # kubeVersion check see the Kubernetes of helm's client-go (v3.22.0: v0.37 → 1.37), not
  # the 1.20 placeholder a plain `go build` leaves (tests/charts/test_chart_defaults.py)
  local client_minor
  client_minor="$(sed -nE 's|^[[:space:]]*k8s\.io/client-go v0\.([0-9]+)\..*|\1|p' \
    "$(module_dir "helm.sh/helm/v3@$HELM_VERSION")/go.mod" | head -1)"
  [[ -n "$client_minor" ]] || die "helm $HELM_VERSION: no k8s.io/client-go in its go.mod"
  local ld="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" p
  for p in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    ld+=" -X $p.k8sVersionMajor=1 -X $p.k8sVersionMinor=$client_minor"
  done
  go_build "$2/helm" helm.sh/helm/v3 "$HELM_VERSION" helm.sh/helm/v3/cmd/helm "$1/helm" "$ld"
}

# NodeResourceTopology CRD (topology.node.k8s.io), shipped in its API module: no binary
recipe_nrt() {
  local src
  src="$(module_dir "github.com/k8stopologyawareschedwg/noderesourcetopology-api@$NRT_API_VERSION")"
  mkdir -p "$1/manifests/nrt"
  cp "$src/manifests/crd.yaml" "$1/manifests/nrt/crd.yaml"
}

# ProvisioningRequest CRD (autoscaling.x-k8s.io), shipped in cluster-autoscaler's API
# module at the version Kueue's go.mod pins: installed before Kueue starts, Kueue runs its
# provisioning admission check (it looks the kind up once, at start)
recipe_provreq() {
  local src
  src="$(module_dir "k8s.io/autoscaler/cluster-autoscaler/apis@$PROVISIONING_REQUEST_API_VERSION")"
  mkdir -p "$1/manifests/provreq"
  cp "$src/config/crd/autoscaling.x-k8s.io_provisioningrequests.yaml" "$1/manifests/provreq/crd.yaml"
}

recipe_jobset() {
  local out="$1"
  go_build "$2/jobset" sigs.k8s.io/jobset "$JOBSET_VERSION" sigs.k8s.io/jobset "$out/jobset-controller"
  local src
  src="$(module_dir "sigs.k8s.io/jobset@$JOBSET_VERSION")/config/components"
  copy_tree "$src/crd/bases" "$out/manifests/jobset/crd"
  copy_tree "$src/webhook" "$out/manifests/jobset/webhook"
}

recipe_lws() {
  local out="$1"
  go_build "$2/lws" sigs.k8s.io/lws "$LWS_VERSION" sigs.k8s.io/lws/cmd "$out/lws-controller"
  local src
  src="$(module_dir "sigs.k8s.io/lws@$LWS_VERSION")/config"
  copy_tree "$src/crd/bases" "$out/manifests/lws/crd"
  copy_tree "$src/webhook" "$out/manifests/lws/webhook"
}

recipe_trainer() {
  local out="$1" module=github.com/kubeflow/trainer/v2
  go_build "$2/trainer" "$module" "$TRAINER_VERSION" "$module/cmd/trainer-controller-manager" \
    "$out/trainer-controller-manager"
  local src
  src="$(module_dir "$module@$TRAINER_VERSION")/manifests/base"
  copy_tree "$src/crds" "$out/manifests/trainer/crd"
  copy_tree "$src/webhook" "$out/manifests/trainer/webhook"
  copy_tree "$src/runtimes" "$out/manifests/trainer/runtimes"
}

recipe_kuberay() {
  local out="$1" module=github.com/ray-project/kuberay/ray-operator
  go_build "$2/kuberay" "$module" "$KUBERAY_VERSION" "$module" "$out/kuberay-operator"
  copy_tree "$(module_dir "$module@$KUBERAY_VERSION")/config/crd/bases" "$out/manifests/kuberay/crd"
}

# The MPI operator fixes two things in package variables, with no flag
# (cmd/mpi-operator/app/server.go): its health server's port, :8080 on every interface, so
# two planes on one machine (a worktree's and CI's) could not both run it; and its leader
# election's timings (15-s lease, 5-s renew deadline, and it exits when a renewal fails),
# so an apiserver or etcd restart of a few seconds (e2e/tests/test_faults.py) killed it,
# where a cluster would restart its pod and the plane does not. Our main is upstream's
# cmd/mpi-operator/main.go with flags for those variables, set before app.Run
# (go:linkname); the controller itself is upstream's, unchanged.
recipe_mpi_operator() {
  local out="$1" mod="$2/mpi-operator" module=github.com/kubeflow/mpi-operator
  # the wrapper module go_build makes: upstream's go.mod decides every dependency version
  mkdir -p "$mod/main"
  printf 'module nexus-admit.local/e2e/mpi-operator\ngo 1.26.0\nrequire %s %s\n' \
    "$module" "$MPI_OPERATOR_VERSION" > "$mod/go.mod"
  cp "$(module_dir "$module@$MPI_OPERATOR_VERSION")/go.sum" "$mod/go.sum"
  chmod u+w "$mod/go.sum"
  cat > "$mod/main/main.go" <<'GO'
package main

import (
	"flag"
	"time"
	_ "unsafe" // go:linkname

	"github.com/kubeflow/mpi-operator/cmd/mpi-operator/app"
	"github.com/kubeflow/mpi-operator/cmd/mpi-operator/app/options"
	"k8s.io/klog/v2"
)

//go:linkname healthCheckPort github.com/kubeflow/mpi-operator/cmd/mpi-operator/app.healthCheckPort
var healthCheckPort int

//go:linkname leaseDuration github.com/kubeflow/mpi-operator/cmd/mpi-operator/app.leaseDuration
var leaseDuration time.Duration

//go:linkname renewDuration github.com/kubeflow/mpi-operator/cmd/mpi-operator/app.renewDuration
var renewDuration time.Duration

//go:linkname retryPeriod github.com/kubeflow/mpi-operator/cmd/mpi-operator/app.retryPeriod
var retryPeriod time.Duration

func main() {
	s := options.NewServerOption()
	s.AddFlags(flag.CommandLine)
	flag.IntVar(&healthCheckPort, "health-port", healthCheckPort, "port of the health server (/healthz)")
	flag.DurationVar(&leaseDuration, "leader-elect-lease-duration", leaseDuration, "leader election lease")
	flag.DurationVar(&renewDuration, "leader-elect-renew-deadline", renewDuration, "how long the leader retries renewing before it gives up (and exits)")
	flag.DurationVar(&retryPeriod, "leader-elect-retry-period", retryPeriod, "wait between tries")
	flag.Parse()
	if s.MonitoringPort != 0 {
		klog.Fatalf("--monitoring-port is not served by this build; leave it 0")
	}
	if err := app.Run(s); err != nil {
		klog.Fatalf("%v\n", err)
	}
}
GO
  log "compiling mpi-operator with --health-port and the leader election's timings"
  (cd "$mod" && go build -trimpath \
    -ldflags "-s -w -X $module/pkg/version.Version=$MPI_OPERATOR_VERSION" \
    -o "$out/mpi-operator.tmp" ./main) || die "mpi-operator (our main)"
  mv "$out/mpi-operator.tmp" "$out/mpi-operator"
  mkdir -p "$out/manifests/mpi-operator/crd"
  cp "$(module_dir "$module@$MPI_OPERATOR_VERSION")/manifests/base/kubeflow.org_mpijobs.yaml" \
    "$out/manifests/mpi-operator/crd/"
}

# ------------------------------------------------------------------- the cache
# component name, recipe function, the versions.env variables it depends on
components=(
  "etcd recipe_etcd ETCD_VERSION"
  "kubernetes recipe_kubernetes KUBERNETES_VERSION KUBERNETES_STAGING_VERSION"
  "kueue recipe_kueue KUEUE_VERSION"
  "kwok recipe_kwok KWOK_VERSION"
  "helm recipe_helm HELM_VERSION"
  "nrt recipe_nrt NRT_API_VERSION"
  "provreq recipe_provreq PROVISIONING_REQUEST_API_VERSION"
  "jobset recipe_jobset JOBSET_VERSION"
  "lws recipe_lws LWS_VERSION"
  "trainer recipe_trainer TRAINER_VERSION"
  "kuberay recipe_kuberay KUBERAY_VERSION"
  "mpi-operator recipe_mpi_operator MPI_OPERATOR_VERSION"
)
shared_helpers="$(declare -f module_dir go_build copy_tree)"

# component_dir <name> <recipe> <vars...>: the cache directory of one component
component_dir() {
  local name="$1" recipe="$2" inputs=""
  shift 2
  local v
  for v in "$@"; do inputs+="$v=${!v}"$'\n'; done
  local hash
  hash="$(printf '%s\n%s\n%s\n' "$inputs" "$(declare -f "$recipe")" "$shared_helpers" \
    | sha256sum | cut -c1-12)"
  echo "$cache_root/bin/$name-${!1}-$hash"
}

# ensure_component <dir> <name> <recipe>: build it unless cached. Builds into <dir>.partial
# under a lock, so two runs never build the same component at once and an interrupted build
# of Kubernetes keeps the binaries it finished.
ensure_component() {
  local dir="$1" name="$2" recipe="$3"
  [[ -f "$dir/.complete" ]] && return
  mkdir -p "$cache_root/bin" "$cache_root/work" "$cache_root/locks"
  local lock_fd
  exec {lock_fd}>"$cache_root/locks/$(basename "$dir")"
  flock "$lock_fd"
  if [[ ! -f "$dir/.complete" ]]; then
    local part="$dir.partial" t0=$SECONDS
    mkdir -p "$part"
    "$recipe" "$part" "$cache_root/work/$(basename "$dir")"
    printf '%s\n' "$((SECONDS - t0))" > "$part/.build-seconds"
    touch "$part/.complete"
    rm -rf "$dir"
    mv "$part" "$dir"
    log "$name ready in $((SECONDS - t0))s: $dir"
  fi
  exec {lock_fd}>&-
}

dirs=()
for entry in "${components[@]}"; do
  read -r name recipe first_var _ <<< "$entry"
  [[ -n "${!first_var:-}" ]] || continue # not pinned: not built, not installed
  read -r -a vars <<< "${entry#* * }"
  dirs+=("$name:$(component_dir "$name" "$recipe" "${vars[@]}")")
done

# NEXUS_E2E_BUILD_ONLY="jobset lws": build (or find) only these components, print their
# directories and stop (a CI step can prebuild some while others build elsewhere)
if [[ -n "${NEXUS_E2E_BUILD_ONLY:-}" ]]; then
  for entry in "${components[@]}"; do
    read -r name recipe _ <<< "$entry"
    [[ " $NEXUS_E2E_BUILD_ONLY " == *" $name "* ]] || continue
    for d in "${dirs[@]}"; do
      [[ "${d%%:*}" == "$name" ]] && ensure_component "${d#*:}" "$name" "$recipe" && echo "${d#*:}"
    done
  done
  exit 0
fi

set_dir="$cache_root/bin/set-$(printf '%s\n' "${dirs[@]}" | sha256sum | cut -c1-16)"
if [[ -f "$set_dir/.complete" ]]; then
  echo "$set_dir"
  exit 0
fi

for entry in "${components[@]}"; do
  read -r name recipe first_var _ <<< "$entry"
  [[ -n "${!first_var:-}" ]] || continue
  for d in "${dirs[@]}"; do
    [[ "${d%%:*}" == "$name" ]] && ensure_component "${d#*:}" "$name" "$recipe"
  done
done

# the set: one directory of symlinks, the layout e2e/cluster.py and NEXUS_E2E_BIN expect
tmp="$set_dir.tmp.$$"
rm -rf "$tmp" && mkdir -p "$tmp/manifests"
for d in "${dirs[@]}"; do
  src="${d#*:}"
  for f in "$src"/*; do
    [[ -f "$f" && -x "$f" ]] && ln -s "$f" "$tmp/$(basename "$f")"
  done
  if [[ -d "$src/manifests" ]]; then
    for m in "$src"/manifests/*; do ln -s "$m" "$tmp/manifests/$(basename "$m")"; done
  fi
done
cp "$e2e/versions.env" "$tmp/versions.env"
printf '%s\n' "${dirs[@]#*:}" > "$tmp/components"
touch "$tmp/.complete"
# put in place under the set's lock: `make test`'s background and foreground runs finish
# their last component together, and one's rm of the set raced the other's mv into it
exec {set_lock}>"$cache_root/locks/$(basename "$set_dir")"
flock "$set_lock"
if [[ -f "$set_dir/.complete" ]]; then
  rm -rf "$tmp" # a concurrent run made the same set
else
  rm -rf "$set_dir"
  mv "$tmp" "$set_dir"
fi
exec {set_lock}>&-
log "control plane ready in $((SECONDS - started))s: $set_dir"
echo "$set_dir"
