/* Memory search against the real cephalond on loopback (DESIGN §7 "reads see writes", §9):
 * a memory written by a completion is found by the very next search and shows in the next
 * turn's recent_memory, with the built-in embedder and with an OpenAI-compatible embeddings
 * endpoint served by the test (tests/support/httpd_double.h) — and when that endpoint fails or
 * hangs, the search still answers 200 with the lexical hit and "degraded": true. No hit ever
 * scores <= 0, a query that matches nothing answers no hit, and a session sees its own and its
 * channels' memories, never another session's. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "tests/support/daemon.h"
#include "tests/support/hclient.h"
#include "tests/support/httpd_double.h"
#include "tests/support/testutil.h"

/* Dedupe off (every trigger event is its own message), a janitor embedding as fast as it can. */
static const char *POLICY_BUILTIN = "{:dedupe {:min-length 1000000}\n"
                                    " :maintenance {:outbox {:drain-interval-s 1}}\n"
                                    " :store {:sync :none}}\n";

#define DIMS 16

/* ---------------------------------------------------------------- the embeddings double */

typedef enum embed_mode {
  EMBED_OK,            /* embeds everything */
  EMBED_FAIL_MEMORIES, /* 500 for texts holding "hunter2" (the memory), embeds queries */
  EMBED_FAIL_ALL,      /* 500 for everything */
  EMBED_HANG           /* answers after 6 s, past the daemon's 1 s timeout */
} embed_mode;

typedef struct embedder {
  pthread_mutex_t mu;
  embed_mode mode;
  int requests;
  int bad_requests; /* requests not in the OpenAI wire format */
  char last_bad[256];
} embedder;

static embedder g_emb = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* A deterministic bag-of-words embedding: each lower-cased word adds +-1 to one of DIMS
 * buckets; L2-normalised. Texts sharing words point the same way. */
static void bow_embed(const char *text, double *v) {
  memset(v, 0, DIMS * sizeof *v);
  for (const char *p = text; *p;) {
    while (*p && !isalnum((unsigned char)*p))
      p++;
    uint64_t h = 1469598103934665603ULL;
    bool any = false;
    for (; *p && isalnum((unsigned char)*p); p++, any = true)
      h = (h ^ (uint64_t)tolower((unsigned char)*p)) * 1099511628211ULL;
    if (any)
      v[h % DIMS] += (h >> 63) ? -1.0 : 1.0;
  }
  double n = 0;
  for (int i = 0; i < DIMS; i++)
    n += v[i] * v[i];
  for (int i = 0; n > 0 && i < DIMS; i++)
    v[i] /= sqrt(n);
}

static void embedder_bad(embedder *e, const char *why) {
  e->bad_requests++;
  snprintf(e->last_bad, sizeof e->last_bad, "%s", why);
}

/* POST /v1/embeddings {"model", "input": [texts] | text} -> {"object": "list", "data":
 * [{"object": "embedding", "index": i, "embedding": [...]}], "model", "usage"}. */
static void embeddings_handler(const char *method, const char *path, const char *body,
                               size_t body_len, void *ctx, cph_httpd_reply *out) {
  embedder *e = ctx;
  pthread_mutex_lock(&e->mu);
  e->requests++;
  embed_mode mode = e->mode;
  json_t *req = json_loadb(body, body_len, 0, NULL);
  json_t *input = req ? json_object_get(req, "input") : NULL;
  const char *model = req ? json_string_value(json_object_get(req, "model")) : NULL;
  if (strcmp(method, "POST") != 0 || strcmp(path, "/v1/embeddings") != 0)
    embedder_bad(e, "not POST /v1/embeddings");
  else if (!model || strcmp(model, "test-embed") != 0)
    embedder_bad(e, "model is not \"test-embed\"");
  else if (!json_is_array(input) && !json_is_string(input))
    embedder_bad(e, "input is neither a string nor an array of strings");
  pthread_mutex_unlock(&e->mu);

  json_t *texts = json_is_string(input) ? json_pack("[O]", input) : json_incref(input);
  bool memory = false;
  for (size_t i = 0; i < json_array_size(texts); i++) {
    const char *t = json_string_value(json_array_get(texts, i));
    memory |= t && strstr(t, "hunter2");
  }
  if (mode == EMBED_FAIL_ALL || (mode == EMBED_FAIL_MEMORIES && memory) || !texts) {
    *out = (cph_httpd_reply){500, strdup("{\"error\":{\"message\":\"embedder down\"}}"), 0};
  } else {
    json_t *data = json_array();
    size_t tokens = 0;
    for (size_t i = 0; i < json_array_size(texts); i++) {
      const char *t = json_string_value(json_array_get(texts, i));
      double v[DIMS];
      bow_embed(t ? t : "", v);
      json_t *emb = json_array();
      for (int d = 0; d < DIMS; d++)
        json_array_append_new(emb, json_real(v[d]));
      json_array_append_new(data, json_pack("{s:s, s:I, s:o}", "object", "embedding", "index",
                                            (json_int_t)i, "embedding", emb));
      tokens += t ? strlen(t) / 4 + 1 : 1;
    }
    json_t *answer = json_pack("{s:s, s:o, s:s, s:{s:I, s:I}}", "object", "list", "data", data,
                               "model", "test-embed", "usage", "prompt_tokens",
                               (json_int_t)tokens, "total_tokens", (json_int_t)tokens);
    *out = (cph_httpd_reply){200, json_dumps(answer, JSON_COMPACT), mode == EMBED_HANG ? 6000 : 0};
    json_decref(answer);
  }
  json_decref(texts);
  json_decref(req);
}

