/*
 * ldp_client: record values through the ldp-telemetry agent's local socket (docs/agent-api.md).
 *
 * C99, POSIX sockets, nothing beyond libc. One request per connection: a line of JSON written
 * by a small writer, one line of JSON read back by a small reader that takes only what a
 * `record` reply holds. A reply longer than LDP_MAX_REPLY_BYTES, or one that is not the
 * protocol's JSON, is refused (LDP_REPLY_TOO_LARGE, LDP_PROTOCOL_ERROR) and nothing of it is
 * trusted. Each `error` kind of the protocol is a status of its own; a kind this client does
 * not know is LDP_REFUSED_OTHER, with the agent's kind and message kept in the client.
 *
 *     ldp_client client;
 *     ldp_outcome outcome;
 *     ldp_client_init(&client, NULL);   // $LDP_AGENT_SOCKET, else /run/ldp-agent/agent.sock
 *     ldp_status status = ldp_record_string(&client, "emoji", "\xF0\x9F\x98\x80", &outcome);
 *     if (status != LDP_OK)
 *         fprintf(stderr, "%s: %s\n", ldp_status_name(status), client.message);
 *
 * `ldp-agent generate --language c REGISTRY` writes one typed function per use case on top of
 * these (docs/agent-api.md, "Clients").
 */
#ifndef LDP_CLIENT_H
#define LDP_CLIENT_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LDP_DEFAULT_SOCKET "/run/ldp-agent/agent.sock"
#define LDP_SOCKET_VARIABLE "LDP_AGENT_SOCKET"
/* The longest request line the agent reads, and the longest reply line this client reads. */
#define LDP_MAX_REQUEST_BYTES 65536
#define LDP_MAX_REPLY_BYTES 65536
#define LDP_PATH_BYTES 108
#define LDP_TEXT_BYTES 1024

typedef enum ldp_status {
    LDP_OK = 0,
    /* The agent refused the request: one status per `error` kind of the protocol. */
    LDP_BAD_REQUEST,
    LDP_UNKNOWN_USE_CASE,
    LDP_VALUE_REFUSED,
    LDP_CONSENT_REQUIRED,
    LDP_USE_CASE_STOPPED,
    LDP_USE_CASE_EXPIRED,
    LDP_STATE_UNREADABLE,
    LDP_STATE_UNWRITABLE,
    LDP_BUSY,
    LDP_REFUSED_OTHER, /* an `error` kind this client does not know (client.error_kind names it) */
    /* No answer that can be used. */
    LDP_UNAVAILABLE,     /* no socket, nothing listening on it, or no reply within the timeout */
    LDP_PROTOCOL_ERROR,  /* the reply is not one line of the protocol's JSON */
    LDP_REPLY_TOO_LARGE, /* the reply is longer than LDP_MAX_REPLY_BYTES */
    LDP_INVALID_ARGUMENT /* the caller's mistake: a NULL, not UTF-8, not finite, too long */
} ldp_status;

typedef enum ldp_outcome_kind {
    LDP_RECORDED,  /* kept: privatized now, or added to the period's running total */
    LDP_DUPLICATE, /* not added: the string is already recorded this period */
    LDP_DROPPED    /* not added: too many distinct strings this period */
} ldp_outcome_kind;

/* The agent's answer to a record (docs/agent-api.md, "record"). */
typedef struct ldp_outcome {
    ldp_outcome_kind outcome;
    bool counter;          /* joined the period's running total, sent once when the period ends */
    long long offered;     /* values recorded this period (event-level use cases) */
    long long limit;       /* the daily record limit */
    long long over_limit;  /* how many of them the limit drops (a random sample is sent) */
    char note[LDP_TEXT_BYTES]; /* a counter value beyond its range and the clamping; "" if none */
} ldp_outcome;

typedef struct ldp_client {
    char socket_path[LDP_PATH_BYTES];
    int timeout_ms;      /* to connect and to get the whole reply (default 10,000) */
    int busy_retries;    /* how many times a busy agent is asked again (default 3) */
    int busy_backoff_ms; /* before the first retry; each next one waits twice as long (default 50) */
    /* After a call that did not return LDP_OK: the agent's `error` kind ("" if it sent none) and
       its message, or this client's sentence saying what went wrong. */
    char error_kind[64];
    char message[LDP_TEXT_BYTES];
} ldp_client;

/* socket_path NULL: $LDP_AGENT_SOCKET, else LDP_DEFAULT_SOCKET. LDP_INVALID_ARGUMENT if it is too long. */
ldp_status ldp_client_init(ldp_client *client, const char *socket_path);

/* Record one value. `key` names a counter's key (an application, say); NULL for none, and for
   use cases that are not counters. `outcome` may be NULL. */
ldp_status ldp_record_bool(ldp_client *client, const char *use_case, bool value, ldp_outcome *outcome);
ldp_status ldp_record_int(ldp_client *client, const char *use_case, long long value, const char *key,
                          ldp_outcome *outcome);
ldp_status ldp_record_double(ldp_client *client, const char *use_case, double value, const char *key,
                             ldp_outcome *outcome);
ldp_status ldp_record_string(ldp_client *client, const char *use_case, const char *value, ldp_outcome *outcome);
/* The value as text, read by the use case's kind (as `ldp-agent record` does). */
ldp_status ldp_record_text(ldp_client *client, const char *use_case, const char *text, const char *key,
                           ldp_outcome *outcome);

/* "ok", "bad-request", ..., "invalid-argument": the protocol's kinds for the refusals. */
const char *ldp_status_name(ldp_status status);
/* "recorded", "duplicate" or "dropped". */
const char *ldp_outcome_name(ldp_outcome_kind outcome);

#ifdef __cplusplus
}
#endif

#endif /* LDP_CLIENT_H */
