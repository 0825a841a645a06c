/* Per-channel backpressure (DESIGN §5) through the public API, on a virtual clock: a spam
 * burst degrades its channel one step per interval, quiet channels are untouched, recovery is
 * one step per :recover-intervals calm intervals; whatever the step, every event still reaches
 * the subscribers — repeats counted in their family's entry, distinct messages one by one —
 * and step 5 stores repeats and events that reach nobody without payload; every step names
 * the trigger (or the policy) that put the channel there, with its figure and limit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/cephalon.h"
#include "common/clock.h"
#include "tests/support/engine_fixture.h"
#include "tests/support/testutil.h"

#define INTERVAL_S 10
#define RECOVER 2
#define SPAM_PER_S 12 /* 720 a minute against a limit of 600 */
#define LIMIT 600
#define BP_STEPS 6

static const char *POLICY =
    "{:scheduler {:concurrency 4}\n"
    " :sessions {:max-queue 100000 :janitor? false}\n"
    " :store {:sync :none}\n"
    " :dedupe {:window-seconds 300 :min-length 12}\n"
    " :backpressure {:interval-s 10 :recover-intervals 2\n"
    "                :channels {\"spam\" {:max-events-per-minute 600}\n"
    "                           \"growth\" {:max-family-growth-per-minute 30}\n"
    "                           \"bots\" {:degrade-to-aggregate-only? true}}}}\n";

/* Everything at its default: no channel has a limit (0 = no limit). */
static const char *POLICY_DEFAULT = "{:store {:sync :none}}\n";

static const char *SPAM_A = "BUY CHEAP PILLS NOW at pills dot example";
static const char *SPAM_B = "free crypto giveaway click the link below";

/* The engine-wide embedding-queue trigger: nothing drains the queue (no janitor). */
static const char *POLICY_EMBED =
    "{:sessions {:max-queue 100000 :janitor? false}\n"
    " :store {:sync :none}\n"
    " :maintenance {:embeddings {:max-queue 5}}\n"
    " :backpressure {:interval-s 10 :recover-intervals 2}}\n";

typedef cph_fixture fixture;

static int setup_with(void **state, const char *policy) {
  *state = cph_fixture_new("backpressure", policy);
  return 0;
}

static int setup(void **state) { return setup_with(state, POLICY); }
static int setup_embed(void **state) { return setup_with(state, POLICY_EMBED); }
static int setup_default(void **state) { return setup_with(state, POLICY_DEFAULT); }

static int teardown(void **state) {
  cph_fixture_free(*state);
  return 0;
}

static void create_session(fixture *f, const char *id, cph_lane lane, const char *subscribe) {
  cph_op op = {0};
  op.kind = CPH_OP_SESSION_CREATE;
  op.u.session.in.id = (char *)id;
  op.u.session.in.lane = lane;
  char *subs[1] = {(char *)subscribe};
  if (subscribe) {
    op.u.session.in.subscribe.items = subs;
    op.u.session.in.subscribe.count = 1;
  }
  if (cph_fixture_run(f, &op))
    fail_msg("create %s: %s", id, op.err.msg);
  cph_op_clear_results(&op);
}

typedef struct ev_spec {
  const char *channel, *body, *mention;
} ev_spec;

/* Posts events in one request (one pass); statuses and ids optional. */
static void post_many(fixture *f, const ev_spec *specs, size_t n, cph_ingest_status *st,
                      uint64_t *ids) {
  cph_event_in *evs = calloc(n, sizeof *evs);
  char **mentions = calloc(n, sizeof *mentions);
  for (size_t i = 0; i < n; i++) {
    evs[i].channel = (char *)specs[i].channel;
    evs[i].sender = "bot";
    evs[i].body = (char *)specs[i].body;
    if (specs[i].mention) {
      mentions[i] = (char *)specs[i].mention;
      evs[i].mentions.items = &mentions[i];
      evs[i].mentions.count = 1;
    }
  }
  cph_op op = {0};
  op.kind = CPH_OP_INGEST;
  op.u.ingest.events = evs;
  op.u.ingest.n_events = n;
  if (cph_fixture_run(f, &op))
    fail_msg("ingest: %s", op.err.msg);
  for (size_t i = 0; i < n; i++) {
    if (st)
      st[i] = op.u.ingest.results[i].status;
    if (ids)
      ids[i] = op.u.ingest.results[i].id;
  }
  cph_op_clear_results(&op);
  free(evs);
  free(mentions);
}

