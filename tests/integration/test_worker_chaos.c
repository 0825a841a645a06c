/* Workers that misbehave (DESIGN §4 turns and leases), against the real cephalond on loopback:
 * a worker that vanishes mid-turn (or mid-long-poll), one that heartbeats after its lease ran
 * out, one that completes twice, one that completes with someone else's lease. Whatever they
 * do, no turn is lost (every event's input is eventually completed) and none is consumed twice
 * (every event is in exactly one completed turn's staged list, and in exactly one reply).
 *
 * The last test runs all of it at once from several threads, seeded (CPH_TEST_SEED overrides
 * the seed; the seed is printed). Threads never call cmocka: they record what went wrong and
 * the main thread fails the test. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/api.h"
#include "tests/support/daemon.h"
#include "tests/support/hclient.h"
#include "tests/support/testutil.h"

/* A 1 s lease; attempts high enough that chaos never parks a turn (parking is tested in
 * test_api_flow); budgets that never hold a turn back; dedupe off so every event is a message;
 * small batches so the chaos run has many turns. */
static const char *POLICY = "{:leases {:ttl-seconds 1 :max-attempts 100}\n"
                            " :scheduler {:concurrency 16\n"
                            "             :lanes {:interactive {:turns 1000000 :tool-calls 1000000}}}\n"
                            " :sessions {:janitor? false :max-batch 3}\n"
                            " :dedupe {:min-length 1000000}\n"
                            " :server {:max-long-polls-per-client 512}}\n";

typedef struct fixture {
  char *policy;
  cph_test_daemon d;
} fixture;

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  f->policy = cph_test_write_tmpfile(".edn", POLICY);
  if (cph_test_daemon_start(&f->d, f->policy, NULL, NULL) != 0)
    return -1;
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  assert_int_equal(cph_test_daemon_stop(&f->d), 0);
  unlink(f->policy);
  free(f->policy);
  free(f);
  return 0;
}

/* ---------------------------------------------------------------- helpers (main thread) */

static void create_session(int port, const char *id, const char *channel) {
  int st;
  json_decref(cph_hc_call(port, NULL, &st, "POST", "/v1/sessions",
                          "{\"id\":\"%s\",\"class\":\"interactive\",\"subscribe\":[\"%s\"]}", id,
                          channel));
  assert_int_equal(st, 200);
}

static int64_t post_one(int port, const char *channel, const char *body) {
  int st;
  json_t *j = cph_hc_call(port, NULL, &st, "POST", "/v1/events",
                          "{\"events\":[{\"channel\":\"%s\",\"sender\":\"u\",\"body\":\"%s\"}]}",
                          channel, body);
  assert_int_equal(st, 200);
  int64_t id = cph_hc_int(json_array_get(json_object_get(j, "results"), 0), "id");
  json_decref(j);
  assert_true(id > 0);
  return id;
}

/* The turn (new reference) or NULL on 204. */
static json_t *lease(int port, const char *worker, int wait_ms) {
  int st;
  json_t *j = cph_hc_call(port, NULL, &st, "POST", "/v1/turns/lease",
                          "{\"worker\":\"%s\",\"wait_ms\":%d}", worker, wait_ms);
  if (st == 204) {
    json_decref(j);
    return NULL;
  }
  if (st != 200)
    fail_msg("lease: status %d", st);
  json_t *t = json_incref(json_object_get(j, "turn"));
  json_decref(j);
  return t;
}

/* POST /v1/turns/{id}/{verb} with lease (and a reply for complete); *already when asked. */
static int turn_call(int port, int64_t id, const char *verb, const char *lease_tok,
                     const char *reply, bool *already) {
  char path[96];
  snprintf(path, sizeof path, "/v1/turns/%lld/%s", (long long)id, verb);
  int st;
  json_t *j;
  if (strcmp(verb, "complete") == 0)
    j = cph_hc_call(port, NULL, &st, "POST", path,
                    "{\"lease\":\"%s\",\"cost\":{\"tokens\":3,\"tool_calls\":0},"
                    "\"reply\":{\"body\":\"%s\"}}",
                    lease_tok, reply ? reply : "done");
  else
    j = cph_hc_call(port, NULL, &st, "POST", path, "{\"lease\":\"%s\"}", lease_tok);
  if (already)
    *already = json_is_true(json_object_get(j, "already"));
  json_decref(j);
  return st;
}

