/* Prepared ingest is ingest (server/offload.c, cph_event_prepare): an event whose text
 * hashes were computed ahead of the engine, on another thread and possibly under other dedupe
 * settings (a policy reload came between), gets exactly the answer it gets unprepared.
 *
 * Each case feeds one random stream of requests to two engines with the same policy: A
 * unprepared, B with every event prepared — under the policy's :shingle-words and
 * :min-length, or under other values (as if prepared before a reload), or not at all. The
 * stream repeats bodies exactly, nearly (one word changed: near duplicates on the bulk
 * channel), with other case and spacing (the same normalised text), across channels and
 * senders, and has direct events and events without a sender. Both engines must give every
 * event the same status, id and family, and list the same duplicate families with the same
 * counts. Seeded; a failing case prints its seed (tests/support/prop.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/cephalon.h"
#include "tests/support/engine_fixture.h"
#include "tests/support/prop.h"

static const char *POLICY = "{:scheduler {:concurrency 4}\n"
                            " :sessions {:max-queue 8 :janitor? false}\n"
                            " :store {:sync :none}\n"
                            " :dedupe {:window-seconds 600 :min-length 16 :shingle-words 2\n"
                            "          :near-distance 12 :bulk [\"alerts\"]}}\n";
enum { SHINGLE = 2, MIN_LENGTH = 16 };

static const char *const WORDS[] = {"disk",  "full",  "on",    "node",  "seven", "eight",
                                    "check", "the",   "logs",  "now",   "backup", "failed",
                                    "queue", "stuck", "retry", "42",    "v1.2.3", "db-01"};
static const char *const CHANNELS[] = {"alerts", "ops", "general"};
static const char *const SENDERS[] = {"watchdog", "ann", "bob"};
static const char *const SESSIONS[] = {"s1", "s2"};

#define N_WORDS (sizeof WORDS / sizeof *WORDS)
#define MAX_EVENTS 24
#define BODY_MAX 256

typedef struct stream_event {
  char body[BODY_MAX];
  const char *channel; /* NULL: direct to session */
  const char *sender;  /* NULL: rejected */
  const char *session;
  int prep;            /* 0 none, 1 the policy's settings, 2 other settings */
  int32_t shingle;
  int64_t min_length;
} stream_event;

/* A body of 2..12 words from WORDS, with random case and spacing. */
static void random_body(rng *r, char *out) {
  size_t n = 2 + below(r, 11), at = 0;
  for (size_t w = 0; w < n; w++) {
    const char *word = WORDS[below(r, N_WORDS)];
    int spaces = w ? 1 + (int)below(r, 3) : (int)below(r, 2);
    for (int s = 0; s < spaces && at < BODY_MAX - 1; s++)
      out[at++] = below(r, 4) ? ' ' : '\t';
    bool upper = below(r, 4) == 0;
    for (const char *c = word; *c && at < BODY_MAX - 1; c++)
      out[at++] = upper && *c >= 'a' && *c <= 'z' ? (char)(*c - 32) : *c;
  }
  out[at] = '\0';
}

/* A near copy: one word of prev replaced (spacing normalised), or prev with other case. */
static void near_body(rng *r, const char *prev, char *out) {
  if (below(r, 2)) {
    size_t i = 0;
    for (; prev[i]; i++)
      out[i] = prev[i] >= 'a' && prev[i] <= 'z' && below(r, 3) == 0 ? (char)(prev[i] - 32)
                                                                     : prev[i];
    out[i] = '\0';
    return;
  }
  char copy[BODY_MAX];
  snprintf(copy, sizeof copy, "%s", prev);
  const char *words[32];
  size_t n = 0;
  for (char *tok = strtok(copy, " \t"); tok && n < 32; tok = strtok(NULL, " \t"))
    words[n++] = tok;
  size_t change = n ? below(r, (uint32_t)n) : 0;
  size_t at = 0;
  for (size_t w = 0; w < n; w++) {
    const char *word = w == change ? WORDS[below(r, N_WORDS)] : words[w];
    at += (size_t)snprintf(out + at, BODY_MAX - at, "%s%s", w ? " " : "", word);
    if (at >= BODY_MAX)
      break;
  }
}