static cph_ingest_status post1(fixture *f, const char *channel, const char *body,
                               const char *mention, uint64_t *id) {
  ev_spec s = {channel, body, mention};
  cph_ingest_status st;
  post_many(f, &s, 1, &st, id);
  return st;
}

static uint32_t inbox_size(fixture *f, const char *id) {
  cph_session_info s;
  cph_err err;
  if (cph_engine_get_session(f->e, id, &s, &err))
    fail_msg("get %s: %s", id, err.msg);
  uint32_t n = s.pending + s.staged;
  cph_session_info_free(&s);
  return n;
}

static cph_channel_info channel(fixture *f, const char *id) {
  cph_channel_info c;
  cph_err err;
  if (cph_engine_channel(f->e, id, &c, &err))
    fail_msg("channel %s: %s", id, err.msg);
  return c;
}

static uint32_t step_of(fixture *f, const char *id) {
  cph_channel_info c = channel(f, id);
  uint32_t s = c.step;
  cph_channel_info_free(&c);
  return s;
}

/* One virtual second of spam: half family A, half family B, in one request. */
static void spam_second(fixture *f) {
  ev_spec specs[SPAM_PER_S];
  for (int i = 0; i < SPAM_PER_S; i++)
    specs[i] = (ev_spec){"spam", i % 2 ? SPAM_B : SPAM_A, NULL};
  post_many(f, specs, SPAM_PER_S, NULL, NULL);
}

/* Seconds 1..seconds of spam, one virtual second apart. */
static void spam_for(fixture *f, int seconds) {
  for (int s = 1; s <= seconds; s++) {
    cph_clock_advance(&f->clock, CPH_NS_PER_S);
    spam_second(f);
  }
}

/* The next turn of the operational lane (any session's) into *op. */
static const cph_turn_info *lease_any(fixture *f, cph_op *op) {
  memset(op, 0, sizeof *op);
  op->kind = CPH_OP_LEASE;
  op->u.lease.worker = "w";
  op->u.lease.lanes = 1u << CPH_LANE_OPERATIONAL;
  op->u.lease.deadline_ns = cph_clock_now(&f->clock) + CPH_NS_PER_S;
  assert_int_equal(cph_fixture_run(f, op), CPH_OK);
  assert_non_null(op->u.lease.turn.session);
  return &op->u.lease.turn;
}

/* Leases the next turn of the operational lane (it must be session's) into *op. */
static const cph_turn_info *lease_op(fixture *f, const char *session, cph_op *op) {
  const cph_turn_info *t = lease_any(f, op);
  assert_string_equal(t->session, session);
  return t;
}

static void complete_op(fixture *f, cph_op *op) {
  cph_op c = {0};
  c.kind = CPH_OP_COMPLETE;
  c.u.turn.turn_id = op->u.lease.turn.id;
  snprintf(c.u.turn.lease, sizeof c.u.turn.lease, "%s", op->u.lease.turn.lease);
  assert_int_equal(cph_fixture_run(f, &c), CPH_OK);
  cph_op_clear_results(op);
}

/* Message n of a stream of messages that share no family: six words made by a fixed PRNG,
 * none shared between messages, so no two are even near-duplicates (each mints a raw
 * memory). */
static void distinct_text(char *buf, size_t size, uint64_t n) {
  uint64_t x = n * 0x9E3779B97F4A7C15ull + 1;
  size_t o = 0;
  for (int i = 0; i < 6 && o < size; i++) {
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    char w[8];
    for (int k = 0; k < 7; k++)
      w[k] = (char)('a' + (x >> (5 * k)) % 26);
    w[7] = '\0';
    o += (size_t)snprintf(buf + o, size - o, "%s%s", i ? " " : "", w);
  }
}

