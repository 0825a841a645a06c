/* store/: record round trips, strict decoding, the storage-full path, schema checks. */
#define _GNU_SOURCE /* memmem */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/store.h"
#include "tests/support/testutil.h"

typedef struct fixture {
  char *dir;
  cph_store *store;
} fixture;

static cph_store *open_store(const char *dir, size_t map_size) {
  cph_store_options o = {dir, map_size, CPH_SYNC_ALWAYS};
  cph_store *s = NULL;
  cph_err err = {0};
  int rc = cph_store_open(&o, &s, &err);
  if (rc)
    fail_msg("open %s: %s", dir, err.msg);
  return s;
}

static int setup(void **state) {
  fixture *f = calloc(1, sizeof *f);
  f->dir = cph_test_tmpdir("store");
  f->store = open_store(f->dir, 64u << 20);
  *state = f;
  return 0;
}

static int teardown(void **state) {
  fixture *f = *state;
  cph_store_close(f->store);
  cph_test_rmtree(f->dir);
  free(f->dir);
  free(f);
  return 0;
}

static cph_key key_str(const char *s) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, s);
  return k;
}

static cph_key key_u64(uint64_t v) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_u64(&k, v);
  return k;
}

/* Puts rec under key in its own committed txn, then reads it back in a new txn. */
static void put_then_get(cph_store *s, cph_db db, const cph_key *k, const cph_record_desc *d,
                         const void *rec, void *out) {
  cph_txn t;
  assert_int_equal(cph_txn_begin(s, true, &t), CPH_OK);
  assert_int_equal(cph_txn_put_record(&t, db, k, d, rec), CPH_OK);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
  assert_int_equal(cph_txn_begin(s, false, &t), CPH_OK);
  int rc = cph_txn_get_record(&t, db, k, d, out);
  if (rc)
    fail_msg("get_record: %s", t.err.msg);
  cph_txn_abort(&t);
}

static char *strs3[] = {"general", "ops:alerts", "ünïcödé ✓"};

static void test_session_round_trips_every_field(void **state) {
  fixture *f = *state;
  cph_session_rec in = {0}, out = {0};
  in.id = "agent.alpha@team-1:x";
  in.lane = 1;
  in.state = CPH_SESSION_PAUSED;
  in.credits = -12.75;
  in.credits_at_ms = 1763712000123;
  in.episode = UINT64_MAX;
  in.subscribe = strs3;
  in.n_subscribe = 3;
  in.member = strs3 + 1;
  in.n_member = 1;
  in.autonomy_interval_s = 60;
  in.report_interval_s = UINT32_MAX;
  in.context_window_tokens = 8192;
  in.system = NULL;
  in.tools = strs3;
  in.n_tools = 2;
  in.created_ms = -5;
  in.updated_ms = INT64_MAX;
  cph_key k = key_str(in.id);
  put_then_get(f->store, CPH_DB_SESSIONS, &k, &cph_session_desc, &in, &out);
  assert_string_equal(out.id, in.id);
  assert_int_equal(out.lane, 1);
  assert_int_equal(out.state, CPH_SESSION_PAUSED);
  assert_true(out.credits == -12.75);
  assert_int_equal(out.credits_at_ms, 1763712000123);
  assert_true(out.episode == UINT64_MAX);
  assert_int_equal(out.n_subscribe, 3);
  assert_string_equal(out.subscribe[2], "ünïcödé ✓");
  assert_int_equal(out.n_member, 1);
  assert_string_equal(out.member[0], "ops:alerts");
  assert_int_equal(out.autonomy_interval_s, 60);
  assert_true(out.report_interval_s == UINT32_MAX);
  assert_int_equal(out.context_window_tokens, 8192);
  assert_null(out.system);
  assert_int_equal(out.n_tools, 2);
  assert_string_equal(out.tools[1], "ops:alerts");
  assert_true(out.created_ms == -5);
  assert_true(out.updated_ms == INT64_MAX);
  cph_record_free(&cph_session_desc, &out);
}

/* Session records are read from version 1 on (store/codec_internal.h): a version-1 record,
 * written before while_running existed, reads with while_running 0 (its class's default); a
 * version-2 one, before tenants, reads with no tenant; a version from the future is refused
 * naming the versions this build reads. */
static void test_session_record_v1_reads_while_running_as_the_class_default(void **state) {
  (void)state;
  cph_session_rec in = {0}, out = {0};
  in.id = "old-timer";
  in.subscribe = strs3;
  in.n_subscribe = 1;
  in.context_window_tokens = 8192;
  in.while_running = 3; /* 1 + interrupt */
  cph_buf b = CPH_BUF_INIT;
  assert_int_equal(cph_record_encode(&cph_session_desc, &in, &b), CPH_OK);
  cph_err err = {0};
  assert_int_equal(cph_record_decode(&cph_session_desc, b.data, b.len, &out, &err), CPH_OK);
  assert_int_equal(out.while_running, 3);
  assert_null(out.tenant);
  cph_record_free(&cph_session_desc, &out);
  /* [version 3, 17 fields] as array16 0xdc 0x00 0x12, then fixint 3, ..., while_running (a
   * fixint) and the tenant (nil) last: version 2 is the same without the last byte, 16
   * fields; version 1 without the last two, 15 fields. */
  const uint8_t *v3 = (const uint8_t *)b.data;
  assert_true(v3[0] == 0xdc && v3[1] == 0x00 && v3[2] == 0x12 && v3[3] == 0x03);
  assert_int_equal(v3[b.len - 2], 3);
  assert_int_equal(v3[b.len - 1], 0xc0);
  uint8_t *old = malloc(b.len);
  memcpy(old, v3, b.len - 1);
  old[2] = 0x11;
  old[3] = 0x02;
  assert_int_equal(cph_record_decode(&cph_session_desc, old, b.len - 1, &out, &err), CPH_OK);
  assert_int_equal(out.while_running, 3);
  assert_null(out.tenant);
  cph_record_free(&cph_session_desc, &out);
  old[2] = 0x10;
  old[3] = 0x01;
  assert_int_equal(cph_record_decode(&cph_session_desc, old, b.len - 2, &out, &err), CPH_OK);
  assert_string_equal(out.id, "old-timer");
  assert_int_equal(out.context_window_tokens, 8192);
  assert_int_equal(out.while_running, 0);
  assert_null(out.tenant);
  cph_record_free(&cph_session_desc, &out);
  /* version 1 with 16 fields, and version 4: refused */
  old[2] = 0x11;
  assert_int_equal(cph_record_decode(&cph_session_desc, old, b.len - 1, &out, &err),
                   CPH_ECORRUPT);
  memcpy(old, v3, b.len);
  old[3] = 0x04;
  assert_int_equal(cph_record_decode(&cph_session_desc, old, b.len, &out, &err), CPH_ECORRUPT);
  if (!strstr(err.msg, "this build reads versions 1 to 3"))
    fail_msg("message '%s' does not name the versions read", err.msg);
  free(old);
  cph_buf_free(&b);
  /* A tenant round-trips. */
  in.tenant = "acme";
  assert_int_equal(cph_record_encode(&cph_session_desc, &in, &b), CPH_OK);
  assert_int_equal(cph_record_decode(&cph_session_desc, b.data, b.len, &out, &err), CPH_OK);
  assert_string_equal(out.tenant, "acme");
  cph_record_free(&cph_session_desc, &out);
  cph_buf_free(&b);
}

/* Reply records are read from version 1 on: one written before origins (cluster mode,
 * core/replystream.h) reads with no origin. */
static void test_reply_record_v1_reads_without_an_origin(void **state) {
  (void)state;
  uint64_t seqs[1] = {4};
  cph_reply_rec in = {7, "s1", "general", "hi", seqs, 1, 3, 99, NULL}, out = {0};
  cph_buf b = CPH_BUF_INIT;
  assert_int_equal(cph_record_encode(&cph_reply_desc, &in, &b), CPH_OK);
  /* [version 2, 8 fields] as fixarray 0x99, then fixint 2, ..., the origin (nil) last:
   * version 1 is the same without it */
  uint8_t *v = (uint8_t *)b.data;
  assert_true(v[0] == 0x99 && v[1] == 0x02);
  assert_int_equal(v[b.len - 1], 0xc0);
  v[0] = 0x98;
  v[1] = 0x01;
  cph_err err = {0};
  assert_int_equal(cph_record_decode(&cph_reply_desc, v, b.len - 1, &out, &err), CPH_OK);
  assert_string_equal(out.body, "hi");
  assert_int_equal(out.ts_ms, 99);
  assert_null(out.origin);
  cph_record_free(&cph_reply_desc, &out);
  cph_buf_free(&b);
}

