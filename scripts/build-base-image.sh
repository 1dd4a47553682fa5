#!/usr/bin/env bash
# Build an air-gapped base image for lfbench from Debian packages (no image registry needed).
#
#   scripts/build-base-image.sh [--force] [NAME]      (default NAME: lfbench-base:bookworm)
#
# It runs `debootstrap --variant=minbase` for Debian bookworm with python3 (3.11), python3-venv,
# python3-pip and ca-certificates into a scratch folder, then imports that tree as an image
# (`tar -C DIR -c . | docker import - NAME`). Python is /usr/bin/python3 (there is no `python`);
# the Dockerfile creates its own venv, so it builds on this base as on the official python image:
#
#   scripts/build-base-image.sh
#   then in params.yaml: image_base: lfbench-base:bookworm  (and `dvc repro`)
#
# Idempotent: if NAME already exists it does nothing (pass --force to rebuild). Needs root (for
# debootstrap), a Docker engine, and a Debian mirror (DEBIAN_MIRROR, default deb.debian.org).
set -euo pipefail

force=0
name=""
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) name="$arg" ;;
  esac
done
name="${name:-lfbench-base:bookworm}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

if [ "$force" = 0 ] && docker image inspect "$name" >/dev/null 2>&1; then
  echo "base image $name exists ($(docker image inspect -f '{{.Id}}' "$name")); --force rebuilds"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "error: debootstrap is not installed" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "error: debootstrap needs root" >&2; exit 1; }

dir="$(mktemp -d "${TMPDIR:-/tmp}/lfbench-base.XXXXXX")"
trap 'rm -rf "$dir"' EXIT
start=$(date +%s)
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
  bookworm "$dir" "$mirror" >"$dir.log" 2>&1 || { tail -n 30 "$dir.log" >&2; rm -f "$dir.log"; exit 1; }
rm -f "$dir.log"
# Keep the image small: no package lists, no apt cache; no manuals, info pages, translations or
# documentation but the copyright notices (as Debian's own slim images do, with dpkg told to
# leave them out of any package installed later): 52 MB of the 191 the base was.
rm -rf "$dir"/var/lib/apt/lists/* "$dir"/var/cache/apt/*.bin "$dir"/var/cache/apt/archives/*.deb
cat >"$dir"/etc/dpkg/dpkg.cfg.d/lfbench-slim <<'CFG'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
CFG
find "$dir"/usr/share/doc -mindepth 1 -not -name copyright -not -type d -delete
find "$dir"/usr/share/doc -mindepth 1 -type d -empty -delete
rm -rf "$dir"/usr/share/man/* "$dir"/usr/share/info/*
find "$dir"/usr/share/locale -mindepth 1 -maxdepth 1 -not -name locale.alias -exec rm -rf {} +
tar -C "$dir" -c . | docker import \
  -c 'ENV LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  -c 'CMD ["/bin/bash"]' - "$name" >/dev/null
echo "base image $name built in $(( $(date +%s) - start )) s: $(docker image inspect -f '{{.Id}}' "$name")"