static void embedder_set(embed_mode mode) {
  pthread_mutex_lock(&g_emb.mu);
  g_emb.mode = mode;
  pthread_mutex_unlock(&g_emb.mu);
}

/* ---------------------------------------------------------------- fixture */

typedef struct fixture {
  char *policy;
  cph_httpd *httpd; /* the embeddings endpoint, for the :openai tests */
  cph_test_daemon d;
} fixture;

static int start(void **state, const char *policy_text, cph_httpd *httpd) {
  fixture *f = calloc(1, sizeof *f);
  f->httpd = httpd;
  f->policy = cph_test_write_tmpfile(".edn", policy_text);
  *state = f;
  return cph_test_daemon_start(&f->d, f->policy, NULL, NULL);
}

static int setup_builtin(void **state) { return start(state, POLICY_BUILTIN, NULL); }

static int setup_openai(void **state) {
  pthread_mutex_lock(&g_emb.mu);
  g_emb.mode = EMBED_OK;
  g_emb.requests = g_emb.bad_requests = 0;
  pthread_mutex_unlock(&g_emb.mu);
  cph_httpd *h = cph_httpd_start();
  cph_httpd_set_handler(h, embeddings_handler, &g_emb);
  char policy[1024];
  snprintf(policy, sizeof policy,
           "{:dedupe {:min-length 1000000}\n"
           " :providers {:embeddings {:kind :openai :url \"%s/v1/embeddings\"\n"
           "                          :model \"test-embed\" :dimensions %d :timeout-ms 1000}}\n"
           " :maintenance {:outbox {:drain-interval-s 1} :embeddings {:batch-size 4}}\n"
           " :store {:sync :none}}\n",
           cph_httpd_url(h), DIMS);
  return start(state, policy, h);
}

static int teardown(void **state) {
  fixture *f = *state;
  int rc = cph_test_daemon_stop(&f->d);
  cph_httpd_stop(f->httpd);
  unlink(f->policy);
  free(f->policy);
  free(f);
  assert_int_equal(rc, 0);
  return 0;
}

/* ---------------------------------------------------------------- helpers */

static void ok(fixture *f, const char *method, const char *path, const char *body) {
  int st;
  char *raw = NULL;
  json_decref(cph_hc_call_raw(f->d.port, NULL, &st, &raw, method, path, body ? "%s" : NULL, body));
  if (st != 200)
    fail_msg("%s %s: status %d: %s", method, path, st, raw ? raw : "");
  free(raw);
}

static void create(fixture *f, const char *id, const char *subscribe, const char *member) {
  char body[512];
  snprintf(body, sizeof body,
           "{\"id\":\"%s\",\"class\":\"interactive\",\"subscribe\":[%s],\"member\":[%s]}", id,
           subscribe, member);
  ok(f, "POST", "/v1/sessions", body);
}

/* An event to session `id` alone (no channel: its direct channel). */
static void post_direct(fixture *f, const char *id, const char *body) {
  char json[512];
  snprintf(json, sizeof json,
           "{\"events\":[{\"session\":\"%s\",\"sender\":\"ann\",\"body\":\"%s\"}]}", id,
           body);
  ok(f, "POST", "/v1/events", json);
}

