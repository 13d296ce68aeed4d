#!/usr/bin/env bash
# A Python 3.11 base image built on this machine, for building the Dockerfile where the
# public base (python:3.11-slim) cannot be pulled: a Debian bookworm rootfs made with
# `debootstrap --variant=minbase` plus python3.11 and a virtual environment at /opt/python
# whose bin/ comes first on PATH, so `python` and `pip` behave as in the slim image (pip
# installs into a writable site-packages, which Debian's own python refuses: PEP 668).
#
# The packages come from the Debian mirror this machine's apt is configured with (read
# from apt at run time, never written down here). The rootfs is cached as a tarball in
#   ${NEXUS_CACHE:-~/.cache/nexus-admit}/image/base-<hash>.tar
# where the hash covers this script (suite, packages, steps); the image is committed into
# buildah's storage as localhost/nexus-admit-base:<hash>. Warm, it returns at once.
# Needs root, debootstrap and buildah. Prints the image name on the last line of stdout.
set -euo pipefail
SUITE=bookworm
# debootstrap does not resolve virtual packages: python3.11-venv needs python3.11-distutils,
# which python3-distutils provides
PACKAGES=python3.11,python3.11-venv,python3-distutils

cache="${NEXUS_CACHE:-$HOME/.cache/nexus-admit}/image"
log() { printf '[local-base %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }

hash="$(sha256sum "${BASH_SOURCE[0]}" | cut -c1-12)"
image="localhost/nexus-admit-base:$hash"
tarball="$cache/base-$hash.tar"

if buildah inspect --type image "$image" >/dev/null 2>&1; then
  echo "$image"
  exit 0
fi
command -v buildah >/dev/null || die "buildah is not installed (apt-get install buildah)"

if [[ ! -f "$tarball" ]]; then
  command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install debootstrap)"
  [[ $(id -u) == 0 ]] || die "debootstrap needs root"
  # the main component of $SUITE from apt's own sources (sources.list or deb822 .sources)
  mirror="$(apt-get indextargets --format '$(REPO_URI)' 'Identifier: Packages' \
    'Label: Debian' "Codename: $SUITE" 'Component: main' | head -n1)"
  [[ -n $mirror ]] || die "apt has no source for Debian $SUITE main (run apt-get update?)"
  started=$SECONDS
  mkdir -p "$cache"
  rootfs="$(mktemp -d "$cache/rootfs.XXXXXX")"
  trap 'rm -rf "$rootfs"' EXIT
  log "debootstrap $SUITE (minbase, $PACKAGES) from $mirror"
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" "$mirror" >&2 \
    || die "debootstrap (its log: $rootfs/debootstrap/debootstrap.log)"
  chroot "$rootfs" /usr/bin/python3.11 -m venv /opt/python
  # what Debian's slim images leave out too: package caches and indexes, manuals,
  # translations, docs (but each package's copyright file)
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
    "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
    "$rootfs"/var/log/*.log "$rootfs"/var/cache/debconf/*-old
  find "$rootfs/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
  find "$rootfs/usr/share/doc" -type f ! -name copyright -delete
  find "$rootfs/usr/share/doc" -mindepth 1 -type d -empty -delete
  tar --numeric-owner --xattrs -C "$rootfs" -cf "$tarball.tmp" .
  mv "$tarball.tmp" "$tarball"
  rm -rf "$rootfs"
  trap - EXIT
  log "rootfs in $((SECONDS - started))s: $(du -m "$tarball" | cut -f1) MiB"
fi

ctr="$(buildah from scratch)"
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
buildah add --quiet "$ctr" "$tarball" / >/dev/null
buildah config --env PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --env LANG=C.UTF-8 --cmd python3 "$ctr"
buildah commit --quiet --rm "$ctr" "$image" >/dev/null
trap - EXIT
log "imported as $image"
echo "$image"