static int64_t staged_event(const json_t *turn, size_t i) {
  return cph_hc_int(json_array_get(json_object_get(turn, "staged"), i), "event_id");
}

/* Every reply: how many name each inbox id as a source (index: inbox id). */
static size_t count_reply_sources(int port, int *counts, size_t max_id) {
  int st;
  size_t n = 0;
  int64_t after = 0;
  for (int page = 0; page < 1000; page++) {
    char path[64];
    snprintf(path, sizeof path, "/v1/replies?after=%lld", (long long)after);
    json_t *j = cph_hc_call(port, NULL, &st, "GET", path, NULL);
    assert_int_equal(st, 200);
    json_t *replies = json_object_get(j, "replies");
    size_t k = json_array_size(replies);
    for (size_t i = 0; i < k; i++) {
      json_t *src = json_object_get(json_array_get(replies, i), "source_inbox_ids");
      for (size_t s = 0; s < json_array_size(src); s++) {
        json_int_t id = json_integer_value(json_array_get(src, s));
        if (id > 0 && (size_t)id < max_id)
          counts[id]++;
      }
    }
    n += k;
    int64_t next = cph_hc_int(j, "next");
    json_decref(j);
    if (!k || next == after)
      break;
    after = next;
  }
  return n;
}

/* ---------------------------------------------------------------- the four, one by one */

static void test_worker_vanishing_mid_turn_or_mid_poll_loses_nothing(void **state) {
  fixture *f = *state;
  int port = f->d.port;
  create_session(port, "s1", "general");
  int64_t ev = post_one(port, "general", "vanish-1");
  json_t *a = lease(port, "ghost", 3000);
  assert_non_null(a);
  assert_int_equal(staged_event(a, 0), ev);
  /* the ghost never comes back; after its 1 s lease the input goes to the next worker */
  int64_t t0 = cph_hc_now_ms();
  json_t *b = lease(port, "live", 5000);
  assert_non_null(b);
  int64_t waited = cph_hc_now_ms() - t0;
  assert_true(waited >= 700); /* not before the ghost's lease ran out */
  assert_true(cph_hc_int(b, "id") != cph_hc_int(a, "id"));
  assert_int_equal(staged_event(b, 0), ev);
  assert_int_equal(cph_hc_int(b, "attempts"), 2);
  bool already = false;
  assert_int_equal(turn_call(port, cph_hc_int(b, "id"), "complete", cph_hc_str(b, "lease"), "b", &already), 200);
  assert_false(already);
  /* the ghost returns after all: too late */
  assert_int_equal(turn_call(port, cph_hc_int(a, "id"), "complete", cph_hc_str(a, "lease"), "a", NULL), 409);
  json_decref(a);
  json_decref(b);

  /* a worker that leaves while its long-poll waits is not handed the next turn */
  int gone = cph_test_http_send_only(port, "POST", "/v1/turns/lease", "{\"worker\":\"gone\",\"wait_ms\":10000}");
  assert_true(gone >= 0);
  cph_hc_sleep_ms(200);
  close(gone);
  cph_hc_sleep_ms(200);
  int64_t ev2 = post_one(port, "general", "vanish-2");
  t0 = cph_hc_now_ms();
  json_t *c = lease(port, "live", 5000);
  assert_non_null(c);
  assert_true(cph_hc_now_ms() - t0 < 700); /* at once: it did not go to the departed poll */
  assert_int_equal(staged_event(c, 0), ev2);
  assert_int_equal(cph_hc_int(c, "attempts"), 1);
  assert_int_equal(turn_call(port, cph_hc_int(c, "id"), "complete", cph_hc_str(c, "lease"), "c", NULL), 200);
  json_decref(c);
  assert_null(lease(port, "live", 300));

  int counts[16] = {0};
  assert_int_equal(count_reply_sources(port, counts, 16), 2);
}