/* ---------------------------------------------------------------- tests */

static void test_spam_burst_degrades_one_step_per_interval_and_recovers(void **state) {
  fixture *f = *state;
  create_session(f, "spam-sub", CPH_LANE_OPERATIONAL, "spam");
  create_session(f, "quiet-sub", CPH_LANE_INTERACTIVE, "quiet");
  create_session(f, "helper", CPH_LANE_INTERACTIVE, NULL);

  /* Phase 1+2: 100 s of spam at 720/min; the quiet channel posts every 10 s. */
  int up_at[BP_STEPS] = {0};
  uint32_t prev = 0, quiet_posted = 0;
  uint32_t inbox_prev = inbox_size(f, "spam-sub");
  int delta_at[16], delta[16], n_deltas = 0;
  uint64_t dropped_id = 0;
  for (int s = 1; s <= 100; s++) {
    cph_clock_advance(&f->clock, CPH_NS_PER_S);
    spam_second(f); /* this pass runs the once-a-second check */
    if (s % 10 == 0) {
      char body[32];
      snprintf(body, sizeof body, "quiet %d", s);
      assert_int_equal(post1(f, "quiet", body, NULL, NULL), CPH_EV_QUEUED);
      quiet_posted++;
    }
    if (s == 75) { /* aggregate-only: a mention still goes through at once */
      assert_int_equal(post1(f, "spam", "helper can you look at the failing build", "helper",
                             NULL),
                       CPH_EV_QUEUED);
      assert_int_equal(inbox_size(f, "helper"), 1);
    }
    if (s == 95) /* step 5: a repeat loses its payload (its family keeps the text) */
      assert_int_equal(post1(f, "spam", SPAM_A, NULL, &dropped_id), CPH_EV_AGGREGATED);
    uint32_t st = step_of(f, "spam");
    assert_true(st == prev || st == prev + 1); /* one step at a time */
    if (st != prev)
      up_at[st] = s;
    prev = st;
    uint32_t inbox = inbox_size(f, "spam-sub");
    if (inbox != inbox_prev && n_deltas < 16) {
      delta_at[n_deltas] = s;
      delta[n_deltas++] = (int)(inbox - inbox_prev);
    }
    inbox_prev = inbox;
    assert_int_equal(step_of(f, "quiet"), 0);
    assert_int_equal(inbox_size(f, "quiet-sub"), quiet_posted);
  }
  /* 12 events a second pass 600 in the sliding minute at s = 51: step 1 at once, then one
   * step per 10 s interval while the trigger holds. */
  assert_int_equal(up_at[1], 51);
  for (int k = 2; k <= 5; k++)
    assert_int_equal(up_at[k], up_at[k - 1] + INTERVAL_S);

  /* What the subscriber has: the two originals at s = 1, every repeat counted in its family's
   * entry (never a new entry, never lost), and the mention at s = 75 as its own entry. */
  const int want_at[] = {1, 75};
  const int want_delta[] = {2, 1};
  assert_int_equal(n_deltas, 2);
  for (int i = 0; i < 2; i++) {
    assert_int_equal(delta_at[i], want_at[i]);
    assert_int_equal(delta[i], want_delta[i]);
  }
  cph_op op;
  const cph_turn_info *t = lease_op(f, "spam-sub", &op);
  assert_int_equal(t->n_staged, 3);
  assert_int_equal(t->staged[0].count, 100 * SPAM_PER_S / 2 + 1); /* and the one at s = 95 */
  assert_int_equal(t->staged[1].count, 100 * SPAM_PER_S / 2);
  for (int k = 0; k < 2; k++) {
    assert_int_equal(t->staged[k].n_event_ids, t->staged[k].count);
    assert_string_equal(t->staged[k].fold, "repeat");
    for (size_t i = 1; i < t->staged[k].n_event_ids; i++)
      assert_true(t->staged[k].event_ids[i] > t->staged[k].event_ids[i - 1]);
  }
  char want[128];
  snprintf(want, sizeof want, "%s (×%d, last ", SPAM_A, 100 * SPAM_PER_S / 2 + 1);
  assert_true(strncmp(t->staged[0].body, want, strlen(want)) == 0);
  assert_string_equal(t->staged[2].body, "helper can you look at the failing build");
  assert_int_equal(t->staged[2].count, 1);
  complete_op(f, &op);

  cph_channel_info c = channel(f, "spam");
  assert_int_equal(c.step, 5);
  assert_string_equal(c.step_name, "drop_payloads");
  assert_true(c.triggers & CPH_BP_TRIGGER_EVENTS);
  /* the last step up was made by the event rate, over its limit at that check */
  assert_string_equal(c.trigger.name, "events_per_minute");
  assert_true(c.trigger.has_figure);
  assert_int_equal(c.trigger.limit, LIMIT);
  assert_true(c.trigger.figure > LIMIT);
  assert_true(c.events_per_minute >= 60 * SPAM_PER_S);
  assert_int_equal(c.settings.max_events_per_minute, LIMIT);
  assert_int_equal(c.settings.dedupe_window_seconds, 4 * 300); /* step 3 widened it */
  assert_true(c.since_ms > 0);
  cph_channel_info_free(&c);

  cph_event_info ev;
  cph_err err;
  assert_int_equal(cph_engine_get_event(f->e, dropped_id, &ev, &err), CPH_OK);
  assert_null(ev.body);
  assert_string_equal(ev.status, "aggregated");
  assert_string_equal(ev.channel, "spam");
  assert_string_equal(ev.sender, "bot");
  assert_true(strspn(ev.body_sha256, "0") < 64); /* the hash is kept */
  assert_int_equal(strlen(ev.body_sha256), 64);
  cph_event_info_free(&ev);

  /* Phase 3: the spam stops. Once the minute is calm, one step back per 2 calm intervals. */
  int down_at[BP_STEPS] = {0}, calm_from = 0;
  for (int s = 101; s <= 260; s++) {
    cph_clock_advance(&f->clock, CPH_NS_PER_S);
    if (s % 10 == 0) {
      char body[32];
      snprintf(body, sizeof body, "quiet %d", s);
      assert_int_equal(post1(f, "quiet", body, NULL, NULL), CPH_EV_QUEUED);
      quiet_posted++;
    } else {
      cph_engine_run_pass(f->e);
    }
    cph_channel_info ci = channel(f, "spam");
    if (!calm_from && !ci.triggers)
      calm_from = s;
    assert_true(ci.step == prev || ci.step + 1 == prev);
    if (ci.step > 0) /* recovering: still the trigger that raised it */
      assert_string_equal(ci.trigger.name, "events_per_minute");
    else
      assert_null(ci.trigger.name);
    if (ci.step != prev)
      down_at[ci.step] = s;
    prev = ci.step;
    cph_channel_info_free(&ci);
    assert_int_equal(step_of(f, "quiet"), 0);
    assert_int_equal(inbox_size(f, "quiet-sub"), quiet_posted);
  }
  assert_int_equal(prev, 0);
  assert_int_equal(calm_from, 111); /* 12 * (160 - s) + 2 singles <= 600 from s = 111 */
  assert_int_equal(down_at[4], calm_from + RECOVER * INTERVAL_S);
  for (int k = 3; k >= 0; k--)
    assert_int_equal(down_at[k], down_at[k + 1] + RECOVER * INTERVAL_S);
}

