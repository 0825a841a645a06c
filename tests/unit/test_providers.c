/* core/providers.h (the built-in embedder and extractive summariser, the embedded vector
 * index in a temp LMDB) and providers/providers.h (the network providers: OpenAI-compatible
 * embeddings and chat, the HTTP vector index) against the HTTP test double — success, server
 * errors, malformed answers and refused URLs (DESIGN §7). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/http_client.h"
#include "core/providers.h"
#include "providers/providers.h"
#include "tests/support/httpd_double.h"
#include "tests/support/testutil.h"

#define DIMS 256

/* ---------------------------------------------------------------- helpers */

static double dot(const float *a, const float *b, uint32_t n) {
  double s = 0;
  for (uint32_t i = 0; i < n; i++)
    s += (double)a[i] * b[i];
  return s;
}

static double cosine_of(const char *a, const char *b) {
  float va[DIMS], vb[DIMS];
  cph_embed_builtin(a, DIMS, va);
  cph_embed_builtin(b, DIMS, vb);
  return dot(va, vb, DIMS);
}

static void assert_contains(const char *haystack, const char *needle) {
  if (!strstr(haystack, needle))
    fail_msg("expected \"%s\" in \"%s\"", needle, haystack);
}

static size_t tokens(const char *s) { return (strlen(s) + 3) / 4; }

/* ---------------------------------------------------------------- built-in embedder */

static void test_embed_builtin_is_deterministic_and_same_text_has_cosine_one(void **state) {
  (void)state;
  const char *text = "The deploy of build 42 failed on the staging cluster.";
  float a[DIMS], b[DIMS];
  cph_embed_builtin(text, DIMS, a);
  cph_embed_builtin(text, DIMS, b);
  assert_memory_equal(a, b, sizeof a);
  assert_true(fabs(dot(a, b, DIMS) - 1.0) < 1e-5);
  /* Case folding: the same words in other case are the same features. */
  assert_true(fabs(cosine_of(text, "THE DEPLOY OF BUILD 42 FAILED ON THE STAGING CLUSTER!") -
                   1.0) < 1e-5);
}

static void test_embed_builtin_vectors_have_unit_length(void **state) {
  (void)state;
  const char *texts[] = {"a", "hello world", "ünïcödé words and ascii words",
                         "one two three four five six seven eight nine ten eleven twelve"};
  for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
    float v[DIMS];
    cph_embed_builtin(texts[i], DIMS, v);
    double norm = sqrt(dot(v, v, DIMS));
    if (fabs(norm - 1.0) > 1e-5)
      fail_msg("|embed(\"%s\")| = %f, expected 1", texts[i], norm);
  }
  float small[8]; /* few dimensions: many collisions, still unit length */
  cph_embed_builtin("collisions are fine in a small space", 8, small);
  assert_true(fabs(sqrt(dot(small, small, 8)) - 1.0) < 1e-5);
}

static void test_embed_builtin_similar_texts_are_closer_than_unrelated(void **state) {
  (void)state;
  const char *base = "the database migration failed because the disk was full";
  const char *similar = "database migration failed: the disk is full again";
  const char *unrelated = "lunch on friday: pizza or sushi for the team outing";
  double near = cosine_of(base, similar), far = cosine_of(base, unrelated);
  if (!(near > far + 0.2))
    fail_msg("similar %f vs unrelated %f", near, far);
  /* Bigrams make word order count, a little. */
  double swapped = cosine_of("dog bites man", "man bites dog");
  assert_true(swapped < 0.999 && swapped > 0.5);
}

static void test_embed_builtin_empty_text_is_the_zero_vector(void **state) {
  (void)state;
  float v[DIMS], zero[DIMS] = {0};
  const char *empties[] = {"", "   \n\t ", "... !!! ???", NULL};
  for (size_t i = 0; i < sizeof empties / sizeof *empties; i++) {
    for (size_t d = 0; d < DIMS; d++)
      v[d] = 7.0f; /* every element must be written */
    cph_embed_builtin(empties[i], DIMS, v);
    assert_memory_equal(v, zero, sizeof v);
  }
}

/* ---------------------------------------------------------------- extractive summariser */

static const char *const NOTES[] = {
    "Good morning everyone. The deploy pipeline broke after the cache upgrade. Coffee is "
    "ready in the kitchen.",
    "The deploy pipeline is still broken; the cache upgrade changed the key format! Someone "
    "parked a car in my spot.",
    "Rolled back the cache upgrade and the deploy pipeline is green again. Lunch was late "
    "today."};

static void test_extractive_summary_respects_max_tokens(void **state) {
  (void)state;
  for (size_t max = 1; max <= 80; max++) {
    char *s = cph_summarize_extractive(NOTES, 3, max);
    assert_non_null(s);
    assert_true(s[0] != '\0');
    if (tokens(s) > max)
      fail_msg("max_tokens %zu: got %zu tokens: \"%s\"", max, tokens(s), s);
    free(s);
  }
  /* A budget that fits everything keeps every sentence. */
  char *all = cph_summarize_extractive(NOTES, 3, 10000);
  assert_contains(all, "Good morning everyone.");
  assert_contains(all, "Lunch was late today.");
  free(all);
}

