#!/usr/bin/env bash
# Runs examples/http-json.json against a local pricing service: starts
# examples/http-json/server.py on a free loopback port, writes a heddle.toml that grants
# the `http` package exactly that destination, and runs the graph with it.
# Usage: examples/http-json/run.sh [more heddle run arguments, e.g. --json]
# HEDDLE names the heddle command (default: `cargo run -q --`).
set -euo pipefail
cd "$(dirname "$0")/../.."
read -r -a heddle <<<"${HEDDLE:-cargo run -q --}"
dir="$(mktemp -d)"
python3 examples/http-json/server.py "$dir/port" &
server=$!
trap 'kill "$server" 2>/dev/null || true; rm -rf "$dir"' EXIT
for _ in $(seq 1 100); do
    [ -s "$dir/port" ] && break
    sleep 0.1
done
[ -s "$dir/port" ] || { echo "run.sh: the pricing service did not start" >&2; exit 1; }
port="$(cat "$dir/port")"
cat >"$dir/heddle.toml" <<TOML
# Only this destination: plain http to this port of loopback (a name would never
# reach a loopback address; the address itself, granted, does).
[packages.http]
network = ["http://127.0.0.1:$port"]
TOML
"${heddle[@]}" run --config "$dir/heddle.toml" examples/http-json.json \
    --input "api=http://127.0.0.1:$port" "$@"