static void post_event(fixture *f, const char *channel, const char *body) {
  char json[512];
  snprintf(json, sizeof json,
           "{\"events\":[{\"channel\":\"%s\",\"sender\":\"ann\",\"body\":\"%s\"}]}", channel,
           body);
  ok(f, "POST", "/v1/events", json);
}

/* Leases the next turn (it must come within 5 s); the turn object (new reference). */
static json_t *lease(fixture *f) {
  int st;
  json_t *j = cph_hc_call(f->d.port, NULL, &st, "POST", "/v1/turns/lease",
                          "{\"worker\":\"w\",\"wait_ms\":5000}");
  if (st != 200)
    fail_msg("lease: status %d", st);
  json_t *turn = json_incref(json_object_get(j, "turn"));
  json_decref(j);
  return turn;
}

/* Completes turn with these memories (a JSON array of {"text"}). */
static void complete(fixture *f, json_t *turn, const char *memories_json) {
  char path[96];
  snprintf(path, sizeof path, "/v1/turns/%lld/complete", (long long)cph_hc_int(turn, "id"));
  size_t len = strlen(memories_json) + 256;
  char *body = malloc(len);
  snprintf(body, len, "{\"lease\":\"%s\",\"cost\":{\"tokens\":1,\"tool_calls\":0},\"memories\":%s}",
           cph_hc_str(turn, "lease"), memories_json);
  ok(f, "POST", path, body);
  free(body);
}

/* Runs one turn of session `id` (through an event on `channel`) that writes `memories`. */
static void turn_writing(fixture *f, const char *id, const char *channel,
                         const char *memories_json) {
  post_event(f, channel, "ping");
  json_t *turn = lease(f);
  assert_string_equal(cph_hc_str(turn, "session"), id);
  complete(f, turn, memories_json);
  json_decref(turn);
}

/* GET /v1/memories/search; the whole answer (new reference) and its status. q is sent with
 * its spaces as %20; k NULL leaves it out. */
static json_t *search(fixture *f, const char *session, const char *q, const char *k, int *st,
                      char **raw) {
  char path[1024], enc[512];
  size_t o = 0;
  for (const char *p = q; *p && o + 4 < sizeof enc; p++)
    o += isalnum((unsigned char)*p) ? (size_t)snprintf(enc + o, sizeof enc - o, "%c", *p)
                                    : (size_t)snprintf(enc + o, sizeof enc - o, "%%%02X",
                                                       (unsigned char)*p);
  snprintf(path, sizeof path, "/v1/memories/search?session=%s&q=%s%s%s", session, enc,
           k ? "&k=" : "", k ? k : "");
  return cph_hc_call_raw(f->d.port, NULL, st, raw, "GET", path, NULL);
}

/* A 200 search's answer (new reference); fails the test otherwise. */
static json_t *search_ok(fixture *f, const char *session, const char *q) {
  int st;
  char *raw = NULL;
  json_t *j = search(f, session, q, NULL, &st, &raw);
  if (st != 200 || !json_is_array(json_object_get(j, "memories")))
    fail_msg("search %s '%s': status %d: %s", session, q, st, raw ? raw : "");
  free(raw);
  return j;
}

/* The hit whose text is `text`, or NULL. */
static const json_t *hit(const json_t *answer, const char *text) {
  const json_t *mems = json_object_get(answer, "memories");
  for (size_t i = 0; i < json_array_size(mems); i++)
    if (strcmp(cph_hc_str(json_array_get(mems, i), "text"), text) == 0)
      return json_array_get(mems, i);
  return NULL;
}

static bool degraded(const json_t *answer) {
  return json_is_true(json_object_get(answer, "degraded"));
}

/* Every hit scores > 0 and no better than the one before; ids are distinct. */
static void assert_hits_sane(const json_t *answer) {
  const json_t *mems = json_object_get(answer, "memories");
  double prev = 2;
  for (size_t i = 0; i < json_array_size(mems); i++) {
    const json_t *h = json_array_get(mems, i);
    double score = json_number_value(json_object_get(h, "score"));
    if (!(score > 0) || score > prev)
      fail_msg("hit %zu (%s) scores %g after %g", i, cph_hc_str(h, "text"), score, prev);
    prev = score;
    for (size_t j = 0; j < i; j++)
      assert_true(cph_hc_int(h, "id") != cph_hc_int(json_array_get(mems, j), "id"));
  }
}

static const char *FACT = "the staging database password is hunter2 and rotates monthly";
static const char *OTHER = "lunch order: two margherita pizzas for the release party";

/* ---------------------------------------------------------------- tests */

