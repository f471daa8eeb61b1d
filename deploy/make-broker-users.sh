#!/usr/bin/env bash
# Make or update the Mosquitto password file for ldp-telemetry's broker users, and the
# password files the agent and the collector present (as systemd credentials).
#
# Usage: deploy/make-broker-users.sh [--user NAME]... PASSWORD_FILE SECRETS_DIRECTORY
#
#   --user NAME        a broker user to (re)hash into PASSWORD_FILE (repeatable; default:
#                      "devices" and "collector", the two roles of deploy/mosquitto/acl).
#                      A name the ACL does not list can connect but may do nothing.
#   PASSWORD_FILE      the broker's password file (mosquitto.conf: password_file). Lines of
#                      users not named here are kept as they are.
#   SECRETS_DIRECTORY  holds one <name>.password per user (mode 0600, no trailing newline).
#                      A missing one is made from 32 random bytes; an existing one is reused,
#                      so a second run leaves every credential valid.
#
# Passwords never appear on a command line (mosquitto_passwd -b would show them in ps):
# they go through a private temporary file that mosquitto_passwd -U hashes in place
# (PBKDF2-SHA512 with a random salt). Then:
#   agent host:     install -m 0600 SECRETS_DIRECTORY/devices.password /etc/ldp-agent/broker-password
#   collector host: install -m 0600 SECRETS_DIRECTORY/collector.password /etc/ldp-collector/broker-password
set -euo pipefail

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
    exit "${1:-2}"
}

die() {
    echo "make-broker-users: $*" >&2
    exit 1
}

users=()
positional=()
while [ $# -gt 0 ]; do
    case "$1" in
        --user) [ $# -ge 2 ] || usage; users+=("$2"); shift 2 ;;
        -h | --help) usage 0 ;;
        --*) die "unknown option $1 (see --help)" ;;
        *) positional+=("$1"); shift ;;
    esac
done
[ ${#positional[@]} -eq 2 ] || usage
passwd_file="${positional[0]}"
secrets="${positional[1]}"
[ ${#users[@]} -gt 0 ] || users=(devices collector)
for name in "${users[@]}"; do
    # ':' ends the user name in the password file; keep names to a plain alphabet.
    [[ "$name" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || die "user name '$name' must match [A-Za-z0-9][A-Za-z0-9._-]*"
done
mosquitto_passwd="$(command -v mosquitto_passwd || true)"
[ -n "$mosquitto_passwd" ] || die "mosquitto_passwd is not installed (Debian: apt-get install mosquitto)"

umask 077
mkdir -p "$secrets" "$(dirname "$passwd_file")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

for name in "${users[@]}"; do
    secret="$secrets/$name.password"
    if [ ! -s "$secret" ]; then
        # 32 bytes from the OS CSPRNG, base64url without padding: no ':' and no newline,
        # so the same bytes work in the password file and as a credential file.
        head -c 32 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n' >"$work/secret"
        chmod 0600 "$work/secret"
        mv -f "$work/secret" "$secret"
        echo "make-broker-users: made a password for '$name' in $secret"
    fi
    password="$(head -n 1 "$secret")"
    case "$password" in *:*) die "$secret contains ':', which the password file cannot hold" ;; esac
    printf '%s:%s\n' "$name" "$password" >>"$work/plain"
done

"$mosquitto_passwd" -U "$work/plain"

# Keep the entries of users this run does not manage, below the new ones.
if [ -f "$passwd_file" ]; then
    pattern="^($(printf '%s|' "${users[@]}" | sed 's/[.]/\\./g; s/|$//')):"
    grep -Ev "$pattern" "$passwd_file" >>"$work/plain" || true
fi
chmod 0600 "$work/plain"
# Same directory as the target, so the final rename is atomic.
tmp="$(mktemp "$(dirname "$passwd_file")/.passwd.XXXXXX")"
cat "$work/plain" >"$tmp"
mv -f "$tmp" "$passwd_file"
echo "make-broker-users: wrote $passwd_file (${users[*]})"
