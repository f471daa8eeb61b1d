#!/usr/bin/env bash
# Run the whole system on this machine: a Mosquitto broker with TLS, passwords and the ACL of
# deploy/mosquitto/, the collector with its HTTP dashboard, and a simulated fleet of devices
# (ldp-fleet) publishing a week of privatized reports. Prints, per use case and period, the
# collector's estimate next to the truth, then the dashboard's URL, and keeps the broker and
# the collector running until Ctrl-C. Everything listens on 127.0.0.1 only.
#
# Usage: deploy/run-demo.sh [options] [-- ldp-fleet options]
#
#   --devices N     simulated devices (default 1000). Fewer than about 100 give nothing to
#                   compare: an estimate is released from 50 reports in a period
#                   (deploy/fleet.usecases.toml), and the run then ends with status 7
#   --days N        simulated days (default 7)
#   --seed N        seed of the simulation (default 1)
#   --workers N     ldp-fleet worker processes (default: 1, or 2 from 5,000 devices on)
#   --scale         simulate the devices in bulk (ldp-fleet --scale: per-device state and the
#                   vectorised privatizers, every report still privatized per device and
#                   counted by receipt; no agent state, ledger or ε audit); the default from
#                   20,000 devices on, where complete agents take too long on one machine
#   --complete-agents
#                   one complete agent per device (state, limits, ledger, ε audit) whatever
#                   the number of devices; the default below 20,000
#   --wait SECONDS  keep the dashboard up this long after the run, then stop (default: until Ctrl-C)
#   --no-wait       stop everything as soon as the results are printed
#   --out DIR       where results.json and the SVG plots go (default: a new ldp-demo.* directory
#                   under $TMPDIR or /tmp, kept after the run)
#   --keep          keep the broker's and collector's working files too (certificates, database)
#   --collectors N  run N collectors in one MQTT shared subscription group (default 1); each
#                   has its own dashboard, and any of them serves the same estimates
#   --brokers N     run N independent brokers (default 1): every collector holds a session on
#                   each, and the fleet spreads its devices over them, each device through
#                   its own primary broker, as agents with [broker] addresses do
#   --postgres      keep the checkpoints in a PostgreSQL server started for the demo (in the
#                   working directory, on a Unix socket) instead of a SQLite file; installs
#                   Debian's postgresql package when it is missing
#   --registry-change
#                   a rollout: at the start of the middle day half the fleet moves to
#                   deploy/fleet.usecases.v2.toml (one use case added, one memoized and one
#                   event-level use case changed, one retired); the collector accepts both
#                   registries and refuses the retired use case's reports for the days after
#                   the change. Every definition is compared with its own truth, and every
#                   report must be counted under its own definition (needs --days 3 or more)
#
# Needs Python 3.11+ and Mosquitto; installs Mosquitto with apt-get when it is missing (as
# deploy/test.sh does), creates the virtual environment .venv and installs the package into
# it when needed. Exit status: ldp-fleet's (0 when every error is within 5 standard errors,
# 7 when nothing was released to compare); 130 after Ctrl-C, which stops everything the demo
# started and removes its working files (the results stay).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"

usage() { # --help prints to stdout and exits 0; a wrong command line gets it on stderr, exit 2
    if [ "${1:-2}" -eq 0 ]; then
        sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
    else
        sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
    fi
    exit "${1:-2}"
}

devices=1000
days=7
seed=1
workers=""
wait_seconds=""
no_wait=0
out=""
keep=0
collectors=1
brokers=1
postgres=0
registry_change=0
mode=""
fleet_args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --devices) [ $# -ge 2 ] || usage; devices="$2"; shift 2 ;;
        --days) [ $# -ge 2 ] || usage; days="$2"; shift 2 ;;
        --seed) [ $# -ge 2 ] || usage; seed="$2"; shift 2 ;;
        --workers) [ $# -ge 2 ] || usage; workers="$2"; shift 2 ;;
        --wait) [ $# -ge 2 ] || usage; wait_seconds="$2"; shift 2 ;;
        --no-wait) no_wait=1; shift ;;
        --out) [ $# -ge 2 ] || usage; out="$2"; shift 2 ;;
        --keep) keep=1; shift ;;
        --collectors) [ $# -ge 2 ] || usage; collectors="$2"; shift 2 ;;
        --brokers) [ $# -ge 2 ] || usage; brokers="$2"; shift 2 ;;
        --postgres) postgres=1; shift ;;
        --registry-change) registry_change=1; shift ;;
        --scale) mode=scale; shift ;;
        --complete-agents) mode=agents; shift ;;
        -h | --help) usage 0 ;;
        --) shift; fleet_args=("$@"); break ;;
        *) echo "run-demo: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