static void test_builtin_memory_found_by_the_search_right_after_its_completion(void **state) {
  fixture *f = *state;
  create(f, "s1", "\"ops\"", "");
  turn_writing(f, "s1", "ops", "[{\"text\":\"lunch order: two margherita pizzas for the release party\"}]");
  char mems[256];
  snprintf(mems, sizeof mems, "[{\"text\":\"%s\"}]", FACT);
  turn_writing(f, "s1", "ops", mems);

  /* at once: no waiting for the embedding job */
  json_t *a = search_ok(f, "s1", "staging database password");
  const json_t *h = hit(a, FACT);
  assert_non_null(h);
  assert_ptr_equal(h, json_array_get(json_object_get(a, "memories"), 0)); /* the best hit */
  assert_true(json_number_value(json_object_get(h, "score")) > 0.99); /* every term matched */
  assert_string_equal(cph_hc_str(h, "session"), "s1");
  assert_string_equal(cph_hc_str(h, "kind"), "raw");
  assert_null(hit(a, OTHER)); /* shares no term with the query */
  assert_false(degraded(a));
  assert_hits_sane(a);
  json_decref(a);

  /* still found, the same way, once the embedding is done (vector and lexical merged) */
  int64_t deadline = cph_hc_now_ms() + 10000;
  for (;;) {
    int st;
    char *raw = NULL;
    json_decref(cph_hc_call_raw(f->d.port, NULL, &st, &raw, "GET", "/metrics", NULL));
    bool drained = raw && strstr(raw, "cephalon_embed_queue_length 0\n");
    free(raw);
    if (drained || cph_hc_now_ms() > deadline)
      break;
    cph_hc_sleep_ms(20);
  }
  a = search_ok(f, "s1", "staging database password");
  assert_non_null(hit(a, FACT));
  assert_ptr_equal(hit(a, FACT), json_array_get(json_object_get(a, "memories"), 0));
  assert_null(hit(a, OTHER));
  assert_hits_sane(a);
  json_decref(a);
}

static void test_query_matching_nothing_answers_no_hit(void **state) {
  fixture *f = *state;
  create(f, "s1", "\"ops\"", "");
  char mems[512];
  snprintf(mems, sizeof mems, "[{\"text\":\"%s\"},{\"text\":\"%s\"}]", FACT, OTHER);
  turn_writing(f, "s1", "ops", mems);
  int st;
  char *raw = NULL;
  json_t *a = search(f, "s1", "zebra violin archipelago", NULL, &st, &raw);
  assert_int_equal(st, 200);
  assert_string_equal(raw, "{\"memories\":[]}\n"); /* exactly: no hit, not degraded */
  free(raw);
  json_decref(a);
}

/* k: above the cap is clamped, 0 or absent is 10, not a number is a 400 naming k. */
static void test_search_k_is_clamped_defaulted_or_refused(void **state) {
  fixture *f = *state;
  create(f, "s1", "\"ops\"", "");
  char mems[4096];
  size_t o = (size_t)snprintf(mems, sizeof mems, "[");
  for (int i = 0; i < 12; i++)
    o += (size_t)snprintf(mems + o, sizeof mems - o, "%s{\"text\":\"kestrel sighting number %d\"}",
                          i ? "," : "", i);
  snprintf(mems + o, sizeof mems - o, "]");
  turn_writing(f, "s1", "ops", mems);
  const char *ks[] = {"1000", "101", "0", NULL, "3"};
  size_t want[] = {12, 12, 10, 10, 3};
  for (size_t i = 0; i < 5; i++) {
    int st;
    char *raw = NULL;
    json_t *a = search(f, "s1", "kestrel sighting", ks[i], &st, &raw);
    if (st != 200)
      fail_msg("k=%s: status %d: %s", ks[i] ? ks[i] : "(absent)", st, raw ? raw : "");
    assert_int_equal(json_array_size(json_object_get(a, "memories")), want[i]);
    assert_hits_sane(a);
    free(raw);
    json_decref(a);
  }
  const char *bad[] = {"ten", "-1", "1.5", "3x"};
  for (size_t i = 0; i < 4; i++) {
    int st;
    json_t *a = search(f, "s1", "kestrel", bad[i], &st, NULL);
    assert_int_equal(st, 400);
    json_t *err = json_object_get(a, "error");
    assert_string_equal(cph_hc_str(err, "code"), "bad_request");
    assert_string_equal(cph_hc_str(err, "field"), "k");
    json_decref(a);
  }
}