static void test_late_heartbeat_is_refused_and_timely_ones_keep_the_lease(void **state) {
  fixture *f = *state;
  int port = f->d.port;
  create_session(port, "s1", "general");
  post_one(port, "general", "slow-worker");
  json_t *a = lease(port, "slow", 3000);
  assert_non_null(a);
  cph_hc_sleep_ms(1600); /* past the 1 s lease */
  assert_int_equal(turn_call(port, cph_hc_int(a, "id"), "heartbeat", cph_hc_str(a, "lease"), NULL, NULL), 409);
  json_t *b = lease(port, "fast", 3000);
  assert_non_null(b); /* the input went back to the queue */
  assert_string_equal(cph_hc_str(b, "input"), "inbox:slow-worker");
  assert_int_equal(turn_call(port, cph_hc_int(a, "id"), "complete", cph_hc_str(a, "lease"), "a", NULL), 409);
  assert_int_equal(turn_call(port, cph_hc_int(b, "id"), "complete", cph_hc_str(b, "lease"), "b", NULL), 200);
  json_decref(a);
  json_decref(b);

  /* heartbeats every 400 ms hold a 1 s lease for 2.4 s: nobody else gets the input */
  post_one(port, "general", "long-turn");
  json_t *c = lease(port, "steady", 3000);
  assert_non_null(c);
  for (int i = 0; i < 6; i++) {
    cph_hc_sleep_ms(400);
    assert_int_equal(turn_call(port, cph_hc_int(c, "id"), "heartbeat", cph_hc_str(c, "lease"), NULL, NULL), 200);
  }
  assert_null(lease(port, "thief", 300));
  assert_int_equal(turn_call(port, cph_hc_int(c, "id"), "complete", cph_hc_str(c, "lease"), "c", NULL), 200);
  json_decref(c);
  int counts[16] = {0};
  assert_int_equal(count_reply_sources(port, counts, 16), 2);
}

typedef struct complete_call {
  int port;
  int64_t id;
  const char *lease;
  int status;
  bool already;
} complete_call;

static void *complete_thread(void *arg) {
  complete_call *c = arg;
  c->status = turn_call(c->port, c->id, "complete", c->lease, "twice", &c->already);
  return NULL;
}

static void test_completing_twice_is_answered_twice_and_applied_once(void **state) {
  fixture *f = *state;
  int port = f->d.port;
  create_session(port, "s1", "general");
  post_one(port, "general", "twice-1");
  json_t *a = lease(port, "w", 3000);
  assert_non_null(a);
  bool already = true;
  assert_int_equal(turn_call(port, cph_hc_int(a, "id"), "complete", cph_hc_str(a, "lease"), "once", &already), 200);
  assert_false(already);
  assert_int_equal(turn_call(port, cph_hc_int(a, "id"), "complete", cph_hc_str(a, "lease"), "once", &already), 200);
  assert_true(already);
  /* a heartbeat or fail after the completion is refused; the completion stands */
  assert_int_equal(turn_call(port, cph_hc_int(a, "id"), "heartbeat", cph_hc_str(a, "lease"), NULL, NULL), 409);
  assert_int_equal(turn_call(port, cph_hc_int(a, "id"), "fail", cph_hc_str(a, "lease"), NULL, NULL), 409);
  json_decref(a);

  /* two completions at the same moment (likely one pass): one applies, both are 200 */
  post_one(port, "general", "twice-2");
  json_t *b = lease(port, "w", 3000);
  assert_non_null(b);
  complete_call c[2] = {{port, cph_hc_int(b, "id"), cph_hc_str(b, "lease"), 0, false},
                        {port, cph_hc_int(b, "id"), cph_hc_str(b, "lease"), 0, false}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++)
    assert_int_equal(pthread_create(&th[i], NULL, complete_thread, &c[i]), 0);
  for (int i = 0; i < 2; i++)
    pthread_join(th[i], NULL);
  assert_int_equal(c[0].status, 200);
  assert_int_equal(c[1].status, 200);
  assert_true(c[0].already != c[1].already); /* exactly one applied */
  json_decref(b);
  assert_null(lease(port, "w", 300));
  int counts[16] = {0};
  assert_int_equal(count_reply_sources(port, counts, 16), 2); /* one reply per turn */
  for (int i = 0; i < 16; i++)
    assert_true(counts[i] <= 1);
}