for n in "$devices" "$days" "$seed"; do
    [[ "$n" =~ ^[0-9]+$ ]] || { echo "run-demo: --devices, --days and --seed take whole numbers" >&2; exit 2; }
done
[[ "$collectors" =~ ^[1-9][0-9]?$ ]] || { echo "run-demo: --collectors takes 1 to 99" >&2; exit 2; }
[[ "$brokers" =~ ^[1-9]$ ]] || { echo "run-demo: --brokers takes 1 to 9" >&2; exit 2; }
[ -z "$wait_seconds" ] || [[ "$wait_seconds" =~ ^[0-9]+$ ]] || { echo "run-demo: --wait takes seconds" >&2; exit 2; }
[ "$registry_change" -eq 0 ] || [ "$days" -ge 3 ] ||
    { echo "run-demo: --registry-change needs --days 3 or more (a day before the change, the change, and after)" >&2; exit 2; }
if [ -z "$mode" ]; then
    # A complete agent costs about 0.5 ms of CPU per report end to end here (README, "How
    # fast"): 100,000 devices for a day would take over 15 minutes; the scale mode, 2 to 3.
    if [ "$devices" -ge 20000 ] && [ "$registry_change" -eq 0 ]; then mode=scale; else mode=agents; fi
fi
if [ "$mode" = scale ]; then
    [ "$registry_change" -eq 0 ] ||
        { echo "run-demo: --registry-change needs complete agents (the scale mode keeps no agent state to move)" >&2; exit 2; }
    [ -z "$workers" ] || { echo "run-demo: --workers is for complete agents; the scale mode runs in one process" >&2; exit 2; }
fi
if [ -z "$workers" ]; then
    # Two processes pay off once the fleet is large (each device costs a few ms per cycle).
    if [ "$devices" -ge 5000 ]; then workers=2; else workers=1; fi
fi

say() { printf '== %s\n' "$*" >&2; }

