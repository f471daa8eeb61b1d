/*
 * ldp_client.c: the agent's socket protocol (docs/agent-api.md) in C99 with POSIX sockets.
 *
 * The writer builds a request line in a fixed buffer, escaping strings as JSON requires and
 * refusing text that is not UTF-8 (the agent would answer bad-request). The reader takes one
 * reply line of at most LDP_MAX_REPLY_BYTES and reads the fields of a `record` reply out of it;
 * any other field is skipped whatever its type, to a bounded depth, so a newer agent's extra
 * fields are read past. Anything that is not JSON, or not the shape the protocol gives a reply,
 * is LDP_PROTOCOL_ERROR: a reply is never half-trusted.
 */
#define _POSIX_C_SOURCE 200809L

#include "ldp_client.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#ifndef MSG_NOSIGNAL
#define MSG_NOSIGNAL 0 /* a platform without it: the application's SIGPIPE setting applies */
#endif

#define MAX_DEPTH 32 /* nesting the reader skips through in fields it does not use */

static ldp_status fail(ldp_client *client, ldp_status status, const char *format, ...) {
    va_list args;
    va_start(args, format);
    vsnprintf(client->message, sizeof client->message, format, args);
    va_end(args);
    return status;
}

/* ------------------------------------------------------------------ the request writer */

typedef struct writer {
    char data[LDP_MAX_REQUEST_BYTES + 1];
    size_t length;
    bool overflow;
} writer;

static void put(writer *w, const char *bytes, size_t n) {
    if (w->overflow || n > LDP_MAX_REQUEST_BYTES - w->length) {
        w->overflow = true;
        return;
    }
    memcpy(w->data + w->length, bytes, n);
    w->length += n;
}

static void put_text(writer *w, const char *text) { put(w, text, strlen(text)); }

