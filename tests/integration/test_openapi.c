/* GET /v1/openapi.json (DESIGN §13) against the real cephalond: the daemon serves exactly
 * docs/openapi.json, to any valid token whatever its scope and to no one without one; and the
 * document lists exactly the routes of the daemon's routing table (server/http.c), each with
 * the scopes that admit it. (The lint is test_openapi_lint; the check of every answer the
 * integration tests get is tests/support/oas.c, tested by test_oas.) */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "tests/support/api.h"
#include "tests/support/daemon.h"
#include "tests/support/testutil.h"

static const char *const TOKENS[][2] = {{"ingest", "tok-oas-ingest-19ab"},
                                        {"worker", "tok-oas-worker-2c7d"},
                                        {"admin", "tok-oas-admin-3e41"},
                                        {"read", "tok-oas-read-4f06"}};
#define N_TOKENS (sizeof TOKENS / sizeof TOKENS[0])

typedef struct fixture {
  char *policy;
  cph_test_daemon d;
} fixture;

static int start_with(void **state, const char *policy_text) {
  fixture *f = calloc(1, sizeof *f);
  f->policy = cph_test_write_tmpfile(".edn", policy_text);
  *state = f;
  return cph_test_daemon_start(&f->d, f->policy, NULL, NULL) == 0 ? 0 : -1;
}

static int setup_open(void **state) { return start_with(state, "{:store {:sync :none}}\n"); }

/* One token per scope. */
static int setup_auth(void **state) {
  char text[4096];
  size_t used = (size_t)snprintf(text, sizeof text, "{:store {:sync :none}\n :auth {:tokens [");
  for (size_t i = 0; i < N_TOKENS; i++) {
    char *hash = cph_test_sha256_hex(TOKENS[i][1]);
    used += (size_t)snprintf(text + used, sizeof text - used,
                             "{:name \"%s\" :sha256 \"%s\" :scopes #{:%s}}\n", TOKENS[i][0], hash,
                             TOKENS[i][0]);
    free(hash);
  }
  snprintf(text + used, sizeof text - used, "]}}\n");
  return start_with(state, text);
}

static int teardown(void **state) {
  fixture *f = *state;
  if (f->d.pid > 0)
    assert_int_equal(cph_test_daemon_stop(&f->d), 0);
  unlink(f->policy);
  free(f->policy);
  free(f);
  return 0;
}

static char *read_source(const char *rel, size_t *len) {
  char *path = cph_test_source_path(rel);
  char *text = cph_test_read_file(path, len);
  if (!text)
    fail_msg("cannot read %s", path);
  free(path);
  return text;
}

/* The answer is 200, application/json, and byte for byte docs/openapi.json. */
static void expect_the_document(const cph_test_response *r) {
  size_t len = 0;
  char *doc = read_source("docs/openapi.json", &len);
  char ct[128];
  if (r->status != 200)
    fail_msg("GET /v1/openapi.json answered %d: %s", r->status, r->body ? r->body : "");
  assert_non_null(cph_test_header(r, "Content-Type", ct, sizeof ct));
  assert_string_equal(ct, "application/json");
  assert_int_equal(r->body_len, len);
  assert_memory_equal(r->body, doc, len);
  free(doc);
}

static void test_served_document_is_docs_openapi_json(void **state) {
  fixture *f = *state;
  cph_test_response r = cph_test_api(f->d.port, "GET", "/v1/openapi.json", NULL, NULL);
  expect_the_document(&r);
  json_t *j = cph_test_json(&r);
  assert_string_equal(json_string_value(json_object_get(j, "openapi")), "3.1.0");
  json_decref(j);
  cph_test_response_free(&r);
  /* msgpack is not offered: the document is JSON whatever the client accepts */
  r = cph_test_http_raw(f->d.port, "GET", "/v1/openapi.json", "Accept: application/msgpack\r\n",
                        NULL, 0);
  expect_the_document(&r);
  cph_test_response_free(&r);
}

