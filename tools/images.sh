#!/usr/bin/env bash
# Builds the txmq container images: `make images` (any engine already reachable) or
# `make images-local` (installs Debian's Docker engine, starts a private daemon, builds the
# base image from debootstrap, then the images). Subcommands:
#
#   tools/images.sh engine    start (or reuse) the private daemon; prints `export DOCKER_HOST=...`
#   tools/images.sh base      the Debian base images (debootstrap + docker import), cached
#   tools/images.sh wheels    the pinned wheels (cached) and txmq's own, for the build
#   tools/images.sh build     the four images from deploy/docker/Dockerfile (one --target each)
#   tools/images.sh images    base and build with the engine already reachable (DOCKER_HOST,
#                             the default socket, or the private daemon when it runs)
#   tools/images.sh all       engine, base, build
#   tools/images.sh push REGISTRY
#                             tag the four images REGISTRY/txmq/<component>:<version> and push
#                             them (`make push REGISTRY=registry.example.com/acme`): the chart
#                             then pulls them with --set global.imageRegistry=REGISTRY
#   tools/images.sh stop      stop the private daemon this script started
#
# The private daemon has its own socket, data root and exec root under $TXMQ_DOCKER_DIR
# (default /var/tmp/txmq-docker), no bridge network and no iptables rules: containers run
# with --network host. Nothing is pulled from an image registry (none is reachable here):
# the base is Debian's own packages, and the Python wheels are downloaded on the host (with
# its pip configuration and trust store) into $CACHE/wheels, so the build itself needs no
# network and a rebuild downloads nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."

DOCKER_DIR=${TXMQ_DOCKER_DIR:-/var/tmp/txmq-docker}
CACHE=${TXMQ_IMAGE_CACHE:-tools/.cache/images}
VERSION=${TXMQ_IMAGE_TAG:-$(sed -n 's/^appVersion: "\(.*\)"/\1/p' deploy/helm/txmq/Chart.yaml)}
PREFIX=${TXMQ_IMAGE_PREFIX:-txmq}
COMPONENTS=(nameserver broker checker proxy)
SUITE=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
# The packages in the base images. The build base adds what creating a virtualenv needs;
# neither has a compiler (every pinned requirement installs from a binary wheel).
RUNTIME_PACKAGES=python3,ca-certificates,tzdata
BUILD_PACKAGES=$RUNTIME_PACKAGES,python3-venv
BASE_KEY=$(printf '%s\n' "$SUITE" "$RUNTIME_PACKAGES" "$BUILD_PACKAGES" v1 | sha256sum | cut -c1-12)
RUNTIME_BASE=$PREFIX/base-runtime:$SUITE-$BASE_KEY
BUILD_BASE=$PREFIX/base-build:$SUITE-$BASE_KEY

# The client that matches Debian's engine when it is installed (a newer client elsewhere on
# PATH would ask the 20.10 daemon for BuildKit features it lacks).
if [[ -x /usr/bin/docker ]]; then DOCKER=/usr/bin/docker; else DOCKER=docker; fi

say() { echo "images: $*" >&2; }

engine_up() { "$DOCKER" info >/dev/null 2>&1; }