# --- system packages: the broker (and mosquitto_passwd), openssl for the test CA ---------
find_mosquitto() {
    command -v mosquitto 2>/dev/null || { [ -x /usr/sbin/mosquitto ] && echo /usr/sbin/mosquitto; } || true
}
need=()
[ -n "$(find_mosquitto)" ] && command -v mosquitto_passwd >/dev/null 2>&1 || need+=(mosquitto)
command -v openssl >/dev/null 2>&1 || need+=(openssl)
find_pg_bin() { # the directory of initdb and pg_ctl (Debian keeps them off PATH)
    local d
    for d in /usr/lib/postgresql/*/bin; do [ -x "$d/initdb" ] && { echo "$d"; return; }; done
    command -v initdb >/dev/null 2>&1 && dirname "$(command -v initdb)"
    true
}
[ "$postgres" -eq 0 ] || [ -n "$(find_pg_bin)" ] || need+=(postgresql)
if [ ${#need[@]} -gt 0 ]; then
    say "installing ${need[*]} from the distribution's packages"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
mosquitto_bin="$(find_mosquitto)"
[ -n "$mosquitto_bin" ] || { echo "run-demo: mosquitto is not installed and could not be installed" >&2; exit 1; }
pg_bin=""
if [ "$postgres" -eq 1 ]; then
    pg_bin="$(find_pg_bin)"
    [ -n "$pg_bin" ] || { echo "run-demo: PostgreSQL is not installed and could not be installed" >&2; exit 1; }
fi

# --- the virtual environment ----------------------------------------------------------------
if [ ! -x .venv/bin/python ]; then
    say "creating the virtual environment .venv"
    python3 -m venv .venv
fi
# The demo runs a collector and the simulator on this machine: their extras, not only a device's base.
if ! .venv/bin/python -c 'import fleet.cli, collector.service, collector.http' >/dev/null 2>&1 || [ ! -x .venv/bin/ldp-fleet ]; then
    say "installing ldp-telemetry[collector,fleet] into .venv"
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e '.[collector,fleet]'
fi
py=.venv/bin/python

# --- a working directory, and cleanup on every exit ----------------------------------------
work="$(mktemp -d "${TMPDIR:-/tmp}/ldp-demo.XXXXXX")"
[ -n "$out" ] || out="$work/results"
mkdir -p "$out"
broker_pids=()
collector_pids=()
pg_started=0
pg_dir=""
interrupted=0
# initdb refuses to run as root: as root the demo's database belongs to "nobody".
pg_user=""
[ "$(id -u)" -ne 0 ] || pg_user="nobody"
as_pg_user() { if [ -n "$pg_user" ]; then runuser -u "$pg_user" -- "$@"; else "$@"; fi; }
cleanup() {
    trap - EXIT INT TERM
    local pid
    for pid in ${collector_pids[@]+"${collector_pids[@]}"}; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in ${collector_pids[@]+"${collector_pids[@]}"}; do
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    done
    if [ "$pg_started" -eq 1 ]; then
        as_pg_user "$pg_bin/pg_ctl" -D "$pg_dir/data" -m fast -w stop >/dev/null 2>&1 || true
    fi
    for pid in ${broker_pids[@]+"${broker_pids[@]}"}; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in ${broker_pids[@]+"${broker_pids[@]}"}; do
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    done
    if [ "$keep" -eq 0 ]; then
        for part in pki secrets broker collector-*; do rm -rf "${work:?}/"$part; done
        [ -z "$pg_dir" ] || rm -rf "$pg_dir"
        # The default results directory is removed only when nothing was written into it.
        [ "$out" != "$work/results" ] || rmdir "$out" 2>/dev/null || true
        rmdir "$work" 2>/dev/null || true
    fi
    if [ "$interrupted" -eq 1 ]; then
        if [ "$keep" -eq 1 ]; then
            echo "run-demo: stopped; the working files stay in $work" >&2
        else
            echo "run-demo: stopped; the broker and the collectors are down and their files removed" >&2
        fi
    fi
}
trap cleanup EXIT
trap 'interrupted=1; echo >&2; exit 130' INT TERM

free_port() {
    "$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}
wait_for() { # wait_for SECONDS PYTHON-CONDITION WHAT
    local deadline=$((SECONDS + $1))
    until "$py" -c "$2" >/dev/null 2>&1; do
        if [ $SECONDS -ge $deadline ]; then
            echo "run-demo: $3 did not come up within $1 s (logs in $work)" >&2
            keep=1
            exit 1
        fi
        sleep 0.2
    done
}

# --- certificates and broker users (the deploy scripts of docs/deploy.md) -----------------
say "making a test CA and broker users in $work"
deploy/make-test-ca.sh "$work/pki" >/dev/null
# The collector, and the fleet simulator's own user: it publishes each simulated device under
# ldp/v1/reports/fleet-sim/<device>/ (deploy/mosquitto/acl.fleet-sim), so the broker's ACL and the
# collector's per-device allowance hold for every simulated device.
deploy/make-broker-users.sh --user collector --user fleet-sim "$work/broker/passwd" "$work/secrets" >/dev/null

# --- the brokers: deploy/mosquitto/mosquitto.conf with its paths and ports moved here -----
# Every broker shares the users, the ACL and the certificates; each has its own ports, data
# and log (broker/1, broker/2, ...). With several, nothing links them: a device picks one.
cat deploy/mosquitto/acl deploy/mosquitto/acl.fleet-sim >"$work/broker/acl"
cp "$work/pki/ca.pem" "$work/pki/broker.pem" "$work/pki/broker.key" "$work/broker/"
mqtt_ports=()
for b in $(seq "$brokers"); do
    mqtt_port="$(free_port)"
    mtls_port="$(free_port)"
    mqtt_ports+=("$mqtt_port")
    bdir="$work/broker/$b"
    mkdir -p "$bdir/data"
    sed -e "s|^listener 8883\$|listener $mqtt_port 127.0.0.1|" \
        -e "s|^listener 8884\$|listener $mtls_port 127.0.0.1|" \
        -e "s|/etc/mosquitto/ldp/|$work/broker/|g" \
        -e "s|^persistence_location .*|persistence_location $bdir/data/|" \
        -e "s|^user .*|user $(id -un)|" \
        -e "s|^pid_file .*||" \
        -e "s|^log_dest .*|log_dest file $bdir/mosquitto.log|" \
        deploy/mosquitto/mosquitto.conf >"$bdir/mosquitto.conf"
    grep -q "^listener $mqtt_port 127.0.0.1" "$bdir/mosquitto.conf" ||
        { echo "run-demo: deploy/mosquitto/mosquitto.conf has no 'listener 8883' line to move" >&2; exit 1; }
    if [ "$brokers" -eq 1 ]; then
        say "starting Mosquitto on 127.0.0.1:$mqtt_port (TLS, passwords, ACL)"
    else
        say "starting Mosquitto $b of $brokers on 127.0.0.1:$mqtt_port (TLS, passwords, ACL)"
    fi
    "$mosquitto_bin" -c "$bdir/mosquitto.conf" >"$bdir/stdout.log" 2>&1 &
    broker_pids+=($!)
    wait_for 15 "import socket; socket.create_connection(('127.0.0.1', $mqtt_port), timeout=0.5)" "Mosquitto $b"
done
broker_list="$(printf '127.0.0.1:%s,' "${mqtt_ports[@]}")"
broker_list="${broker_list%,}"
if [ "$brokers" -eq 1 ]; then
    broker_lines="host = \"127.0.0.1\"
port = ${mqtt_ports[0]}"
else
    broker_lines="addresses = [$(printf '"127.0.0.1:%s", ' "${mqtt_ports[@]}" | sed 's/, $//')]"
fi

# --- the checkpoint store: a SQLite file, or a PostgreSQL server of the demo's own --------
if [ "$postgres" -eq 1 ]; then
    # A cluster of the demo's own, reachable only through its Unix socket, with trust
    # authentication for local connections (a deployment uses a password: docs/deploy.md).
    # It lives directly under /tmp: the server's account must reach it (as root, "nobody",
    # which may not enter $TMPDIR), and a socket's path must stay under 108 bytes.
    pg_dir="$(mktemp -d /tmp/ldp-demo-pg.XXXXXX)"
    [ -z "$pg_user" ] || chown "$pg_user" "$pg_dir"
    say "starting PostgreSQL $("$pg_bin/postgres" --version | awk '{print $3}') on a socket in $pg_dir"
    as_pg_user "$pg_bin/initdb" -D "$pg_dir/data" -U ldp --auth=trust -E UTF8 --data-checksums --no-sync \
        >"$pg_dir/initdb.log" 2>&1 ||
        { echo "run-demo: initdb failed (see $pg_dir/initdb.log)" >&2; keep=1; exit 1; }
    as_pg_user "$pg_bin/pg_ctl" -D "$pg_dir/data" -l "$pg_dir/server.log" -w -t 60 \
        -o "-c listen_addresses='' -c unix_socket_directories='$pg_dir'" start >/dev/null ||
        { echo "run-demo: PostgreSQL did not start (see $pg_dir/server.log)" >&2; keep=1; exit 1; }
    pg_started=1
    as_pg_user "$pg_bin/createdb" -h "$pg_dir" -U ldp ldp
    store_line="url = \"postgresql://ldp@/ldp?host=$pg_dir\""
else
    store_line="path = \"$work/collector-1/collector.sqlite3\""
fi

# --- the registries ------------------------------------------------------------------------
# With --registry-change the collectors accept both files (the second is current), and the use
# case the second one drops is retired from the day after the change: the devices that have not
# moved still report it, and those reports are refused as "retired".
registry_lines="registry = \"$root/deploy/fleet.usecases.toml\""
fleet_registry_args=(--registry deploy/fleet.usecases.toml)
if [ "$registry_change" -eq 1 ]; then
    change_day=$((days / 2 + 1))
    start=$(( $(date -u +%s) / 86400 * 86400 - days * 86400 ))
    retire_day="$(date -u -d "@$((start + change_day * 86400))" +%F)"
    registry_lines="registry = \"$root/deploy/fleet.usecases.v2.toml\"
earlier_registries = [\"$root/deploy/fleet.usecases.toml\"]

[retire]
\"safari-energy-domains\" = $retire_day"
    fleet_registry_args+=(--registry-change deploy/fleet.usecases.v2.toml --change-at-day "$change_day")
    say "registry change: half the fleet moves to deploy/fleet.usecases.v2.toml on day $change_day; safari-energy-domains retired from $retire_day"
fi

# --- the collectors, each with its dashboard on loopback ----------------------------------
# Their retention window must reach back to the first simulated period (6-hour periods).
retention=$(((days + 2) * 4))
group_line=""
[ "$collectors" -eq 1 ] || group_line='shared_group = "demo"'
http_ports=()
for i in $(seq "$collectors"); do
    http_ports+=("$(free_port)")
    dir="$work/collector-$i"
    mkdir -p "$dir"
    cat >"$dir/collector.toml" <<EOF
instance = "demo-$i"
$registry_lines

[mqtt]
$broker_lines
client_id = "ldp-collector-demo-$i"
$group_line
username = "collector"
password_file = "$work/secrets/collector.password"
[mqtt.tls]
ca_file = "$work/pki/ca.pem"

[ingest]
retention_periods = $retention
require_device_identity = true

[store]
$store_line

[http]
host = "127.0.0.1"
port = ${http_ports[$((i - 1))]}

[estimation]
workers = 1
EOF
done
http_port="${http_ports[0]}"
for i in $(seq "$collectors"); do
    dir="$work/collector-$i"
    port="${http_ports[$((i - 1))]}"
    say "starting collector $i of $collectors (dashboard on http://127.0.0.1:$port/)"
    .venv/bin/ldp-collector --config "$dir/collector.toml" --log-level WARNING run >"$dir/collector.log" 2>&1 &
    collector_pids+=($!)
    wait_for 60 "import json, urllib.request; h = json.load(urllib.request.urlopen('http://127.0.0.1:$port/healthz', timeout=2)); assert h.get('connected')" "collector $i"
done

# --- the fleet -----------------------------------------------------------------------------
if [ "$mode" = scale ]; then
    say "running ldp-fleet: $devices devices, $days days, in scale mode (devices simulated in bulk; --complete-agents for one agent per device)"
    mode_args=(--scale)
else
    say "running ldp-fleet: $devices devices, $days days"
    mode_args=(--workers "$workers")
fi
status=0
.venv/bin/ldp-fleet \
    "${fleet_registry_args[@]}" \
    --devices "$devices" --days "$days" --seed "$seed" "${mode_args[@]}" \
    --broker "$broker_list" --ca-file "$work/pki/ca.pem" \
    --username fleet-sim --password-file "$work/secrets/fleet-sim.password" \
    --collector-url "http://127.0.0.1:$http_port" \
    --output "$out/results.json" --plots "$out/plots" \
    ${fleet_args[@]+"${fleet_args[@]}"} || status=$?

if [ "$brokers" -gt 1 ]; then
    # What each broker carried, summed over the collectors (each member sees its share).
    "$py" - "${http_ports[@]}" <<'PY' || true
import json, sys, urllib.request
totals = {}
for port in sys.argv[1:]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as response:
        for broker in json.load(response).get("brokers", []):
            totals[broker["address"]] = totals.get(broker["address"], 0) + broker["received"]
print("Reports received per broker: " + ", ".join(f"{a} {n:,}" for a, n in sorted(totals.items())))
PY
fi
echo
echo "Dashboard (the same estimates, latest period per use case): http://127.0.0.1:$http_port/"
if [ "$collectors" -gt 1 ]; then
    echo "Every collector of the group serves the same estimates:$(printf ' http://127.0.0.1:%s/' "${http_ports[@]}")"
fi
echo "Results: $out/results.json, plots in $out/plots/"
if [ "$no_wait" -eq 0 ] || [ "$keep" -eq 1 ]; then
    echo "From the command line: .venv/bin/ldp-collector --config $work/collector-1/collector.toml estimate emoji"
fi
if [ "$no_wait" -eq 1 ]; then
    exit "$status"
fi
if [ -n "$wait_seconds" ]; then
    echo "Keeping the broker and the collector up for $wait_seconds s (Ctrl-C stops them sooner)."
    end=$((SECONDS + wait_seconds))
else
    echo "Keeping the broker and the collector up until Ctrl-C."
    end=-1
fi
while [ "$end" -lt 0 ] || [ $SECONDS -lt $end ]; do
    for pid in "${collector_pids[@]}"; do
        kill -0 "$pid" 2>/dev/null && continue
        # Ctrl-C reaches the collectors too, and a collector stops on SIGINT by itself, with
        # status 0: that is the demo being stopped, not a crash, whether or not the trap above
        # has run yet (it never runs when a shell started the demo in the background, with
        # SIGINT ignored, which bash then cannot trap). Any other status is a failure, whose
        # files are kept.
        collector_status=0
        wait "$pid" || collector_status=$?
        if [ "$collector_status" -eq 0 ]; then
            interrupted=1
            exit 130
        fi
        echo "run-demo: a collector stopped with status $collector_status (see $work)" >&2
        keep=1
        exit 1
    done
    sleep 1
done
exit "$status"
