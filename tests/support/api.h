/* Helpers for tests that talk to cephalond's HTTP API (DESIGN §9): binary-safe requests,
 * JSON bodies, bearer tokens, the error format, and clocks for long-poll behaviour checks.
 * Built on tests/support/daemon.h; traffic goes to 127.0.0.1 only. */
#ifndef CEPHALON_TESTS_API_H
#define CEPHALON_TESTS_API_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "daemon.h"

/* One request with Connection: close; body is body_len bytes (binary-safe, may be NULL).
 * extra_headers like "Content-Type: application/msgpack\r\n" or NULL. */
cph_test_response cph_test_http_raw(int port, const char *method, const char *path,
                                    const char *extra_headers, const void *body,
                                    size_t body_len);

/* A JSON request: adds Content-Type: application/json when body is non-NULL and
 * Authorization: Bearer <token> when token is non-NULL. */
cph_test_response cph_test_api(int port, const char *method, const char *path,
                               const char *token, const char *body);

/* The body parsed as JSON (new reference), or NULL when it is empty or not JSON. */
json_t *cph_test_json(const cph_test_response *r);

/* The path and the smallest body of the completion of a leased turn — `turn` is a lease
 * answer's "turn" (its id and lease), the cost 1 token — for POST. */
void cph_test_completion(const json_t *turn, char *path, size_t path_size, char *body,
                         size_t body_size);

/* Asserts (cmocka) that r is the error format of DESIGN §9 with this status and code, a
 * non-empty message, and field equal to `field` (NULL: JSON null). On failure the message
 * shows the response. */
void cph_test_expect_error(const cph_test_response *r, int status, const char *code,
                           const char *field);

/* The value of header `name` in r (case-insensitive), copied into buf; NULL if absent. */
const char *cph_test_header(const cph_test_response *r, const char *name, char *buf,
                            size_t size);

/* Lower-case hex SHA-256 of s (65 bytes with the NUL); free() it. */
char *cph_test_sha256_hex(const char *s);

/* A msgpack body holding exactly one value (asserted) as a jansson tree (new reference): the
 * kinds an answer holds (nil, booleans, integers, strings, arrays, maps with string keys);
 * NULL when it holds any other kind. */
json_t *cph_test_msgpack_json(const void *body, size_t len);

/* Runs the real `promtool check metrics` (Debian package prometheus) on text, fed on its
 * standard input; fails the running cmocka test, with promtool's answer and the text, unless
 * it passes (also when promtool is missing). */
void cph_test_promtool_check(const char *text);

/* Monotonic milliseconds. */
int64_t cph_test_now_ms(void);

/* Opens a connection and sends one request without reading the answer (a client that will
 * walk away): returns the socket, or -1. */
int cph_test_http_send_only(int port, const char *method, const char *path, const char *body);

#endif