static void test_event_round_trips_with_redacted_body(void **state) {
  fixture *f = *state;
  cph_event_rec in = {0}, out = {0};
  in.id = 42;
  in.channel = "367156652140658699";
  in.sender = "user:7";
  in.body = NULL; /* redacted */
  in.session = "s1";
  in.mentions = strs3;
  in.n_mentions = 2;
  in.kind = "message";
  in.key = "idem-1";
  in.ts_ms = 1700000000000;
  in.received_ms = 1700000000001;
  in.status = CPH_EVENT_AGGREGATED;
  for (int i = 0; i < 32; i++)
    in.body_sha256[i] = (uint8_t)(i * 7 + 1);
  in.simhash = 0xdeadbeefcafef00dull;
  in.family = 9;
  cph_key k = key_u64(in.id);
  put_then_get(f->store, CPH_DB_EVENTS, &k, &cph_event_desc, &in, &out);
  assert_int_equal(out.id, 42);
  assert_string_equal(out.channel, in.channel);
  assert_string_equal(out.sender, "user:7");
  assert_null(out.body);
  assert_string_equal(out.session, "s1");
  assert_int_equal(out.n_mentions, 2);
  assert_string_equal(out.mentions[0], "general");
  assert_string_equal(out.kind, "message");
  assert_string_equal(out.key, "idem-1");
  assert_true(out.ts_ms == 1700000000000);
  assert_true(out.received_ms == 1700000000001);
  assert_int_equal(out.status, CPH_EVENT_AGGREGATED);
  assert_memory_equal(out.body_sha256, in.body_sha256, 32);
  assert_true(out.simhash == 0xdeadbeefcafef00dull);
  assert_int_equal(out.family, 9);
  cph_record_free(&cph_event_desc, &out);
}

static void test_inbox_turn_reply_round_trip(void **state) {
  fixture *f = *state;
  cph_inbox_rec ib = {"s1", 7, 42, CPH_INBOX_STAGED, true, 0, 2, 123}, ibo = {0};
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, "s1");
  cph_key_u64(&k, 7);
  put_then_get(f->store, CPH_DB_INBOX, &k, &cph_inbox_desc, &ib, &ibo);
  assert_string_equal(ibo.session, "s1");
  assert_int_equal(ibo.seq, 7);
  assert_int_equal(ibo.event_id, 42);
  assert_int_equal(ibo.status, CPH_INBOX_STAGED);
  assert_true(ibo.mentioned);
  assert_int_equal(ibo.attempts, 2);
  assert_int_equal(ibo.created_ms, 123);
  cph_record_free(&cph_inbox_desc, &ibo);

  uint64_t seqs[] = {7, 8, 1u << 20};
  cph_turn_rec t = {0}, to = {0};
  t.id = 5;
  t.session = "s1";
  t.lane = 0;
  t.kind = CPH_TURN_INBOX;
  t.state = CPH_TURN_LEASED;
  memset(t.lease, 0xab, sizeof t.lease);
  t.worker = "w-1";
  t.inbox_seqs = seqs;
  t.n_inbox_seqs = 3;
  t.episode = 3;
  t.attempts = 1;
  t.input = "inbox:hello\nworld";
  t.deadline_ms = 999;
  t.cost_tokens = 1234;
  t.tool_calls = 3;
  t.error = NULL;
  k = key_u64(5);
  put_then_get(f->store, CPH_DB_TURNS, &k, &cph_turn_desc, &t, &to);
  assert_int_equal(to.kind, CPH_TURN_INBOX);
  assert_memory_equal(to.lease, t.lease, 16);
  assert_string_equal(to.worker, "w-1");
  assert_int_equal(to.n_inbox_seqs, 3);
  assert_int_equal(to.inbox_seqs[2], 1u << 20);
  assert_string_equal(to.input, "inbox:hello\nworld");
  assert_int_equal(to.deadline_ms, 999);
  assert_int_equal(to.cost_tokens, 1234);
  assert_int_equal(to.tool_calls, 3);
  assert_null(to.error);
  cph_record_free(&cph_turn_desc, &to);

  cph_reply_rec r = {11, "s1", "general", "hi there", seqs, 2, 5, 77, NULL}, ro = {0};
  k = key_u64(11);
  put_then_get(f->store, CPH_DB_REPLIES, &k, &cph_reply_desc, &r, &ro);
  assert_string_equal(ro.body, "hi there");
  assert_int_equal(ro.n_source_inbox_ids, 2);
  assert_int_equal(ro.source_inbox_ids[1], 8);
  assert_int_equal(ro.turn_id, 5);
  assert_int_equal(ro.ts_ms, 77);
  assert_null(ro.origin); /* a single node's reply has none */
  cph_record_free(&cph_reply_desc, &ro);

  /* version 2 (cluster mode) carries its origin */
  r.origin = "n1/11/00000000000000ff";
  put_then_get(f->store, CPH_DB_REPLIES, &k, &cph_reply_desc, &r, &ro);
  assert_string_equal(ro.origin, "n1/11/00000000000000ff");
  assert_int_equal(ro.ts_ms, 77);
  cph_record_free(&cph_reply_desc, &ro);
}

static void test_memory_job_outbox_gc_aggregate_round_trip(void **state) {
  fixture *f = *state;
  cph_memory_rec m = {0}, mo = {0};
  m.id = 3;
  m.session = "s1";
  m.kind = CPH_MEMORY_SUMMARY;
  m.text = "the user prefers short answers";
  m.tags = strs3;
  m.n_tags = 1;
  m.tokens_est = 8;
  m.created_ms = 10;
  m.last_access_ms = 20;
  m.access_count = 4;
  m.deleted = true;
  m.embed_status = CPH_EMBED_DELETED;
  m.replaced_by = 99;
  m.source_event_id = 42;
  m.gc_group = 6;
  cph_key k = key_u64(3);
  put_then_get(f->store, CPH_DB_MEMORIES, &k, &cph_memory_desc, &m, &mo);
  assert_int_equal(mo.kind, CPH_MEMORY_SUMMARY);
  assert_string_equal(mo.text, m.text);
  assert_string_equal(mo.tags[0], "general");
  assert_int_equal(mo.access_count, 4);
  assert_true(mo.deleted);
  assert_int_equal(mo.embed_status, CPH_EMBED_DELETED);
  assert_int_equal(mo.replaced_by, 99);
  assert_int_equal(mo.gc_group, 6);
  cph_record_free(&cph_memory_desc, &mo);

  cph_job_rec j = {8, "janitor", CPH_JOB_GC_COMMIT, CPH_JOB_QUEUED, "group=6", 6, 1, 5, 6, 0,
                   NULL},
              jo = {0};
  k = key_u64(8);
  put_then_get(f->store, CPH_DB_JOBS, &k, &cph_job_desc, &j, &jo);
  assert_int_equal(jo.kind, CPH_JOB_GC_COMMIT);
  assert_string_equal(jo.args, "group=6");
  assert_int_equal(jo.group_id, 6);
  assert_null(jo.error);
  cph_record_free(&cph_job_desc, &jo);

  cph_outbox_rec o = {4, CPH_OUTBOX_VECTOR_DELETE, CPH_OUTBOX_PENDING, 3, "builtin-hash-256",
                      2, 3, 100, 200, 0, "HTTP 500"},
                 oo = {0};
  k = key_u64(4);
  put_then_get(f->store, CPH_DB_OUTBOX, &k, &cph_outbox_desc, &o, &oo);
  assert_int_equal(oo.memory_id, 3);
  assert_string_equal(oo.model, "builtin-hash-256");
  assert_int_equal(oo.shard, 2);
  assert_int_equal(oo.attempts, 3);
  assert_int_equal(oo.next_attempt_ms, 200);
  assert_string_equal(oo.last_error, "HTTP 500");
  cph_record_free(&cph_outbox_desc, &oo);

  uint64_t src[] = {1, 2, 10};
  cph_gc_group_rec g = {6, "s1", CPH_GC_SUMMARIZED, src, 3, 5000, 300,
                        "a3f1000000000000000000000000000000000000000000000000000000000000",
                        "summary text", 0, 1, 2},
                   go = {0};
  k = key_u64(6);
  put_then_get(f->store, CPH_DB_GC_GROUPS, &k, &cph_gc_group_desc, &g, &go);
  assert_int_equal(go.state, CPH_GC_SUMMARIZED);
  assert_int_equal(go.n_source_ids, 3);
  assert_int_equal(go.source_ids[2], 10);
  assert_int_equal(go.newest_ts_ms, 5000);
  assert_int_equal(go.total_tokens_est, 300);
  assert_string_equal(go.group_hash, g.group_hash);
  assert_string_equal(go.summary_text, "summary text");
  cph_record_free(&cph_gc_group_desc, &go);

  cph_aggregate_rec a = {0}, ao = {0};
  a.family = 12;
  a.dup_count = 1000000;
  a.sample = "BUY NOW!!!";
  a.channels = strs3;
  a.n_channels = 3;
  a.first_ms = 1;
  a.last_ms = 2;
  a.simhash = 77;
  a.body_sha256[31] = 0xff;
  k = key_u64(12);
  put_then_get(f->store, CPH_DB_AGGREGATES, &k, &cph_aggregate_desc, &a, &ao);
  assert_int_equal(ao.dup_count, 1000000);
  assert_string_equal(ao.sample, "BUY NOW!!!");
  assert_int_equal(ao.n_channels, 3);
  assert_int_equal(ao.body_sha256[31], 0xff);
  cph_record_free(&cph_aggregate_desc, &ao);
}

