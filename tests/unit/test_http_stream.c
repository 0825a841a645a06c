/* common/http_client's streamed body (on_data): the answer reaches the callback in pieces as
 * it arrives — all of it, in order, nothing kept in the response — and a callback that says
 * stop abandons the exchange (CPH_HTTPC_ECANCELED). cluster.c reads etcd's watch so. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/http_client.h"
#include "tests/support/httpd_double.h"

typedef struct sink {
  cph_buf got;
  int calls;
  int stop_after; /* 0: never */
} sink;

static int collect(void *arg, const char *data, size_t len) {
  sink *k = arg;
  cph_buf_append(&k->got, data, len);
  k->calls++;
  return k->stop_after && k->calls >= k->stop_after;
}

static int fetch(cph_httpd *d, sink *k, cph_httpc_response *resp, char *err, size_t err_len) {
  cph_httpc_url url;
  const char *why = NULL;
  assert_int_equal(cph_httpc_url_parse(cph_httpd_url(d), &url, &why), 0);
  cph_httpc_request req = {.method = "POST",
                           .path = "/v3/watch",
                           .body = "{}",
                           .body_len = 2,
                           .timeout_ms = 5000,
                           .on_data = collect,
                           .on_data_arg = k};
  int rc = cph_httpc_do(&url, &req, resp, err, err_len);
  cph_httpc_url_free(&url);
  return rc;
}

static void test_the_body_is_handed_over_in_order_and_not_kept(void **state) {
  (void)state;
  size_t n = 300000; /* several writes of libcurl's */
  char *body = malloc(n + 1);
  assert_non_null(body);
  for (size_t i = 0; i < n; i++)
    body[i] = (char)('a' + i % 26);
  body[n] = '\0';
  cph_httpd *d = cph_httpd_start();
  cph_httpd_script(d, (cph_httpd_reply[]){{200, body, 0}}, 1);
  sink k = {CPH_BUF_INIT, 0, 0};
  cph_httpc_response resp;
  char err[256];
  assert_int_equal(fetch(d, &k, &resp, err, sizeof err), CPH_HTTPC_OK);
  assert_int_equal(resp.status, 200);
  assert_int_equal(resp.body_len, 0);
  assert_int_equal(k.got.len, n);
  assert_memory_equal(k.got.data, body, n);
  assert_true(k.calls > 1);
  cph_httpc_response_free(&resp);
  cph_buf_free(&k.got);

  sink stop = {CPH_BUF_INIT, 0, 1}; /* stop at the first piece */
  cph_httpd_script(d, (cph_httpd_reply[]){{200, body, 0}}, 1);
  assert_int_equal(fetch(d, &stop, &resp, err, sizeof err), CPH_HTTPC_ECANCELED);
  assert_int_equal(stop.calls, 1);
  assert_true(stop.got.len < n);
  cph_httpc_response_free(&resp);
  cph_buf_free(&stop.got);
  cph_httpd_stop(d);
  free(body);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_the_body_is_handed_over_in_order_and_not_kept),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
