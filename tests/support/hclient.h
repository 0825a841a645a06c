/* A JSON-over-HTTP client for the hardening tests (crash, disk full, worker chaos, security)
 * and the soak driver. Unlike cph_test_http, every socket has a send and receive timeout, so a
 * daemon that stops answering fails the test instead of hanging it. Traffic goes to
 * 127.0.0.1 only. */
#ifndef CEPHALON_TESTS_HCLIENT_H
#define CEPHALON_TESTS_HCLIENT_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* How long one request may take end to end before it counts as failed (status -1). */
#define CPH_HC_TIMEOUT_MS 30000

/* A TCP connection to 127.0.0.1:port with send/receive timeouts of timeout_ms; -1 on failure. */
int cph_hc_connect(int port, int timeout_ms);

/* One request with Connection: close and a JSON body formatted from fmt (NULL: no body).
 * token: sent as `Authorization: Bearer <token>` when non-NULL. Returns the parsed JSON answer
 * (NULL when the body is empty or not JSON) and the HTTP status in *status (-1 when the
 * connection failed, timed out or the answer was not HTTP). */
json_t *cph_hc_call(int port, const char *token, int *status, const char *method,
                    const char *path, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* As cph_hc_call, with the raw answer body copied into *raw (free() it; may be NULL). */
json_t *cph_hc_call_raw(int port, const char *token, int *status, char **raw,
                        const char *method, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));

/* Field accessors that tolerate NULL objects and missing keys ("" / 0). */
const char *cph_hc_str(const json_t *o, const char *key);
int64_t cph_hc_int(const json_t *o, const char *key);

/* Monotonic milliseconds and a sleep. */
int64_t cph_hc_now_ms(void);
void cph_hc_sleep_ms(int ms);

/* A small deterministic PRNG (splitmix64) for seeded tests. */
typedef struct cph_hc_rng {
  uint64_t s;
} cph_hc_rng;
uint64_t cph_hc_rand(cph_hc_rng *r);
/* Uniform in [lo, hi]. */
int64_t cph_hc_rand_range(cph_hc_rng *r, int64_t lo, int64_t hi);

/* Appends one line to path with a single write(2) on an O_APPEND descriptor, so a reader
 * never sees half a line from a writer that was still running. Returns 0 or -1. */
int cph_hc_append_line(const char *path, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