/* Every truncation of a valid record, and every single-byte corruption, decodes to a clean
 * error or a valid record — never a crash (ASan watches) and never a leak. A string cut short
 * is named so, not as a string where a string was expected. */
static void test_truncated_and_flipped_bytes_never_crash(void **state) {
  (void)state;
  cph_session_rec in = {0};
  in.id = "s1";
  in.subscribe = strs3;
  in.n_subscribe = 3;
  in.system = "be brief";
  cph_buf b = CPH_BUF_INIT;
  assert_int_equal(cph_record_encode(&cph_session_desc, &in, &b), CPH_OK);
  for (size_t cut = 0; cut < b.len; cut++) {
    cph_session_rec out;
    cph_err err = {0};
    assert_int_equal(cph_record_decode(&cph_session_desc, b.data, cut, &out, &err),
                     CPH_ECORRUPT);
    assert_true(strlen(err.msg) > 0);
    if (strstr(err.msg, "got a string"))
      fail_msg("cut at %zu of %zu: '%s'", cut, b.len, err.msg);
  }
  cph_session_rec cut_rec;
  cph_err cut_err = {0};
  const char *brief = memmem(b.data, b.len, "be brief", 8);
  assert_non_null(brief);
  size_t inside = (size_t)(brief - (const char *)b.data) + 3; /* cut inside "be brief" */
  assert_int_equal(cph_record_decode(&cph_session_desc, b.data, inside, &cut_rec, &cut_err),
                   CPH_ECORRUPT);
  assert_string_equal(cut_err.msg, "session field 'system': a string cut short (it runs past "
                                   "the end of the data)");
  char *copy = malloc(b.len);
  for (size_t i = 0; i < b.len; i++) {
    for (int bit = 0; bit < 8; bit++) {
      memcpy(copy, b.data, b.len);
      copy[i] ^= (char)(1 << bit);
      cph_session_rec out;
      cph_err err = {0};
      int rc = cph_record_decode(&cph_session_desc, copy, b.len, &out, &err);
      assert_true(rc == CPH_OK || rc == CPH_ECORRUPT);
      cph_record_free(&cph_session_desc, &out);
    }
  }
  free(copy);
  cph_buf_free(&b);
}

static void expect_corrupt(const void *bytes, size_t len, const char *fragment) {
  cph_event_rec out;
  cph_err err = {0};
  assert_int_equal(cph_record_decode(&cph_event_desc, bytes, len, &out, &err), CPH_ECORRUPT);
  if (!strstr(err.msg, fragment))
    fail_msg("message '%s' lacks '%s'", err.msg, fragment);
}

static void test_garbage_values_give_specific_errors(void **state) {
  (void)state;
  expect_corrupt("", 0, "empty value");
  expect_corrupt("\xa3" "abc", 4, "expected a record array, got a string");
  expect_corrupt("\x90", 1, "expected a record version first, got an empty array");
  expect_corrupt("\x92\x07\x01", 3, "record version 7, this build reads version 1");
  expect_corrupt("\x92\x01\x01", 3, "1 fields, expected 14");
  /* array32 claiming 4 billion elements in 5 bytes: refused before any allocation */
  expect_corrupt("\xdd\xff\xff\xff\xff", 5, "expected a record array");
  /* a valid event followed by a stray byte */
  cph_event_rec ev = {0};
  ev.channel = "c";
  ev.sender = "u";
  cph_buf b = CPH_BUF_INIT;
  cph_record_encode(&cph_event_desc, &ev, &b);
  cph_buf_putc(&b, '\x00');
  expect_corrupt(b.data, b.len, "1 unexpected bytes after the record");
  /* status (field 11) set past the enum's range */
  cph_buf_reset(&b);
  ev.status = CPH_EVENT_STATUS_COUNT;
  cph_record_encode(&cph_event_desc, &ev, &b);
  expect_corrupt(b.data, b.len, "event field 'status': value 3 is out of range");
  cph_buf_free(&b);
}

static void test_corrupt_value_in_store_names_database_and_key(void **state) {
  fixture *f = *state;
  cph_key k = key_str("agent-7");
  cph_txn t;
  assert_int_equal(cph_txn_begin(f->store, true, &t), CPH_OK);
  assert_int_equal(cph_txn_put(&t, CPH_DB_SESSIONS, &k, "\x93\x01\xc3\xc3", 4), CPH_OK);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);

  assert_int_equal(cph_txn_begin(f->store, false, &t), CPH_OK);
  cph_session_rec out;
  assert_int_equal(cph_txn_get_record(&t, CPH_DB_SESSIONS, &k, &cph_session_desc, &out),
                   CPH_ECORRUPT);
  assert_string_equal(t.err.msg, "corrupt record in database \"sessions\" at key \"agent-7\": "
                                 "session: 2 fields, expected 15");
  /* The error is sticky: the txn refuses further work with the same error. */
  cph_val v;
  assert_int_equal(cph_txn_get(&t, CPH_DB_SESSIONS, &k, &v), CPH_ECORRUPT);
  cph_txn_abort(&t);

  cph_key ek = key_u64(1234);
  assert_int_equal(cph_txn_begin(f->store, true, &t), CPH_OK);
  assert_int_equal(cph_txn_put(&t, CPH_DB_EVENTS, &ek, "\xc1", 1), CPH_OK);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
  assert_int_equal(cph_txn_begin(f->store, false, &t), CPH_OK);
  cph_event_rec ev;
  assert_int_equal(cph_txn_get_record(&t, CPH_DB_EVENTS, &ek, &cph_event_desc, &ev),
                   CPH_ECORRUPT);
  assert_non_null(strstr(t.err.msg, "database \"events\" at key 1234:"));
  assert_non_null(strstr(t.err.msg, "the reserved byte 0xc1"));
  cph_txn_abort(&t);
}

static void test_missing_key_is_notfound_and_not_sticky(void **state) {
  fixture *f = *state;
  cph_txn t;
  assert_int_equal(cph_txn_begin(f->store, true, &t), CPH_OK);
  cph_key k = key_str("nobody");
  cph_session_rec out;
  assert_int_equal(cph_txn_get_record(&t, CPH_DB_SESSIONS, &k, &cph_session_desc, &out),
                   CPH_ENOTFOUND);
  assert_int_equal(cph_txn_del(&t, CPH_DB_SESSIONS, &k), CPH_ENOTFOUND);
  assert_int_equal(cph_txn_put(&t, CPH_DB_SESSIONS, &k, "x", 1), CPH_OK);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
}

/* cph_txn_append puts whatever it is given: at the end without a search when the key sorts
 * last, as cph_txn_put otherwise (before the last key, or replacing one), in a child txn too. */
