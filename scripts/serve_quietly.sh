#!/usr/bin/env bash
# Run a server with its output going to a log file, say nothing until it answers, then say
# where it is and where its log is; Ctrl-C (or SIGTERM) stops it. `make phoenix` runs Phoenix
# with it: Phoenix writes thousands of SQLAlchemy INFO lines while it starts.
#
#   scripts/serve_quietly.sh NAME LOG URL COMMAND [ARGS...]
#
# NAME names the server in what this prints; LOG is the file its stdout and stderr go to
# (created, or emptied); URL is polled (HTTP GET, any status counts as an answer) until it
# answers, and named in the line that says the server is up (with NOTE, when set). When the
# server exits first, or STARTUP_SECONDS (default 300) pass, this prints the log's last lines
# and exits non-zero. Needs python3 (PYTHON) for the poll.
set -euo pipefail
if [ "$#" -lt 4 ]; then
  echo "usage: $0 NAME LOG URL COMMAND [ARGS...]" >&2
  exit 2
fi
name=$1 log=$2 url=$3
shift 3
PYTHON="${PYTHON:-python3}"
STARTUP_SECONDS="${STARTUP_SECONDS:-300}"

mkdir -p "$(dirname "$log")"
: >"$log"
# Its own process group, so a stop reaches the server's children too; SIGINT is not ignored
# (a background job of a script would otherwise start with it ignored).
"$PYTHON" -c 'import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
os.setpgrp()
os.execvp(sys.argv[1], sys.argv[1:])' "$@" >>"$log" 2>&1 &
server=$!

stop() {  # SIGNAL: pass it on, wait for the server, exit as the shell would for it
  trap - INT TERM
  kill -TERM -- "-$server" 2>/dev/null || kill -TERM "$server" 2>/dev/null || true
  wait "$server" 2>/dev/null || true
  echo "$name: stopped (its log: $log)"
  exit "$1"
}
trap 'stop 130' INT
trap 'stop 143' TERM

answers() {
  "$PYTHON" - "$url" <<'EOF'
import sys, urllib.error, urllib.request

try:
    urllib.request.urlopen(sys.argv[1], timeout=2).close()
except urllib.error.HTTPError:
    pass  # an HTTP status is an answer
except OSError:
    sys.exit(1)
EOF
}

echo "$name: starting (its log: $log)"
started=$SECONDS
until answers; do
  if ! kill -0 "$server" 2>/dev/null; then
    status=0
    wait "$server" || status=$?
    echo "$name: exited with status $status before answering at $url; the last lines of $log:" >&2
    tail -n 20 "$log" >&2
    exit "$(( status == 0 ? 1 : status ))"
  fi
  if (( SECONDS - started >= STARTUP_SECONDS )); then
    echo "$name: no answer at $url within ${STARTUP_SECONDS}s; the last lines of $log:" >&2
    tail -n 20 "$log" >&2
    stop 1
  fi
  sleep 0.5 &
  wait $! || true  # a wait a signal can cut short, so Ctrl-C stops at once
done
echo "$name is up on $url after $((SECONDS - started))s (${NOTE:+$NOTE; }its log: $log);" \
  "Ctrl-C stops it."
status=0
wait "$server" || status=$?
# wait returns early (status > 128) when a trapped signal arrives: the trap has exited then.
echo "$name: exited with status $status (its log: $log)" >&2
exit "$status"