static void test_extractive_summary_picks_the_frequent_topic_sentence(void **state) {
  (void)state;
  /* Room for about one sentence: it must be about the deploy pipeline and the cache upgrade,
   * the words every note repeats, not coffee or cars. */
  char *s = cph_summarize_extractive(NOTES, 3, 16);
  assert_contains(s, "deploy pipeline");
  assert_null(strstr(s, "Coffee"));
  assert_null(strstr(s, "parked"));
  assert_null(strstr(s, "Lunch"));
  free(s);
}

static void test_extractive_summary_keeps_the_original_order(void **state) {
  (void)state;
  char *s = cph_summarize_extractive(NOTES, 3, 60);
  const char *first = strstr(s, "The deploy pipeline broke");
  const char *second = strstr(s, "The deploy pipeline is still broken");
  const char *third = strstr(s, "Rolled back the cache upgrade");
  if (!first || !second || !third)
    fail_msg("expected all three topic sentences in \"%s\"", s);
  assert_true(first < second && second < third);
  free(s);
}

static void test_extractive_summary_is_deterministic_and_never_empty(void **state) {
  (void)state;
  char *a = cph_summarize_extractive(NOTES, 3, 30), *b = cph_summarize_extractive(NOTES, 3, 30);
  assert_string_equal(a, b);
  free(a);
  free(b);

  /* One sentence longer than the budget: its head, cut at a word, within the budget. */
  const char *long_one[] = {"an extraordinarily long sentence without any punctuation that "
                            "keeps going well past the small budget it is given"};
  char *s = cph_summarize_extractive(long_one, 1, 4);
  assert_true(s[0] != '\0' && tokens(s) <= 4);
  assert_true(strncmp(s, "an extraordinarily", strlen(s)) == 0);
  free(s);
  /* max_tokens 0 still says something. */
  s = cph_summarize_extractive(long_one, 1, 0);
  assert_true(s[0] != '\0' && strlen(s) <= 4);
  free(s);
  /* Multi-byte characters are never cut in half. */
  const char *wide[] = {"ééééééééééééééééééééééé"};
  s = cph_summarize_extractive(wide, 1, 2);
  assert_true(strlen(s) > 0 && strlen(s) <= 8 && strlen(s) % 2 == 0);
  free(s);

  /* No text at all gives "", not NULL. */
  const char *blank[] = {"", "  \n ", NULL};
  s = cph_summarize_extractive(blank, 3, 10);
  assert_string_equal(s, "");
  free(s);
  s = cph_summarize_extractive(NULL, 0, 10);
  assert_string_equal(s, "");
  free(s);
}

static void test_extractive_summary_splits_on_punctuation_and_lines_only(void **state) {
  (void)state;
  /* "3.14" and "example.com" do not end sentences; the line without a full stop does. */
  const char *texts[] = {"Pi is 3.14 per example.com docs. Noise here.\nA line without a stop\n"
                         "pi docs again mention example.com"};
  char *s = cph_summarize_extractive(texts, 1, 10000);
  assert_contains(s, "Pi is 3.14 per example.com docs.");
  assert_contains(s, "A line without a stop\npi docs"); /* no run-on across the line break */
  free(s);
}

/* ---------------------------------------------------------------- embedded vector index */

typedef struct store_fixture {
  char *dir;
  cph_store *store;
} store_fixture;

static int store_setup(void **state) {
  store_fixture *f = calloc(1, sizeof *f);
  f->dir = cph_test_tmpdir("vindex");
  cph_store_options o = {f->dir, 64u << 20, CPH_SYNC_NONE};
  cph_err err = {0};
  if (cph_store_open(&o, &f->store, &err))
    fail_msg("open %s: %s", f->dir, err.msg);
  *state = f;
  return 0;
}

static int store_teardown(void **state) {
  store_fixture *f = *state;
  cph_store_close(f->store);
  cph_test_rmtree(f->dir);
  free(f->dir);
  free(f);
  return 0;
}

static void put_text(cph_txn *t, const char *scope, uint64_t id, const char *text) {
  float v[DIMS];
  cph_embed_builtin(text, DIMS, v);
  assert_int_equal(cph_vindex_put(t, scope, id, v, DIMS), CPH_OK);
}

static void search_text(cph_store *s, const char *scope, const char *text, size_t k,
                        cph_vhit *out, size_t *n) {
  float q[DIMS];
  cph_embed_builtin(text, DIMS, q);
  cph_txn t;
  assert_int_equal(cph_txn_begin(s, false, &t), CPH_OK);
  int rc = cph_vindex_search(&t, scope, q, DIMS, k, out, n);
  if (rc)
    fail_msg("search: %s", t.err.msg);
  cph_txn_abort(&t);
}