static void draw_event(rng *r, stream_event *ev, stream_event *past, size_t n_past) {
  memset(ev, 0, sizeof *ev);
  uint32_t kind = below(r, 10);
  if (n_past && kind < 3) /* an exact repeat (maybe elsewhere: other channel or sender) */
    snprintf(ev->body, BODY_MAX, "%s", past[below(r, (uint32_t)n_past)].body);
  else if (n_past && kind < 6)
    near_body(r, past[below(r, (uint32_t)n_past)].body, ev->body);
  else
    random_body(r, ev->body);
  ev->channel = below(r, 8) ? CHANNELS[below(r, 3)] : NULL;
  ev->session = ev->channel ? (below(r, 6) ? NULL : SESSIONS[below(r, 2)]) : SESSIONS[below(r, 2)];
  ev->sender = below(r, 20) ? SENDERS[below(r, 3)] : NULL;
  ev->prep = (int)below(r, 3);
  ev->shingle = ev->prep == 2 ? (int32_t)(1 + below(r, 4)) : SHINGLE;
  ev->min_length = ev->prep == 2 ? (int64_t)below(r, 40) : MIN_LENGTH;
}

static void fill_in(const stream_event *s, cph_event_in *in) {
  memset(in, 0, sizeof *in);
  in->channel = (char *)s->channel;
  in->sender = (char *)s->sender;
  in->body = (char *)s->body;
  in->session = (char *)s->session;
}

static uint64_t family_of(cph_fixture *f, uint64_t id) {
  if (!id)
    return 0;
  cph_event_info ev;
  cph_err err;
  if (cph_engine_get_event(f->e, id, &ev, &err) != CPH_OK)
    fail_msg("event %" PRIu64 ": %s", id, err.msg);
  uint64_t family = ev.family;
  cph_event_info_free(&ev);
  return family;
}

/* The families and their counts, in the engine's order. */
static void same_families(cph_fixture *a, cph_fixture *b, uint64_t seed) {
  cph_aggregate_info *fa = NULL, *fb = NULL;
  size_t na = 0, nb = 0;
  cph_err err;
  if (cph_engine_aggregates(a->e, 100, &fa, &na, &err) ||
      cph_engine_aggregates(b->e, 100, &fb, &nb, &err))
    fail_msg("seed %" PRIu64 ": aggregates: %s", seed, err.msg);
  if (na != nb)
    fail_msg("seed %" PRIu64 ": %zu families unprepared, %zu prepared", seed, na, nb);
  for (size_t i = 0; i < na; i++)
    if (fa[i].family != fb[i].family || fa[i].dup_count != fb[i].dup_count)
      fail_msg("seed %" PRIu64 ": family %zu: %" PRIu64 " x%" PRIu64 " unprepared, %" PRIu64
               " x%" PRIu64 " prepared",
               seed, i, fa[i].family, fa[i].dup_count, fb[i].family, fb[i].dup_count);
  for (size_t i = 0; i < na; i++)
    cph_aggregate_info_free(&fa[i]);
  for (size_t i = 0; i < nb; i++)
    cph_aggregate_info_free(&fb[i]);
  free(fa);
  free(fb);
}