/* Step 5 drops a repeat's payload only where an entry already shows its text. A repeat that
 * starts an entry — its family's entry is out with a running turn, or the session (a late
 * subscriber) never had one — is that entry's only text, and the worker must see it. */
static void test_a_repeat_that_starts_an_entry_keeps_its_text_at_step_5(void **state) {
  fixture *f = *state;
  create_session(f, "spam-sub", CPH_LANE_OPERATIONAL, "spam");
  spam_for(f, 95);
  assert_int_equal(step_of(f, "spam"), 5);
  cph_op running;
  const cph_turn_info *t = lease_op(f, "spam-sub", &running); /* both families' entries */
  assert_int_equal(t->n_staged, 2);
  create_session(f, "late-sub", CPH_LANE_OPERATIONAL, "spam");
  uint64_t ids[3];
  ev_spec specs[] = {{"spam", SPAM_A, NULL}, {"spam", SPAM_B, NULL}, {"spam", SPAM_A, NULL}};
  cph_ingest_status st[3];
  post_many(f, specs, 3, st, ids);
  for (int i = 0; i < 3; i++)
    assert_int_equal(st[i], CPH_EV_AGGREGATED);
  complete_op(f, &running);
  /* Each session: SPAM_A's entry (the first repeat, and the third counted in it) and SPAM_B's. */
  for (int k = 0; k < 2; k++) {
    cph_op op;
    t = lease_any(f, &op);
    if (t->n_staged != 2)
      fail_msg("%s: %zu staged entries, want 2", t->session, (size_t)t->n_staged);
    char want[128];
    snprintf(want, sizeof want, "%s (×2, last ", SPAM_A);
    if (strncmp(t->staged[0].body, want, strlen(want)) != 0)
      fail_msg("%s: SPAM_A's entry shows \"%s\"", t->session, t->staged[0].body);
    assert_int_equal(t->staged[0].count, 2);
    assert_int_equal(t->staged[0].event_id, ids[0]);
    if (strcmp(t->staged[1].body, SPAM_B) != 0)
      fail_msg("%s: SPAM_B's entry shows \"%s\"", t->session, t->staged[1].body);
    complete_op(f, &op);
  }
  cph_event_info ev;
  cph_err err;
  assert_int_equal(cph_engine_get_event(f->e, ids[0], &ev, &err), CPH_OK);
  assert_string_equal(ev.body, SPAM_A); /* it starts entries: kept */
  cph_event_info_free(&ev);
  assert_int_equal(cph_engine_get_event(f->e, ids[2], &ev, &err), CPH_OK);
  assert_null(ev.body); /* counted where the first shows the text: dropped */
  cph_event_info_free(&ev);
}

