#!/usr/bin/env bash
# Build mado's OCI images here, from the Dockerfile, with nothing installed by hand (docs/deploy.md#images):
#   1. podman, runc and debootstrap from Debian when missing;
#   2. a Debian bookworm base (debootstrap --variant=minbase, `podman import`) tagged $MADO_BASE_IMAGE, built once
#      and kept (skipped while the tag exists: delete it with `podman rmi` to rebuild);
#   3. a wheelhouse under var/wheelhouse: `pip wheel` of the dependencies of mado and its SDK as this host's pip
#      resolves them (so the image carries the CPU torch build found here, not the index's multi-GB CUDA one);
#   4. `podman build` of the targets `web` (no torch) and `worker` (torch; also the demo), tagged
#      $MADO_IMAGE and $MADO_IMAGE-worker; prints each image's size and the build time.
# Usage: deploy/build-image.sh            (MADO_IMAGE=localhost/mado:<pyproject.toml's version> by default)
#        deploy/build-image.sh --tags     (prints the two tags it would build, builds nothing)
# The Kubernetes overlays run these tags (deploy/kubernetes/components/release; docs/deploy.md#kubernetes).
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_IMAGE=${MADO_BASE_IMAGE:-localhost/debian-bookworm-minbase:latest}
VERSION=$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -n 1)
IMAGE=${MADO_IMAGE:-localhost/mado:$VERSION}
WORKER_IMAGE=${MADO_WORKER_IMAGE:-$IMAGE-worker}
if [ "${1:-}" = --tags ]; then
  printf '%s\n' "$IMAGE" "$WORKER_IMAGE"
  exit 0
fi
PIP=${PIP:-.venv/bin/pip}
[ -x "$PIP" ] || PIP=$(command -v pip3)
# This host refuses raised limits and has no systemd or daemon: runc, cgroupfs, the host network, lowered ulimits.
PODMAN=(podman --runtime runc --cgroup-manager cgroupfs)
LIMITS=(--ulimit nofile=1024:1024 --ulimit nproc=4096:4096)
started=$(date +%s)

install_tools() {
  local missing=()
  for tool in podman runc debootstrap; do command -v "$tool" >/dev/null || missing+=("$tool"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "installing ${missing[*]} from Debian"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc debootstrap uidmap >/dev/null
  fi
}

build_base() {
  if "${PODMAN[@]}" image exists "$BASE_IMAGE"; then
    echo "base image $BASE_IMAGE exists (podman rmi it to rebuild)"
    return
  fi
  local root
  root=$(mktemp -d /var/tmp/mado-bookworm.XXXXXX)
  echo "debootstrap bookworm (minbase) into $root"
  debootstrap --variant=minbase bookworm "$root" "${DEBIAN_MIRROR:-http://deb.debian.org/debian}" >/dev/null
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -c . | "${PODMAN[@]}" import --change 'CMD ["/bin/bash"]' - "$BASE_IMAGE" >/dev/null
  rm -rf "$root"
}

build_wheelhouse() {
  # Only the dependencies: mado and its SDK come in as source (COPY . /app), so a change of the code leaves the
  # image's dependency layers cached. Rebuilt from scratch each time (pip's cache makes it quick), so no stale wheel
  # stays behind; the same files give the same layer.
  rm -rf var/wheelhouse && mkdir -p var/wheelhouse
  # Debian's Python is 3.11.2: redis needs async-timeout below 3.11.3, which a newer host Python never resolves.
  # The image's `pip check` fails the build on any other requirement that differs so.
  "$PIP" wheel --quiet --wheel-dir var/wheelhouse . ./sdk async-timeout 2>&1 | grep -v "is ignored: it is neither" || true
  rm -f var/wheelhouse/mado-[0-9]*.whl var/wheelhouse/mado_tracking-*.whl
  compgen -G "var/wheelhouse/torch-*.whl" >/dev/null || { echo "the wheelhouse has no torch wheel" >&2; exit 1; }
}

npm_files() {
  # htmx and uPlot, served by the pages (package.json); without npm the pages work without live refresh.
  if [ ! -d node_modules/htmx.org/dist ] && command -v npm >/dev/null; then npm ci --no-audit --no-fund --silent; fi
  mkdir -p node_modules
}

build_images() {
  # Python packages come from the wheelhouse and Debian's over its mirror's own signatures, so the build needs no
  # CA bundle of the host; a build that installed from a package index over TLS would mount it read-only at
  # /etc/ssl/certs/ca-certificates.crt (which clashes with the image's own ca-certificates package: not here).
  for target in web worker; do
    local tag=$IMAGE
    [ "$target" = worker ] && tag=$WORKER_IMAGE
    "${PODMAN[@]}" build --network host "${LIMITS[@]}" --layers \
      --build-arg "BASE_IMAGE=$BASE_IMAGE" --target "$target" --tag "$tag" --file deploy/Dockerfile .
  done
}

install_tools
build_base
build_wheelhouse
npm_files
build_images
for tag in "$IMAGE" "$WORKER_IMAGE"; do
  "${PODMAN[@]}" image inspect --format "image {{index .RepoTags 0}}: {{.Size}} bytes" "$tag"
done
echo "build time: $(($(date +%s) - started)) s"