static void test_completing_with_someone_elses_lease_is_409_and_changes_nothing(void **state) {
  fixture *f = *state;
  int port = f->d.port;
  create_session(port, "s1", "one");
  create_session(port, "s2", "two");
  post_one(port, "one", "for-s1");
  post_one(port, "two", "for-s2");
  json_t *a = lease(port, "wa", 3000), *b = lease(port, "wb", 3000);
  assert_non_null(a);
  assert_non_null(b);
  assert_string_not_equal(cph_hc_str(a, "session"), cph_hc_str(b, "session"));
  int64_t ia = cph_hc_int(a, "id"), ib = cph_hc_int(b, "id");
  const char *la = cph_hc_str(a, "lease"), *lb = cph_hc_str(b, "lease");
  /* each with the other's lease, for every verb */
  assert_int_equal(turn_call(port, ia, "complete", lb, "stolen", NULL), 409);
  assert_int_equal(turn_call(port, ib, "complete", la, "stolen", NULL), 409);
  assert_int_equal(turn_call(port, ia, "heartbeat", lb, NULL, NULL), 409);
  assert_int_equal(turn_call(port, ib, "fail", la, NULL, NULL), 409);
  /* a forged lease, and a turn that does not exist */
  assert_int_equal(turn_call(port, ia, "complete", "00000000000000000000000000000000", "x", NULL), 409);
  assert_int_equal(turn_call(port, 999999, "complete", la, "x", NULL), 404);
  /* the rightful workers are unaffected */
  bool already = true;
  assert_int_equal(turn_call(port, ia, "complete", la, "mine-a", &already), 200);
  assert_false(already);
  assert_int_equal(turn_call(port, ib, "complete", lb, "mine-b", &already), 200);
  assert_false(already);
  /* and a completed turn's lease opens nothing else: the next turn of s1 refuses it */
  post_one(port, "one", "next-for-s1");
  json_t *c = lease(port, "wc", 3000);
  assert_non_null(c);
  assert_int_equal(turn_call(port, cph_hc_int(c, "id"), "complete", la, "old-lease", NULL), 409);
  assert_int_equal(turn_call(port, cph_hc_int(c, "id"), "complete", cph_hc_str(c, "lease"), "mine-c", NULL), 200);
  json_decref(a);
  json_decref(b);
  json_decref(c);
  assert_null(lease(port, "w", 300));
  int counts[16] = {0};
  assert_int_equal(count_reply_sources(port, counts, 16), 3);
}

/* ---------------------------------------------------------------- all at once */

enum {
  CHAOS_SESSIONS = 12,
  CHAOS_WORKERS = 5,
  CHAOS_EVENTS = 240,
  MAX_COMPLETED = 4096,
  LEASE_RING = 64,
};

typedef struct chaos {
  int port;
  uint64_t seed;
  pthread_mutex_t mu;
  atomic_bool producing, chaotic, stop;
  /* acknowledged events: event id -> posted (1) */
  int64_t acked[CHAOS_EVENTS];
  size_t n_acked;
  /* per event id (index), how many completed turns carried it */
  int *consumed;
  size_t max_event_id;
  size_t completions, vanished, late, doubled, stolen, ghosts, expired_completes;
  /* recent (turn id, lease) pairs, for completing with someone else's lease */
  int64_t ring_id[LEASE_RING];
  char ring_lease[LEASE_RING][33];
  size_t ring_n;
  char error[512]; /* the first thing that went wrong in a thread */
} chaos;

static void chaos_error(chaos *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void chaos_error(chaos *c, const char *fmt, ...) {
  pthread_mutex_lock(&c->mu);
  if (!c->error[0]) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->error, sizeof c->error, fmt, ap);
    va_end(ap);
  }
  pthread_mutex_unlock(&c->mu);
}

static void *producer(void *arg) {
  chaos *c = arg;
  cph_hc_rng rng = {c->seed ^ 0x5eed};
  for (int n = 0; n < CHAOS_EVENTS;) {
    int batch = (int)cph_hc_rand_range(&rng, 1, 4);
    if (batch > CHAOS_EVENTS - n)
      batch = CHAOS_EVENTS - n;
    char json[2048];
    size_t used = (size_t)snprintf(json, sizeof json, "{\"events\":[");
    for (int i = 0; i < batch; i++)
      used += (size_t)snprintf(json + used, sizeof json - used,
                               "%s{\"channel\":\"ch%d\",\"sender\":\"u\",\"body\":\"chaos-%d\"}",
                               i ? "," : "", (int)cph_hc_rand_range(&rng, 0, CHAOS_SESSIONS - 1),
                               n + i);
    snprintf(json + used, sizeof json - used, "]}");
    int st;
    json_t *j = cph_hc_call(c->port, NULL, &st, "POST", "/v1/events", "%s", json);
    if (st != 200) {
      chaos_error(c, "ingest: status %d", st);
      json_decref(j);
      break;
    }
    pthread_mutex_lock(&c->mu);
    json_t *results = json_object_get(j, "results");
    for (size_t i = 0; i < json_array_size(results); i++)
      c->acked[c->n_acked++] = cph_hc_int(json_array_get(results, i), "id");
    pthread_mutex_unlock(&c->mu);
    json_decref(j);
    n += batch;
    cph_hc_sleep_ms((int)cph_hc_rand_range(&rng, 2, 25));
  }
  atomic_store(&c->producing, false);
  return NULL;
}

