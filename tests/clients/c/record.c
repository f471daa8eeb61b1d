/*
 * The C client's test driver: one record through clients/c/ldp_client.c, the result printed
 * as `name=value` lines for tests/clients/test_c_client.py to read.
 *
 *   record SOCKET TYPE USE_CASE VALUE [KEY] [RETRIES] [TIMEOUT_MS]
 *
 * TYPE is bool, int, double, string or text; KEY "-" is none; RETRIES is the busy retries.
 */
#include "ldp_client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    ldp_client client;
    ldp_outcome outcome;
    ldp_status status;
    const char *type, *use_case, *value, *key = NULL;
    if (argc < 5) {
        fprintf(stderr, "usage: record SOCKET TYPE USE_CASE VALUE [KEY] [RETRIES] [TIMEOUT_MS]\n");
        return 2;
    }
    type = argv[2];
    use_case = argv[3];
    value = argv[4];
    if (argc > 5 && strcmp(argv[5], "-") != 0)
        key = argv[5];
    status = ldp_client_init(&client, argv[1]);
    if (status != LDP_OK) {
        printf("status=%s\nmessage=%s\n", ldp_status_name(status), client.message);
        return 1;
    }
    if (argc > 6)
        client.busy_retries = atoi(argv[6]);
    if (argc > 7)
        client.timeout_ms = atoi(argv[7]);
    client.busy_backoff_ms = 1;
    memset(&outcome, 0, sizeof outcome);
    if (strcmp(type, "bool") == 0)
        status = ldp_record_bool(&client, use_case, strcmp(value, "true") == 0, &outcome);
    else if (strcmp(type, "int") == 0)
        status = ldp_record_int(&client, use_case, strtoll(value, NULL, 10), key, &outcome);
    else if (strcmp(type, "double") == 0)
        status = ldp_record_double(&client, use_case, strtod(value, NULL), key, &outcome);
    else if (strcmp(type, "string") == 0)
        status = ldp_record_string(&client, use_case, value, &outcome);
    else
        status = ldp_record_text(&client, use_case, value, key, &outcome);
    printf("status=%s\n", ldp_status_name(status));
    printf("kind=%s\n", client.error_kind);
    printf("message=%s\n", client.message);
    if (status == LDP_OK) {
        printf("outcome=%s\n", ldp_outcome_name(outcome.outcome));
        printf("counter=%d\n", outcome.counter ? 1 : 0);
        printf("offered=%lld\nlimit=%lld\nover_limit=%lld\n", outcome.offered, outcome.limit, outcome.over_limit);
        printf("note=%s\n", outcome.note);
    }
    return status == LDP_OK ? 0 : 1;
}
