#!/usr/bin/env bash
# `make image`: build the repository's Dockerfile with buildah (daemonless; Debian package
# `buildah`) and tag it nexus-admit:<version>, the version being the package's own
# (nexus_admit/__init__.py). Prints the image name on the last line of stdout.
#
# `image.sh --print-tag` prints the tag and stops (tests/test_versions.py).
#
# Environment:
#   IMAGE_BASE   the Dockerfile's PYTHON_IMAGE build argument. Default python:3.11-slim.
#                `local`: a Debian bookworm base built on this machine with debootstrap
#                (e2e/build/local-base.sh), for where no registry can be pulled from.
#   IMAGE_NAME   repository part of the tag. Default nexus-admit.
#   PYTHON       the python whose pip configuration the build uses. Default python3.
#
# pip in the build stage sees this machine's pip configuration (`pip config list`: index
# URLs, trusted hosts, timeouts, the CA bundle), handed over as the Dockerfile's secrets
# `pip.conf` and `pip-cert`: mounted for that one RUN step, never stored in a layer. pip's
# download cache is the stage's cache mount, which buildah keeps under $TMPDIR, here
#   ${NEXUS_CACHE:-~/.cache/nexus-admit}/image/tmp/buildah-cache/
# so a rebuild after a code change downloads nothing where the index sends cache headers
# (pip's HTTP cache stores nothing without them). The base image (IMAGE_BASE=local) is
# cached as described in local-base.sh. An image under the same tag built from the same
# inputs is reused; the one a new build replaces is removed once nothing else names it.
# Storage: buildah's defaults (overlay, as root in /var/lib/containers/storage); set
# driver = "vfs" in /etc/containers/storage.conf where overlay cannot mount.
# Isolation: chroot (no OCI runtime, none of its rlimit or namespace needs).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache="${NEXUS_CACHE:-$HOME/.cache/nexus-admit}/image"
log() { printf '[image %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }

version="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$repo/nexus_admit/__init__.py")"
[[ -n $version ]] || die "no __version__ in nexus_admit/__init__.py"
tag="${IMAGE_NAME:-nexus-admit}:$version"
if [[ ${1:-} == --print-tag ]]; then
  echo "$tag"
  exit 0
fi
command -v buildah >/dev/null || die "buildah is not installed (apt-get install buildah)"
base="${IMAGE_BASE:-python:3.11-slim}"
if [[ $base == local ]]; then
  base="$(bash "$here/local-base.sh" | tail -n1)"
fi

# what the image is made of; an image under the same tag built from the same inputs is reused
inputs="$(
  cd "$repo"
  {
    cat Dockerfile .dockerignore pyproject.toml README.md
    find nexus_admit -type f ! -path '*/__pycache__/*' | LC_ALL=C sort | xargs sha256sum
    buildah inspect --type image --format '{{.FromImageID}}' "$base" 2>/dev/null || echo "$base"
  } | sha256sum | cut -c1-16
)"
label=io.kubenexus.nexus-admit.build-inputs
if [[ $(buildah inspect --type image --format "{{index .OCIv1.Config.Labels \"$label\"}}" \
  "$tag" 2>/dev/null) == "$inputs" ]]; then
  log "$tag is up to date (inputs $inputs)"
  echo "$tag"
  exit 0
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$cache/tmp"
# this machine's pip settings that decide where packages come from and how they are fetched
"${PYTHON:-python3}" -m pip config list 2>/dev/null | "${PYTHON:-python3}" -c '
import ast, os, sys
keys = {"index-url", "extra-index-url", "trusted-host", "cert", "proxy", "timeout",
        "default-timeout", "retries"}
conf = {}
for line in sys.stdin:
    name, _, value = line.strip().partition("=")
    key = name.rpartition(".")[2]
    if key in keys and value:
        conf[key] = ast.literal_eval(value)
cert = conf.pop("cert", "")
if os.path.isfile(cert):
    conf["cert"] = "/run/secrets/pip-cert"
    print(cert)
with open(sys.argv[1], "w") as f:
    f.write("[global]\n" + "".join(f"{k} = {v}\n" for k, v in sorted(conf.items())))
' "$work/pip.conf" > "$work/cert"
secrets=(--secret "id=pip.conf,src=$work/pip.conf")
if [[ -s "$work/cert" ]]; then
  secrets+=(--secret "id=pip-cert,src=$(cat "$work/cert")")
fi

replaced="$(buildah images --quiet --no-trunc "$tag" 2>/dev/null || true)"
started=$SECONDS
log "building $tag from $base"
TMPDIR="$cache/tmp" buildah bud --isolation chroot ${IMAGE_BUILD_FLAGS:---quiet} \
  --build-arg "PYTHON_IMAGE=$base" "${secrets[@]}" \
  --label "$label=$inputs" --label "org.opencontainers.image.version=$version" \
  --file "$repo/Dockerfile" --tag "$tag" "$repo" >&2 || die "buildah bud"
log "built $tag in $((SECONDS - started))s"
built="$(buildah images --quiet --no-trunc "$tag")"
if [[ -n $replaced && $replaced != "$built" ]]; then
  buildah rmi "$replaced" >/dev/null 2>&1 || true  # still named by another tag: kept
fi
echo "$tag"