static void test_vindex_search_ranks_best_first_within_k(void **state) {
  store_fixture *f = *state;
  cph_txn t;
  assert_int_equal(cph_txn_begin(f->store, true, &t), CPH_OK);
  put_text(&t, "s1", 1, "the database migration failed because the disk was full");
  put_text(&t, "s1", 2, "lunch on friday with the team");
  put_text(&t, "s1", 3, "database migration failed with disk full on the primary");
  put_text(&t, "s1", 4, "the quarterly report is due");
  put_text(&t, "s1", 5, "the database migration failed because the disk was full");
  assert_int_equal(cph_txn_commit(&t), CPH_OK);

  cph_vhit hits[3];
  size_t n = 0;
  search_text(f->store, "s1", "the database migration failed because the disk was full", 3,
              hits, &n);
  assert_int_equal(n, 3);
  /* Two exact matches tie at 1: the earlier memory first. Then the paraphrase. */
  assert_int_equal(hits[0].memory_id, 1);
  assert_int_equal(hits[1].memory_id, 5);
  assert_int_equal(hits[2].memory_id, 3);
  assert_true(fabsf(hits[0].score - 1.0f) < 1e-5f);
  assert_true(hits[1].score >= hits[2].score);

  /* k beyond the count returns everything, still best first. */
  cph_vhit all[10];
  search_text(f->store, "s1", "database disk", 10, all, &n);
  assert_int_equal(n, 5);
  for (size_t i = 1; i < n; i++)
    assert_true(all[i - 1].score >= all[i].score);
  /* k = 0 asks for nothing. */
  search_text(f->store, "s1", "database disk", 0, NULL, &n);
  assert_int_equal(n, 0);
}

static void test_vindex_scopes_are_isolated(void **state) {
  store_fixture *f = *state;
  cph_txn t;
  assert_int_equal(cph_txn_begin(f->store, true, &t), CPH_OK);
  put_text(&t, "s", 10, "alpha beta gamma");
  put_text(&t, "s1", 11, "alpha beta gamma");
  put_text(&t, "s10", 12, "alpha beta gamma");
  put_text(&t, "t", 13, "alpha beta gamma");
  assert_int_equal(cph_txn_commit(&t), CPH_OK);

  const char *scopes[] = {"s", "s1", "s10", "t"};
  for (size_t i = 0; i < 4; i++) {
    cph_vhit hits[10];
    size_t n = 0;
    search_text(f->store, scopes[i], "alpha beta gamma", 10, hits, &n);
    assert_int_equal(n, 1);
    assert_int_equal(hits[0].memory_id, 10 + i);
  }
  cph_vhit hits[10];
  size_t n = 7;
  search_text(f->store, "nobody", "alpha beta gamma", 10, hits, &n);
  assert_int_equal(n, 0);
}

static void test_vindex_deleted_ids_are_gone_and_absent_deletes_say_notfound(void **state) {
  store_fixture *f = *state;
  cph_txn t;
  assert_int_equal(cph_txn_begin(f->store, true, &t), CPH_OK);
  put_text(&t, "s1", 1, "first memory text");
  put_text(&t, "s1", 2, "second memory text");
  put_text(&t, "s2", 1, "first memory text");
  assert_int_equal(cph_txn_commit(&t), CPH_OK);

  assert_int_equal(cph_txn_begin(f->store, true, &t), CPH_OK);
  assert_int_equal(cph_vindex_del(&t, "s1", 1), CPH_OK);
  /* Already gone, never there, or in another scope's place: an answer, not a failure. */
  assert_int_equal(cph_vindex_del(&t, "s1", 1), CPH_ENOTFOUND);
  assert_int_equal(cph_vindex_del(&t, "s1", 99), CPH_ENOTFOUND);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);

  cph_vhit hits[10];
  size_t n;
  search_text(f->store, "s1", "first memory text", 10, hits, &n);
  assert_int_equal(n, 1);
  assert_int_equal(hits[0].memory_id, 2);
  search_text(f->store, "s2", "first memory text", 10, hits, &n); /* s2's id 1 stays */
  assert_int_equal(n, 1);
  assert_int_equal(hits[0].memory_id, 1);
}