static void test_append_places_any_key_and_is_never_an_error(void **state) {
  fixture *f = *state;
  cph_txn t, c;
  assert_int_equal(cph_txn_begin(f->store, true, &t), CPH_OK);
  cph_key k5 = key_u64(5), k3 = key_u64(3), k9 = key_u64(9);
  assert_int_equal(cph_txn_append(&t, CPH_DB_EVENTS, &k5, "five", 4), CPH_OK);
  assert_int_equal(cph_txn_begin_child(&t, &c), CPH_OK);
  assert_int_equal(cph_txn_append(&c, CPH_DB_EVENTS, &k3, "three", 5), CPH_OK); /* before */
  assert_int_equal(cph_txn_append(&c, CPH_DB_EVENTS, &k5, "FIVE", 4), CPH_OK);  /* replaces */
  assert_int_equal(cph_txn_append(&c, CPH_DB_EVENTS, &k9, "nine", 4), CPH_OK);  /* after */
  assert_int_equal(cph_txn_commit(&c), CPH_OK);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);

  assert_int_equal(cph_txn_begin(f->store, false, &t), CPH_OK);
  size_t n = 0;
  assert_int_equal(cph_txn_count(&t, CPH_DB_EVENTS, &n), CPH_OK);
  assert_int_equal(n, 3);
  cph_val v;
  assert_int_equal(cph_txn_get(&t, CPH_DB_EVENTS, &k3, &v), CPH_OK);
  assert_memory_equal(v.data, "three", 5);
  assert_int_equal(cph_txn_get(&t, CPH_DB_EVENTS, &k5, &v), CPH_OK);
  assert_memory_equal(v.data, "FIVE", 4);
  assert_int_equal(cph_txn_get(&t, CPH_DB_EVENTS, &k9, &v), CPH_OK);
  assert_memory_equal(v.data, "nine", 4);
  cph_txn_abort(&t);
}

static void test_sticky_error_discards_the_whole_transaction(void **state) {
  fixture *f = *state;
  cph_txn t;
  assert_int_equal(cph_txn_begin(f->store, true, &t), CPH_OK);
  cph_key a = key_str("a");
  assert_int_equal(cph_txn_put(&t, CPH_DB_SESSIONS, &a, "1", 1), CPH_OK);
  cph_key big;
  cph_key_reset(&big);
  char long_id[600];
  memset(long_id, 'x', sizeof long_id - 1);
  long_id[sizeof long_id - 1] = '\0';
  cph_key_str(&big, long_id);
  assert_int_equal(cph_txn_put(&t, CPH_DB_SESSIONS, &big, "2", 1), CPH_ELIMIT);
  cph_key b = key_str("b");
  assert_int_equal(cph_txn_put(&t, CPH_DB_SESSIONS, &b, "3", 1), CPH_ELIMIT);
  assert_int_equal(cph_txn_commit(&t), CPH_ELIMIT);
  assert_string_equal(t.err.msg, "key for database \"sessions\" is longer than 511 bytes");

  assert_int_equal(cph_txn_begin(f->store, false, &t), CPH_OK);
  cph_val v;
  assert_int_equal(cph_txn_get(&t, CPH_DB_SESSIONS, &a, &v), CPH_ENOTFOUND);
  cph_txn_abort(&t);
}

static void test_counters_are_monotonic_and_persist(void **state) {
  fixture *f = *state;
  cph_txn t;
  uint64_t id = 0;
  assert_int_equal(cph_txn_begin(f->store, true, &t), CPH_OK);
  assert_int_equal(cph_txn_next_id(&t, "event", &id), CPH_OK);
  assert_int_equal(id, 1);
  assert_int_equal(cph_txn_next_id(&t, "event", &id), CPH_OK);
  assert_int_equal(id, 2);
  assert_int_equal(cph_txn_next_id(&t, "turn", &id), CPH_OK);
  assert_int_equal(id, 1);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
  /* An aborted txn does not consume ids. */
  assert_int_equal(cph_txn_begin(f->store, true, &t), CPH_OK);
  assert_int_equal(cph_txn_next_id(&t, "event", &id), CPH_OK);
  cph_txn_abort(&t);
  cph_store_close(f->store);
  f->store = open_store(f->dir, 64u << 20);
  assert_int_equal(cph_txn_begin(f->store, true, &t), CPH_OK);
  assert_int_equal(cph_txn_next_id(&t, "event", &id), CPH_OK);
  assert_int_equal(id, 3);
  cph_txn_abort(&t);
}

static uint64_t next_of(cph_txn *t, const char *counter) {
  uint64_t id = 0;
  if (cph_txn_next_id(t, counter, &id) != CPH_OK)
    fail_msg("next_id %s: %s", counter, t->err.msg);
  return id;
}

/* The stored value of a counter (what a crash right now would restart from). */
static uint64_t stored_counter(cph_store *s, const char *counter) {
  cph_txn t;
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, "next_id");
  cph_key_str(&k, counter);
  cph_val v;
  uint64_t next = 0;
  assert_int_equal(cph_txn_begin(s, false, &t), CPH_OK);
  if (cph_txn_get(&t, CPH_DB_META, &k, &v) == CPH_OK && v.len == 8)
    next = cph_be64_get(v.data);
  cph_txn_abort(&t);
  return next;
}

/* Counters are kept in memory and written once per top-level commit: a child that aborts
 * gives its ids back, one that commits hands them to its parent, and only a committed
 * top-level txn moves the stored counter — so a reopen (or a crash) never reissues an id
 * that committed data holds. */
static void test_counters_in_memory_follow_nested_txns_and_survive_reopen(void **state) {
  fixture *f = *state;
  cph_txn t, c;
  assert_int_equal(cph_txn_begin(f->store, true, &t), CPH_OK);
  assert_int_equal(next_of(&t, "event"), 1);
  assert_int_equal(cph_txn_begin_child(&t, &c), CPH_OK);
  assert_int_equal(next_of(&c, "event"), 2);
  assert_int_equal(next_of(&c, "chan:a"), 1);
  cph_txn_abort(&c); /* gives 2 and chan:a 1 back */
  assert_int_equal(next_of(&t, "event"), 2);
  assert_int_equal(cph_txn_begin_child(&t, &c), CPH_OK);
  assert_int_equal(next_of(&c, "event"), 3);
  assert_int_equal(next_of(&c, "chan:a"), 1);
  assert_int_equal(next_of(&c, "chan:a"), 2);
  assert_int_equal(cph_txn_commit(&c), CPH_OK);
  assert_int_equal(cph_txn_begin_child(&t, &c), CPH_OK);
  assert_int_equal(next_of(&c, "event"), 4);
  assert_int_equal(cph_txn_commit(&c), CPH_OK);
  assert_int_equal(stored_counter(f->store, "event"), 0); /* nothing written before commit */
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
  assert_int_equal(stored_counter(f->store, "event"), 5);
  assert_int_equal(stored_counter(f->store, "chan:a"), 3);

  /* A child's ids go back when its parent aborts after the child committed. */
  assert_int_equal(cph_txn_begin(f->store, true, &t), CPH_OK);
  assert_int_equal(cph_txn_begin_child(&t, &c), CPH_OK);
  assert_int_equal(next_of(&c, "event"), 5);
  assert_int_equal(cph_txn_commit(&c), CPH_OK);
  cph_txn_abort(&t);
  /* ... and when a top-level commit fails (sticky error). */
  assert_int_equal(cph_txn_begin(f->store, true, &t), CPH_OK);
  assert_int_equal(next_of(&t, "event"), 5);
  cph_key empty;
  cph_key_reset(&empty);
  assert_int_equal(cph_txn_put(&t, CPH_DB_SESSIONS, &empty, "x", 1), CPH_ELIMIT);
  assert_int_equal(cph_txn_commit(&t), CPH_ELIMIT);
  assert_int_equal(stored_counter(f->store, "event"), 5);

  cph_store_close(f->store);
  f->store = open_store(f->dir, 64u << 20);
  assert_int_equal(cph_txn_begin(f->store, true, &t), CPH_OK);
  assert_int_equal(next_of(&t, "event"), 5);
  assert_int_equal(next_of(&t, "chan:a"), 3);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
}

/* More counters than the cache keeps: they are forgotten after the commit and read back
 * from meta, continuing where they were. */
static void test_counters_beyond_the_cache_reload_without_reuse(void **state) {
  fixture *f = *state;
  enum { N = 5000 };
  char name[32];
  cph_txn t;
  for (int round = 1; round <= 2; round++) {
    assert_int_equal(cph_txn_begin(f->store, true, &t), CPH_OK);
    for (int i = 0; i < N; i++) {
      snprintf(name, sizeof name, "chan:c%d", i);
      assert_int_equal(next_of(&t, name), (uint64_t)round);
    }
    assert_int_equal(cph_txn_commit(&t), CPH_OK);
  }
  snprintf(name, sizeof name, "chan:c%d", N - 1);
  assert_int_equal(stored_counter(f->store, name), 3);
}