static void run_case(uint64_t seed, size_t *n_dups) {
  rng r = {seed};
  cph_fixture *a = cph_fixture_new("prep_a", POLICY), *b = cph_fixture_new("prep_b", POLICY);
  const char *sub_all[3] = {"alerts", "ops", "general"};
  for (size_t i = 0; i < 2; i++) {
    cph_fixture_create_session(a, SESSIONS[i], CPH_LANE_INTERACTIVE, sub_all, 1 + i);
    cph_fixture_create_session(b, SESSIONS[i], CPH_LANE_INTERACTIVE, sub_all, 1 + i);
  }
  cph_event_hasher *h = cph_event_hasher_new();
  assert_non_null(h);
  stream_event past[256];
  size_t n_past = 0;
  int requests = 3 + (int)below(&r, 6);
  for (int q = 0; q < requests; q++) {
    size_t n = 1 + below(&r, MAX_EVENTS);
    stream_event evs[MAX_EVENTS];
    cph_event_in ina[MAX_EVENTS], inb[MAX_EVENTS];
    cph_event_prep preps[MAX_EVENTS];
    for (size_t i = 0; i < n; i++) {
      draw_event(&r, &evs[i], past, n_past);
      fill_in(&evs[i], &ina[i]);
      fill_in(&evs[i], &inb[i]);
      if (evs[i].prep) {
        assert_int_equal(cph_event_prepare(h, &inb[i], evs[i].shingle, evs[i].min_length,
                                           &preps[i]),
                         CPH_OK);
        inb[i].prep = &preps[i];
      }
    }
    cph_op oa, ob;
    cph_fixture_ingest(a, ina, n, &oa);
    cph_fixture_ingest(b, inb, n, &ob);
    for (size_t i = 0; i < n; i++) {
      const cph_event_result *ra = &oa.u.ingest.results[i], *rb = &ob.u.ingest.results[i];
      if (ra->status != rb->status || ra->id != rb->id)
        fail_msg("seed %" PRIu64 ": request %d event %zu \"%s\" (prep %d, shingle %d, min %d): "
                 "%s id %" PRIu64 " unprepared, %s id %" PRIu64 " prepared",
                 seed, q, i, evs[i].body, evs[i].prep, (int)evs[i].shingle,
                 (int)evs[i].min_length, cph_ingest_status_name(ra->status), ra->id,
                 cph_ingest_status_name(rb->status), rb->id);
      uint64_t fa = family_of(a, ra->id), fb = family_of(b, rb->id);
      if (fa != fb)
        fail_msg("seed %" PRIu64 ": request %d event %zu: family %" PRIu64
                 " unprepared, %" PRIu64 " prepared",
                 seed, q, i, fa, fb);
      if (ra->status == CPH_EV_AGGREGATED)
        (*n_dups)++;
      if (n_past < 256 && evs[i].sender)
        past[n_past++] = evs[i];
    }
    cph_op_clear_results(&oa);
    cph_op_clear_results(&ob);
  }
  same_families(a, b, seed);
  cph_event_hasher_free(h);
  cph_fixture_free(a);
  cph_fixture_free(b);
}

static void test_prepared_events_get_the_answers_of_unprepared_ones(void **state) {
  (void)state;
  uint64_t seed;
  long cases;
  cph_property_run(20261128, 300, &seed, &cases);
  size_t n_dups = 0;
  for (long c = 0; c < cases; c++)
    run_case(seed + (uint64_t)c, &n_dups);
  /* The stream must exercise dedupe, or the equality above says little. */
  if (cases >= 50 && n_dups < (size_t)cases)
    fail_msg("only %zu duplicates over %ld cases", n_dups, cases);
}

/* The prep of an event is what dedupe computes for it: an exact repeat prepared on another
 * thread's hasher is found, a prep under the policy's settings carries the hashes, and one
 * whose text is under its min-length carries none. */
static void test_a_prep_carries_the_text_hashes(void **state) {
  (void)state;
  cph_event_hasher *h = cph_event_hasher_new();
  assert_non_null(h);
  cph_event_in in = {0};
  in.channel = "ops";
  in.sender = "ann";
  in.body = "  Disk FULL on   node seven ";
  cph_event_prep p1, p2, p3;
  assert_int_equal(cph_event_prepare(h, &in, SHINGLE, MIN_LENGTH, &p1), CPH_OK);
  assert_true(p1.ready && p1.hashed);
  assert_int_equal(p1.norm_len, strlen("disk full on node seven"));
  in.body = "disk full on node seven";
  assert_int_equal(cph_event_prepare(h, &in, SHINGLE, MIN_LENGTH, &p2), CPH_OK);
  assert_memory_equal(p1.sha256, p2.sha256, 32);
  assert_true(p1.simhash == p2.simhash && p1.idsig == p2.idsig);
  in.sender = "bob"; /* the exact hash covers the sender */
  assert_int_equal(cph_event_prepare(h, &in, SHINGLE, 100, &p3), CPH_OK);
  assert_true(p3.ready && !p3.hashed);
  assert_memory_not_equal(p1.sha256, p3.sha256, 32);
  in.sender = NULL; /* rejected by ingest: nothing to prepare */
  assert_int_equal(cph_event_prepare(h, &in, SHINGLE, MIN_LENGTH, &p3), CPH_OK);
  assert_false(p3.ready);
  cph_event_hasher_free(h);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_a_prep_carries_the_text_hashes),
      cmocka_unit_test(test_prepared_events_get_the_answers_of_unprepared_ones),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