static void test_vindex_skips_other_widths_and_reports_corrupt_values(void **state) {
  store_fixture *f = *state;
  cph_txn t;
  float wide[2 * DIMS] = {1.0f};
  float nan_vec[4] = {1.0f, NAN, 0, 0};
  assert_int_equal(cph_txn_begin(f->store, true, &t), CPH_OK);
  put_text(&t, "s1", 1, "kept vector");
  assert_int_equal(cph_vindex_put(&t, "s1", 2, wide, 2 * DIMS), CPH_OK); /* an older model */
  assert_int_equal(cph_vindex_put(&t, "s1", 3, nan_vec, 4), CPH_EINVAL);
  assert_int_equal(cph_vindex_put(&t, "s1", 3, wide, 0), CPH_EINVAL);
  assert_int_equal(cph_txn_commit(&t), CPH_OK); /* bad arguments do not fail the txn */

  cph_vhit hits[4];
  size_t n;
  search_text(f->store, "s1", "kept vector", 4, hits, &n);
  assert_int_equal(n, 1);
  assert_int_equal(hits[0].memory_id, 1);

  /* A value whose length disagrees with its dims is a corrupt record, named by its key. */
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, "s1");
  cph_key_u64(&k, 9);
  uint8_t bad[6] = {2, 0, 0, 0, 1, 2};
  assert_int_equal(cph_txn_begin(f->store, true, &t), CPH_OK);
  assert_int_equal(cph_txn_put(&t, CPH_DB_VECTORS, &k, bad, sizeof bad), CPH_OK);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
  float q[DIMS];
  cph_embed_builtin("kept vector", DIMS, q);
  assert_int_equal(cph_txn_begin(f->store, false, &t), CPH_OK);
  assert_int_equal(cph_vindex_search(&t, "s1", q, DIMS, 4, hits, &n), CPH_ECORRUPT);
  assert_contains(t.err.msg, "\"vectors\"");
  assert_contains(t.err.msg, "\"s1\"/9");
  cph_txn_abort(&t);
}

/* ---------------------------------------------------------------- network providers */

typedef struct net_fixture {
  cph_httpd *httpd;
  char url[160];
} net_fixture;

static int net_setup(void **state) {
  net_fixture *f = calloc(1, sizeof *f);
  f->httpd = cph_httpd_start();
  snprintf(f->url, sizeof f->url, "%s/v1/endpoint", cph_httpd_url(f->httpd));
  *state = f;
  return 0;
}

static int net_teardown(void **state) {
  net_fixture *f = *state;
  cph_httpd_stop(f->httpd);
  free(f);
  unsetenv("CPH_TEST_API_KEY");
  return 0;
}

static cph_policy_embedder embedder(char *url, int64_t dims) {
  return (cph_policy_embedder){.kind = CPH_POLICY_PROVIDER_OPENAI, .url = url, .model = "emb-1",
                               .api_key_env = "", .dimensions = dims, .timeout_ms = 5000};
}

static cph_policy_summarizer summarizer(char *url) {
  return (cph_policy_summarizer){.kind = CPH_POLICY_PROVIDER_OPENAI, .url = url,
                                 .model = "chat-1", .api_key_env = "", .timeout_ms = 5000,
                                 .max_tokens = 64};
}

static cph_policy_vector_index vindex(char *url) {
  return (cph_policy_vector_index){.kind = CPH_POLICY_INDEX_HTTP, .url = url, .shards = 2,
                                   .timeout_ms = 5000};
}

/* The recorded request i parsed as JSON (fails the test if it is not). */
static json_t *request_json(net_fixture *f, size_t i, const char *path) {
  cph_httpd_request r;
  if (!cph_httpd_request_at(f->httpd, i, &r))
    fail_msg("no request %zu recorded", i);
  assert_string_equal(r.method, "POST");
  assert_string_equal(r.path, path);
  char ct[64];
  assert_true(cph_httpd_request_header(&r, "Content-Type", ct, sizeof ct));
  assert_string_equal(ct, "application/json");
  json_error_t jerr;
  json_t *j = json_loadb(r.body, r.body_len, 0, &jerr);
  if (!j)
    fail_msg("request body is not JSON: %s", jerr.text);
  cph_httpd_request_free(&r);
  return j;
}

static void test_embed_openai_sends_model_inputs_and_key_and_places_by_index(void **state) {
  net_fixture *f = *state;
  setenv("CPH_TEST_API_KEY", "sk-test-123", 1);
  /* Answered out of order: "index" decides where each embedding goes. */
  cph_httpd_script(f->httpd,
                   (cph_httpd_reply[]){{200,
                                        "{\"object\":\"list\",\"data\":["
                                        "{\"index\":1,\"embedding\":[0.5,0.25,-1]},"
                                        "{\"index\":0,\"embedding\":[1,2,3]}],"
                                        "\"model\":\"emb-1\"}",
                                        0}},
                   1);
  cph_policy_embedder cfg = embedder(f->url, 3);
  cfg.api_key_env = "CPH_TEST_API_KEY";
  const char *texts[] = {"first text", "second ✓"};
  float out[6];
  cph_err err = {0};
  int rc = cph_embed_openai(&cfg, texts, 2, out, &err);
  if (rc)
    fail_msg("embed: %s", err.msg);
  const float want[6] = {1, 2, 3, 0.5f, 0.25f, -1};
  assert_memory_equal(out, want, sizeof want);

  json_t *req = request_json(f, 0, "/v1/endpoint");
  assert_string_equal(json_string_value(json_object_get(req, "model")), "emb-1");
  json_t *input = json_object_get(req, "input");
  assert_int_equal(json_array_size(input), 2);
  assert_string_equal(json_string_value(json_array_get(input, 1)), "second ✓");
  json_decref(req);
  cph_httpd_request r;
  assert_true(cph_httpd_request_at(f->httpd, 0, &r));
  char auth[128];
  assert_true(cph_httpd_request_header(&r, "Authorization", auth, sizeof auth));
  assert_string_equal(auth, "Bearer sk-test-123");
  cph_httpd_request_free(&r);
}

