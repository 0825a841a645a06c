/* The web console's files (ui/ in the source tree), compiled into cephalond: the build
 * generates their bytes (cmake/embed_ui.cmake) and server/routes_ui.c serves them at /ui. */
#ifndef CEPHALON_SERVER_UI_ASSETS_H
#define CEPHALON_SERVER_UI_ASSETS_H

#include <stddef.h>

typedef struct cph_ui_asset {
  const char *name;         /* "index.html", "app.js", ... */
  const char *content_type; /* "text/html; charset=utf-8", ... */
  const unsigned char *data;
  size_t len;
} cph_ui_asset;

extern const cph_ui_asset cph_ui_assets[];
extern const size_t cph_ui_n_assets;

#endif
