#!/bin/sh
# As the official image's entrypoint: no arguments, or a first argument starting with `-`,
# runs WireMock with those arguments; anything else is run as a command.
set -eu
if [ "$#" -eq 0 ] || [ "${1#-}" != "$1" ]; then
  # JAVA_OPTS is split on spaces on purpose, as in the official image. The export is the
  # one the jar's manifest asks for (HTTPS certificates), which -cp does not apply.
  # shellcheck disable=SC2086
  set -- java $JAVA_OPTS --add-exports java.base/sun.security.x509=ALL-UNNAMED -cp "/var/wiremock/lib/*:/var/wiremock/extensions/*" wiremock.Run "$@"
fi
exec "$@"