cmd_engine() {
  if [[ -z "${DOCKER_HOST:-}" ]] && engine_up; then
    say "using the engine already reachable"; return
  fi
  export DOCKER_HOST=unix://$DOCKER_DIR/docker.sock
  if engine_up; then
    say "private daemon already running ($DOCKER_HOST)"
    echo "export DOCKER_HOST=$DOCKER_HOST"; return
  fi
  if ! command -v dockerd >/dev/null || ! [[ -x /usr/bin/docker ]]; then
    say "installing Debian's docker.io"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >/dev/null
    DOCKER=/usr/bin/docker
  fi
  mkdir -p "$DOCKER_DIR/data" "$DOCKER_DIR/exec"
  say "starting a private dockerd ($DOCKER_HOST, log $DOCKER_DIR/dockerd.log)"
  # setsid: the daemon outlives this script (and make) and is stopped by `tools/images.sh stop`.
  setsid dockerd -H "$DOCKER_HOST" --data-root "$DOCKER_DIR/data" --exec-root "$DOCKER_DIR/exec" \
    --pidfile "$DOCKER_DIR/dockerd.pid" --bridge=none --iptables=false --ip-masq=false \
    >"$DOCKER_DIR/dockerd.log" 2>&1 < /dev/null &
  for _ in $(seq 1 600); do
    engine_up && { echo "export DOCKER_HOST=$DOCKER_HOST"; return; }
    sleep 0.1
  done
  say "dockerd did not answer within 60 s:"; tail -20 "$DOCKER_DIR/dockerd.log" >&2; exit 1
}

cmd_stop() {
  local pid
  pid=$(cat "$DOCKER_DIR/dockerd.pid" 2>/dev/null || true)
  [[ -n "$pid" ]] && kill "$pid" 2>/dev/null && say "stopped dockerd $pid" || say "no private dockerd running"
}

# The host's Debian mirror (the first URIs/deb line of its apt sources), else debootstrap's default.
mirror() {
  local m=""
  if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
    m=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
  fi
  if [[ -z "$m" && -f /etc/apt/sources.list ]]; then
    m=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list)
  fi
  echo "$m"
}

