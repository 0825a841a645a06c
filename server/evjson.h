/* A fast decoder for the JSON of events (DESIGN §4), without a jansson tree: the request
 * bodies of POST /v1/events (routes_events.c) and the cluster log's messages (clusterflow.c)
 * are mostly plain — known fields, string values without \u escapes, a non-negative integer
 * ts_ms — and jansson spends several microseconds an event building and freeing its objects.
 *
 * Contract: each function decodes what it is named for at f->p (skipping whitespace first)
 * and advances f->p past it, or returns false — with f->p anywhere and nothing to undo but
 * what f->alloc handed out — on anything else: unknown or repeated keys, other value types,
 * \u escapes, ill-formed UTF-8, a string over f->max_str bytes. A caller then decodes the same
 * bytes with jansson, which accepts all the fast path accepts with the same values (and more).
 * Strings and arrays come from f->alloc (aligned for pointers), NUL-terminated. */
#ifndef CEPHALON_SERVER_EVJSON_H
#define CEPHALON_SERVER_EVJSON_H

#include <stdbool.h>
#include <stddef.h>

#include "cephalon/cephalon.h"

typedef struct cph_evjson {
  void *(*alloc)(void *ctx, size_t n); /* NULL when out of memory (the decode then fails) */
  void *ctx;
  const char *p, *end;
  size_t max_str;
} cph_evjson;

void cph_evjson_ws(cph_evjson *f);
/* Skips whitespace, then c if it is next (true). */
bool cph_evjson_lit(cph_evjson *f, char c);
/* A string value. */
bool cph_evjson_str(cph_evjson *f, char **out);
/* An event object: channel, sender, body, session, kind, key (strings or null), mentions (an
 * array of strings or null), ts_ms (an integer from 0 to INT64_MAX, or null); in is zeroed
 * first (only_session false). */
bool cph_evjson_event(cph_evjson *f, cph_event_in *in);

#endif
