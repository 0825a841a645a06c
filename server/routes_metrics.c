/* GET /metrics (DESIGN §9, §10): every cephalon_* metric in the Prometheus text exposition
 * format 0.0.4. Scope read. With :metrics :enabled? false it answers 404 in the JSON error
 * format, as for any unknown path. The text is built by the engine in one go (bounded work,
 * see cph_engine_metrics_text) on the event loop, like every other read. */
#include <stdlib.h>

#include "routes.h"
#include "server.h"

#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

void cph_route_metrics(cph_req *r) {
  if (!cph_engine_policy(r->srv->engine)->metrics.enabled) {
    cph_reply_error(r, 404, "not_found", NULL, "metrics are disabled (:metrics :enabled? false)");
    return;
  }
  size_t len = 0;
  char *text = cph_engine_metrics_text(r->srv->engine, &len);
  if (!text) {
    cph_reply_error(r, 500, "internal", NULL, "out of memory building the metrics");
    return;
  }
  cph_reply_text(r, 200, METRICS_CONTENT_TYPE, text, len);
  free(text);
}
