#!/usr/bin/env bash
# Install one role of ldp-telemetry on this host, as root: the Mosquitto broker, the
# collector, or the agent, with the files, owners and modes the systemd units expect.
# docs/deploy.md walks through what each step does; tests/deploy/test_container.py runs this
# script in a booted Debian 12 container and checks that a report reaches an estimate.
#
# Usage: deploy/install.sh [options] broker|collector|agent
#
#   --pki DIR          the certificates (deploy/make-test-ca.sh DIR, or the organisation's):
#                      ca.pem for every role, broker.pem and broker.key for the broker.
#                      Default /root/ldp-pki.
#   --passwd FILE      the broker's password file (deploy/make-broker-users.sh).
#                      Default DIR/passwd of --pki.
#   --secrets DIR      the clients' passwords (deploy/make-broker-users.sh): the collector
#                      installs collector.password, the agent <--device>.password.
#                      Default /root/ldp-secrets.
#   --device NAME      the agent's broker user, its identity: it may publish only under
#                      ldp/v1/reports/NAME/ (docs/device-identity.md). Written into a newly
#                      installed agent.toml as broker.username. Give every device its own
#                      (make-broker-users.sh --user NAME). Default devices.
#   --broker-host NAME the broker's host name, written into a newly installed config
#                      (it must be a name in the broker's certificate). Default localhost.
#   --registry FILE    the use-case registry (default deploy/usecases.example.toml); the
#                      collector also gets the dictionaries it names, from --dictionaries.
#   --dictionaries DIR where the registry's relative dictionary paths are found
#                      (default: the registry's directory, then deploy/).
#   --package SPEC     what pip installs (default: this checkout): a directory, a wheel or
#                      a project name with an optional version. The collector role adds
#                      the [collector] extra (HTTP server, Prometheus client, PostgreSQL
#                      driver); the agent role installs the base alone. One virtualenv
#                      serves both tools: /opt/ldp-telemetry/.venv, linked from /usr/local/bin.
#   --wheels DIR       install from the wheels in DIR only (pip --no-index --find-links),
#                      for hosts without access to PyPI.
#   --no-start         install and enable the service, but do not (re)start it.
#
# Idempotent: a second run upgrades the package and the units, replaces the registry, the
# dictionaries, the CA and the broker files, and keeps what an operator owns: an existing
# agent.toml or collector.toml, the agent's state key, and the agent's state.
# Needs systemd 250 or later (LoadCredentialEncrypted=, systemd-creds) and Python 3.11.
set -euo pipefail

usage() { # --help prints to stdout and exits 0; a wrong command line gets it on stderr, exit 2
    if [ "${1:-2}" -eq 0 ]; then
        sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
    else
        sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
    fi
    exit "${1:-2}"
}

die() {
    echo "install: $*" >&2
    exit 1
}

say() {
    echo "install: $*"
}

deploy="$(cd "$(dirname "$0")" && pwd)"
checkout="$(dirname "$deploy")"
prefix=/opt/ldp-telemetry
venv="$prefix/.venv"
pki=/root/ldp-pki
passwd=""
secrets=/root/ldp-secrets
broker_host=localhost
device=devices
registry="$deploy/usecases.example.toml"
dictionaries=""
package="$checkout"
wheels=""
start=1
role=""
while [ $# -gt 0 ]; do
    case "$1" in
        --pki) [ $# -ge 2 ] || usage; pki="$2"; shift 2 ;;
        --passwd) [ $# -ge 2 ] || usage; passwd="$2"; shift 2 ;;
        --secrets) [ $# -ge 2 ] || usage; secrets="$2"; shift 2 ;;
        --broker-host) [ $# -ge 2 ] || usage; broker_host="$2"; shift 2 ;;
        --device) [ $# -ge 2 ] || usage; device="$2"; shift 2 ;;
        --registry) [ $# -ge 2 ] || usage; registry="$2"; shift 2 ;;
        --dictionaries) [ $# -ge 2 ] || usage; dictionaries="$2"; shift 2 ;;
        --package) [ $# -ge 2 ] || usage; package="$2"; shift 2 ;;
        --wheels) [ $# -ge 2 ] || usage; wheels="$2"; shift 2 ;;
        --no-start) start=0; shift ;;
        -h | --help) usage 0 ;;
        --*) die "unknown option $1 (see --help)" ;;
        *) [ -z "$role" ] || usage; role="$1"; shift ;;
    esac