static void test_step_survives_a_restart(void **state) {
  fixture *f = *state;
  create_session(f, "spam-sub", CPH_LANE_OPERATIONAL, "spam");
  spam_for(f, 61);
  assert_int_equal(step_of(f, "spam"), 2);
  cph_channel_info before = channel(f, "spam");
  cph_engine_close(f->e);
  cph_fixture_open(f);
  cph_channel_info after = channel(f, "spam");
  assert_int_equal(after.step, 2);
  assert_int_equal(after.since_ms, before.since_ms);
  assert_string_equal(before.trigger.name, "events_per_minute");
  assert_string_equal(after.trigger.name, "events_per_minute");
  assert_int_equal(after.trigger.figure, before.trigger.figure);
  assert_int_equal(after.trigger.limit, LIMIT);
  cph_channel_info_free(&before);
  cph_channel_info_free(&after);
  /* still aggregate-only: a new distinct message reaches the subscriber with its own text,
   * and a repeat after the restart still folds into its family's entry */
  assert_int_equal(post1(f, "spam", "something entirely new after the restart", NULL, NULL),
                   CPH_EV_QUEUED);
  assert_int_equal(post1(f, "spam", SPAM_B, NULL, NULL), CPH_EV_AGGREGATED);
  cph_op op;
  const cph_turn_info *t = lease_op(f, "spam-sub", &op);
  assert_int_equal(t->n_staged, 3);
  assert_int_equal(t->staged[0].count, 61 * SPAM_PER_S / 2);
  assert_int_equal(t->staged[1].count, 61 * SPAM_PER_S / 2 + 1);
  assert_string_equal(t->staged[2].body, "something entirely new after the restart");
  complete_op(f, &op);
}