static void record_completion(chaos *c, const json_t *turn) {
  json_t *staged = json_object_get(turn, "staged");
  pthread_mutex_lock(&c->mu);
  c->completions++;
  for (size_t i = 0; i < json_array_size(staged); i++) {
    int64_t ev = cph_hc_int(json_array_get(staged, i), "event_id");
    if (ev > 0 && (size_t)ev < c->max_event_id)
      c->consumed[ev]++;
  }
  pthread_mutex_unlock(&c->mu);
}

/* Completes as the rightful worker; records it when it applied. */
static void complete_properly(chaos *c, const json_t *turn, int64_t id, const char *lease_tok,
                              bool may_have_expired) {
  char reply[64];
  snprintf(reply, sizeof reply, "r-%lld", (long long)id);
  bool already = false;
  int st = turn_call(c->port, id, "complete", lease_tok, reply, &already);
  if (st == 200 && !already) {
    record_completion(c, turn);
  } else if (st == 200 && already) {
    chaos_error(c, "turn %lld: first completion answered already=true", (long long)id);
  } else if (st == 409 && may_have_expired) {
    pthread_mutex_lock(&c->mu);
    c->expired_completes++; /* the lease ran out first: its input went back, not lost */
    pthread_mutex_unlock(&c->mu);
  } else if (st != 409) {
    chaos_error(c, "turn %lld: complete answered %d", (long long)id, st);
  } else {
    pthread_mutex_lock(&c->mu);
    c->expired_completes++; /* a slow machine can outlast a 1 s lease; counted, not lost */
    pthread_mutex_unlock(&c->mu);
  }
}