static void test_new_memory_is_in_the_next_turns_recent_memory(void **state) {
  fixture *f = *state;
  create(f, "s1", "\"ops\"", "");
  char mems[256];
  snprintf(mems, sizeof mems, "[{\"text\":\"%s\"}]", FACT);
  turn_writing(f, "s1", "ops", mems);
  post_event(f, "ops", "what was the password again");
  json_t *turn = lease(f);
  const json_t *recent = json_object_get(json_object_get(turn, "sections"), "recent_memory");
  bool found = false;
  for (size_t i = 0; i < json_array_size(recent); i++)
    found |= strcmp(cph_hc_str(json_array_get(recent, i), "text"), FACT) == 0;
  if (!found) {
    char *dump = json_dumps(recent, 0);
    fail_msg("the new memory is not in recent_memory: %s", dump);
  }
  json_decref(turn);
}

/* DESIGN §7: a session's search covers its memories and its channels' (subscribed or member),
 * never another session's own. */
static void test_session_sees_its_channels_memories_not_another_sessions(void **state) {
  fixture *f = *state;
  create(f, "s1", "\"ops\"", "\"lounge\"");
  create(f, "s2", "\"dev\"", "");
  post_event(f, "ops", "quasar alert from the ops pager");       /* #ops: s1 subscribes */
  post_event(f, "lounge", "quasar sighting over the lounge");    /* #lounge: s1 is a member */
  post_event(f, "elsewhere", "quasar note nobody listens to");   /* #elsewhere: nobody */
  json_t *turn = lease(f); /* s1's, for the ops event (members are not triggered) */
  assert_string_equal(cph_hc_str(turn, "session"), "s1");
  complete(f, turn, "[{\"text\":\"quasar notes kept by s1\"}]");
  json_decref(turn);
  turn_writing(f, "s2", "dev", "[{\"text\":\"quasar secret of s2\"}]");
  /* Told to each session alone: its direct channel. Leased and completed so that s1's turn
   * consumes it (search must find it either way). */
  post_direct(f, "s1", "quasar told to s1 alone");
  turn = lease(f);
  assert_string_equal(cph_hc_str(turn, "session"), "s1");
  complete(f, turn, "[]");
  json_decref(turn);
  post_direct(f, "s2", "quasar told to s2 alone");

  json_t *a = search_ok(f, "s1", "quasar");
  assert_non_null(hit(a, "quasar notes kept by s1"));
  assert_non_null(hit(a, "quasar alert from the ops pager"));
  assert_non_null(hit(a, "quasar sighting over the lounge"));
  assert_null(hit(a, "quasar secret of s2"));
  assert_null(hit(a, "quasar note nobody listens to"));
  assert_non_null(hit(a, "quasar told to s1 alone"));
  assert_null(hit(a, "quasar told to s2 alone"));
  assert_int_equal(json_array_size(json_object_get(a, "memories")), 4);
  json_t *mems = json_object_get(a, "memories");
  for (size_t i = 0; i < json_array_size(mems); i++) {
    const char *scope = cph_hc_str(json_array_get(mems, i), "session");
    assert_true(strcmp(scope, "s1") == 0 || strcmp(scope, "#ops") == 0 ||
                strcmp(scope, "#lounge") == 0 || strcmp(scope, "#direct:s1") == 0);
  }
  json_decref(a);

  a = search_ok(f, "s2", "quasar");
  assert_non_null(hit(a, "quasar secret of s2"));
  assert_non_null(hit(a, "quasar told to s2 alone"));
  assert_int_equal(json_array_size(json_object_get(a, "memories")), 2);
  json_decref(a);

  int st;
  json_t *e = search(f, "nobody", "quasar", NULL, &st, NULL);
  assert_int_equal(st, 404);
  assert_string_equal(cph_hc_str(json_object_get(e, "error"), "field"), "session");
  json_decref(e);
}

/* Seeded: memories made of words from one vocabulary, queries mixing it with words no memory
 * holds. No hit scores <= 0; with the built-in embedder every hit shares a query word (hash
 * collisions alone never make a hit); a query of unused words only finds nothing. */
static const char *USED[] = {"amber",  "basalt", "cobalt", "dune",   "ember",  "fjord",
                             "garnet", "harbor", "indigo", "jasper", "kelp",   "lagoon",
                             "marble", "nectar", "onyx",   "pollen", "quartz", "russet"};
static const char *UNUSED[] = {"saffron", "tundra", "umber", "velvet", "willow", "zephyr",
                               "alpaca",  "bongo",  "cello", "dingo",  "egret",  "ferret"};