done
case "$role" in broker | collector | agent) ;; *) usage ;; esac
[ -n "$passwd" ] || passwd="$pki/passwd"
[[ "$broker_host" =~ ^[A-Za-z0-9.:-]+$ ]] || die "--broker-host '$broker_host' is not a host name or address"
# The name is one topic level of the broker's ACL (pattern ldp/v1/reports/%u/+).
[[ "$device" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || die "--device '$device' must match [A-Za-z0-9][A-Za-z0-9._-]*"
[ "$(id -u)" -eq 0 ] || die "run as root: the $role role installs system files and a service"

need_file() { # need_file PATH WHAT
    [ -f "$1" ] && [ -r "$1" ] || die "$1 ($2) is missing or unreadable"
}

systemd_version() {
    systemctl --version | awk 'NR == 1 { print $2 }'
}

check_systemd() {
    command -v systemctl >/dev/null 2>&1 || die "systemctl not found: the $role role runs as a systemd service"
    local v
    v="$(systemd_version)"
    [[ "$v" =~ ^[0-9]+$ ]] && [ "$v" -ge 250 ] || die "systemd $v is too old: the units need 250 or later"
}

# SPEC with the extra EXTRA: "dir[extra]", "file.whl[extra]", "name[extra]==1.0"; a SPEC
# that names extras already is left as it is.
with_extra() { # with_extra SPEC EXTRA
    local spec="$1" extra="$2"
    if [ -z "$extra" ] || [[ "$spec" == *"["* ]]; then
        printf '%s\n' "$spec"
    elif [ -e "$spec" ]; then
        printf '%s[%s]\n' "$spec" "$extra"
    elif [[ "$spec" =~ ^([A-Za-z0-9][A-Za-z0-9._-]*)([^/]*)$ ]]; then
        printf '%s[%s]%s\n' "${BASH_REMATCH[1]}" "$extra" "${BASH_REMATCH[2]}"
    else
        printf '%s\n' "$spec"
    fi
}

# The package, once per host: a virtualenv under /opt that no distribution package touches,
# and links for the operator's shell. The units name the virtualenv's scripts directly.
# The collector's extra brings the server's libraries; a device gets the base install only.
install_package() { # install_package [EXTRA]
    local extra="${1:-}"
    command -v python3 >/dev/null 2>&1 || die "python3 is not installed (Debian: apt-get install python3 python3-venv)"
    python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "Python 3.11 or later is needed"
    if [ ! -x "$venv/bin/python" ]; then
        install -d -m 0755 "$prefix"
        python3 -m venv "$venv" || die "python3 -m venv failed (Debian: apt-get install python3-venv)"
    fi
    local pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check --upgrade)
    if [ -n "$wheels" ]; then
        [ -d "$wheels" ] || die "--wheels $wheels is not a directory"
        pip+=(--no-index --find-links "$wheels")
    fi
    say "installing $(with_extra "$package" "$extra") into $venv"
    # A source tree is built in a private copy: pip builds in place, and the checkout may be
    # read-only or owned by someone else.
    if [ -d "$package" ]; then
        local build
        build="$(mktemp -d)"
        tar -C "$package" --exclude=./.venv --exclude=./.git --exclude=./build --exclude='*.egg-info' \
            --exclude=__pycache__ -cf - . | tar -C "$build" -xf -
        "${pip[@]}" "$(with_extra "$build" "$extra")"
        rm -rf "$build"
    else
        "${pip[@]}" "$(with_extra "$package" "$extra")"
    fi
    local tool
    for tool in ldp-agent ldp-collector ldp-fleet; do
        ln -sfn "$venv/bin/$tool" "/usr/local/bin/$tool"
    done
    chmod -R go-w "$venv"
}

install_unit() { # install_unit NAME
    install -m 0644 "$deploy/$1.service" "/etc/systemd/system/$1.service"
    systemctl daemon-reload
    systemctl enable --quiet "$1.service"
    if [ "$start" -eq 1 ]; then
        systemctl restart "$1.service"
        say "$1.service started"
    fi
}

# The registry, and for the collector the dictionaries it names, world-readable: the
# collector runs as a dynamic user that owns no file here.
install_registry() { # install_registry ETC_DIR WITH_DICTIONARIES
    need_file "$registry" "the use-case registry"
    install -m 0644 "$registry" "$1/usecases.toml"
    [ "$2" -eq 1 ] || return 0
    local rel src base
    # Dictionary paths are relative to the registry file (protocol/registry.py).
    while IFS= read -r rel; do
        [ -n "$rel" ] || continue
        case "$rel" in /*) need_file "$rel" "a dictionary the registry names"; continue ;; esac
        src=""
        for base in ${dictionaries:+"$dictionaries"} "$(dirname "$registry")" "$deploy"; do
            if [ -f "$base/$rel" ]; then src="$base/$rel"; break; fi
        done
        [ -n "$src" ] || die "the registry names the dictionary '$rel'; it is not under ${dictionaries:-$(dirname "$registry")} or $deploy"
        install -d -m 0755 "$1/$(dirname "$rel")"
        install -m 0644 "$src" "$1/$rel"
    done < <(sed -n 's/^[[:space:]]*dictionary[[:space:]]*=[[:space:]]*"\([^"]*\)".*/\1/p' "$registry")
}

# A new config from the example, with this deployment's broker host; an existing one is the
# operator's and stays.
install_config() { # install_config EXAMPLE DEST SECTION_KEY_SED
    if [ -e "$2" ]; then
        say "keeping $2"
        return 0
    fi
    local tmp
    tmp="$(mktemp "$(dirname "$2")/.config.XXXXXX")"
    sed -e "$3" "$1" >"$tmp"
    chmod 0644 "$tmp"
    mv -f "$tmp" "$2"
    say "wrote $2 from $(basename "$1"); review it"
}

role_broker() {
    command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || {
        command -v apt-get >/dev/null 2>&1 || die "Mosquitto 2 is not installed"
        say "installing mosquitto from the distribution"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mosquitto >/dev/null
    }
    getent passwd mosquitto >/dev/null || die "the mosquitto user is missing (the Debian package creates it)"
    need_file "$pki/ca.pem" "the CA certificate"
    need_file "$pki/broker.pem" "the broker certificate"
    need_file "$pki/broker.key" "the broker key"
    need_file "$passwd" "the broker's password file"
    # Mosquitto drops to its user before it opens these files: they belong to it.
    install -d -o root -g mosquitto -m 0750 /etc/mosquitto/ldp
    install -o mosquitto -g mosquitto -m 0644 "$pki/ca.pem" "$pki/broker.pem" /etc/mosquitto/ldp/
    install -o mosquitto -g mosquitto -m 0600 "$pki/broker.key" /etc/mosquitto/ldp/broker.key
    install -o mosquitto -g mosquitto -m 0600 "$passwd" /etc/mosquitto/ldp/passwd
    install -o mosquitto -g mosquitto -m 0600 "$deploy/mosquitto/acl" /etc/mosquitto/ldp/acl
    if [ -f /etc/mosquitto/mosquitto.conf ] && [ ! -e /etc/mosquitto/mosquitto.conf.orig ] &&
        ! cmp -s /etc/mosquitto/mosquitto.conf "$deploy/mosquitto/mosquitto.conf"; then
        cp -p /etc/mosquitto/mosquitto.conf /etc/mosquitto/mosquitto.conf.orig
    fi
    install -m 0644 "$deploy/mosquitto/mosquitto.conf" /etc/mosquitto/mosquitto.conf
    systemctl enable --quiet mosquitto.service
    if [ "$start" -eq 1 ]; then
        systemctl restart mosquitto.service
        say "mosquitto.service started (TLS 8883 with passwords, 8884 with client certificates)"
    fi
}

role_collector() {
    need_file "$pki/ca.pem" "the CA certificate"
    need_file "$secrets/collector.password" "the collector's broker password"
    install_package collector
    # Config, registry, dictionaries and CA world-readable (the dynamic user must read them);
    # the password root-only, handed over by LoadCredential=.
    install -d -m 0755 /etc/ldp-collector
    local client_id
    client_id="ldp-collector-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
    install_config "$deploy/collector.example.toml" /etc/ldp-collector/collector.toml \
        "/^\[mqtt\]/,/^\[/{s/^host = .*/host = \"$broker_host\"/;s/^client_id = \"[^\"]*\"/client_id = \"$client_id\"/}"
    install_registry /etc/ldp-collector 1
    install -m 0644 "$pki/ca.pem" /etc/ldp-collector/ca.pem
    install -m 0600 "$secrets/collector.password" /etc/ldp-collector/broker-password
    install_unit ldp-collector
}

role_agent() {
    need_file "$pki/ca.pem" "the CA certificate"
    need_file "$secrets/$device.password" "the broker password of device $device"
    command -v systemd-creds >/dev/null 2>&1 || die "systemd-creds is missing: the agent's state key needs systemd 250 or later"
    install_package
    # A static system user: the API socket's group (ldp-agent) is how applications get to
    # record, which a dynamic user could not give them (ldp-agent.service).
    if ! getent passwd ldp-agent >/dev/null; then
        useradd --system --user-group --no-create-home --home-dir /var/lib/ldp-agent \
            --shell /usr/sbin/nologin --comment "ldp-telemetry agent" ldp-agent
        say "created the system user ldp-agent"
    fi
    install -d -m 0755 /etc/ldp-agent
    install_config "$deploy/agent.example.toml" /etc/ldp-agent/agent.toml \
        "/^\[broker\]/,/^\[/{s/^host = .*/host = \"$broker_host\"/;s/^username = .*/username = \"$device\"/}"
    install_registry /etc/ldp-agent 0
    install -m 0644 "$pki/ca.pem" /etc/ldp-agent/ca.pem
    install -m 0600 "$secrets/$device.password" /etc/ldp-agent/broker-password
    # The state key: 32 bytes from the CSPRNG straight into an encrypted credential (bound
    # to this host's credential secret, or its TPM), never on disk in the clear. An existing
    # one is kept: a new key would make the sealed state unreadable.
    if [ ! -e /etc/ldp-agent/state-key.cred ]; then
        (
            umask 077
            head -c 32 /dev/urandom | systemd-creds encrypt --name=state-key - /etc/ldp-agent/state-key.cred
        )
        say "made the state key /etc/ldp-agent/state-key.cred"
    fi
    chmod 0600 /etc/ldp-agent/state-key.cred
    install_unit ldp-agent
    say "nothing is recorded before the user opts in: ldp-agent consent grant"
}

case "$role" in
    broker) role_broker ;;
    collector) check_systemd; role_collector ;;
    agent) check_systemd; role_agent ;;
esac