/* The length of the UTF-8 sequence that starts `s` (0: not UTF-8: overlong, surrogate, beyond U+10FFFF). */
static size_t utf8_length(const unsigned char *s) {
    if (s[0] < 0x80)
        return 1;
    if (s[0] >= 0xC2 && s[0] <= 0xDF)
        return (s[1] & 0xC0) == 0x80 ? 2 : 0;
    if (s[0] >= 0xE0 && s[0] <= 0xEF) {
        if ((s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80)
            return 0;
        if ((s[0] == 0xE0 && s[1] < 0xA0) || (s[0] == 0xED && s[1] >= 0xA0))
            return 0;
        return 3;
    }
    if (s[0] >= 0xF0 && s[0] <= 0xF4) {
        if ((s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
            return 0;
        if ((s[0] == 0xF0 && s[1] < 0x90) || (s[0] == 0xF4 && s[1] >= 0x90))
            return 0;
        return 4;
    }
    return 0;
}

/* A JSON string; false if `text` is not UTF-8. */
static bool put_string(writer *w, const char *text) {
    const unsigned char *s = (const unsigned char *)text;
    put(w, "\"", 1);
    while (*s) {
        size_t n = utf8_length(s);
        if (n == 0)
            return false;
        if (*s == '"' || *s == '\\') {
            char escaped[2] = {'\\', (char)*s};
            put(w, escaped, 2);
        } else if (*s < 0x20) {
            char escaped[7];
            snprintf(escaped, sizeof escaped, "\\u%04x", (unsigned)*s);
            put(w, escaped, 6);
        } else {
            put(w, (const char *)s, n);
        }
        s += n;
    }
    put(w, "\"", 1);
    return true;
}

typedef enum value_kind { VALUE_BOOL, VALUE_INT, VALUE_DOUBLE, VALUE_STRING } value_kind;

typedef struct value {
    value_kind kind;
    const char *field; /* "value" or "text" */
    bool boolean;
    long long integer;
    double number;
    const char *string;
} value;

static ldp_status write_request(ldp_client *client, writer *w, const char *use_case, const value *v,
                                const char *key) {
    char number[64];
    w->length = 0;
    w->overflow = false;
    put_text(w, "{\"op\":\"record\",\"use_case\":");
    if (!put_string(w, use_case))
        return fail(client, LDP_INVALID_ARGUMENT, "the use case's name is not UTF-8");
    put_text(w, ",\"");
    put_text(w, v->field);
    put_text(w, "\":");
    switch (v->kind) {
    case VALUE_BOOL:
        put_text(w, v->boolean ? "true" : "false");
        break;
    case VALUE_INT:
        snprintf(number, sizeof number, "%lld", v->integer);
        put_text(w, number);
        break;
    case VALUE_DOUBLE:
        if (!isfinite(v->number))
            return fail(client, LDP_INVALID_ARGUMENT, "a value must be finite (JSON has no NaN or infinity)");
        snprintf(number, sizeof number, "%.17g", v->number);
        /* A locale whose decimal separator is a comma would write one; JSON's is a point. */
        for (char *c = number; *c; c++)
            if (*c == ',')
                *c = '.';
        put_text(w, number);
        break;
    case VALUE_STRING:
        if (!put_string(w, v->string))
            return fail(client, LDP_INVALID_ARGUMENT, "the value is not UTF-8 text");
        break;
    }
    if (key != NULL) {
        put_text(w, ",\"key\":");
        if (!put_string(w, key))
            return fail(client, LDP_INVALID_ARGUMENT, "the key is not UTF-8 text");
    }
    put_text(w, "}\n");
    if (w->overflow)
        return fail(client, LDP_INVALID_ARGUMENT, "the request is longer than the agent's %d bytes",
                    LDP_MAX_REQUEST_BYTES);
    return LDP_OK;
}

/* ------------------------------------------------------------------ the reply reader */

typedef struct reader {
    const char *at;
    const char *end;
} reader;

static void skip_space(reader *r) {
    while (r->at < r->end && (*r->at == ' ' || *r->at == '\t' || *r->at == '\r' || *r->at == '\n'))
        r->at++;
}

static bool expect(reader *r, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(r->end - r->at) < n || memcmp(r->at, word, n) != 0)
        return false;
    r->at += n;
    return true;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static bool read_hex4(reader *r, unsigned *out) {
    unsigned value = 0;
    if (r->end - r->at < 4)
        return false;
    for (int i = 0; i < 4; i++) {
        int d = hex_digit(r->at[i]);
        if (d < 0)
            return false;
        value = value * 16 + (unsigned)d;
    }
    r->at += 4;
    *out = value;
    return true;
}

/* Append a code point as UTF-8 if it fits whole (else the text is cut there). */
static void append_utf8(char *out, size_t size, size_t *used, bool *cut, unsigned cp) {
    char bytes[4];
    size_t n;
    if (cp < 0x80) {
        bytes[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        bytes[0] = (char)(0xC0 | (cp >> 6));
        bytes[1] = (char)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        bytes[0] = (char)(0xE0 | (cp >> 12));
        bytes[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        bytes[2] = (char)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        bytes[0] = (char)(0xF0 | (cp >> 18));
        bytes[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
        bytes[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
        bytes[3] = (char)(0x80 | (cp & 0x3F));
        n = 4;
    }
    if (*cut || out == NULL || *used + n >= size) {
        *cut = true;
        return;
    }
    memcpy(out + *used, bytes, n);
    *used += n;
}

/* A JSON string into `out` (NULL: only checked), cut at a whole character to fit `size`. */
static bool read_string(reader *r, char *out, size_t size) {
    size_t used = 0;
    bool cut = false;
    if (r->at >= r->end || *r->at != '"')
        return false;
    r->at++;
    while (r->at < r->end && *r->at != '"') {
        unsigned char c = (unsigned char)*r->at;
        unsigned cp;
        if (c < 0x20)
            return false;
        if (c != '\\') {
            size_t n = utf8_length((const unsigned char *)r->at);
            if (n == 0 || (size_t)(r->end - r->at) < n)
                return false;
            if (!cut && out != NULL && used + n < size) {
                memcpy(out + used, r->at, n);
                used += n;
            } else {
                cut = true;
            }
            r->at += n;
            continue;
        }
        r->at++;
        if (r->at >= r->end)
            return false;
        switch (*r->at++) {
        case '"': cp = '"'; break;
        case '\\': cp = '\\'; break;
        case '/': cp = '/'; break;
        case 'b': cp = '\b'; break;
        case 'f': cp = '\f'; break;
        case 'n': cp = '\n'; break;
        case 'r': cp = '\r'; break;
        case 't': cp = '\t'; break;
        case 'u': {
            if (!read_hex4(r, &cp))
                return false;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                unsigned low;
                if (!expect(r, "\\u") || !read_hex4(r, &low) || low < 0xDC00 || low > 0xDFFF)
                    return false;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                return false;
            }
            break;
        }
        default:
            return false;
        }
        append_utf8(out, size, &used, &cut, cp);
    }
    if (r->at >= r->end)
        return false;
    r->at++;
    if (out != NULL && size > 0)
        out[used] = '\0';
    return true;
}

/* A JSON number that is an integer (no fraction, no exponent) and fits a long long. */
static bool read_integer(reader *r, long long *out) {
    bool negative = false;
    unsigned long long magnitude = 0;
    const char *start;
    if (r->at < r->end && *r->at == '-') {
        negative = true;
        r->at++;
    }
    start = r->at;
    while (r->at < r->end && *r->at >= '0' && *r->at <= '9') {
        unsigned digit = (unsigned)(*r->at - '0');
        if (magnitude > (ULLONG_MAX - digit) / 10)
            return false;
        magnitude = magnitude * 10 + digit;
        r->at++;
    }
    if (r->at == start || (*start == '0' && r->at - start > 1))
        return false;
    if (r->at < r->end && (*r->at == '.' || *r->at == 'e' || *r->at == 'E'))
        return false;
    if (magnitude > (unsigned long long)LLONG_MAX + (negative ? 1u : 0u))
        return false;
    *out = negative ? (magnitude == (unsigned long long)LLONG_MAX + 1u ? LLONG_MIN : -(long long)magnitude)
                    : (long long)magnitude;
    return true;
}

static bool skip_value(reader *r, int depth);

static bool skip_number(reader *r) {
    const char *start = r->at;
    if (r->at < r->end && *r->at == '-')
        r->at++;
    if (r->at >= r->end || *r->at < '0' || *r->at > '9')
        return false;
    while (r->at < r->end && ((*r->at >= '0' && *r->at <= '9') || *r->at == '.' || *r->at == 'e' || *r->at == 'E' ||
                              *r->at == '+' || *r->at == '-'))
        r->at++;
    return r->at > start;
}

static bool skip_container(reader *r, int depth, char close) {
    bool object = close == '}';
    r->at++;
    skip_space(r);
    if (r->at < r->end && *r->at == close) {
        r->at++;
        return true;
    }
    for (;;) {
        if (object) {
            if (!read_string(r, NULL, 0))
                return false;
            skip_space(r);
            if (!expect(r, ":"))
                return false;
        }
        if (!skip_value(r, depth + 1))
            return false;
        skip_space(r);
        if (r->at < r->end && *r->at == ',') {
            r->at++;
            skip_space(r);
            continue;
        }
        if (r->at < r->end && *r->at == close) {
            r->at++;
            return true;
        }
        return false;
    }
}

/* Any JSON value, read past without keeping it (nested at most MAX_DEPTH deep). */
static bool skip_value(reader *r, int depth) {
    skip_space(r);
    if (depth > MAX_DEPTH || r->at >= r->end)
        return false;
    switch (*r->at) {
    case '"': return read_string(r, NULL, 0);
    case '{': return skip_container(r, depth, '}');
    case '[': return skip_container(r, depth, ']');
    case 't': return expect(r, "true");
    case 'f': return expect(r, "false");
    case 'n': return expect(r, "null");
    default: return skip_number(r);
    }
}

static bool read_bool(reader *r, bool *out) {
    if (expect(r, "true")) {
        *out = true;
        return true;
    }
    if (expect(r, "false")) {
        *out = false;
        return true;
    }
    return false;
}

/* What a reply holds, as read. */
typedef struct reply {
    int ok; /* -1: missing */
    bool has_error, has_message, has_outcome, has_counter, has_offered, has_limit, has_over_limit;
    char error[64];
    char outcome[16];
    bool counter;
    long long offered, limit, over_limit;
} reply;

static bool read_field(reader *r, ldp_client *client, reply *rep, ldp_outcome *out, const char *name) {
    bool flag;
    if (strcmp(name, "ok") == 0) {
        if (!read_bool(r, &flag))
            return false;
        rep->ok = flag ? 1 : 0;
        return true;
    }
    if (strcmp(name, "error") == 0)
        return (rep->has_error = read_string(r, rep->error, sizeof rep->error));
    if (strcmp(name, "message") == 0)
        return (rep->has_message = read_string(r, client->message, sizeof client->message));
    if (strcmp(name, "outcome") == 0)
        return (rep->has_outcome = read_string(r, rep->outcome, sizeof rep->outcome));
    if (strcmp(name, "counter") == 0)
        return (rep->has_counter = read_bool(r, &rep->counter));
    if (strcmp(name, "offered") == 0)
        return (rep->has_offered = read_integer(r, &rep->offered));
    if (strcmp(name, "limit") == 0)
        return (rep->has_limit = read_integer(r, &rep->limit));
    if (strcmp(name, "over_limit") == 0)
        return (rep->has_over_limit = read_integer(r, &rep->over_limit));
    if (strcmp(name, "note") == 0) {
        if (expect(r, "null")) {
            out->note[0] = '\0';
            return true;
        }
        return read_string(r, out->note, sizeof out->note);
    }
    return skip_value(r, 1);
}

/* The one JSON object of a reply line, its fields into `rep` and `out`. */
static bool read_object(reader *r, ldp_client *client, reply *rep, ldp_outcome *out) {
    char name[64];
    skip_space(r);
    if (!expect(r, "{"))
        return false;
    skip_space(r);
    if (expect(r, "}"))
        return true;
    for (;;) {
        skip_space(r);
        if (!read_string(r, name, sizeof name))
            return false;
        skip_space(r);
        if (!expect(r, ":"))
            return false;
        skip_space(r);
        if (!read_field(r, client, rep, out, name))
            return false;
        skip_space(r);
        if (expect(r, ","))
            continue;
        if (expect(r, "}"))
            break;
        return false;
    }
    skip_space(r);
    return r->at == r->end;
}

static const struct {
    const char *kind;
    ldp_status status;
} KINDS[] = {
    {"bad-request", LDP_BAD_REQUEST},           {"unknown-use-case", LDP_UNKNOWN_USE_CASE},
    {"value-refused", LDP_VALUE_REFUSED},       {"consent-required", LDP_CONSENT_REQUIRED},
    {"use-case-stopped", LDP_USE_CASE_STOPPED}, {"use-case-expired", LDP_USE_CASE_EXPIRED},
    {"state-unreadable", LDP_STATE_UNREADABLE}, {"state-unwritable", LDP_STATE_UNWRITABLE},
    {"busy", LDP_BUSY},
};

static ldp_status interpret(ldp_client *client, const char *line, size_t length, ldp_outcome *out) {
    reader r = {line, line + length};
    reply rep;
    memset(&rep, 0, sizeof rep);
    rep.ok = -1;
    out->note[0] = '\0';
    client->message[0] = '\0';
    if (!read_object(&r, client, &rep, out) || rep.ok < 0)
        return fail(client, LDP_PROTOCOL_ERROR, "the reply is not a JSON object with a boolean \"ok\"");
    if (!rep.ok) {
        if (!rep.has_error || !rep.has_message)
            return fail(client, LDP_PROTOCOL_ERROR, "a refusal without a string \"error\" and \"message\"");
        snprintf(client->error_kind, sizeof client->error_kind, "%s", rep.error);
        for (size_t i = 0; i < sizeof KINDS / sizeof KINDS[0]; i++)
            if (strcmp(rep.error, KINDS[i].kind) == 0)
                return KINDS[i].status;
        return LDP_REFUSED_OTHER;
    }
    if (!rep.has_outcome || !rep.has_counter || !rep.has_offered || !rep.has_limit || !rep.has_over_limit)
        return fail(client, LDP_PROTOCOL_ERROR, "the reply lacks a field of a record's outcome");
    if (strcmp(rep.outcome, "recorded") == 0)
        out->outcome = LDP_RECORDED;
    else if (strcmp(rep.outcome, "duplicate") == 0)
        out->outcome = LDP_DUPLICATE;
    else if (strcmp(rep.outcome, "dropped") == 0)
        out->outcome = LDP_DROPPED;
    else
        return fail(client, LDP_PROTOCOL_ERROR, "the reply's outcome is not recorded, duplicate or dropped");
    out->counter = rep.counter;
    out->offered = rep.offered;
    out->limit = rep.limit;
    out->over_limit = rep.over_limit;
    client->message[0] = '\0';
    return LDP_OK;
}

/* ------------------------------------------------------------------ the exchange */

static long long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Wait until `fd` is ready for `events`, or the deadline passes (false). */
static bool ready(int fd, short events, long long deadline) {
    for (;;) {
        long long left = deadline - now_ms();
        struct pollfd p = {fd, events, 0};
        int n;
        if (left <= 0)
            return false;
        n = poll(&p, 1, left > INT_MAX ? INT_MAX : (int)left);
        if (n > 0)
            return true;
        if (n == 0 || errno != EINTR)
            return false;
    }
}

static ldp_status exchange_once(ldp_client *client, const writer *w, char *line, size_t *length) {
    struct sockaddr_un address;
    long long deadline = now_ms() + client->timeout_ms;
    size_t sent = 0;
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    ldp_status status = LDP_OK;
    *length = 0;
    if (fd < 0)
        return fail(client, LDP_UNAVAILABLE, "cannot make a socket: %s", strerror(errno));
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    memset(&address, 0, sizeof address);
    address.sun_family = AF_UNIX;
    memcpy(address.sun_path, client->socket_path, strlen(client->socket_path) + 1);
    if (connect(fd, (const struct sockaddr *)&address, sizeof address) != 0) {
        status = fail(client, LDP_UNAVAILABLE, "no agent listens on %s: %s", client->socket_path, strerror(errno));
        goto done;
    }
    while (sent < w->length) {
        ssize_t n;
        if (!ready(fd, POLLOUT, deadline)) {
            status = fail(client, LDP_UNAVAILABLE, "the agent did not take the request within %d ms", client->timeout_ms);
            goto done;
        }
        n = send(fd, w->data + sent, w->length - sent, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EPIPE || errno == ECONNRESET))
            break; /* an agent may answer before it reads (busy does): its reply is still there to read */
        if (n <= 0) {
            status = fail(client, LDP_PROTOCOL_ERROR, "sending the request: %s", strerror(errno));
            goto done;
        }
        sent += (size_t)n;
    }
    for (;;) {
        ssize_t n;
        char *newline;
        if (!ready(fd, POLLIN, deadline)) {
            status = fail(client, LDP_UNAVAILABLE, "the agent did not answer within %d ms", client->timeout_ms);
            goto done;
        }
        n = recv(fd, line + *length, LDP_MAX_REPLY_BYTES + 1 - *length, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == ECONNRESET)
            n = 0; /* closed with the request unread, after the reply: the end of the reply */
        if (n < 0) {
            status = fail(client, LDP_PROTOCOL_ERROR, "reading the reply: %s", strerror(errno));
            goto done;
        }
        newline = memchr(line + *length, '\n', (size_t)n);
        *length += (size_t)n;
        if (newline != NULL) {
            *length = (size_t)(newline - line);
            break;
        }
        if (*length > LDP_MAX_REPLY_BYTES) {
            status = fail(client, LDP_REPLY_TOO_LARGE, "the reply is longer than %d bytes", LDP_MAX_REPLY_BYTES);
            goto done;
        }
        if (n == 0)
            break; /* the connection closed: what came is the reply, if anything did */
    }
    if (*length > LDP_MAX_REPLY_BYTES)
        status = fail(client, LDP_REPLY_TOO_LARGE, "the reply is longer than %d bytes", LDP_MAX_REPLY_BYTES);
    else if (*length == 0)
        status = fail(client, LDP_PROTOCOL_ERROR, "the agent closed the connection without a reply");
done:
    close(fd);
    return status;
}

static ldp_status record(ldp_client *client, const char *use_case, const value *v, const char *key,
                         ldp_outcome *outcome) {
    writer *w;
    char *line;
    ldp_outcome ignored;
    ldp_status status;
    if (client == NULL)
        return LDP_INVALID_ARGUMENT;
    client->error_kind[0] = '\0';
    if (use_case == NULL || (v->kind == VALUE_STRING && v->string == NULL))
        return fail(client, LDP_INVALID_ARGUMENT, "the use case and a string value must not be NULL");
    if (outcome == NULL)
        outcome = &ignored;
    w = malloc(sizeof *w);
    line = malloc(LDP_MAX_REPLY_BYTES + 1);
    if (w == NULL || line == NULL) {
        free(w);
        free(line);
        return fail(client, LDP_UNAVAILABLE, "out of memory");
    }
    status = write_request(client, w, use_case, v, key);
    for (int attempt = 0; status == LDP_OK; attempt++) {
        size_t length;
        status = exchange_once(client, w, line, &length);
        if (status == LDP_OK)
            status = interpret(client, line, length, outcome);
        if (status != LDP_BUSY || attempt >= client->busy_retries)
            break;
        {
            long long wait = (long long)client->busy_backoff_ms << (attempt < 20 ? attempt : 20);
            struct timespec pause = {(time_t)(wait / 1000), (long)(wait % 1000) * 1000000L};
            while (nanosleep(&pause, &pause) != 0 && errno == EINTR) {
            }
        }
        status = LDP_OK;
    }
    free(w);
    free(line);
    return status;
}

/* ------------------------------------------------------------------ the API */

ldp_status ldp_client_init(ldp_client *client, const char *socket_path) {
    const char *path = socket_path;
    if (client == NULL)
        return LDP_INVALID_ARGUMENT;
    memset(client, 0, sizeof *client);
    client->timeout_ms = 10000;
    client->busy_retries = 3;
    client->busy_backoff_ms = 50;
    if (path == NULL)
        path = getenv(LDP_SOCKET_VARIABLE);
    if (path == NULL || *path == '\0')
        path = LDP_DEFAULT_SOCKET;
    if (strlen(path) >= sizeof client->socket_path)
        return fail(client, LDP_INVALID_ARGUMENT, "the socket path is longer than %d bytes",
                    (int)sizeof client->socket_path - 1);
    memcpy(client->socket_path, path, strlen(path) + 1);
    return LDP_OK;
}

ldp_status ldp_record_bool(ldp_client *client, const char *use_case, bool flag, ldp_outcome *outcome) {
    value v = {VALUE_BOOL, "value", flag, 0, 0.0, NULL};
    return record(client, use_case, &v, NULL, outcome);
}

ldp_status ldp_record_int(ldp_client *client, const char *use_case, long long number, const char *key,
                          ldp_outcome *outcome) {
    value v = {VALUE_INT, "value", false, number, 0.0, NULL};
    return record(client, use_case, &v, key, outcome);
}

ldp_status ldp_record_double(ldp_client *client, const char *use_case, double number, const char *key,
                             ldp_outcome *outcome) {
    value v = {VALUE_DOUBLE, "value", false, 0, number, NULL};
    return record(client, use_case, &v, key, outcome);
}

ldp_status ldp_record_string(ldp_client *client, const char *use_case, const char *text, ldp_outcome *outcome) {
    value v = {VALUE_STRING, "value", false, 0, 0.0, text};
    return record(client, use_case, &v, NULL, outcome);
}

ldp_status ldp_record_text(ldp_client *client, const char *use_case, const char *text, const char *key,
                           ldp_outcome *outcome) {
    value v = {VALUE_STRING, "text", false, 0, 0.0, text};
    return record(client, use_case, &v, key, outcome);
}

const char *ldp_status_name(ldp_status status) {
    switch (status) {
    case LDP_OK: return "ok";
    case LDP_BAD_REQUEST: return "bad-request";
    case LDP_UNKNOWN_USE_CASE: return "unknown-use-case";
    case LDP_VALUE_REFUSED: return "value-refused";
    case LDP_CONSENT_REQUIRED: return "consent-required";
    case LDP_USE_CASE_STOPPED: return "use-case-stopped";
    case LDP_USE_CASE_EXPIRED: return "use-case-expired";
    case LDP_STATE_UNREADABLE: return "state-unreadable";
    case LDP_STATE_UNWRITABLE: return "state-unwritable";
    case LDP_BUSY: return "busy";
    case LDP_REFUSED_OTHER: return "refused";
    case LDP_UNAVAILABLE: return "unavailable";
    case LDP_PROTOCOL_ERROR: return "protocol-error";
    case LDP_REPLY_TOO_LARGE: return "reply-too-large";
    case LDP_INVALID_ARGUMENT: return "invalid-argument";
    }
    return "unknown-status";
}

const char *ldp_outcome_name(ldp_outcome_kind outcome) {
    switch (outcome) {
    case LDP_RECORDED: return "recorded";
    case LDP_DUPLICATE: return "duplicate";
    case LDP_DROPPED: return "dropped";
    }
    return "unknown-outcome";
}
