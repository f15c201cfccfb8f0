#!/usr/bin/env bash
# Make sure the image wiremock/wiremock:3.13.2 exists in the local Docker engine.
#
#   docker/wiremock/build.sh            # nothing to do when the image is there
#   WIREMOCK_IMAGE=name:tag docker/wiremock/build.sh
#
# Order: the image already present -> `docker pull` where a registry answers -> a local build
# of an equivalent image (see Dockerfile) from:
#   - the WireMock 3.13.2 standalone jar in the npm package `wiremock@3.13.2` (npm pack);
#   - a Java runtime jlinked from the machine's JDK 17 (needs jlink and the jmods:
#     Debian's openjdk-17-jdk-headless);
#   - the host's C libraries for that runtime, /bin/sh and curl (for the healthcheck),
#     found with ldd and copied into a FROM-scratch image.
# Needs: docker, npm, jlink, ldd, tar. Takes ~15 s here; the image is ~125 MB.
set -euo pipefail

IMAGE="${WIREMOCK_IMAGE:-wiremock/wiremock:3.13.2}"
WIREMOCK_VERSION="${WIREMOCK_VERSION:-3.13.2}"
HERE="$(cd "$(dirname "$0")" && pwd)"
# What `jdeps --print-module-deps --ignore-missing-deps` reports for the 3.13.2 standalone jar,
# plus jdk.crypto.ec (TLS with EC ciphers: --https-port and proxying to HTTPS) and
# jdk.zipfs (jar: URLs).
JAVA_MODULES="java.base,java.compiler,java.desktop,java.instrument,java.management,java.naming,\
java.scripting,java.security.jgss,java.sql,jdk.unsupported,jdk.crypto.ec,jdk.zipfs"

log() { echo "wiremock image: $*" >&2; }

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  log "$IMAGE is present"
  exit 0
fi
if timeout 60 docker pull -q "$IMAGE" >/dev/null 2>&1; then
  log "pulled $IMAGE"
  exit 0
fi
log "$IMAGE cannot be pulled here: building it locally"

for tool in npm jlink ldd tar; do
  command -v "$tool" >/dev/null || { log "needs $tool"; exit 1; }
done

ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT
root="$ctx/rootfs"
mkdir -p "$root"/{tmp,home/wiremock/mappings,home/wiremock/__files,var/wiremock/lib,var/wiremock/extensions,etc,bin,usr/bin}
chmod 1777 "$root/tmp"

# The jar, from the npm registry.
(cd "$ctx" && npm pack --silent "wiremock@$WIREMOCK_VERSION" >/dev/null)
tar -xzf "$ctx/wiremock-$WIREMOCK_VERSION.tgz" -C "$ctx" \
  "package/build/wiremock-standalone-$WIREMOCK_VERSION.jar"
mv "$ctx/package/build/wiremock-standalone-$WIREMOCK_VERSION.jar" \
  "$root/var/wiremock/lib/wiremock-standalone.jar"

# A small Java runtime. TieredStopAtLevel=1 makes jlink itself 3-4x faster.
jlink -J-XX:TieredStopAtLevel=1 --add-modules "$JAVA_MODULES" \
  --strip-debug --no-man-pages --no-header-files --compress=2 \
  --output "$root/opt/java"

# sh for the entrypoint, curl for the healthcheck, and every shared library that they and the
# runtime load (ldd follows the whole tree), kept at their host paths.
cp -L /bin/sh "$root/bin/sh"
cp -L "$(command -v curl)" "$root/usr/bin/curl"
{
  ldd "$root/bin/sh" "$root/usr/bin/curl" "$root/opt/java/bin/java"
  find "$root/opt/java/lib" -name '*.so' -exec ldd {} +
} 2>/dev/null | grep -oE '/[^ ]+\.so[^ ]*' | sort -u | while read -r lib; do
  [ -e "$lib" ] || continue
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
# Name lookups (localhost) and the CA bundle for proxying to HTTPS.
printf 'hosts: files dns\n' >"$root/etc/nsswitch.conf"
printf '127.0.0.1 localhost\n::1 localhost\n' >"$root/etc/hosts"
printf 'root:x:0:0:root:/root:/bin/sh\n' >"$root/etc/passwd"
if [ -d /etc/ssl/certs ]; then
  mkdir -p "$root/etc/ssl"
  cp -rL /etc/ssl/certs "$root/etc/ssl/certs"
fi
install -m 0755 "$HERE/docker-entrypoint.sh" "$root/docker-entrypoint.sh"

cp "$HERE/Dockerfile" "$ctx/Dockerfile"
# The legacy builder: Debian's docker.io has no buildx. Its deprecation notice is shown only
# when the build fails, with the rest of the output.
if ! DOCKER_BUILDKIT=0 docker build -q -t "$IMAGE" "$ctx" >"$ctx/build.log" 2>&1; then
  cat "$ctx/build.log" >&2
  exit 1
fi
log "built $IMAGE ($(docker image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%d MB", $1/1e6}'))"