#define N_USED (sizeof USED / sizeof USED[0])
#define N_UNUSED (sizeof UNUSED / sizeof UNUSED[0])

static bool has_word(const char *text, const char *word) {
  size_t n = strlen(word);
  for (const char *p = text; (p = strcasestr(p, word)) != NULL; p += n)
    if ((p == text || !isalnum((unsigned char)p[-1])) && !isalnum((unsigned char)p[n]))
      return true;
  return false;
}

static void test_randomized_queries_never_return_nonpositive_or_unrelated_hits(void **state) {
  fixture *f = *state;
  uint64_t seed = getenv("CPH_TEST_SEED") ? strtoull(getenv("CPH_TEST_SEED"), NULL, 10) : 20240611;
  printf("seed %llu\n", (unsigned long long)seed);
  cph_hc_rng rng = {seed};
  create(f, "s1", "\"ops\"", "");
  char mems[8192];
  size_t o = (size_t)snprintf(mems, sizeof mems, "[");
  for (int m = 0; m < 40; m++) {
    o += (size_t)snprintf(mems + o, sizeof mems - o, "%s{\"text\":\"", m ? "," : "");
    int words = (int)cph_hc_rand_range(&rng, 2, 6);
    for (int w = 0; w < words; w++)
      o += (size_t)snprintf(mems + o, sizeof mems - o, "%s%s", w ? " " : "",
                            USED[cph_hc_rand_range(&rng, 0, N_USED - 1)]);
    o += (size_t)snprintf(mems + o, sizeof mems - o, "\"}");
  }
  snprintf(mems + o, sizeof mems - o, "]");
  turn_writing(f, "s1", "ops", mems);

  for (int round = 0; round < 2; round++) { /* pending, then (mostly) embedded */
    for (int i = 0; i < 150; i++) {
      char q[256];
      size_t qo = 0;
      const char *words[4];
      int n = (int)cph_hc_rand_range(&rng, 1, 4);
      bool only_unused = cph_hc_rand_range(&rng, 0, 2) == 0;
      for (int w = 0; w < n; w++) {
        bool unused = only_unused || cph_hc_rand_range(&rng, 0, 1);
        words[w] = unused ? UNUSED[cph_hc_rand_range(&rng, 0, N_UNUSED - 1)]
                          : USED[cph_hc_rand_range(&rng, 0, N_USED - 1)];
        qo += (size_t)snprintf(q + qo, sizeof q - qo, "%s%s", w ? " " : "", words[w]);
      }
      json_t *a = search_ok(f, "s1", q);
      assert_hits_sane(a);
      const json_t *hits = json_object_get(a, "memories");
      for (size_t h = 0; h < json_array_size(hits); h++) {
        const char *text = cph_hc_str(json_array_get(hits, h), "text");
        bool shares = false;
        for (int w = 0; w < n; w++)
          shares |= has_word(text, words[w]);
        if (!shares)
          fail_msg("seed %llu: query '%s' found '%s', which shares no word with it",
                   (unsigned long long)seed, q, text);
      }
      bool any_used = false;
      for (int w = 0; w < n; w++)
        for (size_t u = 0; u < N_USED; u++)
          any_used |= strcmp(words[w], USED[u]) == 0;
      if (!any_used && json_array_size(hits) != 0)
        fail_msg("seed %llu: query '%s' of unused words found %zu memories",
                 (unsigned long long)seed, q, json_array_size(hits));
      json_decref(a);
    }
    cph_hc_sleep_ms(1500);
  }
}

/* The same with an OpenAI-compatible endpoint: the query is embedded through it; while it
 * fails for the memory (which stays queued) the memory is found lexically; once embedded it is
 * found by both halves; when the endpoint fails or hangs, the answer is lexical and degraded. */
