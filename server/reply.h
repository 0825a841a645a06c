/* Answering a request (see the request lifetime in request.h): replies in JSON or msgpack,
 * answers after an engine operation, and the error format of DESIGN §9:
 *
 *   {"error": {"code": "...", "message": "...", "field": "..." | null}}
 */
#ifndef CEPHALON_SERVER_REPLY_H
#define CEPHALON_SERVER_REPLY_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cephalon/cephalon.h"
#include "common/buf.h"
#include "request.h"

/* ---------------------------------------------------------------- replies */

/* Sends body (stolen; NULL = no body) as JSON, or msgpack when the client asked for it. */
void cph_reply_json(cph_req *r, int status, json_t *body);
/* Sends a body written with cph_emit (server/emit.h) for this request's format
 * (r->msgpack_out): the bytes are handed to libevent without a copy and body is left empty.
 * A failed (out of memory) buffer answers 500. */
void cph_reply_emitted(cph_req *r, int status, cph_buf *body);
/* 204 No Content. */
void cph_reply_empty(cph_req *r, int status);
/* Sends data[0..len) as is, with this Content-Type (GET /metrics: Prometheus text). */
void cph_reply_text(cph_req *r, int status, const char *content_type, const char *data,
                    size_t len);
/* Answers the recorded error (500 if none was recorded). */
void cph_reply_failure(cph_req *r);
/* Records and answers at once. */
void cph_reply_error(cph_req *r, int status, const char *code, const char *field,
                     const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* Answers an engine result code: CPH_EINVAL 400 (field names the field), CPH_ENOTFOUND 404,
 * CPH_ECONFLICT/CPH_EEXISTS/CPH_ESTATE 409, CPH_ELIMIT 413, CPH_EBUSY 503, CPH_EFULL 507,
 * anything else 500. msg may be NULL or empty (the code's meaning is used). */
void cph_reply_rc(cph_req *r, int rc, const char *msg, const char *field);

/* ---------------------------------------------------------------- async requests */

/* Submits r->op (kind and inputs filled by the caller) and schedules a pass. on_done runs
 * after the pass that applied it committed; it must answer, and then the op's results are
 * cleared and the request freed. When the engine refuses the op the request is answered
 * here (503 for CPH_EBUSY) and false is returned. */
bool cph_req_submit(cph_req *r, cph_op_kind kind, void (*on_done)(cph_req *r));

/* ---------------------------------------------------------------- JSON output helpers */

/* json_string(s), or JSON null when s is NULL; never fails into a missing field silently
 * (NULL only on out of memory). */
json_t *cph_json_str(const char *s);
json_t *cph_json_strv(const cph_strv *v);
json_t *cph_json_u64(uint64_t v);

#endif