static void *worker(void *arg) {
  chaos *c = ((void **)arg)[0];
  int idx = (int)(intptr_t)((void **)arg)[1];
  cph_hc_rng rng = {c->seed + 1000003u * (uint64_t)(idx + 1)};
  char name[16];
  snprintf(name, sizeof name, "w%d", idx);
  while (!atomic_load(&c->stop)) {
    int st;
    json_t *j = cph_hc_call(c->port, NULL, &st, "POST", "/v1/turns/lease",
                            "{\"worker\":\"%s\",\"wait_ms\":200}", name);
    if (st == 204 || st == 429) {
      json_decref(j);
      continue;
    }
    if (st != 200) {
      chaos_error(c, "%s: lease answered %d", name, st);
      json_decref(j);
      break;
    }
    json_t *turn = json_object_get(j, "turn");
    int64_t id = cph_hc_int(turn, "id");
    char lease_tok[33];
    snprintf(lease_tok, sizeof lease_tok, "%s", cph_hc_str(turn, "lease"));
    /* someone else's lease, remembered for later misuse */
    int64_t other_id = 0;
    char other[33] = "";
    pthread_mutex_lock(&c->mu);
    if (c->ring_n) {
      size_t k = (size_t)cph_hc_rand_range(&rng, 0, (int64_t)(c->ring_n < LEASE_RING ? c->ring_n : LEASE_RING) - 1);
      other_id = c->ring_id[k];
      memcpy(other, c->ring_lease[k], sizeof other);
    }
    c->ring_id[c->ring_n % LEASE_RING] = id;
    memcpy(c->ring_lease[c->ring_n % LEASE_RING], lease_tok, sizeof lease_tok);
    c->ring_n++;
    pthread_mutex_unlock(&c->mu);

    int roll = atomic_load(&c->chaotic) ? (int)cph_hc_rand_range(&rng, 0, 99) : 0;
    if (roll < 50) { /* well behaved */
      complete_properly(c, turn, id, lease_tok, false);
    } else if (roll < 62) { /* vanishes mid-turn: the lease runs out */
      pthread_mutex_lock(&c->mu);
      c->vanished++;
      pthread_mutex_unlock(&c->mu);
    } else if (roll < 70) { /* heartbeats late, then tries to finish anyway */
      cph_hc_sleep_ms(1500);
      int hb = turn_call(c->port, id, "heartbeat", lease_tok, NULL, NULL);
      if (hb != 409 && hb != 200)
        chaos_error(c, "late heartbeat of turn %lld answered %d", (long long)id, hb);
      complete_properly(c, turn, id, lease_tok, true);
      pthread_mutex_lock(&c->mu);
      c->late++;
      pthread_mutex_unlock(&c->mu);
    } else if (roll < 82) { /* completes twice */
      bool already = false;
      char reply[64];
      snprintf(reply, sizeof reply, "r-%lld", (long long)id);
      int s1 = turn_call(c->port, id, "complete", lease_tok, reply, &already);
      if (s1 == 200 && !already) {
        record_completion(c, turn);
        bool again = false;
        int s2 = turn_call(c->port, id, "complete", lease_tok, reply, &again);
        if (s2 != 200 || !again)
          chaos_error(c, "second completion of turn %lld: status %d already=%d", (long long)id,
                      s2, again);
      } else if (s1 != 409) {
        chaos_error(c, "completion of turn %lld answered %d", (long long)id, s1);
      }
      pthread_mutex_lock(&c->mu);
      c->doubled++;
      pthread_mutex_unlock(&c->mu);
    } else { /* completes with someone else's lease (or a forged one), then maybe properly */
      const char *wrong = other_id && other_id != id ? other : "0123456789abcdef0123456789abcdef";
      int s1 = turn_call(c->port, id, "complete", wrong, "stolen", NULL);
      if (s1 != 409)
        chaos_error(c, "turn %lld completed with another lease: status %d", (long long)id, s1);
      if (other_id && other_id != id) { /* and the other turn with this one's lease */
        int s2 = turn_call(c->port, other_id, "complete", lease_tok, "stolen", NULL);
        if (s2 != 409)
          chaos_error(c, "turn %lld completed with turn %lld's lease: status %d",
                      (long long)other_id, (long long)id, s2);
      }
      if (cph_hc_rand_range(&rng, 0, 1))
        complete_properly(c, turn, id, lease_tok, false);
      pthread_mutex_lock(&c->mu);
      c->stolen++;
      pthread_mutex_unlock(&c->mu);
    }
    json_decref(j);
  }
  return NULL;
}

/* Opens lease long-polls and walks away from them at random moments, some just as a turn may
 * be handed over: such a turn comes back after its lease, it is not lost. */
static void *ghost(void *arg) {
  chaos *c = arg;
  cph_hc_rng rng = {c->seed ^ 0x6057};
  while (atomic_load(&c->chaotic) && !atomic_load(&c->stop)) {
    int fd = cph_test_http_send_only(c->port, "POST", "/v1/turns/lease",
                                     "{\"worker\":\"ghost\",\"wait_ms\":5000}");
    cph_hc_sleep_ms((int)cph_hc_rand_range(&rng, 0, 60));
    if (fd >= 0)
      close(fd);
    pthread_mutex_lock(&c->mu);
    c->ghosts++;
    pthread_mutex_unlock(&c->mu);
  }
  return NULL;
}

static uint64_t test_seed(void) {
  const char *s = getenv("CPH_TEST_SEED");
  if (s && *s)
    return strtoull(s, NULL, 0);
  return (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 16);
}

