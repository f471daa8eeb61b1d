#!/usr/bin/env bash
# Make a test certificate authority, a broker certificate and client certificates for
# ldp-telemetry's Mosquitto broker. For tests, staging and small private deployments: a
# production fleet should get its broker certificate from the organisation's CA.
#
# Usage: deploy/make-test-ca.sh [options] DIRECTORY
#
#   --broker-host NAME  also name NAME in the broker certificate (repeatable; an IPv4 or
#                       IPv6 address becomes an IP entry, anything else a DNS entry).
#                       localhost, 127.0.0.1 and ::1 are always included.
#   --client NAME       make a client certificate whose common name is NAME (repeatable;
#                       default: "devices" and "collector"). On the broker's mTLS listener
#                       the common name is the user name the ACL sees: a device certificate
#                       (--client dev-0001) may publish only under ldp/v1/reports/dev-0001/
#                       (docs/device-identity.md says how a fleet enrols its devices).
#   --days N            validity of new leaf certificates (default 825; the CA gets 3650).
#   --new-ca            replace an existing CA (and reissue the broker's and the named clients'
#                       certificates under the new one).
#                       Without it an existing CA is never touched.
#
# Writes into DIRECTORY (created mode 0700 if missing):
#   ca.pem, ca.key                 the CA (keep ca.key offline for anything but tests)
#   broker.pem, broker.key         the broker's certificate and key (serverAuth)
#   <name>.pem, <name>.key         one client certificate and key per --client (clientAuth)
# Keys are ECDSA P-256, mode 0600; certificates mode 0644.
#
# Idempotent: a run keeps every file that is still valid (signed by the current CA, not
# expiring within a day, and for the broker naming every requested host) and makes only
# what is missing or stale, so running it twice changes nothing.
set -euo pipefail

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0" >&2
    exit "${1:-2}"
}

die() {
    echo "make-test-ca: $*" >&2
    exit 1
}

hosts=(localhost 127.0.0.1 ::1)
clients=()
days=825
new_ca=0
dir=""
while [ $# -gt 0 ]; do
    case "$1" in
        --broker-host) [ $# -ge 2 ] || usage; hosts+=("$2"); shift 2 ;;
        --client) [ $# -ge 2 ] || usage; clients+=("$2"); shift 2 ;;
        --days) [ $# -ge 2 ] || usage; days="$2"; shift 2 ;;
        --new-ca) new_ca=1; shift ;;
        -h | --help) usage 0 ;;
        --*) die "unknown option $1 (see --help)" ;;
        *) [ -z "$dir" ] || usage; dir="$1"; shift ;;
    esac