static void test_embed_openai_errors_name_the_url_and_the_problem(void **state) {
  net_fixture *f = *state;
  cph_httpd_script(f->httpd,
                   (cph_httpd_reply[]){
                       {500, "{\"error\":{\"message\":\"model overloaded\"}}", 0},
                       {200, "{\"data\": [{\"embedding\": [1, 2", 0},
                       {200, "{\"data\":[{\"index\":0,\"embedding\":[1,2]}]}", 0},
                       {200, "{\"data\":[]}", 0},
                       {200, "{\"data\":[{\"index\":0,\"embedding\":[1,\"x\",3]}]}", 0},
                   },
                   5);
  cph_policy_embedder cfg = embedder(f->url, 3);
  const char *texts[] = {"hello"};
  float out[3];
  cph_err err = {0};

  assert_int_equal(cph_embed_openai(&cfg, texts, 1, out, &err), CPH_EIO);
  assert_contains(err.msg, f->url);
  assert_contains(err.msg, "HTTP 500");
  assert_contains(err.msg, "model overloaded");

  assert_int_equal(cph_embed_openai(&cfg, texts, 1, out, &err), CPH_EPARSE);
  assert_contains(err.msg, f->url);
  assert_contains(err.msg, "not JSON");

  assert_int_equal(cph_embed_openai(&cfg, texts, 1, out, &err), CPH_EPARSE);
  assert_contains(err.msg, "2 dimensions, expected 3");

  assert_int_equal(cph_embed_openai(&cfg, texts, 1, out, &err), CPH_EPARSE);
  assert_contains(err.msg, "0 items for 1 inputs");

  assert_int_equal(cph_embed_openai(&cfg, texts, 1, out, &err), CPH_EPARSE);
  assert_contains(err.msg, "embedding[1] is not a finite number");
  assert_int_equal(cph_httpd_count(f->httpd), 5);

  /* A named key variable that is unset fails before any request. */
  cfg.api_key_env = "CPH_TEST_API_KEY";
  assert_int_equal(cph_embed_openai(&cfg, texts, 1, out, &err), CPH_EAUTH);
  assert_contains(err.msg, "CPH_TEST_API_KEY");
  assert_int_equal(cph_httpd_count(f->httpd), 5);
  /* Nothing to embed: no request either. */
  assert_int_equal(cph_embed_openai(&cfg, texts, 0, out, &err), CPH_OK);
  assert_int_equal(cph_httpd_count(f->httpd), 5);
}

static void test_network_failures_name_the_url(void **state) {
  net_fixture *f = *state;
  /* Slower than the timeout: CPH_ETIMEDOUT, well before the reply would come. */
  size_t asked = cph_httpd_count(f->httpd);
  cph_httpd_script(f->httpd, (cph_httpd_reply[]){{200, "{}", 3000}}, 1);
  cph_policy_embedder cfg = embedder(f->url, 3);
  cfg.timeout_ms = 200;
  const char *texts[] = {"hello"};
  float out[3];
  cph_err err = {0};
  assert_int_equal(cph_embed_openai(&cfg, texts, 1, out, &err), CPH_ETIMEDOUT);
  assert_contains(err.msg, f->url);
  /* The double may take the timed-out request only now (a loaded machine): it must have taken
   * its scripted reply before the next script replaces it, or it would take that one. */
  for (int waited = 0; cph_httpd_count(f->httpd) == asked && waited < 10000; waited += 10)
    usleep(10 * 1000);
  assert_int_equal(cph_httpd_count(f->httpd), asked + 1);

  /* Closed without an answer. */
  cph_httpd_script(f->httpd, (cph_httpd_reply[]){{0, NULL, 0}}, 1);
  cfg.timeout_ms = 5000;
  assert_int_equal(cph_embed_openai(&cfg, texts, 1, out, &err), CPH_EIO);
  assert_contains(err.msg, f->url);

  /* Nobody listening. */
  char dead[160];
  cph_httpd *gone = cph_httpd_start();
  snprintf(dead, sizeof dead, "%s/v1/embeddings", cph_httpd_url(gone));
  cph_httpd_stop(gone);
  cfg = embedder(dead, 3);
  assert_int_equal(cph_embed_openai(&cfg, texts, 1, out, &err), CPH_EIO);
  assert_contains(err.msg, dead);
  assert_contains(err.msg, "cannot connect");
}

