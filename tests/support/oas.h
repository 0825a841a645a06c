/* The daemon's answers checked against its OpenAPI document (docs/openapi.json, DESIGN §13).
 *
 * Every test HTTP client (cph_test_http, cph_test_http_raw, cph_hc_call) hands each answer it
 * gets from a cephalond that this process started (cph_test_daemon_start registers its port)
 * to cph_oas_expect_answer. The answer's operation is found by method and path template, its
 * response by status, and the body is validated against that response's schema for the
 * answer's Content-Type (JSON and msgpack bodies as JSON values). A mismatch prints
 *
 *   openapi: GET /v1/sessions/s1 -> 200: at /credits: "x" is not of type number
 *
 * and aborts the test process: it cannot be missed, from any thread. A success answer for a
 * method and path the document does not list fails the same way; an error answer there (401,
 * 404, 405, ...) must have the Error shape.
 *
 * The validator covers the JSON Schema (2020-12) the document uses: $ref (local JSON pointers),
 * type (a name or a list), properties, required, additionalProperties, items, enum, const,
 * oneOf, anyOf, allOf, minimum, maximum, minLength, maxLength, pattern (POSIX ERE), minItems,
 * maxItems, maxProperties. Annotations (description, example, default, format, ...) are
 * ignored; any other keyword is refused, so the document cannot use one the check would skip.
 *
 * Strictness: the document leaves its answer objects open (DESIGN §9: "more fields may be
 * added"), but the check is strict: an object schema that lists properties and says nothing
 * of additionalProperties admits no other member. So every field the daemon sends is
 * documented.
 *
 * Needs only jansson, msgpack-c and pthreads (the soak driver links it too). */
#ifndef CEPHALON_TESTS_OAS_H
#define CEPHALON_TESTS_OAS_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct cph_oas cph_oas;

/* Loads an OpenAPI document; NULL with the reason in err. */
cph_oas *cph_oas_load(const char *path, char *err, size_t size);
/* The same from a JSON value (borrowed: it must outlive d). */
cph_oas *cph_oas_from_json(json_t *doc);
void cph_oas_free(cph_oas *d);

/* Validates value against schema (a node of d's document, or any schema whose $refs point into
 * it). strict: see above. true, or false with "at POINTER: what" in err. */
bool cph_oas_validate(const cph_oas *d, const json_t *schema, const json_t *value, bool strict,
                      char *err, size_t size);

/* Checks one answer to METHOD TARGET (path, query allowed) with this status, Content-Type
 * (NULL when absent; parameters after ';' ignored) and body: has_body false for an empty
 * body; body the parsed JSON or msgpack value, NULL when it did not parse (then raw is the
 * text, for text media types). true, or false with the reason in err. */
bool cph_oas_check_answer(const cph_oas *d, const char *method, const char *target, int status,
                          const char *content_type, bool has_body, const json_t *body,
                          char *err, size_t size);

/* A msgpack body holding one value, as a jansson tree (nil, booleans, integers, floats,
 * strings, arrays, maps with string keys); NULL for anything else or trailing bytes. */
json_t *cph_oas_msgpack_json(const void *data, size_t len);

/* ---------------------------------------------------------------- the clients' hook */

/* Answers from this port are checked (cph_test_daemon_start; removed when it stops). */
void cph_oas_watch_port(int port);
void cph_oas_unwatch_port(int port);

/* The hook: head is the answer's status line and headers (as received, "\r\n" between
 * lines), body its body_len bytes. Nothing happens for a port not watched, a status < 0 or a
 * body cut short of its Content-Length (a daemon killed mid-answer). The document is
 * $CPH_SOURCE_DIR/docs/openapi.json, loaded once. Aborts on a mismatch (see above). */
void cph_oas_expect_answer(int port, const char *method, const char *target, int status,
                           const char *head, const char *body, size_t body_len);

#endif