static void test_any_valid_token_reads_the_document_and_no_token_does_not(void **state) {
  fixture *f = *state;
  cph_test_response r = cph_test_api(f->d.port, "GET", "/v1/openapi.json", NULL, NULL);
  cph_test_expect_error(&r, 401, "unauthorized", NULL);
  cph_test_response_free(&r);
  r = cph_test_api(f->d.port, "GET", "/v1/openapi.json", "not-a-token", NULL);
  cph_test_expect_error(&r, 401, "unauthorized", NULL);
  cph_test_response_free(&r);
  for (size_t i = 0; i < N_TOKENS; i++) {
    r = cph_test_api(f->d.port, "GET", "/v1/openapi.json", TOKENS[i][1], NULL);
    expect_the_document(&r);
    cph_test_response_free(&r);
  }
}

/* The hook in the test clients checks msgpack answers as well (as the same JSON values): a
 * session's life in msgpack, down to the 404 after its delete. */
static void test_msgpack_answers_match_the_document_too(void **state) {
  fixture *f = *state;
  static const char *const MP = "Content-Type: application/json\r\nAccept: application/msgpack\r\n";
  static const struct {
    const char *method, *path, *body;
    int status;
  } calls[] = {
      {"POST", "/v1/sessions", "{\"id\":\"mp1\",\"class\":\"operational\",\"subscribe\":[\"c\"]}", 200},
      {"GET", "/v1/sessions/mp1", NULL, 200},
      {"PUT", "/v1/sessions/mp1", "{\"paused\":true,\"system\":\"be brief\"}", 200},
      {"GET", "/v1/sessions/mp1/why", NULL, 200},
      {"GET", "/v1/lanes", NULL, 200},
      {"GET", "/v1/top", NULL, 200},
      {"GET", "/readyz", NULL, 200},
      {"DELETE", "/v1/sessions/mp1", NULL, 200},
      {"GET", "/v1/sessions/mp1", NULL, 404},
  };
  for (size_t i = 0; i < sizeof calls / sizeof calls[0]; i++) {
    const char *body = calls[i].body;
    cph_test_response r = cph_test_http_raw(f->d.port, calls[i].method, calls[i].path, MP, body,
                                            body ? strlen(body) : 0);
    char ct[128];
    if (r.status != calls[i].status)
      fail_msg("%s %s answered %d, not %d", calls[i].method, calls[i].path, r.status,
               calls[i].status);
    assert_non_null(cph_test_header(&r, "Content-Type", ct, sizeof ct));
    assert_string_equal(ct, "application/msgpack");
    cph_test_response_free(&r);
  }
}

/* ---------------------------------------------------------------- the routing table */

typedef struct route {
  char method[8];
  char path[128];
  char scopes[64]; /* sorted names joined by ',' ("" = public) */
} route;

static int cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Sorts and joins names (n of them) into out. */
static void join_sorted(const char **names, size_t n, char *out, size_t size) {
  qsort(names, n, sizeof *names, cmp_str);
  size_t used = 0;
  out[0] = '\0';
  for (size_t i = 0; i < n; i++)
    used += (size_t)snprintf(out + used, size - used, "%s%s", i ? "," : "", names[i]);
}