static void test_summarize_openai_returns_the_trimmed_content(void **state) {
  net_fixture *f = *state;
  cph_httpd_script(f->httpd,
                   (cph_httpd_reply[]){{200,
                                        "{\"choices\":[{\"index\":0,\"message\":{\"role\":"
                                        "\"assistant\",\"content\":\"  Deploy fixed by "
                                        "rollback.\\n\"}}]}",
                                        0}},
                   1);
  cph_policy_summarizer cfg = summarizer(f->url);
  const char *texts[] = {"deploy broke", "rolled back"};
  char *out = NULL;
  cph_err err = {0};
  int rc = cph_summarize_openai(&cfg, texts, 2, &out, &err);
  if (rc)
    fail_msg("summarize: %s", err.msg);
  assert_string_equal(out, "Deploy fixed by rollback.");
  free(out);

  json_t *req = request_json(f, 0, "/v1/endpoint");
  assert_string_equal(json_string_value(json_object_get(req, "model")), "chat-1");
  assert_int_equal(json_integer_value(json_object_get(req, "max_tokens")), 64);
  json_t *msgs = json_object_get(req, "messages");
  assert_int_equal(json_array_size(msgs), 2);
  assert_string_equal(json_string_value(json_object_get(json_array_get(msgs, 0), "role")),
                      "system");
  const char *user = json_string_value(json_object_get(json_array_get(msgs, 1), "content"));
  assert_contains(user, "deploy broke");
  assert_contains(user, "rolled back");
  json_decref(req);
}

static void test_summarize_openai_rejects_errors_and_malformed_answers(void **state) {
  net_fixture *f = *state;
  cph_httpd_script(f->httpd,
                   (cph_httpd_reply[]){
                       {500, "upstream exploded", 0},
                       {200, "not json", 0},
                       {200, "{\"choices\":[]}", 0},
                       {200, "{\"choices\":[{\"message\":{\"content\":\"  \"}}]}", 0},
                       {429, "{\"error\":{\"message\":\"slow down\"}}", 0},
                   },
                   5);
  cph_policy_summarizer cfg = summarizer(f->url);
  const char *texts[] = {"x"};
  char *out = NULL;
  cph_err err = {0};
  assert_int_equal(cph_summarize_openai(&cfg, texts, 1, &out, &err), CPH_EIO);
  assert_contains(err.msg, f->url);
  assert_contains(err.msg, "upstream exploded");
  assert_int_equal(cph_summarize_openai(&cfg, texts, 1, &out, &err), CPH_EPARSE);
  assert_contains(err.msg, "not JSON");
  assert_int_equal(cph_summarize_openai(&cfg, texts, 1, &out, &err), CPH_EPARSE);
  assert_contains(err.msg, "choices[0].message.content");
  assert_int_equal(cph_summarize_openai(&cfg, texts, 1, &out, &err), CPH_EPARSE);
  assert_contains(err.msg, "empty");
  assert_int_equal(cph_summarize_openai(&cfg, texts, 1, &out, &err), CPH_EBUSY);
  assert_contains(err.msg, "HTTP 429");
  assert_null(out);
}

static void test_vindex_http_upsert_sends_shard_and_items(void **state) {
  net_fixture *f = *state;
  char base[160];
  snprintf(base, sizeof base, "%s/index/", cph_httpd_url(f->httpd)); /* trailing '/' is fine */
  cph_httpd_script(f->httpd,
                   (cph_httpd_reply[]){{200, "{\"upserted\": 2}", 0},
                                       {200, "{\"upserted\": 1}", 0},
                                       {503, "{\"error\":\"rebuilding\"}", 0}},
                   3);
  cph_policy_vector_index cfg = vindex(base);
  const float v1[3] = {0.5f, -0.25f, 0.1f}, v2[3] = {1, 0, 0};
  cph_vitem items[2] = {{7, "s1", v1, 3}, {8, "s2", v2, 3}};
  cph_err err = {0};
  int rc = cph_vindex_http_upsert(&cfg, 1, items, 2, &err);
  if (rc)
    fail_msg("upsert: %s", err.msg);

  json_t *req = request_json(f, 0, "/index/upsert");
  assert_int_equal(json_integer_value(json_object_get(req, "shard")), 1);
  json_t *arr = json_object_get(req, "items");
  assert_int_equal(json_array_size(arr), 2);
  json_t *first = json_array_get(arr, 0);
  assert_int_equal(json_integer_value(json_object_get(first, "id")), 7);
  assert_string_equal(json_string_value(json_object_get(first, "scope")), "s1");
  json_t *vec = json_object_get(first, "vector");
  assert_int_equal(json_array_size(vec), 3);
  for (size_t i = 0; i < 3; i++) /* floats survive the trip exactly */
    assert_true((float)json_number_value(json_array_get(vec, i)) == v1[i]);
  json_decref(req);

  /* Fewer upserted than sent is an error; so is a 503. */
  assert_int_equal(cph_vindex_http_upsert(&cfg, 1, items, 2, &err), CPH_EPARSE);
  assert_contains(err.msg, "upserted 1 of 2");
  assert_int_equal(cph_vindex_http_upsert(&cfg, 1, items, 2, &err), CPH_EBUSY);
  assert_contains(err.msg, "/index/upsert");
  assert_contains(err.msg, "HTTP 503");
}