# One debootstrap (with the build packages) gives both tarballs, kept in $CACHE so a second
# build reuses them: the build base as it is, the runtime base with the venv packages purged.
base_tarballs() {
  local build_tar="$CACHE/base-build-$SUITE-$BASE_KEY.tar" runtime_tar="$CACHE/base-runtime-$SUITE-$BASE_KEY.tar"
  if [[ ! -s "$build_tar" || ! -s "$runtime_tar" ]]; then
    command -v debootstrap >/dev/null || {
      apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
    local root
    root=$(mktemp -d /var/tmp/txmq-rootfs.XXXXXX)
    say "debootstrap $SUITE ($BUILD_PACKAGES) into $root"
    debootstrap --variant=minbase --include="$BUILD_PACKAGES" "$SUITE" "$root" $(mirror) >"$root.log" 2>&1 \
      || { tail -20 "$root.log" >&2; exit 1; }
    # Smaller images: no package lists, caches, documentation or locales beyond C.
    chroot "$root" apt-get clean
    slim "$root"
    mkdir -p "$CACHE"
    tar --numeric-owner -C "$root" -cf "$build_tar.tmp" . && mv "$build_tar.tmp" "$build_tar"
    chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq --auto-remove \
      python3-venv python3.11-venv python3-pip-whl python3-setuptools-whl >/dev/null
    chroot "$root" apt-get clean
    slim "$root"
    tar --numeric-owner -C "$root" -cf "$runtime_tar.tmp" . && mv "$runtime_tar.tmp" "$runtime_tar"
    rm -rf "$root" "$root.log"
  fi
}

slim() {
  rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/* "$1"/usr/share/doc/* "$1"/usr/share/man/* \
    "$1"/usr/share/info/* "$1"/var/log/*.log
  find "$1"/usr/share/locale -mindepth 1 -maxdepth 1 ! -name 'C*' -exec rm -rf {} +
}

cmd_base() {
  local image kind
  for kind in runtime build; do
    if [[ $kind == runtime ]]; then image=$RUNTIME_BASE; else image=$BUILD_BASE; fi
    "$DOCKER" image inspect "$image" >/dev/null 2>&1 && continue
    base_tarballs
    say "importing $image"
    "$DOCKER" import -c 'ENV LANG=C.UTF-8' -c 'CMD ["/bin/bash"]' \
      "$CACHE/base-$kind-$SUITE-$BASE_KEY.tar" "$image" >/dev/null
  done
}

# The pinned requirements as wheels for this platform (the images run the same Debian
# release's python3), kept between builds; txmq's own two wheels built fresh from a copy of
# the sources (no build/ or egg-info left in the tree).
cmd_wheels() {
  local py=python3 src
  [[ -x .venv/bin/python ]] && py=.venv/bin/python
  mkdir -p "$CACHE/wheels/deps"
  say "pinned wheels into $CACHE/wheels/deps"
  "$py" -m pip download -qq --disable-pip-version-check --only-binary=:all: \
    -d "$CACHE/wheels/deps" -r requirements/proxy.txt
  src=$(mktemp -d /var/tmp/txmq-src.XXXXXX)
  cp -r sdk services pyproject.toml "$src"/
  find "$src" -name __pycache__ -prune -exec rm -rf {} + -o -name '*.egg-info' -prune -exec rm -rf {} +
  rm -rf "$src/sdk/build" "$src/build"  # what an earlier `pip install ./sdk` left (stale modules)
  rm -rf "$CACHE/wheels/txmq"
  "$py" -m pip wheel -qq --disable-pip-version-check --no-deps -w "$CACHE/wheels/txmq" "$src/sdk" "$src"
  rm -rf "$src"
}

cmd_build() {
  local c
  cmd_wheels
  for c in "${COMPONENTS[@]}"; do
    say "building $PREFIX/$c:$VERSION"
    "$DOCKER" build -q -f deploy/docker/Dockerfile --target "$c" \
      --build-arg "RUNTIME_BASE=$RUNTIME_BASE" --build-arg "BUILD_BASE=$BUILD_BASE" --build-arg "WHEELS=$CACHE/wheels" \
      -t "$PREFIX/$c:$VERSION" . >/dev/null
  done
  "$DOCKER" image ls --filter "reference=$PREFIX/*:$VERSION" --format '{{.Repository}}:{{.Tag}} {{.Size}}' >&2
}

# The built images under REGISTRY (a host[:port][/path] prefix), pushed with the engine's own
# credentials (`docker login REGISTRY` first where it needs them).
cmd_push() {
  local registry=${1:-} c target
  [[ -n "$registry" ]] || { say "push needs a registry: tools/images.sh push registry.example.com/acme \
(make push REGISTRY=...)"; exit 2; }
  registry=${registry%/}
  for c in "${COMPONENTS[@]}"; do
    "$DOCKER" image inspect "$PREFIX/$c:$VERSION" >/dev/null 2>&1 \
      || { say "$PREFIX/$c:$VERSION is not built: make images first"; exit 1; }
  done
  for c in "${COMPONENTS[@]}"; do
    target=$registry/$PREFIX/$c:$VERSION
    "$DOCKER" tag "$PREFIX/$c:$VERSION" "$target"
    say "pushing $target"
    "$DOCKER" push -q "$target" >/dev/null
  done
  say "pushed; install with: helm install txmq deploy/helm/txmq --set global.imageRegistry=$registry"
}

case "${1:-all}" in
  engine) cmd_engine ;;
  base) cmd_base ;;
  wheels) cmd_wheels ;;
  build) cmd_build ;;
  images)
    if [[ -z "${DOCKER_HOST:-}" ]] && ! engine_up; then
      export DOCKER_HOST=unix://$DOCKER_DIR/docker.sock
      engine_up || { say "no Docker engine reachable (DOCKER_HOST, the default socket, $DOCKER_HOST): \
make images-local installs one and starts it"; exit 1; }
    fi
    cmd_base; cmd_build ;;
  all) eval "$(cmd_engine)"; cmd_base; cmd_build ;;
  push)
    if [[ -z "${DOCKER_HOST:-}" ]] && ! engine_up; then export DOCKER_HOST=unix://$DOCKER_DIR/docker.sock; fi
    cmd_push "${2:-}" ;;
  stop) cmd_stop ;;
  *) echo "usage: $0 [engine|base|wheels|build|images|all|push REGISTRY|stop]" >&2; exit 2 ;;
esac
