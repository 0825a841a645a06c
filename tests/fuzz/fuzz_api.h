/* The request shape shared by fuzz_api_json.c and the seed writer (seeds.c).
 *
 * A fuzz_api_json input is
 *   byte 0   the route: index into fuzz_api_routes (modulo its length)
 *   byte 1   flags: FUZZ_API_MSGPACK_IN, FUZZ_API_MSGPACK_OUT, and the path parameter choice
 *            in bits 2..4 (index into the session or turn parameter table of the harness)
 *   byte 2.. the request body, sent as is (JSON, or msgpack with FUZZ_API_MSGPACK_IN)
 * Every 32-byte run of FUZZ_API_LEASE_MARK in the body is replaced by the lease of the
 * harness's live turn (same length, so a msgpack body stays well-formed), which lets the
 * fuzzer reach heartbeat/complete/fail past the lease check. */
#ifndef CEPHALON_TESTS_FUZZ_API_H
#define CEPHALON_TESTS_FUZZ_API_H

#include <event2/http.h>

enum {
  FUZZ_API_MSGPACK_IN = 1u << 0,  /* Content-Type: application/msgpack */
  FUZZ_API_MSGPACK_OUT = 1u << 1, /* Accept: application/msgpack */
};
#define FUZZ_API_PARAM(flags) (((flags) >> 2) & 7u)
#define FUZZ_API_LEASE_MARK "LLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLL"

enum { FUZZ_PARAM_NONE, FUZZ_PARAM_SESSION, FUZZ_PARAM_TURN };

typedef struct fuzz_api_route {
  const char *name;           /* seed file prefix */
  enum evhttp_cmd_type method;
  const char *path;           /* "%s" stands for the path parameter */
  int param;                  /* FUZZ_PARAM_* */
} fuzz_api_route;

/* Every route of server/http.c that takes a JSON body (CPH_ROUTE_BODY). */
static const fuzz_api_route fuzz_api_routes[] = {
    {"session_create", EVHTTP_REQ_POST, "/v1/sessions", FUZZ_PARAM_NONE},
    {"session_update", EVHTTP_REQ_PUT, "/v1/sessions/%s", FUZZ_PARAM_SESSION},
    {"context_insert", EVHTTP_REQ_POST, "/v1/sessions/%s/context", FUZZ_PARAM_SESSION},
    {"seal", EVHTTP_REQ_POST, "/v1/sessions/%s/seal", FUZZ_PARAM_SESSION},
    {"events", EVHTTP_REQ_POST, "/v1/events", FUZZ_PARAM_NONE},
    {"lease", EVHTTP_REQ_POST, "/v1/turns/lease", FUZZ_PARAM_NONE},
    {"heartbeat", EVHTTP_REQ_POST, "/v1/turns/%s/heartbeat", FUZZ_PARAM_TURN},
    {"complete", EVHTTP_REQ_POST, "/v1/turns/%s/complete", FUZZ_PARAM_TURN},
    {"fail", EVHTTP_REQ_POST, "/v1/turns/%s/fail", FUZZ_PARAM_TURN},
    {"requeue", EVHTTP_REQ_POST, "/v1/turns/%s/requeue", FUZZ_PARAM_TURN},
    {"job", EVHTTP_REQ_POST, "/v1/maintenance/jobs", FUZZ_PARAM_NONE},
};
#define FUZZ_API_ROUTES (sizeof fuzz_api_routes / sizeof fuzz_api_routes[0])

#endif