static void test_vindex_http_delete_confirms_only_listed_ids(void **state) {
  net_fixture *f = *state;
  cph_httpd_script(f->httpd,
                   (cph_httpd_reply[]){{200, "{\"deleted\": [3, 1, 99]}", 0},
                                       {200, "{\"deleted\": [1, \"2\"]}", 0},
                                       {200, "{\"deleted\": [1, 2", 0},
                                       {500, "", 0},
                                       {200, "{\"gone\": [1]}", 0}},
                   5);
  cph_policy_vector_index cfg = vindex(f->url);
  const uint64_t ids[3] = {1, 2, 3};
  bool confirmed[3] = {true, true, true};
  cph_err err = {0};
  int rc = cph_vindex_http_delete(&cfg, 0, "emb-1", ids, 3, confirmed, &err);
  if (rc)
    fail_msg("delete: %s", err.msg);
  /* 2 was not listed (the index has not confirmed it); 99 was never asked for. */
  assert_true(confirmed[0]);
  assert_false(confirmed[1]);
  assert_true(confirmed[2]);

  json_t *req = request_json(f, 0, "/v1/endpoint/delete");
  assert_int_equal(json_integer_value(json_object_get(req, "shard")), 0);
  assert_string_equal(json_string_value(json_object_get(req, "model")), "emb-1");
  assert_int_equal(json_array_size(json_object_get(req, "ids")), 3);
  json_decref(req);

  /* Malformed answers and errors confirm nothing, whatever the array held before. */
  const char *expect[] = {"deleted[1] is not a memory id", "not JSON", "HTTP 500",
                          "expected {\"deleted\""};
  for (size_t i = 0; i < 4; i++) {
    memset(confirmed, 1, sizeof confirmed);
    assert_int_not_equal(cph_vindex_http_delete(&cfg, 0, "emb-1", ids, 3, confirmed, &err),
                         CPH_OK);
    assert_contains(err.msg, expect[i]);
    assert_false(confirmed[0] || confirmed[1] || confirmed[2]);
  }
}

static void test_vindex_http_search_returns_k_best_first(void **state) {
  net_fixture *f = *state;
  cph_httpd_script(f->httpd,
                   (cph_httpd_reply[]){
                       {200,
                        "{\"hits\":[{\"id\":4,\"score\":0.2},{\"id\":9,\"score\":0.9},"
                        "{\"id\":5,\"score\":0.5}]}",
                        0},
                       {200, "{\"hits\":[{\"id\":4}]}", 0},
                       {200, "{\"hits\":[]}", 0}},
                   3);
  cph_policy_vector_index cfg = vindex(f->url);
  const float q[2] = {1, 0};
  cph_vhit hits[2];
  size_t n = 0;
  cph_err err = {0};
  int rc = cph_vindex_http_search(&cfg, "s1", q, 2, 2, hits, &n, &err);
  if (rc)
    fail_msg("search: %s", err.msg);
  assert_int_equal(n, 2);
  assert_int_equal(hits[0].memory_id, 9);
  assert_int_equal(hits[1].memory_id, 5);
  assert_true(fabsf(hits[0].score - 0.9f) < 1e-6f);

  json_t *req = request_json(f, 0, "/v1/endpoint/search");
  assert_string_equal(json_string_value(json_object_get(req, "scope")), "s1");
  assert_int_equal(json_integer_value(json_object_get(req, "k")), 2);
  assert_int_equal(json_array_size(json_object_get(req, "vector")), 2);
  json_decref(req);

  assert_int_equal(cph_vindex_http_search(&cfg, "s1", q, 2, 2, hits, &n, &err), CPH_EPARSE);
  assert_contains(err.msg, "hits[0]");
  assert_int_equal(n, 0);
  assert_int_equal(cph_vindex_http_search(&cfg, "s1", q, 2, 2, hits, &n, &err), CPH_OK);
  assert_int_equal(n, 0);
}

