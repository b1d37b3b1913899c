#!/usr/bin/env bash
# Make a base image for the execgate daemon without a registry: a minimal Debian
# (debootstrap, from the Debian mirror) with Python 3, venv and bubblewrap, imported
# into the local docker daemon. Needs root and the debootstrap package.
#
#   sudo docker/make-base-image.sh [TAG] [SUITE] [MIRROR]
#   (defaults: execgate-base:bookworm, bookworm, http://deb.debian.org/debian)
#
# The wheels the Dockerfile installs must match this Python (bookworm: 3.11).
set -euo pipefail
TAG=${1:-execgate-base:bookworm}
SUITE=${2:-bookworm}
MIRROR=${3:-http://deb.debian.org/debian}
# Bump the number when what goes into the image changes (tests rebuild an older one).
RECIPE=debootstrap-$SUITE-1
command -v debootstrap >/dev/null || { echo "needs debootstrap (apt-get install debootstrap)" >&2; exit 1; }
root=$(mktemp -d /tmp/execgate-rootfs.XXXXXX)
trap 'rm -rf "$root"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,bubblewrap "$SUITE" "$root" "$MIRROR"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
tar -C "$root" -c . | docker import --change 'CMD ["/bin/bash"]' \
    --change "LABEL execgate.base-recipe=$RECIPE" - "$TAG"
echo "made $TAG"
