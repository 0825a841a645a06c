/* GET /v1/openapi.json: the OpenAPI 3.1 document of this API (docs/openapi.json), compiled
 * into the binary at build time (scripts/embed-file.cmake), so the daemon always serves the
 * document of the routes it has. Any valid token may read it, whatever its scope (http.c);
 * as for every route but the health checks, a client without one learns nothing. */
#include <stddef.h>

#include "routes.h"

/* The generated openapi_json.c in the build dir. */
extern const unsigned char cph_openapi_json[];
extern const size_t cph_openapi_json_len;

void cph_route_openapi(cph_req *r) {
  cph_reply_text(r, 200, "application/json", (const char *)cph_openapi_json,
                 cph_openapi_json_len);
}