done
[ -n "$dir" ] || usage
[ ${#clients[@]} -gt 0 ] || clients=(devices collector)
[[ "$days" =~ ^[1-9][0-9]*$ ]] || die "--days needs a positive whole number of days, got '$days'"
for name in "${clients[@]}"; do
    # The name becomes a file name and a certificate subject: keep it to a safe alphabet.
    [[ "$name" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] || die "client name '$name' must match [A-Za-z0-9][A-Za-z0-9._-]*"
    case "$name" in ca | broker) die "client name '$name' is reserved for the CA and broker files" ;; esac
done
command -v openssl >/dev/null 2>&1 || die "openssl is not installed"

umask 077
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
work="$(mktemp -d "$dir/.make-test-ca.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# Write a file's new content next to it and rename it into place: a crash leaves either
# the old file or the new one, never half of one.
install_file() { # install_file SOURCE DEST MODE
    chmod "$3" "$1"
    mv -f "$1" "$2"
}

new_key() { # new_key PATH
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null
}

serial() {
    # A random positive 127-bit serial (RFC 5280 §4.1.2.2: unique, at most 20 octets).
    echo "0x$(openssl rand -hex 16 | sed 's/^./7/')"
}

# --- the CA -----------------------------------------------------------------------------
ca_key="$dir/ca.key"
ca_pem="$dir/ca.pem"
reissue_all=0
if [ -e "$ca_key" ] || [ -e "$ca_pem" ]; then
    if [ "$new_ca" -eq 0 ]; then
        [ -f "$ca_key" ] && [ -f "$ca_pem" ] ||
            die "$dir holds only half a CA (ca.key or ca.pem is missing); pass --new-ca to replace it"
        # The pair must belong together, or every certificate signed below would be unusable.
        [ "$(openssl pkey -in "$ca_key" -pubout 2>/dev/null)" = "$(openssl x509 -in "$ca_pem" -noout -pubkey 2>/dev/null)" ] ||
            die "$ca_key does not match $ca_pem; pass --new-ca to replace the CA"
        openssl x509 -in "$ca_pem" -noout -checkend 86400 >/dev/null ||
            die "the CA in $ca_pem expires within a day; pass --new-ca to replace it"
    fi
fi
if [ ! -e "$ca_pem" ] || [ "$new_ca" -eq 1 ]; then
    new_key "$work/ca.key"
    openssl req -x509 -new -key "$work/ca.key" -sha256 -days 3650 -set_serial "$(serial)" \
        -subj "/O=ldp-telemetry/CN=ldp-telemetry test CA" \
        -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -addext "subjectKeyIdentifier=hash" \
        -out "$work/ca.pem" 2>/dev/null
    install_file "$work/ca.key" "$ca_key" 0600
    install_file "$work/ca.pem" "$ca_pem" 0644
    reissue_all=1
    echo "make-test-ca: made a new CA in $ca_pem"
fi

# --- leaf certificates ------------------------------------------------------------------
# still_valid PEM KEY: the certificate exists, matches its key, chains to the CA and lives
# at least another day.
still_valid() {
    [ "$reissue_all" -eq 0 ] && [ -f "$1" ] && [ -f "$2" ] || return 1
    openssl verify -CAfile "$ca_pem" "$1" >/dev/null 2>&1 || return 1
    openssl x509 -in "$1" -noout -checkend 86400 >/dev/null 2>&1 || return 1
    [ "$(openssl pkey -in "$2" -pubout 2>/dev/null)" = "$(openssl x509 -in "$1" -noout -pubkey 2>/dev/null)" ]
}

# issue NAME SUBJECT EXTENSIONS: a fresh key and a certificate signed by the CA.
issue() {
    local name="$1" subject="$2" extensions="$3"
    new_key "$work/$name.key"
    openssl req -new -key "$work/$name.key" -subj "$subject" -out "$work/$name.csr" 2>/dev/null
    printf '%s\n' "$extensions" >"$work/$name.ext"
    openssl x509 -req -in "$work/$name.csr" -CA "$ca_pem" -CAkey "$ca_key" -set_serial "$(serial)" \
        -sha256 -days "$days" -extfile "$work/$name.ext" -out "$work/$name.pem" 2>/dev/null
    install_file "$work/$name.key" "$dir/$name.key" 0600
    install_file "$work/$name.pem" "$dir/$name.pem" 0644
    echo "make-test-ca: issued $dir/$name.pem ($subject)"
}

common_extensions="basicConstraints=critical,CA:FALSE
subjectKeyIdentifier=hash
authorityKeyIdentifier=keyid,issuer"

# The broker certificate names every host clients may dial; clients check it (RFC 6125).
san=""
for host in "${hosts[@]}"; do
    if [[ "$host" =~ ^[0-9.]+$ || "$host" == *:* ]]; then entry="IP:$host"; else entry="DNS:$host"; fi
    case ",$san," in *",$entry,"*) ;; *) san="${san:+$san,}$entry" ;; esac
done
broker_names_ok() {
    local host check
    for host in "${hosts[@]}"; do
        # Let openssl match the names (it compares IPv6 addresses in any spelling).
        if [[ "$host" =~ ^[0-9.]+$ || "$host" == *:* ]]; then check=-checkip; else check=-checkhost; fi
        openssl x509 -in "$dir/broker.pem" -noout "$check" "$host" 2>/dev/null | grep -q " does match " || return 1
    done
}
if still_valid "$dir/broker.pem" "$dir/broker.key" && broker_names_ok; then
    echo "make-test-ca: kept $dir/broker.pem"
else
    issue broker "/O=ldp-telemetry/CN=localhost" "$common_extensions
keyUsage=critical,digitalSignature
extendedKeyUsage=serverAuth
subjectAltName=$san"
fi

for name in "${clients[@]}"; do
    if still_valid "$dir/$name.pem" "$dir/$name.key" &&
        [ "$(openssl x509 -in "$dir/$name.pem" -noout -subject -nameopt multiline | sed -n 's/^ *commonName *= //p')" = "$name" ]; then
        echo "make-test-ca: kept $dir/$name.pem"
    else
        issue "$name" "/O=ldp-telemetry/CN=$name" "$common_extensions
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth"
    fi
done