static void test_openai_embedder_found_at_once_and_degraded_when_it_fails(void **state) {
  fixture *f = *state;
  embedder_set(EMBED_FAIL_MEMORIES); /* the memory's embedding cannot happen yet */
  create(f, "s1", "\"ops\"", "");
  char mems[512];
  snprintf(mems, sizeof mems, "[{\"text\":\"%s\"},{\"text\":\"%s\"}]", FACT, OTHER);
  turn_writing(f, "s1", "ops", mems);

  int before = cph_httpd_count(f->httpd) > 0 ? (int)cph_httpd_count(f->httpd) : 0;
  json_t *a = search_ok(f, "s1", "staging database password");
  assert_non_null(hit(a, FACT));
  assert_ptr_equal(hit(a, FACT), json_array_get(json_object_get(a, "memories"), 0));
  assert_false(degraded(a)); /* the query was embedded; the memory matched lexically */
  assert_hits_sane(a);
  json_decref(a);
  assert_true((int)cph_httpd_count(f->httpd) > before); /* the query went to the endpoint */
  /* the query's request: POST /v1/embeddings {"model": "test-embed", "input": [q]} */
  bool query_seen = false;
  for (size_t i = 0; i < cph_httpd_count(f->httpd) && !query_seen; i++) {
    cph_httpd_request r;
    if (!cph_httpd_request_at(f->httpd, i, &r))
      continue;
    json_t *body = json_loads(r.body, 0, NULL);
    json_t *input = json_object_get(body, "input");
    query_seen = strcmp(r.method, "POST") == 0 && strcmp(r.path, "/v1/embeddings") == 0 &&
                 json_array_size(input) == 1 &&
                 strcmp(json_string_value(json_array_get(input, 0)),
                        "staging database password") == 0;
    json_decref(body);
    cph_httpd_request_free(&r);
  }
  assert_true(query_seen);

  /* the endpoint works for everything: the memories get embedded and are still found */
  embedder_set(EMBED_OK);
  int64_t deadline = cph_hc_now_ms() + 15000;
  for (;;) {
    int st;
    char *raw = NULL;
    json_decref(cph_hc_call_raw(f->d.port, NULL, &st, &raw, "GET", "/metrics", NULL));
    bool drained = raw && strstr(raw, "cephalon_embed_queue_length 0\n");
    free(raw);
    if (drained)
      break;
    if (cph_hc_now_ms() > deadline)
      fail_msg("the memories were never embedded");
    cph_hc_sleep_ms(50);
  }
  a = search_ok(f, "s1", "staging database password");
  assert_ptr_equal(hit(a, FACT), json_array_get(json_object_get(a, "memories"), 0));
  assert_false(degraded(a));
  assert_hits_sane(a);
  json_decref(a);

  /* the endpoint fails: 200, the lexical hit, degraded */
  embedder_set(EMBED_FAIL_ALL);
  a = search_ok(f, "s1", "staging database password");
  assert_ptr_equal(hit(a, FACT), json_array_get(json_object_get(a, "memories"), 0));
  assert_true(degraded(a));
  assert_hits_sane(a);
  json_decref(a);

  /* the endpoint hangs past :timeout-ms (1 s): the same, once the timeout passed */
  embedder_set(EMBED_HANG);
  int64_t t0 = cph_hc_now_ms();
  a = search_ok(f, "s1", "staging database password");
  int64_t took = cph_hc_now_ms() - t0;
  assert_ptr_equal(hit(a, FACT), json_array_get(json_object_get(a, "memories"), 0));
  assert_true(degraded(a));
  assert_hits_sane(a);
  json_decref(a);
  assert_true(took < 5000); /* not the endpoint's 6 s: the daemon gave up on it */

  /* the unrelated query still finds nothing, degraded or not */
  a = search_ok(f, "s1", "zebra violin archipelago");
  assert_int_equal(json_array_size(json_object_get(a, "memories")), 0);
  json_decref(a);

  embedder_set(EMBED_OK);
  pthread_mutex_lock(&g_emb.mu);
  int bad = g_emb.bad_requests;
  pthread_mutex_unlock(&g_emb.mu);
  if (bad)
    fail_msg("%d requests to the embeddings endpoint broke the wire format: %s", bad,
             g_emb.last_bad);
}

/* Outbox items carry their shard (memory id mod :vector-index :shards), shown by
 * GET /v1/outbox; and once compacted, the sources never come back from search: their summary
 * answers for them, once. */
static int setup_sharded(void **state) {
  return start(state,
               "{:dedupe {:min-length 1000000}\n"
               " :vector-index {:shards 4}\n"
               " :maintenance {:outbox {:drain-interval-s 1}}\n"
               " :store {:sync :none}}\n",
               NULL);
}