static void test_cursor_walks_composite_keys_in_order(void **state) {
  fixture *f = *state;
  cph_txn t;
  assert_int_equal(cph_txn_begin(f->store, true, &t), CPH_OK);
  const char *sessions[] = {"a", "ab", "b"};
  uint64_t seqs[] = {300, 2, 1u << 16};
  for (int s = 0; s < 3; s++)
    for (int i = 0; i < 3; i++) {
      cph_key k;
      cph_key_reset(&k);
      cph_key_str(&k, sessions[s]);
      cph_key_u64(&k, seqs[i]);
      assert_int_equal(cph_txn_put(&t, CPH_DB_INBOX, &k, "v", 1), CPH_OK);
    }
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
  assert_int_equal(cph_txn_begin(f->store, false, &t), CPH_OK);
  cph_cursor c;
  assert_int_equal(cph_cursor_open(&t, CPH_DB_INBOX, &c), CPH_OK);
  cph_key prefix = key_str("a");
  cph_val k, v;
  uint64_t got[3];
  int n = 0;
  for (int rc = cph_cursor_seek(&c, &prefix, &k, &v); rc == CPH_OK;
       rc = cph_cursor_next(&c, &k, &v)) {
    if (k.len != prefix.len + 8 || memcmp(k.data, prefix.data, prefix.len) != 0)
      break; /* "ab" keys must not be mistaken for "a" keys */
    got[n++] = cph_be64_get((const uint8_t *)k.data + prefix.len);
  }
  assert_int_equal(n, 3);
  assert_int_equal(got[0], 2);
  assert_int_equal(got[1], 300);
  assert_int_equal(got[2], 1u << 16);
  /* Walking back from past the end of "a": the last "a" key, never an "ab" one. */
  cph_key past;
  cph_key_reset(&past);
  cph_key_str(&past, "a");
  cph_key_u64(&past, UINT64_MAX);
  assert_int_equal(cph_cursor_seek(&c, &past, &k, &v), CPH_OK); /* lands on "ab"/2 */
  assert_int_equal(cph_cursor_prev(&c, &k, &v), CPH_OK);
  assert_int_equal(cph_be64_get((const uint8_t *)k.data + prefix.len), 1u << 16);
  /* and past the end of the whole database: the last key */
  cph_key z = key_str("zzz");
  assert_int_equal(cph_cursor_seek(&c, &z, &k, &v), CPH_ENOTFOUND);
  assert_int_equal(cph_cursor_prev(&c, &k, &v), CPH_OK);
  assert_memory_equal(k.data, "b", 2);
  cph_cursor_close(&c);
  cph_txn_abort(&t);
}

/* The storage-full contract: the failing txn is aborted with a clear error, everything
 * committed before is intact, reads still work, and the store reopens with all of it. */
static void test_tiny_map_fills_up_cleanly_and_reopens_intact(void **state) {
  (void)state;
  char *dir = cph_test_tmpdir("full");
  const size_t tiny = 256u << 10; /* 256 KiB */
  cph_store *s = open_store(dir, tiny);
  char value[2000];
  memset(value, 'v', sizeof value);
  uint64_t committed = 0;
  int rc = CPH_OK;
  cph_txn t;
  char errmsg[512] = "";
  for (uint64_t batch = 0; batch < 1000 && rc == CPH_OK; batch++) {
    assert_int_equal(cph_txn_begin(s, true, &t), CPH_OK);
    for (uint64_t i = 0; i < 10; i++) {
      cph_key k = key_u64(batch * 10 + i);
      cph_txn_put(&t, CPH_DB_EVENTS, &k, value, sizeof value);
    }
    rc = cph_txn_commit(&t);
    if (rc == CPH_OK)
      committed = batch * 10 + 10;
    else
      snprintf(errmsg, sizeof errmsg, "%s", t.err.msg);
  }
  assert_int_equal(rc, CPH_EFULL);
  assert_true(committed > 0);
  assert_string_equal(cph_strerror(rc), "storage full");
  assert_non_null(strstr(errmsg, "storage full"));
  assert_non_null(strstr(errmsg, ":server :max-map-size-mb"));

  /* The environment is still usable: reads see every committed record and nothing of the
   * failed txn. */
  assert_int_equal(cph_txn_begin(s, false, &t), CPH_OK);
  for (uint64_t i = 0; i < committed; i++) {
    cph_key k = key_u64(i);
    cph_val v;
    assert_int_equal(cph_txn_get(&t, CPH_DB_EVENTS, &k, &v), CPH_OK);
    assert_int_equal(v.len, sizeof value);
  }
  cph_key first_lost = key_u64(committed);
  cph_val v;
  assert_int_equal(cph_txn_get(&t, CPH_DB_EVENTS, &first_lost, &v), CPH_ENOTFOUND);
  cph_txn_abort(&t);
  /* and a write that frees space still commits */
  assert_int_equal(cph_txn_begin(s, true, &t), CPH_OK);
  cph_key k0 = key_u64(0);
  assert_int_equal(cph_txn_del(&t, CPH_DB_EVENTS, &k0), CPH_OK);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
  cph_store_close(s);

  /* Reopen with a larger map: all data present, writes work again. */
  s = open_store(dir, 8u << 20);
  assert_int_equal(cph_txn_begin(s, true, &t), CPH_OK);
  for (uint64_t i = 1; i < committed; i++) {
    cph_key k = key_u64(i);
    assert_int_equal(cph_txn_get(&t, CPH_DB_EVENTS, &k, &v), CPH_OK);
  }
  cph_key more = key_u64(committed + 1);
  assert_int_equal(cph_txn_put(&t, CPH_DB_EVENTS, &more, value, sizeof value), CPH_OK);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
  cph_store_close(s);
  cph_test_rmtree(dir);
  free(dir);
}

/* Group commit relies on this: a request that fills the map fails alone, the others of the
 * same transaction commit — whether the parent had written before it (an LMDB child) or not
 * (the child shares the parent's txn, store.h). */
static void full_child_leaves_parent_usable(bool parent_wrote) {
  char *dir = cph_test_tmpdir("child");
  cph_store *s = open_store(dir, 256u << 10);
  cph_txn parent, child;
  assert_int_equal(cph_txn_begin(s, true, &parent), CPH_OK);
  cph_key before = key_str("before");
  if (parent_wrote)
    assert_int_equal(cph_txn_put(&parent, CPH_DB_SESSIONS, &before, "1", 1), CPH_OK);

  assert_int_equal(cph_txn_begin_child(&parent, &child), CPH_OK);
  assert_int_equal(child.borrowed, !parent_wrote);
  char value[4000];
  memset(value, 'x', sizeof value);
  int rc = CPH_OK;
  for (uint64_t i = 0; i < 1000 && rc == CPH_OK; i++) {
    cph_key k = key_u64(i);
    rc = cph_txn_put(&child, CPH_DB_EVENTS, &k, value, sizeof value);
  }
  assert_int_equal(rc, CPH_EFULL);
  assert_int_equal(cph_txn_commit(&child), CPH_EFULL); /* aborts the child only */

  assert_int_equal(cph_txn_begin_child(&parent, &child), CPH_OK);
  cph_key small = key_str("small");
  assert_int_equal(cph_txn_put(&child, CPH_DB_SESSIONS, &small, "2", 1), CPH_OK);
  assert_int_equal(cph_txn_commit(&child), CPH_OK);
  cph_key after = key_str("after");
  assert_int_equal(cph_txn_put(&parent, CPH_DB_SESSIONS, &after, "3", 1), CPH_OK);
  assert_int_equal(cph_txn_commit(&parent), CPH_OK);

  cph_txn t;
  cph_val v;
  assert_int_equal(cph_txn_begin(s, false, &t), CPH_OK);
  assert_int_equal(cph_txn_get(&t, CPH_DB_SESSIONS, &before, &v),
                   parent_wrote ? CPH_OK : CPH_ENOTFOUND);
  assert_int_equal(cph_txn_get(&t, CPH_DB_SESSIONS, &small, &v), CPH_OK);
  assert_int_equal(cph_txn_get(&t, CPH_DB_SESSIONS, &after, &v), CPH_OK);
  cph_key k0 = key_u64(0);
  assert_int_equal(cph_txn_get(&t, CPH_DB_EVENTS, &k0, &v), CPH_ENOTFOUND);
  cph_txn_abort(&t);
  cph_store_close(s);
  cph_test_rmtree(dir);
  free(dir);
}