static void test_aggregate_only_floor_still_delivers_every_message_counted(void **state) {
  fixture *f = *state;
  create_session(f, "bots-sub", CPH_LANE_OPERATIONAL, "bots");
  create_session(f, "helper", CPH_LANE_INTERACTIVE, NULL);
  /* :degrade-to-aggregate-only? true: aggregate-only from the first event, no trigger; the
   * policy holds it there and says so */
  assert_int_equal(step_of(f, "bots"), 1);
  cph_channel_info floor = channel(f, "bots");
  assert_string_equal(floor.trigger.name, "policy");
  assert_false(floor.trigger.has_figure);
  assert_int_equal(floor.triggers, 0);
  cph_channel_info_free(&floor);
  ev_spec specs[] = {{"bots", "build 101 passed on the main branch", NULL},
                     {"bots", "coverage report uploaded for build 101", NULL},
                     {"bots", "artifact storage cleanup removed 12 files", NULL},
                     {"bots", "build 102 passed on the main branch", NULL},
                     {"bots", "build 101 passed on the main branch", NULL}};
  cph_ingest_status st[5];
  post_many(f, specs, 5, st, NULL);
  for (int i = 0; i < 4; i++)
    assert_int_equal(st[i], CPH_EV_QUEUED); /* distinct: a number differs, never folded */
  assert_int_equal(st[4], CPH_EV_AGGREGATED); /* the repeat: counted in build 101's entry */
  assert_int_equal(inbox_size(f, "bots-sub"), 4);
  assert_int_equal(post1(f, "bots", "helper please rerun build 101", "helper", NULL),
                   CPH_EV_QUEUED);
  assert_int_equal(inbox_size(f, "helper"), 1);
  assert_int_equal(inbox_size(f, "bots-sub"), 5);

  cph_op op;
  const cph_turn_info *t = lease_op(f, "bots-sub", &op);
  assert_int_equal(t->n_staged, 5);
  assert_true(strncmp(t->staged[0].body, "build 101 passed on the main branch (×2, last ", 46) ==
              0);
  assert_int_equal(t->staged[0].count, 2);
  assert_string_equal(t->staged[1].body, "coverage report uploaded for build 101");
  assert_string_equal(t->staged[3].body, "build 102 passed on the main branch");
  assert_string_equal(t->staged[4].body, "helper please rerun build 101");
  assert_string_equal(t->staged[4].sender, "bot");
  complete_op(f, &op);

  /* nothing new, nothing staged; quiet for long, the floor holds */
  for (int s = 0; s < 120; s++) {
    cph_clock_advance(&f->clock, CPH_NS_PER_S);
    cph_engine_run_pass(f->e);
  }
  assert_int_equal(inbox_size(f, "bots-sub"), 0);
  assert_int_equal(step_of(f, "bots"), 1);
  floor = channel(f, "bots");
  assert_string_equal(floor.trigger.name, "policy");
  cph_channel_info_free(&floor);
  size_t len;
  char *text = cph_engine_metrics_text(f->e, &len);
  assert_non_null(strstr(text, "cephalon_backpressure_step{channel=\"bots\",trigger=\"policy\"} 1\n"));
  assert_non_null(strstr(text, "cephalon_backpressure_step{channel=\"spam\",trigger=\"none\"} 0\n"));
  free(text);
}

