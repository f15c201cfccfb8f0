#!/usr/bin/env bash
# Build the images of docker/compose.yaml that come from this repository and PyPI: the app, the
# reranker and Phoenix, with the names compose looks for (so `docker compose up --no-build`
# starts them).
#
#   docker/build-images.sh                       # on python:3.11-slim (pulled if missing)
#   BASE_IMAGE=debian-python:local docker/build-images.sh
#
# Where python:3.11-slim cannot be pulled (no registry answers), a stand-in base is made once:
# a Debian bookworm root file system from the machine's configured Debian mirror (debootstrap
# --variant=minbase, with python3 and python3-venv), imported with `docker import`, and kept
# as $LOCAL_BASE: later runs skip it while that image exists. The host's CA bundle goes into it
# (and pip is told to trust it), so pip works behind an intercepting proxy as it does on the host.
#
# pip inside the builds uses the public index unless the host's pip names another one
# (PIP_INDEX_URL / PIP_EXTRA_INDEX_URL or `pip config`): http(s) indexes are passed as build
# arguments; file:// ones and find-links directories exist only on the host and are left out.
#
# Needs: docker; for the stand-in base also debootstrap and tar (as root). Prints one line per
# step with its seconds, and last which images were built and which failed; exits non-zero
# when an image cannot be built.
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_IMAGE="${BASE_IMAGE:-python:3.11-slim}"
LOCAL_BASE="${LOCAL_BASE:-retrieval-stage-base:bookworm}"
APP_IMAGE="${APP_IMAGE:-retrieval-stage-app}"
RERANKER_IMAGE="${RERANKER_IMAGE:-retrieval-stage-reranker}"
PHOENIX_IMAGE="${PHOENIX_IMAGE:-$(sed -n 's/^ *image: *\(arizephoenix\/phoenix:[^ ]*\).*/\1/p' docker/compose.yaml)}"
PULL_SECONDS="${PULL_SECONDS:-60}"

log() { echo "images: $*" >&2; }

# Debian's mirror as apt is configured (deb822 .sources or one-line .list), else the public one.
debian_mirror() {
  local uri
  uri="$(grep -hsE '^(URIs:|deb )' /etc/apt/sources.list.d/*.sources /etc/apt/sources.list \
    /etc/apt/sources.list.d/*.list 2>/dev/null | grep -oE 'https?://[^ ]+/debian/?' | head -1 || true)"
  echo "${uri:-http://deb.debian.org/debian}"
}

# The stand-in for python:3.11-slim: Debian bookworm's python3 (3.11) with venv, as root.
make_local_base() {
  local root status=0
  command -v debootstrap >/dev/null || { log "needs debootstrap (apt-get install debootstrap)"; return 1; }
  root="$(mktemp -d)"
  if ! debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$root" "$(debian_mirror)" >"$root.log" 2>&1; then
    tail -20 "$root.log" >&2
    status=1
  else
    # The host's CA bundle (it holds any CA the host trusts, such as an intercepting proxy's).
    if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
      cp -L /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
    fi
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/tmp/*
    tar -C "$root" -c . | docker import \
      --change 'ENV LANG=C.UTF-8' \
      --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
      --change 'CMD ["python3"]' \
      - "$LOCAL_BASE" >/dev/null || status=1
  fi
  rm -rf "$root" "$root.log"
  return "$status"
}

# The base: the one asked for if present or pullable, else the local stand-in (made once).
all_started=$SECONDS
started=$SECONDS
base="$BASE_IMAGE"
if docker image inspect "$base" >/dev/null 2>&1; then
  log "base $base is present"
elif timeout "$PULL_SECONDS" docker pull -q "$base" >/dev/null 2>&1; then
  log "base $base pulled in $((SECONDS - started))s"
else
  base="$LOCAL_BASE"
  if docker image inspect "$base" >/dev/null 2>&1; then
    log "base $BASE_IMAGE cannot be pulled; $base (made earlier) is present"
  else
    log "base $BASE_IMAGE cannot be pulled: making $base with debootstrap"
    make_local_base || { log "could not make $base"; exit 1; }
    log "base $base made in $((SECONDS - started))s"
  fi
fi

# The host's pip settings (its environment first, then `pip config`).
pip_setting() {  # NAME as in `pip config`, e.g. index-url
  local env_name="PIP_$(echo "$1" | tr 'a-z-' 'A-Z_')"
  if [ -n "${!env_name:-}" ]; then
    echo "${!env_name}"
  else
    python3 -m pip config get "global.$1" 2>/dev/null || true
  fi
}
# Its package indexes where a container can reach them too (http or https, not file://).
build_args=(--build-arg "BASE=$base")
for setting in index-url extra-index-url; do
  # shellcheck disable=SC2046
  value="$(printf '%s\n' $(pip_setting "$setting") | grep -E '^https?://' | paste -sd ' ' - || true)"
  [ -z "$value" ] || build_args+=(--build-arg "PIP_$(echo "$setting" | tr 'a-z-' 'A-Z_')=$value")
done
value="$(pip_setting trusted-host)"
[ -z "$value" ] || build_args+=(--build-arg "PIP_TRUSTED_HOST=$value")

# The legacy builder (Debian's docker.io has no buildx) reads the root .dockerignore.
build() {  # IMAGE DOCKERFILE [docker build options]
  local image=$1 dockerfile=$2 log_file status=0 started=$SECONDS
  shift 2
  log_file="$(mktemp)"
  if DOCKER_BUILDKIT=0 docker build -f "$dockerfile" "${build_args[@]}" "$@" -t "$image" . \
    >"$log_file" 2>&1; then
    log "$image built in $((SECONDS - started))s \
($(docker image inspect -f '{{.Size}}' "$image" | awk '{printf "%d MB", $1/1e6}'))"
  else
    tail -30 "$log_file" >&2
    log "$image: docker build -f $dockerfile failed"
    status=1
  fi
  rm -f "$log_file"
  return "$status"
}

# The last line: what was built and what was not, in so many words.
summary() {  # SECONDS_SINCE_START BUILT_COUNT [FAILED_IMAGE...]
  local seconds=$1 built=$2 total failed_list
  shift 2
  total=$((built + $#))
  failed_list="$(printf '%s, ' "$@")"
  failed_list="${failed_list%, }"
  if [ "$#" -eq 0 ]; then
    echo "all $total images built, ${seconds}s after the start"
  elif [ "$built" -eq 0 ]; then
    echo "no image built: all $total builds failed ($failed_list), ${seconds}s after the start"
  else
    echo "$# of $total builds failed ($failed_list), $built built, ${seconds}s after the start"
  fi
}

# The three at once: their installs wait mostly on the package index, not on the CPUs.
images=("$APP_IMAGE" "$RERANKER_IMAGE" "$PHOENIX_IMAGE")
dockerfiles=(docker/Dockerfile docker/Dockerfile.server docker/Dockerfile.phoenix)
jobs=()
for i in "${!images[@]}"; do
  build "${images[$i]}" "${dockerfiles[$i]}" &
  jobs+=("$!")
done
failed=()
for i in "${!jobs[@]}"; do
  wait "${jobs[$i]}" || failed+=("${images[$i]}")
done
log "$(summary "$((SECONDS - all_started))" "$((${#images[@]} - ${#failed[@]}))" ${failed[@]+"${failed[@]}"})"
[ "${#failed[@]}" -eq 0 ]