static void test_full_child_txn_leaves_parent_usable(void **state) {
  (void)state;
  full_child_leaves_parent_usable(true);
}

static void test_full_child_of_a_clean_parent_leaves_it_usable(void **state) {
  (void)state;
  full_child_leaves_parent_usable(false);
}

static bool has_key(cph_txn *t, cph_db db, const char *key) {
  cph_key k = key_str(key);
  cph_val v;
  return cph_txn_get(t, db, &k, &v) == CPH_OK;
}

/* A child of a parent that wrote nothing shares the parent's LMDB txn (store.h): its abort
 * must still discard exactly its own writes — through a chain of such children too — leave
 * every txn above it usable, and give its ids back. */
static void test_child_of_a_clean_parent_aborts_only_its_own_writes(void **state) {
  fixture *f = *state;
  cph_txn t, c, g;
  assert_int_equal(cph_txn_begin(f->store, true, &t), CPH_OK);
  assert_false(has_key(&t, CPH_DB_SESSIONS, "a")); /* reads leave the parent clean */
  assert_int_equal(cph_txn_begin_child(&t, &c), CPH_OK);
  assert_true(c.borrowed);
  cph_key a = key_str("a"), b = key_str("b"), d = key_str("d"), e = key_str("e");
  assert_int_equal(cph_txn_put(&c, CPH_DB_SESSIONS, &a, "1", 1), CPH_OK);
  assert_int_equal(next_of(&c, "event"), 1);
  cph_txn_abort(&c);
  assert_false(has_key(&t, CPH_DB_SESSIONS, "a"));

  /* A chain: the middle child lends too, the grandchild's abort restarts the top's txn. */
  assert_int_equal(cph_txn_begin_child(&t, &c), CPH_OK);
  assert_int_equal(cph_txn_begin_child(&c, &g), CPH_OK);
  assert_true(c.borrowed && g.borrowed);
  assert_int_equal(cph_txn_put(&g, CPH_DB_SESSIONS, &b, "2", 1), CPH_OK);
  cph_txn_abort(&g);
  assert_false(has_key(&c, CPH_DB_SESSIONS, "b"));
  assert_int_equal(cph_txn_put(&c, CPH_DB_SESSIONS, &d, "3", 1), CPH_OK);
  assert_int_equal(next_of(&c, "event"), 1); /* the aborted child's id, given back */
  /* c wrote: its child is a real LMDB child now, and its abort keeps c's write. */
  assert_int_equal(cph_txn_begin_child(&c, &g), CPH_OK);
  assert_false(g.borrowed);
  assert_int_equal(cph_txn_put(&g, CPH_DB_SESSIONS, &e, "4", 1), CPH_OK);
  cph_txn_abort(&g);
  assert_int_equal(cph_txn_commit(&c), CPH_OK);
  assert_true(has_key(&t, CPH_DB_SESSIONS, "d"));
  assert_false(has_key(&t, CPH_DB_SESSIONS, "e"));

  /* A child that only read aborts without touching the parent's txn. */
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
  assert_int_equal(cph_txn_begin(f->store, true, &t), CPH_OK);
  assert_int_equal(cph_txn_begin_child(&t, &c), CPH_OK);
  assert_true(has_key(&c, CPH_DB_SESSIONS, "d"));
  cph_txn_abort(&c);
  assert_int_equal(cph_txn_put(&t, CPH_DB_SESSIONS, &a, "5", 1), CPH_OK);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);

  assert_int_equal(cph_txn_begin(f->store, false, &t), CPH_OK);
  assert_true(has_key(&t, CPH_DB_SESSIONS, "a"));
  assert_false(has_key(&t, CPH_DB_SESSIONS, "b"));
  assert_true(has_key(&t, CPH_DB_SESSIONS, "d"));
  assert_false(has_key(&t, CPH_DB_SESSIONS, "e"));
  cph_txn_abort(&t);
  assert_int_equal(stored_counter(f->store, "event"), 2);
}

/* While its child is open a parent takes no call and no second child, borrowed child or
 * real one (LMDB refuses a parent's calls then): a write through it would otherwise land in
 * the txn the child shares and be lost with the child's abort. */
static void test_parent_refuses_calls_while_its_child_is_open(void **state) {
  fixture *f = *state;
  for (int dirty = 0; dirty < 2; dirty++) {
    cph_txn t, c, c2;
    cph_key a = key_str("a"), b = key_str("b");
    assert_int_equal(cph_txn_begin(f->store, true, &t), CPH_OK);
    if (dirty)
      assert_int_equal(cph_txn_put(&t, CPH_DB_SESSIONS, &b, "0", 1), CPH_OK);
    assert_int_equal(cph_txn_begin_child(&t, &c), CPH_OK);
    assert_int_equal(c.borrowed, !dirty);
    assert_int_equal(cph_txn_begin_child(&t, &c2), CPH_ESTATE);
    assert_int_equal(cph_txn_put(&c, CPH_DB_SESSIONS, &a, "1", 1), CPH_OK);
    assert_int_equal(cph_txn_put(&t, CPH_DB_SESSIONS, &b, "2", 1), CPH_ESTATE);
    cph_txn_abort(&c);
    assert_int_equal(cph_txn_commit(&t), CPH_ESTATE); /* the misuse is sticky */
  }
  cph_txn t;
  assert_int_equal(cph_txn_begin(f->store, false, &t), CPH_OK);
  assert_false(has_key(&t, CPH_DB_SESSIONS, "a"));
  assert_false(has_key(&t, CPH_DB_SESSIONS, "b"));
  cph_txn_abort(&t);
}

/* A parent with a cursor open lends nothing (an abort of the shared txn would free the
 * cursor): its child is a real one, and the cursor still walks after the child's abort. */
static void test_parent_with_a_cursor_open_gets_a_real_child(void **state) {
  fixture *f = *state;
  cph_txn t, c;
  assert_int_equal(cph_txn_begin(f->store, true, &t), CPH_OK);
  for (int i = 0; i < 3; i++) {
    cph_key k = key_u64((uint64_t)i + 1);
    assert_int_equal(cph_txn_put(&t, CPH_DB_EVENTS, &k, "x", 1), CPH_OK);
  }
  assert_int_equal(cph_txn_commit(&t), CPH_OK);

  assert_int_equal(cph_txn_begin(f->store, true, &t), CPH_OK);
  cph_cursor cur;
  cph_val key, val;
  assert_int_equal(cph_cursor_open(&t, CPH_DB_EVENTS, &cur), CPH_OK);
  assert_int_equal(cph_cursor_seek(&cur, NULL, &key, &val), CPH_OK);
  assert_int_equal(cph_txn_begin_child(&t, &c), CPH_OK);
  assert_false(c.borrowed);
  cph_key k9 = key_u64(9);
  assert_int_equal(cph_txn_put(&c, CPH_DB_EVENTS, &k9, "y", 1), CPH_OK);
  cph_txn_abort(&c);
  int n = 1;
  while (cph_cursor_next(&cur, &key, &val) == CPH_OK)
    n++;
  assert_int_equal(n, 3);
  cph_cursor_close(&cur);
  /* Closed, the parent lends again. */
  assert_int_equal(cph_txn_begin_child(&t, &c), CPH_OK);
  assert_true(c.borrowed);
  assert_int_equal(cph_txn_commit(&c), CPH_OK);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
}

static void test_schema_version_mismatch_refuses_to_open(void **state) {
  (void)state;
  char *dir = cph_test_tmpdir("schema");
  cph_store *s = open_store(dir, 1u << 20);
  cph_store_close(s);
  /* Rewrite the version behind the store's back, as an older or newer build would. */
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi dbi;
  assert_int_equal(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, 32);
  assert_int_equal(mdb_env_open(env, dir, 0, 0644), 0);
  assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
  assert_int_equal(mdb_dbi_open(txn, "meta", 0, &dbi), 0);
  uint8_t v99[4] = {0, 0, 0, 99};
  MDB_val key = {strlen("schema_version"), "schema_version"}, val = {4, v99};
  assert_int_equal(mdb_put(txn, dbi, &key, &val, 0), 0);
  assert_int_equal(mdb_txn_commit(txn), 0);
  mdb_env_close(env);

  cph_store_options o = {dir, 1u << 20, CPH_SYNC_ALWAYS};
  cph_err err = {0};
  assert_int_equal(cph_store_open(&o, &s, &err), CPH_ESCHEMA);
  assert_null(s);
  char expected[1024];
  snprintf(expected, sizeof expected,
           "data dir '%s' has storage schema version 99, but this build reads version %u; use a "
           "build that matches, or move the data dir away to start fresh",
           dir, CPH_STORE_SCHEMA_VERSION);
  assert_string_equal(err.msg, expected);
  cph_test_rmtree(dir);
  free(dir);
}