static void test_random_chaos_loses_no_turn_and_consumes_none_twice(void **state) {
  fixture *f = *state;
  chaos *c = calloc(1, sizeof *c);
  c->port = f->d.port;
  c->seed = test_seed();
  print_message("chaos seed %llu (CPH_TEST_SEED=%llu reproduces it)\n",
                (unsigned long long)c->seed, (unsigned long long)c->seed);
  pthread_mutex_init(&c->mu, NULL);
  c->max_event_id = 4 * CHAOS_EVENTS + 64;
  c->consumed = calloc(c->max_event_id, sizeof *c->consumed);
  for (int i = 0; i < CHAOS_SESSIONS; i++) {
    char id[16], ch[16];
    snprintf(id, sizeof id, "s%d", i);
    snprintf(ch, sizeof ch, "ch%d", i);
    create_session(c->port, id, ch);
  }
  atomic_store(&c->producing, true);
  atomic_store(&c->chaotic, true);
  pthread_t prod, gh, ws[CHAOS_WORKERS];
  void *wargs[CHAOS_WORKERS][2];
  assert_int_equal(pthread_create(&prod, NULL, producer, c), 0);
  assert_int_equal(pthread_create(&gh, NULL, ghost, c), 0);
  for (int i = 0; i < CHAOS_WORKERS; i++) {
    wargs[i][0] = c;
    wargs[i][1] = (void *)(intptr_t)i;
    assert_int_equal(pthread_create(&ws[i], NULL, worker, wargs[i]), 0);
  }
  pthread_join(prod, NULL);
  /* chaos for a while after the last event, then well-behaved workers drain the rest */
  cph_hc_sleep_ms(2000);
  atomic_store(&c->chaotic, false);
  pthread_join(gh, NULL);
  int64_t deadline = cph_hc_now_ms() + 60000;
  size_t done = 0;
  while (cph_hc_now_ms() < deadline) {
    pthread_mutex_lock(&c->mu);
    done = 0;
    for (size_t i = 0; i < c->n_acked; i++)
      done += c->consumed[c->acked[i]] > 0;
    bool failed = c->error[0] != 0;
    pthread_mutex_unlock(&c->mu);
    if (done == c->n_acked || failed)
      break;
    cph_hc_sleep_ms(100);
  }
  atomic_store(&c->stop, true);
  for (int i = 0; i < CHAOS_WORKERS; i++)
    pthread_join(ws[i], NULL);
  print_message("%zu events, %zu completions; vanished %zu, late %zu, doubled %zu, other's "
                "lease %zu, ghost polls %zu, completions refused as expired %zu\n",
                c->n_acked, c->completions, c->vanished, c->late, c->doubled, c->stolen,
                c->ghosts, c->expired_completes);
  if (c->error[0])
    fail_msg("seed %llu: %s", (unsigned long long)c->seed, c->error);
  assert_int_equal(c->n_acked, CHAOS_EVENTS);
  assert_true(c->vanished > 0 && c->doubled > 0 && c->stolen > 0);

  /* No turn lost, none consumed twice. */
  for (size_t i = 0; i < c->n_acked; i++)
    if (c->consumed[c->acked[i]] != 1)
      fail_msg("seed %llu: event %lld is in %d completed turns", (unsigned long long)c->seed,
               (long long)c->acked[i], c->consumed[c->acked[i]]);
  /* nothing is left over for a worker */
  assert_null(lease(c->port, "final", 500));
  /* the replies stream agrees: one reply per completion, each inbox message in one reply */
  int *sources = calloc(c->max_event_id, sizeof *sources);
  size_t replies = count_reply_sources(c->port, sources, c->max_event_id);
  assert_int_equal(replies, c->completions);
  size_t sourced = 0;
  for (size_t i = 0; i < c->max_event_id; i++) {
    if (sources[i] > 1)
      fail_msg("seed %llu: inbox message %zu is the source of %d replies",
               (unsigned long long)c->seed, i, sources[i]);
    sourced += (size_t)sources[i];
  }
  assert_int_equal(sourced, c->n_acked);
  int st;
  json_t *parked = cph_hc_call(c->port, NULL, &st, "GET", "/v1/turns?state=parked", NULL);
  assert_int_equal(json_array_size(json_object_get(parked, "turns")), 0);
  json_decref(parked);
  free(sources);
  free(c->consumed);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

int main(void) {
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
  const struct CMUnitTest tests[] = {
      T(test_worker_vanishing_mid_turn_or_mid_poll_loses_nothing),
      T(test_late_heartbeat_is_refused_and_timely_ones_keep_the_lease),
      T(test_completing_twice_is_answered_twice_and_applied_once),
      T(test_completing_with_someone_elses_lease_is_409_and_changes_nothing),
      T(test_random_chaos_loses_no_turn_and_consumes_none_twice),
  };
#undef T
  return cmocka_run_group_tests(tests, NULL, NULL);
}