static void test_family_growth_triggers_without_an_event_limit(void **state) {
  fixture *f = *state;
  create_session(f, "growth-sub", CPH_LANE_OPERATIONAL, "growth");
  int stepped = 0;
  for (int s = 1; s <= 60 && !stepped; s++) {
    cph_clock_advance(&f->clock, CPH_NS_PER_S);
    post1(f, "growth", "the same alert text over and over again", NULL, NULL);
    if (step_of(f, "growth") == 1)
      stepped = s;
  }
  /* one duplicate a second: the family grows past 30 a minute after 31 duplicates (the
   * original is not growth) */
  assert_int_equal(stepped, 32);
  cph_channel_info c = channel(f, "growth");
  assert_true(c.triggers & CPH_BP_TRIGGER_FAMILY_GROWTH);
  assert_false(c.triggers & CPH_BP_TRIGGER_EVENTS);
  assert_true(c.family_growth_per_minute > 30);
  assert_string_equal(c.trigger.name, "family_growth");
  assert_true(c.trigger.has_figure);
  assert_int_equal(c.trigger.figure, 31); /* 31 duplicates in the minute of that check */
  assert_int_equal(c.trigger.limit, 30);
  cph_channel_info_free(&c);
  size_t len;
  char *text = cph_engine_metrics_text(f->e, &len);
  assert_non_null(
      strstr(text, "cephalon_backpressure_step{channel=\"growth\",trigger=\"family_growth\"} 1\n"));
  free(text);
}

/* With every limit at its default (0 = no limit) no trigger holds, however often one alert
 * repeats: not at 50 repeats, and not at 20 a second for a minute (a loud channel, for the
 * engine-wide triggers, whose figures stay under their limits). */
static void test_default_policy_never_degrades_a_repeated_alert(void **state) {
  fixture *f = *state;
  create_session(f, "ops-sub", CPH_LANE_OPERATIONAL, "ops");
  for (int i = 0; i < 50; i++)
    post1(f, "ops", "ALERT disk usage above 90% on host alpha", NULL, NULL);
  for (int s = 1; s <= 70; s++) {
    cph_clock_advance(&f->clock, CPH_NS_PER_S);
    ev_spec specs[20];
    for (int i = 0; i < 20; i++)
      specs[i] = (ev_spec){"ops", "ALERT disk usage above 90% on host alpha", NULL};
    post_many(f, specs, 20, NULL, NULL);
    cph_channel_info c = channel(f, "ops");
    assert_int_equal(c.step, 0);
    assert_int_equal(c.triggers, 0);
    assert_null(c.trigger.name);
    cph_channel_info_free(&c);
  }
  cph_channel_info c = channel(f, "ops");
  assert_true(c.events_per_minute >= 60 * 20);
  assert_true(c.family_growth_per_minute >= 1000); /* 55 to 60 s of 20 a second */
  assert_int_equal(c.settings.max_events_per_minute, 0);
  assert_int_equal(c.settings.max_family_growth_per_minute, 0);
  cph_channel_info_free(&c);
}

static void test_embedding_queue_degrades_only_the_loud_channel(void **state) {
  fixture *f = *state;
  create_session(f, "loud-sub", CPH_LANE_OPERATIONAL, "loud");
  create_session(f, "soft-sub", CPH_LANE_INTERACTIVE, "soft");
  uint32_t soft_posted = 0;
  for (int s = 1; s <= 40; s++) {
    cph_clock_advance(&f->clock, CPH_NS_PER_S);
    char a[96], b[96];
    distinct_text(a, sizeof a, 2 * (uint64_t)s);
    distinct_text(b, sizeof b, 2 * (uint64_t)s + 1);
    ev_spec specs[] = {{"loud", a, NULL}, {"loud", b, NULL}};
    cph_ingest_status st[2];
    bool normal = step_of(f, "loud") == 0;
    post_many(f, specs, 2, st, NULL); /* 120 a minute, each minting a raw memory */
    if (normal) { /* no duplicates: both are staged while the channel is normal */
      assert_int_equal(st[0], CPH_EV_QUEUED);
      assert_int_equal(st[1], CPH_EV_QUEUED);
    }
    if (s % 10 == 0) {
      char q[32];
      snprintf(q, sizeof q, "soft %d", s);
      assert_int_equal(post1(f, "soft", q, NULL, NULL), CPH_EV_QUEUED);
      soft_posted++;
    }
  }
  /* the queue passed :max-queue 5 at once, but "loud" is loud (>= 60 new events a minute and
   * >= 1/4 of all) only from s = 30 */
  cph_channel_info c = channel(f, "loud");
  assert_true(c.step >= 1);
  assert_true(c.triggers & CPH_BP_TRIGGER_EMBED_QUEUE);
  assert_string_equal(c.trigger.name, "embedding_queue");
  assert_int_equal(c.trigger.limit, 5);
  assert_true(c.trigger.figure > 5);
  cph_channel_info_free(&c);
  c = channel(f, "soft");
  assert_int_equal(c.step, 0);
  assert_int_equal(c.triggers, 0);
  assert_null(c.trigger.name);
  cph_channel_info_free(&c);
  assert_int_equal(inbox_size(f, "soft-sub"), soft_posted);
}

