/* GET /metrics (DESIGN §9, §10): every cephalon_* metric in the Prometheus text exposition
 * format 0.0.4. Scope read. With :metrics :enabled? false it answers 404 in the JSON error
 * format, as for any unknown path. The text is built by the engine in one go (bounded work,
 * see cph_engine_metrics_text) on the event loop, like every other read; the server's own
 * families (cephalon_http_timeouts_total, deadlines.c; in cluster mode the ownership ones,
 * cluster.c, and with a log the cephalon_cluster_log_* ones, clusterflow.c) follow it. */
#include <stdlib.h>

#include "cluster.h"
#include "clusterflow.h"
#include "deadlines.h"
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
  cph_buf out = CPH_BUF_INIT;
  if (text)
    cph_buf_append(&out, text, len);
  free(text);
  /* the server's own families after the engine's */
  if (!text || cph_deadlines_metrics(r->srv->deadlines, &out) != CPH_OK ||
      (r->srv->cluster && cph_cluster_metrics(r->srv->cluster, &out) != CPH_OK) ||
      (r->srv->cflow && cph_cflow_metrics(r->srv->cflow, &out) != CPH_OK)) {
    cph_buf_free(&out);
    cph_reply_error(r, 500, "internal", NULL, "out of memory building the metrics");
    return;
  }
  cph_reply_text(r, 200, METRICS_CONTENT_TYPE, out.data, out.len);
  cph_buf_free(&out);
}
