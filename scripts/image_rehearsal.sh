#!/usr/bin/env bash
# Image rehearsal without Docker (issue 27, item 3): builds the root filesystem the Dockerfile describes
# (devkit/image_dockerfile.py reads and runs the Dockerfile's own instructions, multi-stage, in a
# debootstrapped python:3.11-slim-bookworm equivalent), starts the service from it as the image's
# non-root user (chroot in a private mount namespace) against a noida-db broker and a local EMS
# endpoint, in four modes: as `docker run` would, as deploy/kubernetes would (read-only root, empty /tmp),
# as an arbitrary uid in group 0 (`docker run --user N:0`) and as OpenShift would (that uid, read-only
# root); `--modes` picks some (devkit/image_build.py). It checks /healthz, /readyz, the image's HEALTHCHECK, delivery, scratch writes, commits and exit 0
# on SIGTERM. Prints the image size. Exits non-zero on any failure.
#
#   sudo scripts/image_rehearsal.sh                 # build + check; outputs in /work/image-build
#   sudo scripts/image_rehearsal.sh --skip-build    # check the last build again
#   sudo scripts/image_rehearsal.sh --git-ref HEAD  # build from the commit, not the working tree
#   sudo scripts/image_rehearsal.sh --builder buildah   # same checks on a `buildah bud` image (apt-get install buildah)
#   IMAGE_BUILD_DIR=/somewhere scripts/image_rehearsal.sh --modes docker
#
# Needs root, debootstrap (apt-get install debootstrap), util-linux (unshare, nsenter), network access
# to deb.debian.org and PyPI, and the dev virtualenv (.venv). Cold ~7 min (debootstrap ~2 min, cached after), warm ~3 min.
# Not part of pytest: too slow for CI's unit run.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v debootstrap >/dev/null || { echo "debootstrap is missing: apt-get install -y debootstrap" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "run as root (debootstrap, chroot, mount namespaces)" >&2; exit 2; }
start=$(date +%s)
status=0
.venv/bin/python -m devkit.image_build --out "${IMAGE_BUILD_DIR:-/work/image-build}" "$@" || status=$?
echo "image rehearsal: exit ${status}, wall $(( $(date +%s) - start )) s"
exit "${status}"