static void test_https_urls_are_tried_and_a_failed_connection_names_the_url(void **state) {
  (void)state;
  /* Nobody listens on the port: the https URL is accepted, the connection fails, and the
   * message names the URL (tests/integration/test_https.c covers a real TLS server). */
  char url[64];
  cph_httpd *gone = cph_httpd_start();
  snprintf(url, sizeof url, "https://127.0.0.1:%d/v1/embeddings", cph_httpd_port(gone));
  cph_httpd_stop(gone);
  cph_err err = {0};
  const char *texts[] = {"x"};

  cph_policy_embedder e = embedder(url, 3);
  e.timeout_ms = 5000;
  float out[3];
  assert_int_equal(cph_embed_openai(&e, texts, 1, out, &err), CPH_EIO);
  assert_contains(err.msg, "cannot connect");
  assert_contains(err.msg, url);

  cph_policy_vector_index v = vindex(url);
  v.timeout_ms = 5000;
  bool confirmed[1];
  const uint64_t ids[1] = {1};
  assert_int_equal(cph_vindex_http_delete(&v, 0, "m", ids, 1, confirmed, &err), CPH_EIO);
  assert_contains(err.msg, "cannot connect");
  assert_false(confirmed[0]);
}

static void test_http_client_sends_extra_headers_and_refuses_injection(void **state) {
  net_fixture *f = *state;
  cph_httpc_url url;
  const char *why = NULL;
  assert_int_equal(cph_httpc_url_parse(cph_httpd_url(f->httpd), &url, &why), 0);
  const char *headers[] = {"X-Trace: abc", NULL};
  cph_httpc_request req = {.method = "POST", .path = "/p", .headers = headers, .body = "{}",
                           .body_len = 2, .timeout_ms = 5000};
  cph_httpc_response resp;
  char err[256];
  assert_int_equal(cph_httpc_do(&url, &req, &resp, err, sizeof err), CPH_HTTPC_OK);
  assert_int_equal(resp.status, 200);
  assert_string_equal(resp.body, "{}");
  cph_httpc_response_free(&resp);
  cph_httpd_request r;
  assert_true(cph_httpd_request_at(f->httpd, 0, &r));
  char v[32];
  assert_true(cph_httpd_request_header(&r, "x-trace", v, sizeof v));
  assert_string_equal(v, "abc");
  assert_string_equal(r.body, "{}");
  cph_httpd_request_free(&r);

  const char *evil[] = {"X-A: b\r\nX-Injected: 1", NULL};
  req.headers = evil;
  assert_int_equal(cph_httpc_do(&url, &req, &resp, err, sizeof err), CPH_HTTPC_EINVAL);
  cph_httpc_response_free(&resp);
  assert_int_equal(cph_httpd_count(f->httpd), 1);
  cph_httpc_url_free(&url);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_embed_builtin_is_deterministic_and_same_text_has_cosine_one),
      cmocka_unit_test(test_embed_builtin_vectors_have_unit_length),
      cmocka_unit_test(test_embed_builtin_similar_texts_are_closer_than_unrelated),
      cmocka_unit_test(test_embed_builtin_empty_text_is_the_zero_vector),
      cmocka_unit_test(test_extractive_summary_respects_max_tokens),
      cmocka_unit_test(test_extractive_summary_picks_the_frequent_topic_sentence),
      cmocka_unit_test(test_extractive_summary_keeps_the_original_order),
      cmocka_unit_test(test_extractive_summary_is_deterministic_and_never_empty),
      cmocka_unit_test(test_extractive_summary_splits_on_punctuation_and_lines_only),
      cmocka_unit_test_setup_teardown(test_vindex_search_ranks_best_first_within_k, store_setup,
                                      store_teardown),
      cmocka_unit_test_setup_teardown(test_vindex_scopes_are_isolated, store_setup,
                                      store_teardown),
      cmocka_unit_test_setup_teardown(
          test_vindex_deleted_ids_are_gone_and_absent_deletes_say_notfound, store_setup,
          store_teardown),
      cmocka_unit_test_setup_teardown(test_vindex_skips_other_widths_and_reports_corrupt_values,
                                      store_setup, store_teardown),
      cmocka_unit_test_setup_teardown(
          test_embed_openai_sends_model_inputs_and_key_and_places_by_index, net_setup,
          net_teardown),
      cmocka_unit_test_setup_teardown(test_embed_openai_errors_name_the_url_and_the_problem,
                                      net_setup, net_teardown),
      cmocka_unit_test_setup_teardown(test_network_failures_name_the_url, net_setup,
                                      net_teardown),
      cmocka_unit_test_setup_teardown(test_summarize_openai_returns_the_trimmed_content,
                                      net_setup, net_teardown),
      cmocka_unit_test_setup_teardown(test_summarize_openai_rejects_errors_and_malformed_answers,
                                      net_setup, net_teardown),
      cmocka_unit_test_setup_teardown(test_vindex_http_upsert_sends_shard_and_items, net_setup,
                                      net_teardown),
      cmocka_unit_test_setup_teardown(test_vindex_http_delete_confirms_only_listed_ids,
                                      net_setup, net_teardown),
      cmocka_unit_test_setup_teardown(test_vindex_http_search_returns_k_best_first, net_setup,
                                      net_teardown),
      cmocka_unit_test(test_https_urls_are_tried_and_a_failed_connection_names_the_url),
      cmocka_unit_test_setup_teardown(test_http_client_sends_extra_headers_and_refuses_injection,
                                      net_setup, net_teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