static void test_outbox_items_carry_their_shard(void **state) {
  fixture *f = *state;
  create(f, "s1", "\"ops\"", "");
  turn_writing(f, "s1", "ops",
               "[{\"text\":\"heron count at the north pond was twelve\"},"
               "{\"text\":\"heron nest found near the boathouse\"},"
               "{\"text\":\"heron chicks hatched in late spring\"},"
               "{\"text\":\"heron feeding times are dawn and dusk\"},"
               "{\"text\":\"heron survey volunteers meet on saturdays\"}]");
  /* the five ids, once embedded (the outbox only deletes embedded vectors) */
  int64_t ids[5] = {0};
  size_t n_ids = 0;
  int64_t deadline = cph_hc_now_ms() + 15000;
  for (;;) {
    int st;
    char *raw = NULL;
    json_decref(cph_hc_call_raw(f->d.port, NULL, &st, &raw, "GET", "/metrics", NULL));
    bool drained = raw && strstr(raw, "cephalon_embed_queue_length 0\n");
    free(raw);
    if (drained)
      break;
    if (cph_hc_now_ms() > deadline)
      fail_msg("the memories were never embedded");
    cph_hc_sleep_ms(20);
  }
  json_t *a = search_ok(f, "s1", "heron");
  json_t *mems = json_object_get(a, "memories");
  for (size_t i = 0; i < json_array_size(mems); i++)
    if (strcmp(cph_hc_str(json_array_get(mems, i), "session"), "s1") == 0 && n_ids < 5)
      ids[n_ids++] = cph_hc_int(json_array_get(mems, i), "id");
  json_decref(a);
  assert_int_equal(n_ids, 5);

  char body[256];
  snprintf(body, sizeof body,
           "{\"job\":\"gc_plan\",\"args\":{\"sources\":[%lld,%lld,%lld,%lld,%lld]}}",
           (long long)ids[0], (long long)ids[1], (long long)ids[2], (long long)ids[3],
           (long long)ids[4]);
  int st;
  json_decref(cph_hc_call(f->d.port, NULL, &st, "POST", "/v1/maintenance/jobs", "%s", body));
  assert_int_equal(st, 202);

  json_t *items = NULL;
  deadline = cph_hc_now_ms() + 15000;
  for (;;) {
    json_t *o = cph_hc_call(f->d.port, NULL, &st, "GET", "/v1/outbox", NULL);
    assert_int_equal(st, 200);
    if (json_array_size(json_object_get(o, "items")) == 5) {
      items = json_incref(json_object_get(o, "items"));
      json_decref(o);
      break;
    }
    json_decref(o);
    if (cph_hc_now_ms() > deadline)
      fail_msg("the compaction never queued its five vector deletes");
    cph_hc_sleep_ms(20);
  }
  int shards_seen[4] = {0};
  for (size_t i = 0; i < json_array_size(items); i++) {
    const json_t *it = json_array_get(items, i);
    int64_t id = cph_hc_int(it, "memory_id"), shard = cph_hc_int(it, "shard");
    assert_int_equal(shard, id % 4);
    shards_seen[shard] = 1;
  }
  assert_true(shards_seen[0] + shards_seen[1] + shards_seen[2] + shards_seen[3] >= 3);
  json_decref(items);

  /* the sources are gone; the summary answers for them, once */
  a = search_ok(f, "s1", "heron");
  mems = json_object_get(a, "memories");
  size_t summaries = 0;
  for (size_t i = 0; i < json_array_size(mems); i++) {
    const json_t *h = json_array_get(mems, i);
    for (size_t j = 0; j < 5; j++)
      assert_true(cph_hc_int(h, "id") != ids[j]);
    summaries += strcmp(cph_hc_str(h, "kind"), "summary") == 0;
  }
  assert_int_equal(summaries, 1);
  assert_hits_sane(a);
  json_decref(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(
          test_builtin_memory_found_by_the_search_right_after_its_completion, setup_builtin,
          teardown),
      cmocka_unit_test_setup_teardown(test_query_matching_nothing_answers_no_hit, setup_builtin,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_search_k_is_clamped_defaulted_or_refused,
                                      setup_builtin, teardown),
      cmocka_unit_test_setup_teardown(test_new_memory_is_in_the_next_turns_recent_memory,
                                      setup_builtin, teardown),
      cmocka_unit_test_setup_teardown(
          test_session_sees_its_channels_memories_not_another_sessions, setup_builtin,
          teardown),
      cmocka_unit_test_setup_teardown(
          test_randomized_queries_never_return_nonpositive_or_unrelated_hits, setup_builtin,
          teardown),
      cmocka_unit_test_setup_teardown(
          test_openai_embedder_found_at_once_and_degraded_when_it_fails, setup_openai,
          teardown),
      cmocka_unit_test_setup_teardown(test_outbox_items_carry_their_shard, setup_sharded,
                                      teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
