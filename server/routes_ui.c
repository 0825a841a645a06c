/* The web console (issue #18): GET /ui answers ui/index.html (and so does GET /, for whoever
 * opens the daemon's address in a browser: the page names its files by absolute paths), GET
 * /ui/{file} any other file of ui/, from the bytes compiled into cephalond
 * (server/ui_assets.h). No token is needed for these files: they hold no data. The console's own API calls carry the token its user gives
 * (kept in the browser's sessionStorage, never in a page), so it is as read-only as that
 * token: read scope views, admin acts.
 *
 * Every answer carries `Content-Security-Policy: default-src 'self'` (the console has no
 * inline script or style and loads nothing from elsewhere), `X-Content-Type-Options: nosniff`
 * and `Cache-Control: no-cache` (a new cephalond serves its own console at once). */
#include <string.h>

#include <event2/http.h>

#include "routes.h"
#include "server.h"
#include "server/ui_assets.h"

static const cph_ui_asset *asset_named(const char *name) {
  for (size_t i = 0; i < cph_ui_n_assets; i++)
    if (strcmp(cph_ui_assets[i].name, name) == 0)
      return &cph_ui_assets[i];
  return NULL;
}

void cph_route_ui(cph_req *r) {
  bool index = strcmp(r->route->pattern, "/ui") == 0 || strcmp(r->route->pattern, "/") == 0;
  const char *name = index ? "index.html" : r->params[0];
  const cph_ui_asset *a = name ? asset_named(name) : NULL;
  if (!a) {
    cph_reply_error(r, 404, "not_found", NULL, "no such console file: %s", name ? name : "");
    return;
  }
  struct evkeyvalq *h = evhttp_request_get_output_headers(r->ev);
  evhttp_add_header(h, "Content-Security-Policy", "default-src 'self'");
  evhttp_add_header(h, "X-Content-Type-Options", "nosniff");
  evhttp_add_header(h, "Cache-Control", "no-cache");
  cph_reply_text(r, 200, a->content_type, (const char *)a->data, a->len);
}
