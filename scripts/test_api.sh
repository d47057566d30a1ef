#!/usr/bin/env bash
# Fuzzes the registry and notifier API of a running appliance against its OpenAPI document
# (api/openapi.json) with schemathesis, and fails on any finding.
#
# Builds ./playwatch, runs `playwatch run` on a fresh data directory with a
# REGISTRY_TOKEN and free loopback ports (it starts its own PostgreSQL and
# broker), waits for /readyz, runs every schemathesis check with
# SCHEMATHESIS_MAX_EXAMPLES (default 100) examples per operation from
# SCHEMATHESIS_SEED (default 1, so that runs repeat), then stops the
# appliance and removes the data directory, whatever happened.
#
# schemathesis is installed into .cache/schemathesis (a Python venv). Where
# that cannot be done (no python3, no venv module, no network) the test is
# skipped, except with CI=true, where that is a failure.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"
schemathesis_version=4.32.5
venv=$repo_root/.cache/schemathesis
max_examples=${SCHEMATHESIS_MAX_EXAMPLES:-100}
seed=${SCHEMATHESIS_SEED:-1}

log() { echo "test_api: $*" >&2; }

unavailable() {
	if [ "${CI:-}" = true ]; then
		log "FAIL: $* (CI=true: schemathesis must run)"
		exit 1
	fi
	log "SKIP: $*"
	exit 0
}

install_schemathesis() {
	if [ "$("$venv/bin/schemathesis" --version 2>/dev/null)" = "schemathesis, version $schemathesis_version" ]; then
		return
	fi
	command -v python3 >/dev/null || unavailable "python3 is not installed"
	rm -rf "$venv"
	python3 -m venv "$venv" >&2 || unavailable "python3 -m venv failed (Debian: apt-get install python3-venv)"
	log "installing schemathesis $schemathesis_version into $venv"
	"$venv/bin/pip" install --quiet --disable-pip-version-check "schemathesis==$schemathesis_version" >&2 ||
		unavailable "pip install schemathesis==$schemathesis_version failed (no network?)"
}

free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

install_schemathesis
log "building ./playwatch"
"${GO:-go}" build -o playwatch .

work=$(mktemp -d)
# The managed PostgreSQL runs as an unprivileged user when this runs as
# root, and must be able to walk into the data directory.
chmod 755 "$work"
pid=
cleanup() {
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid"
		wait "$pid" || true
	fi
	rm -rf "$work"
}
trap cleanup EXIT

http_port=$(free_port)
broker_port=$(free_port)
# Nothing listens there either: the notifier's test messages (POST
# /api/v1/destinations/{id}/test, to the URLs schemathesis makes up) go
# through it and fail, so none leaves this machine.
notify_proxy_port=$(free_port)
# Nothing listens there: the crawler, which reads the apps schemathesis
# registers, must not reach the real Play Store.
playstore_port=$(free_port)
token=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
base=http://127.0.0.1:$http_port

PLAYWATCH_DATA_DIR=$work/data \
	PLAYWATCH_HTTP_ADDR=127.0.0.1:$http_port \
	PLAYWATCH_BROKER_ADDR=127.0.0.1:$broker_port \
	PLAYSTORE_URL=http://127.0.0.1:$playstore_port \
	REGISTRY_TOKEN=$token \
	NOTIFY_PROXY=http://127.0.0.1:$notify_proxy_port \
	./playwatch run >"$work/playwatch.log" 2>&1 &
pid=$!

ready() {
	python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)' "$base/readyz" 2>/dev/null
}
log "waiting for $base/readyz"
for _ in $(seq 120); do
	ready && break
	if ! kill -0 "$pid" 2>/dev/null; then
		cat "$work/playwatch.log" >&2
		log "FAIL: playwatch run exited before it was ready"
		exit 1
	fi
	sleep 0.5
done
ready || {
	tail -50 "$work/playwatch.log" >&2
	log "FAIL: $base/readyz is not ready after 60 s"
	exit 1
}

# What the document cannot say: a rule refers to destinations and apps that
# must exist, and a PATCH of a destination takes only its own type's fields,
# so a body the schema allows may be a 400 there; a test message to a made-up
# receiver fails with 502 (or 503 where no sender runs), as documented.
cat >"$work/schemathesis.toml" <<'TOML'
[[operations]]
include-operation-id = ["createRule", "updateRule", "updateDestination"]
checks.positive_data_acceptance.expected-statuses = ["2xx", "400", "401", "404", "409"]

[[operations]]
include-operation-id = "testDestination"
checks.not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "502", "503"]
TOML

st_args=(
	--config-file "$work/schemathesis.toml"
	run "$base/api/v1/openapi.json"
	--url "$base"
	--checks all
	# Excluded because it contradicts a documented design: DELETE is a soft
	# delete, the app stays readable with is_active false, and
	# PATCH {"is_active": true} brings it back.
	--exclude-checks use_after_free
	--max-examples "$max_examples"
	--header "Authorization: Bearer $token"
	# With two workers, schemathesis failed inside Hypothesis on CPython 3.11
	# ("AST constructor recursion depth mismatch"): Hypothesis changes the
	# interpreter-wide recursion limit around each test while the other
	# thread parses source.
	--workers 1
	--seed "$seed"
	--generation-database none
	--report har --report-har-path "$work/requests.har"
	--no-color
)

status=0
# From the scratch directory: schemathesis keeps a cache in ./.schemathesis.
(cd "$work" && "$venv/bin/schemathesis" "${st_args[@]}") || status=$?
requests=$(python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))["log"]["entries"]))' "$work/requests.har" 2>/dev/null || echo unknown)
log "schemathesis $schemathesis_version sent $requests requests"
if [ "$status" -ne 0 ]; then
	log "the appliance's last log lines:"
	tail -20 "$work/playwatch.log" >&2
	log "FAIL: schemathesis found problems (exit $status)"
	exit 1
fi
log "PASS"