/* The routes of server/http.c's table: `{EVHTTP_REQ_GET, "/path", SCOPE_A | SCOPE_B, ...`. */
static size_t table_routes(route *out, size_t max) {
  char *src = read_source("server/http.c", NULL);
  const char *p = strstr(src, "static const cph_route routes[] = {");
  assert_non_null(p);
  const char *end = strstr(p, "\n};");
  assert_non_null(end);
  size_t n = 0;
  while ((p = strstr(p, "{EVHTTP_REQ_")) && p < end) {
    assert_true(n < max);
    route *r = &out[n++];
    p += strlen("{EVHTTP_REQ_");
    size_t ml = strcspn(p, ",");
    snprintf(r->method, sizeof r->method, "%.*s", (int)ml, p);
    for (char *c = r->method; *c; c++)
      *c = (char)(*c - 'A' + 'a');
    const char *q = strchr(p, '"');
    const char *qe = strchr(q + 1, '"');
    snprintf(r->path, sizeof r->path, "%.*s", (int)(qe - q - 1), q + 1);
    const char *s = qe + 1;
    s += strspn(s, ", \n");
    const char *se = strchr(s, ',');
    const char *names[4];
    size_t k = 0;
    for (const char *t = s; t < se;) {
      t += strspn(t, " |\n");
      size_t tl = strcspn(t, " |,\n");
      if (tl > 6 && strncmp(t, "SCOPE_", 6) == 0) {
        static const char *const known[] = {"ingest", "worker", "admin", "read"};
        for (size_t i = 0; i < 4; i++)
          if (strlen(known[i]) == tl - 6 && strncasecmp(t + 6, known[i], tl - 6) == 0)
            names[k++] = known[i];
      } else if (!(tl == 1 && t[0] == '0')) {
        fail_msg("server/http.c: cannot read the scopes of %s %s", r->method, r->path);
      }
      t += tl;
    }
    join_sorted(names, k, r->scopes, sizeof r->scopes);
    p = se;
  }
  free(src);
  return n;
}

/* The document's scopes of an operation: the role names of its security requirements. */
static void doc_scopes(const json_t *op, char *out, size_t size) {
  const json_t *sec = json_object_get(op, "security");
  assert_non_null(sec); /* every operation says who may call it */
  const char *names[8];
  size_t k = 0, i;
  json_t *req;
  json_array_foreach(sec, i, req) {
    json_t *roles = json_object_get(req, "bearer");
    assert_int_equal(json_array_size(roles), 1); /* one scope per alternative */
    assert_true(k < 8);
    names[k++] = json_string_value(json_array_get(roles, 0));
  }
  join_sorted(names, k, out, size);
}

static void test_document_lists_every_route_with_its_scopes(void **state) {
  (void)state;
  route table[96];
  size_t n = table_routes(table, 96);
  assert_true(n > 30);
  char *path = cph_test_source_path("docs/openapi.json");
  json_error_t je;
  json_t *doc = json_load_file(path, 0, &je);
  free(path);
  assert_non_null(doc);
  json_t *paths = json_object_get(doc, "paths");
  size_t documented = 0;
  for (size_t i = 0; i < n; i++) {
    json_t *op = json_object_get(json_object_get(paths, table[i].path), table[i].method);
    if (!op)
      fail_msg("server/http.c routes %s %s; docs/openapi.json does not document it",
               table[i].method, table[i].path);
    char scopes[64];
    doc_scopes(op, scopes, sizeof scopes);
    if (strcmp(scopes, table[i].scopes) != 0)
      fail_msg("%s %s: server/http.c admits scopes {%s}, docs/openapi.json says {%s}",
               table[i].method, table[i].path, table[i].scopes, scopes);
  }
  /* ...and nothing else */
  const char *key;
  json_t *item;
  json_object_foreach(paths, key, item) {
    const char *m;
    json_t *op;
    json_object_foreach(item, m, op) {
      bool found = false;
      for (size_t i = 0; i < n && !found; i++)
        found = strcmp(table[i].path, key) == 0 && strcmp(table[i].method, m) == 0;
      if (!found)
        fail_msg("docs/openapi.json documents %s %s, which server/http.c does not route", m,
                 key);
      documented++;
    }
  }
  assert_int_equal(documented, n);
  json_decref(doc);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_served_document_is_docs_openapi_json, setup_open,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_msgpack_answers_match_the_document_too, setup_open,
                                      teardown),
      cmocka_unit_test_setup_teardown(
          test_any_valid_token_reads_the_document_and_no_token_does_not, setup_auth, teardown),
      cmocka_unit_test(test_document_lists_every_route_with_its_scopes),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