/* The engine-wide triggers degrade the channels whose events make that work. A repeat joins
 * its family and mints and embeds nothing, so a channel repeating one alert three times a
 * second stays normal while the embedding queue is over its limit, and the channel whose new
 * messages fill the queue is degraded, naming the queue. */
static void test_repeats_alone_never_degrade_a_channel_for_the_embedding_queue(void **state) {
  fixture *f = *state;
  create_session(f, "loud-sub", CPH_LANE_OPERATIONAL, "loud");
  create_session(f, "alerts-sub", CPH_LANE_OPERATIONAL, "alerts");
  for (int s = 1; s <= 70; s++) {
    cph_clock_advance(&f->clock, CPH_NS_PER_S);
    char a[96], b[96];
    distinct_text(a, sizeof a, 2 * (uint64_t)s);
    distinct_text(b, sizeof b, 2 * (uint64_t)s + 1);
    const char *alert = "ALERT disk usage above 90% on host alpha";
    ev_spec specs[] = {{"loud", a, NULL}, {"loud", b, NULL}, {"alerts", alert, NULL},
                       {"alerts", alert, NULL}, {"alerts", alert, NULL}};
    post_many(f, specs, 5, NULL, NULL); /* loud: 120 new a minute; alerts: 180, all repeats */
    cph_channel_info c = channel(f, "alerts");
    assert_int_equal(c.step, 0);
    assert_int_equal(c.triggers, 0);
    cph_channel_info_free(&c);
  }
  cph_channel_info c = channel(f, "alerts");
  assert_true(c.events_per_minute >= 180); /* the loudest channel by raw count */
  cph_channel_info_free(&c);
  c = channel(f, "loud");
  assert_true(c.step >= 1);
  assert_string_equal(c.trigger.name, "embedding_queue");
  cph_channel_info_free(&c);
}

static void test_unknown_channel_is_not_found(void **state) {
  fixture *f = *state;
  cph_channel_info c;
  cph_err err;
  assert_int_equal(cph_engine_channel(f->e, "never-seen", &c, &err), CPH_ENOTFOUND);
  assert_int_equal(cph_engine_channel(f->e, "", &c, &err), CPH_EINVAL);
  /* a channel the policy names is known before any traffic */
  assert_int_equal(cph_engine_channel(f->e, "spam", &c, &err), CPH_OK);
  assert_int_equal(c.step, 0);
  assert_string_equal(c.step_name, "normal");
  cph_channel_info_free(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_spam_burst_degrades_one_step_per_interval_and_recovers,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_a_repeat_that_starts_an_entry_keeps_its_text_at_step_5,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_step_survives_a_restart, setup, teardown),
      cmocka_unit_test_setup_teardown(test_aggregate_only_floor_still_delivers_every_message_counted, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_family_growth_triggers_without_an_event_limit, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_embedding_queue_degrades_only_the_loud_channel,
                                      setup_embed, teardown),
      cmocka_unit_test_setup_teardown(
          test_repeats_alone_never_degrade_a_channel_for_the_embedding_queue, setup_embed,
          teardown),
      cmocka_unit_test_setup_teardown(test_unknown_channel_is_not_found, setup, teardown),
      cmocka_unit_test_setup_teardown(test_default_policy_never_degrades_a_repeated_alert,
                                      setup_default, teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