/* Writes `version` as the data dir's schema version behind the store's back. */
static void set_schema_version(const char *dir, uint32_t version) {
  MDB_env *env;
  MDB_txn *txn;
  MDB_dbi dbi;
  assert_int_equal(mdb_env_create(&env), 0);
  mdb_env_set_maxdbs(env, 32);
  assert_int_equal(mdb_env_open(env, dir, 0, 0644), 0);
  assert_int_equal(mdb_txn_begin(env, NULL, 0, &txn), 0);
  assert_int_equal(mdb_dbi_open(txn, "meta", 0, &dbi), 0);
  uint8_t be[4] = {(uint8_t)(version >> 24), (uint8_t)(version >> 16), (uint8_t)(version >> 8),
                   (uint8_t)version};
  MDB_val key = {strlen("schema_version"), "schema_version"}, val = {4, be};
  assert_int_equal(mdb_put(txn, dbi, &key, &val, 0), 0);
  assert_int_equal(mdb_txn_commit(txn), 0);
  mdb_env_close(env);
}

typedef struct fake_migration {
  int runs;
  int fail_with; /* CPH_OK: succeed */
} fake_migration;

/* Writes a marker into "context", then fails or not. */
static int fake_run(void *ctx, uint32_t found, cph_txn *t, cph_err *err) {
  fake_migration *m = ctx;
  assert_int_equal(found, CPH_STORE_SCHEMA_VERSION - 1);
  m->runs++;
  cph_key k = {.len = 0};
  cph_key_str(&k, "marker");
  cph_txn_put(t, CPH_DB_CONTEXT, &k, "x", 1);
  if (m->fail_with)
    return cph_err_set(err, m->fail_with, "the fake migration failed on purpose");
  return t->ret;
}

static bool has_marker(const char *dir) {
  cph_store *s = open_store(dir, 1u << 20);
  cph_txn t;
  assert_int_equal(cph_txn_begin(s, false, &t), CPH_OK);
  cph_key k = {.len = 0};
  cph_key_str(&k, "marker");
  cph_val v;
  bool found = cph_txn_get(&t, CPH_DB_CONTEXT, &k, &v) == CPH_OK;
  cph_txn_abort(&t);
  cph_store_close(s);
  return found;
}

/* The previous schema is migrated at open, in one transaction with the new version: a failed
 * migration changes nothing (the version stays, the next open tries again), a successful one
 * runs once. An older schema stays refused, migration or not. */
static void test_previous_schema_is_migrated_once_and_all_or_nothing(void **state) {
  (void)state;
  char *dir = cph_test_tmpdir("schema-migrate");
  cph_store_close(open_store(dir, 1u << 20));
  set_schema_version(dir, CPH_STORE_SCHEMA_VERSION - 1);
  cph_store_options o = {dir, 1u << 20, CPH_SYNC_ALWAYS};
  cph_store *s = NULL;
  cph_err err = {0};
  assert_int_equal(cph_store_open(&o, &s, &err), CPH_ESCHEMA); /* no migration given */

  fake_migration fm = {0, CPH_EIO};
  cph_store_migration m = {CPH_STORE_SCHEMA_VERSION - 1, fake_run, &fm};
  assert_int_equal(cph_store_open_migrating(&o, &m, &s, &err), CPH_EIO);
  assert_null(s);
  assert_int_equal(fm.runs, 1);
  char expected[1024];
  snprintf(expected, sizeof expected,
           "data dir '%s': migrating storage schema version %u to %u failed, nothing was "
           "changed: the fake migration failed on purpose",
           dir, CPH_STORE_SCHEMA_VERSION - 1, CPH_STORE_SCHEMA_VERSION);
  assert_string_equal(err.msg, expected);
  assert_int_equal(cph_store_open(&o, &s, &err), CPH_ESCHEMA); /* still the old version */

  fm.fail_with = CPH_OK;
  assert_int_equal(cph_store_open_migrating(&o, &m, &s, &err), CPH_OK);
  cph_store_close(s);
  assert_int_equal(fm.runs, 2);
  assert_true(has_marker(dir)); /* opens plainly now: the version was written */
  assert_int_equal(cph_store_open_migrating(&o, &m, &s, &err), CPH_OK);
  cph_store_close(s);
  assert_int_equal(fm.runs, 2); /* nothing more to do */

  set_schema_version(dir, CPH_STORE_SCHEMA_VERSION - 2);
  assert_int_equal(cph_store_open_migrating(&o, &m, &s, &err), CPH_ESCHEMA);
  assert_non_null(strstr(err.msg, "but this build reads version"));
  assert_int_equal(fm.runs, 2);
  cph_test_rmtree(dir);
  free(dir);
}

static void test_second_open_of_a_data_dir_is_refused(void **state) {
  fixture *f = *state;
  cph_store_options o = {f->dir, 1u << 20, CPH_SYNC_ALWAYS};
  cph_store *s2 = NULL;
  cph_err err = {0};
  assert_int_equal(cph_store_open(&o, &s2, &err), CPH_EBUSY);
  assert_non_null(strstr(err.msg, "is in use by another process"));
  char pid[32]; /* it names the holder (this test's process holds the first open) */
  snprintf(pid, sizeof pid, "(pid %ld)", (long)getpid());
  if (!strstr(err.msg, pid))
    fail_msg("\"%s\" does not name the holder, %s", err.msg, pid);
}

static void test_unopenable_data_dir_says_where_and_why(void **state) {
  (void)state;
  char *path = cph_test_write_tmpfile(".notadir", "x");
  cph_store_options o = {path, 1u << 20, CPH_SYNC_ALWAYS};
  cph_store *s = NULL;
  cph_err err = {0};
  assert_int_equal(cph_store_open(&o, &s, &err), CPH_EIO);
  assert_non_null(strstr(err.msg, path));
  assert_non_null(strstr(err.msg, "Not a directory"));
  remove(path);
  free(path);
}

static void test_error_mapping_covers_lmdb_codes(void **state) {
  (void)state;
  assert_int_equal(cph_store_map_error(MDB_MAP_FULL), CPH_EFULL);
  assert_int_equal(cph_store_map_error(MDB_NOTFOUND), CPH_ENOTFOUND);
  assert_int_equal(cph_store_map_error(MDB_CORRUPTED), CPH_ECORRUPT);
  assert_int_equal(cph_store_map_error(MDB_KEYEXIST), CPH_EEXISTS);
  assert_int_equal(cph_store_map_error(MDB_READERS_FULL), CPH_EBUSY);
  assert_int_equal(cph_store_map_error(28 /* ENOSPC */), CPH_EFULL);
  assert_int_equal(cph_store_map_error(0), CPH_OK);
  assert_string_equal(cph_strerror(CPH_ECORRUPT), "corrupt record");
  assert_string_equal(cph_errname(CPH_EFULL), "FULL");
  assert_string_equal(cph_strerror(-9999), "unknown error");
}

static void test_key_description_is_readable(void **state) {
  (void)state;
  char buf[128];
  cph_key k;
  cph_key_reset(&k);
  cph_key_str(&k, "s1");
  cph_key_u64(&k, 42);
  cph_key_describe(k.data, k.len, buf, sizeof buf);
  assert_string_equal(buf, "\"s1\"/42");
  cph_key_describe("\x01\x02", 2, buf, sizeof buf);
  assert_string_equal(buf, "0x0102");
}

/* RssFile of this process, in kB (Linux). */
static long rss_file_kb(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long kb = -1;
  while (f && fgets(line, sizeof line, f))
    if (strncmp(line, "RssFile:", 8) == 0)
      kb = strtol(line + 8, NULL, 10);
  if (f)
    fclose(f);
  return kb;
}

