/* The HTTP client of the providers, cephalonctl and the worker (common/http_client.c, over
 * libcurl) against an https server on loopback with a self-signed certificate made here with
 * the openssl CLI: trusted when that certificate is the CA (the request's ca_file, the process
 * default, or the policy's :providers :ca-file through the engine), refused without it; and
 * connections are kept alive across requests. */
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

#include "common/http_client.h"
#include "providers/providers.h"
#include "tests/support/engine_fixture.h"
#include "tests/support/model_double.h"
#include "tests/support/testutil.h"

typedef struct fixture {
  char *dir;
  char cert[512], key[512];
  cph_md *md;
} fixture;

/* An embeddings endpoint: one 3-wide vector per input. */
static void answer(void *arg, const cph_md_request *rq, cph_md_answer *out) {
  (void)arg;
  if (strcmp(rq->path, "/v1/embeddings") == 0) {
    size_t n = json_array_size(json_object_get(rq->json, "input"));
    json_t *data = json_array();
    for (size_t i = 0; i < n; i++)
      json_array_append_new(data, json_pack("{s:i, s:[f, f, f]}", "index", (int)i, "embedding",
                                            0.6, 0.8, 0.0));
    json_t *body = json_pack("{s:o}", "data", data);
    out->body = json_dumps(body, JSON_COMPACT);
    json_decref(body);
  } else {
    out->body = strdup("{\"hello\":\"tls\"}");
  }
}

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  f->dir = cph_test_tmpdir("https");
  cph_md_make_cert(f->dir);
  snprintf(f->cert, sizeof f->cert, "%s/cert.pem", f->dir);
  snprintf(f->key, sizeof f->key, "%s/key.pem", f->dir);
  f->md = cph_md_start(answer, NULL, f->cert, f->key);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  cph_httpc_set_ca_file(NULL);
  cph_md_stop(f->md);
  cph_test_rmtree(f->dir);
  free(f->dir);
  free(f);
  return 0;
}

static int get(fixture *f, const char *ca_file, cph_httpc_response *resp, char *err,
               size_t len) {
  cph_httpc_url url;
  const char *why = NULL;
  assert_int_equal(cph_httpc_url_parse(cph_md_url(f->md), &url, &why), 0);
  assert_true(url.https);
  assert_string_equal(url.port, cph_md_url(f->md) + strlen("https://127.0.0.1:"));
  cph_httpc_request req = {.method = "GET", .path = "/hello", .timeout_ms = 5000,
                           .ca_file = ca_file};
  int rc = cph_httpc_do(&url, &req, resp, err, len);
  cph_httpc_url_free(&url);
  return rc;
}

static void test_https_with_the_servers_certificate_as_ca_succeeds_and_keeps_alive(
    void **state) {
  fixture *f = *state;
  for (int i = 0; i < 3; i++) {
    cph_httpc_response resp;
    char err[256];
    int rc = get(f, f->cert, &resp, err, sizeof err);
    if (rc != CPH_HTTPC_OK)
      fail_msg("GET over https with the CA: %d %s", rc, err);
    assert_int_equal(resp.status, 200);
    assert_string_equal(resp.reason, "OK");
    assert_string_equal(resp.body, "{\"hello\":\"tls\"}");
    cph_httpc_response_free(&resp);
  }
  assert_int_equal(cph_md_count(f->md), 3);
  assert_int_equal(cph_md_connections(f->md), 1); /* one TLS connection, reused */
}

static void test_https_without_the_ca_is_refused(void **state) {
  fixture *f = *state;
  cph_httpc_response resp;
  char err[256];
  int rc = get(f, NULL, &resp, err, sizeof err);
  assert_int_equal(rc, CPH_HTTPC_ETLS);
  assert_null(resp.body);
  if (!strstr(err, "certificate"))
    fail_msg("the error does not say certificate: %s", err);
  assert_int_equal(cph_md_count(f->md), 0); /* no request went through */
}

static void test_providers_reach_https_with_the_default_ca_and_refuse_without(void **state) {
  fixture *f = *state;
  char url[128];
  snprintf(url, sizeof url, "%s/v1/embeddings", cph_md_url(f->md));
  cph_policy_embedder cfg = {.kind = CPH_POLICY_PROVIDER_OPENAI, .url = url, .model = "e",
                             .api_key_env = "", .dimensions = 3, .timeout_ms = 5000};
  const char *texts[] = {"a", "b"};
  float out[6];
  cph_err err = {0};
  assert_int_equal(cph_embed_openai(&cfg, texts, 2, out, &err), CPH_EIO);
  assert_true(strstr(err.msg, url) != NULL);

  assert_int_equal(cph_httpc_set_ca_file(f->cert), CPH_OK);
  int rc = cph_embed_openai(&cfg, texts, 2, out, &err);
  if (rc != CPH_OK)
    fail_msg("embeddings over https with the CA: %s", err.msg);
  assert_float_equal(out[0], 0.6f, 1e-6);
  assert_float_equal(out[4], 0.8f, 1e-6);
  cph_httpc_set_ca_file(NULL);
  assert_int_equal(cph_embed_openai(&cfg, texts, 2, out, &err), CPH_EIO);
}

static void test_policy_providers_ca_file_is_what_the_engine_trusts(void **state) {
  fixture *f = *state;
  char policy[900];
  snprintf(policy, sizeof policy, "{:store {:sync :none} :providers {:ca-file \"%s\"}}",
           f->cert);
  cph_fixture *e = cph_fixture_new("https-policy", policy);
  char url[128];
  snprintf(url, sizeof url, "%s/v1/embeddings", cph_md_url(f->md));
  cph_policy_embedder cfg = {.kind = CPH_POLICY_PROVIDER_OPENAI, .url = url, .model = "e",
                             .api_key_env = "", .dimensions = 3, .timeout_ms = 5000};
  const char *texts[] = {"a"};
  float out[3];
  cph_err err = {0};
  int rc = cph_embed_openai(&cfg, texts, 1, out, &err);
  if (rc != CPH_OK)
    fail_msg("the engine opened with :providers :ca-file, yet: %s", err.msg);
  cph_fixture_free(e);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(
          test_https_with_the_servers_certificate_as_ca_succeeds_and_keeps_alive, setup,
          teardown),
      cmocka_unit_test_setup_teardown(test_https_without_the_ca_is_refused, setup, teardown),
      cmocka_unit_test_setup_teardown(
          test_providers_reach_https_with_the_default_ca_and_refuse_without, setup, teardown),
      cmocka_unit_test_setup_teardown(test_policy_providers_ca_file_is_what_the_engine_trusts,
                                      setup, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