static void test_count_and_last_answer_without_a_scan(void **state) {
  fixture *f = *state;
  cph_txn t;
  assert_int_equal(cph_txn_begin(f->store, true, &t), CPH_OK);
  size_t n = 99;
  assert_int_equal(cph_txn_count(&t, CPH_DB_REPLIES, &n), CPH_OK);
  assert_int_equal(n, 0);
  cph_cursor c;
  cph_val k;
  assert_int_equal(cph_cursor_open(&t, CPH_DB_REPLIES, &c), CPH_OK);
  assert_int_equal(cph_cursor_last(&c, &k, NULL), CPH_ENOTFOUND);
  cph_cursor_close(&c);
  for (uint64_t i = 1; i <= 5000; i++) {
    cph_key key = key_u64(i * 3);
    assert_int_equal(cph_txn_put(&t, CPH_DB_REPLIES, &key, "r", 1), CPH_OK);
  }
  assert_int_equal(cph_txn_count(&t, CPH_DB_REPLIES, &n), CPH_OK); /* its own writes count */
  assert_int_equal(n, 5000);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
  assert_int_equal(cph_txn_begin(f->store, false, &t), CPH_OK);
  assert_int_equal(cph_cursor_open(&t, CPH_DB_REPLIES, &c), CPH_OK);
  assert_int_equal(cph_cursor_last(&c, &k, NULL), CPH_OK);
  assert_int_equal(k.len, 8);
  assert_int_equal(cph_be64_get(k.data), 15000);
  assert_int_equal(cph_cursor_prev(&c, &k, NULL), CPH_OK); /* and it is a position */
  assert_int_equal(cph_be64_get(k.data), 14997);
  cph_cursor_close(&c);
  cph_txn_abort(&t);
}

/* Pages read once leave the process's RSS and come back, intact, when read again — even
 * under a transaction that was open across the release. */
static void test_released_pages_leave_rss_and_read_back_intact(void **state) {
  fixture *f = *state;
  enum { N = 4000, LEN = 1000 }; /* about 4 MB of values */
  char value[LEN];
  cph_txn t;
  assert_int_equal(cph_txn_begin(f->store, true, &t), CPH_OK);
  for (uint64_t i = 0; i < N; i++) {
    memset(value, 'a' + (int)(i % 26), sizeof value);
    cph_key key = key_u64(i);
    assert_int_equal(cph_txn_put(&t, CPH_DB_EVENTS, &key, value, sizeof value), CPH_OK);
  }
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
  assert_int_equal(cph_txn_begin(f->store, false, &t), CPH_OK);
  cph_val v0;
  cph_key k0 = key_u64(7);
  assert_int_equal(cph_txn_get(&t, CPH_DB_EVENTS, &k0, &v0), CPH_OK);
  unsigned sum = 0;
  for (uint64_t i = 0; i < N; i++) {
    cph_val v;
    cph_key key = key_u64(i);
    assert_int_equal(cph_txn_get(&t, CPH_DB_EVENTS, &key, &v), CPH_OK);
    for (size_t j = 0; j < v.len; j += 512)
      sum += ((const unsigned char *)v.data)[j];
  }
  assert_true(sum > 0);
  long before = rss_file_kb();
  assert_int_equal(cph_store_release_pages(f->store), CPH_OK);
  long after = rss_file_kb();
  if (before >= 0) /* /proc is there: at least most of the 4 MB read went */
    assert_true(before - after >= 3000);
  assert_int_equal(v0.len, LEN); /* the open txn's pointer still reads the data */
  assert_int_equal(((const char *)v0.data)[LEN - 1], 'a' + 7);
  cph_txn_abort(&t);
  assert_int_equal(cph_txn_begin(f->store, false, &t), CPH_OK);
  for (uint64_t i = 0; i < N; i += 97) {
    cph_val v;
    cph_key key = key_u64(i);
    assert_int_equal(cph_txn_get(&t, CPH_DB_EVENTS, &key, &v), CPH_OK);
    assert_int_equal(v.len, LEN);
    assert_int_equal(((const char *)v.data)[LEN / 2], 'a' + (int)(i % 26));
  }
  cph_txn_abort(&t);
}

/* A partial decode copies only the fields asked for, checks the rest, and sets scalars. */
static void test_decode_some_copies_only_the_fields_asked_for(void **state) {
  (void)state;
  char *mentions[2] = {"ann", "bob"};
  cph_event_rec ev = {0};
  ev.id = 7;
  ev.channel = "room";
  ev.sender = "ann";
  ev.body = "hello";
  ev.mentions = mentions;
  ev.n_mentions = 2;
  ev.key = "k1";
  ev.ts_ms = 1234;
  cph_buf b = CPH_BUF_INIT;
  assert_int_equal(cph_record_encode(&cph_event_desc, &ev, &b), CPH_OK);
  static const char *const WANT[] = {"sender", "body", "no such field"};
  uint64_t mask = cph_record_field_mask(&cph_event_desc, WANT, 3);
  cph_event_rec got;
  cph_err err = {0};
  assert_int_equal(cph_record_decode_some(&cph_event_desc, b.data, b.len, &got, mask, &err),
                   CPH_OK);
  assert_string_equal(got.sender, "ann");
  assert_string_equal(got.body, "hello");
  assert_null(got.channel);
  assert_null(got.mentions);
  assert_int_equal(got.n_mentions, 0);
  assert_null(got.key);
  assert_int_equal(got.id, 7);      /* scalars always */
  assert_int_equal(got.ts_ms, 1234);
  cph_record_free(&cph_event_desc, &got);
  /* a skipped field is still checked: corrupt it (the channel string's type byte) */
  char *bad = malloc(b.len);
  memcpy(bad, b.data, b.len);
  char *at = NULL;
  for (size_t i = 0; !at && i + 5 <= b.len; i++)
    if (memcmp(bad + i, "\xa4room", 5) == 0)
      at = bad + i;
  assert_non_null(at);
  *at = (char)0xc3; /* true, not a string */
  assert_int_equal(cph_record_decode_some(&cph_event_desc, bad, b.len, &got, mask, &err),
                   CPH_ECORRUPT);
  assert_non_null(strstr(err.msg, "'channel'"));
  free(bad);
  cph_buf_free(&b);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_decode_some_copies_only_the_fields_asked_for),
      cmocka_unit_test(test_session_record_v1_reads_while_running_as_the_class_default),
      cmocka_unit_test(test_reply_record_v1_reads_without_an_origin),
      cmocka_unit_test_setup_teardown(test_session_round_trips_every_field, setup, teardown),
      cmocka_unit_test_setup_teardown(test_count_and_last_answer_without_a_scan, setup, teardown),
      cmocka_unit_test_setup_teardown(test_released_pages_leave_rss_and_read_back_intact, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_event_round_trips_with_redacted_body, setup, teardown),
      cmocka_unit_test_setup_teardown(test_inbox_turn_reply_round_trip, setup, teardown),
      cmocka_unit_test_setup_teardown(test_memory_job_outbox_gc_aggregate_round_trip, setup,
                                      teardown),
      cmocka_unit_test(test_truncated_and_flipped_bytes_never_crash),
      cmocka_unit_test(test_garbage_values_give_specific_errors),
      cmocka_unit_test_setup_teardown(test_corrupt_value_in_store_names_database_and_key, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_append_places_any_key_and_is_never_an_error, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_missing_key_is_notfound_and_not_sticky, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_sticky_error_discards_the_whole_transaction, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_counters_are_monotonic_and_persist, setup, teardown),
      cmocka_unit_test_setup_teardown(test_counters_in_memory_follow_nested_txns_and_survive_reopen,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_counters_beyond_the_cache_reload_without_reuse, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_cursor_walks_composite_keys_in_order, setup, teardown),
      cmocka_unit_test(test_tiny_map_fills_up_cleanly_and_reopens_intact),
      cmocka_unit_test(test_full_child_txn_leaves_parent_usable),
      cmocka_unit_test(test_full_child_of_a_clean_parent_leaves_it_usable),
      cmocka_unit_test_setup_teardown(test_child_of_a_clean_parent_aborts_only_its_own_writes,
                                      setup, teardown),
      cmocka_unit_test_setup_teardown(test_parent_with_a_cursor_open_gets_a_real_child, setup,
                                      teardown),
      cmocka_unit_test_setup_teardown(test_parent_refuses_calls_while_its_child_is_open, setup,
                                      teardown),
      cmocka_unit_test(test_schema_version_mismatch_refuses_to_open),
      cmocka_unit_test(test_previous_schema_is_migrated_once_and_all_or_nothing),
      cmocka_unit_test_setup_teardown(test_second_open_of_a_data_dir_is_refused, setup, teardown),
      cmocka_unit_test(test_unopenable_data_dir_says_where_and_why),
      cmocka_unit_test(test_error_mapping_covers_lmdb_codes),
      cmocka_unit_test(test_key_description_is_readable),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
