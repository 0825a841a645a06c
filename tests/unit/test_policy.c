/* Tests for the policy schema, loader and printer (include/cephalon/policy.h).
 *
 * Documents are loaded from exact-size heap copies without a trailing NUL, so
 * AddressSanitizer proves the loader never reads past len. Every expected error message and
 * every expected value is written here by hand (columns counted in the comments), never
 * produced by the code under test. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/error.h"
#include "cephalon/policy.h"
#include "common/buf.h"
#include "lanes/sched.h"
#include "policy/edn.h"

/* DESIGN §8, verbatim. */
static const char seed_policy[] =
    "{:scheduler {:concurrency 4\n"
    "             :lanes {:interactive {:turns 60 :tool-calls 120}\n"
    "                     :operational {:turns 30 :tool-calls 60}\n"
    "                     :maintenance {:turns 10 :tool-calls 20}}\n"
    "             :credits {:refill-per-second 1.0 :max 30\n"
    "                       :cost {:interactive 2 :operational 1 :maintenance 1}}}\n"
    " :maintenance {:outbox {:min-batches-per-minute 1 :batch-size 50}\n"
    "               :embeddings {:max-queue 5000 :pause-on-backpressure? true}\n"
    "               :retention {:events {:payload-keep-days 14 :metadata-keep-days 180}}}\n"
    " :backpressure {:channels {\"367156652140658699\" {:max-events-per-minute 600\n"
    "                                                 :degrade-to-aggregate-only? true}}}}\n";

#define SHA_CHANGE_ME "e2186dbdb1bb4193608605e84f33208765b5693b55edd4f730a719a100eeea6f"

/* ---- helpers ---------------------------------------------------------------------------- */

/* Loads doc from a heap copy of exactly strlen(doc) bytes. */
static int load_exact(const char *name, const char *doc, cph_policy **out, cph_err *err) {
  size_t len = strlen(doc);
  char *copy = malloc(len ? len : 1);
  assert_non_null(copy);
  memcpy(copy, doc, len);
  int rc = cph_policy_load_text(name, copy, len, out, err);
  free(copy);
  return rc;
}

static cph_policy *must_load(const char *doc) {
  cph_policy *p = NULL;
  cph_err err = {0};
  int rc = load_exact("test.edn", doc, &p, &err);
  if (rc != CPH_OK)
    fail_msg("load failed (%d): %s", rc, err.msg);
  assert_non_null(p);
  return p;
}

/* The load must fail with CPH_EPOLICY and exactly this message. */
static void expect_error(const char *doc, const char *message) {
  cph_policy *p = (cph_policy *)1;
  cph_err err = {0};
  int rc = load_exact("p.edn", doc, &p, &err);
  assert_null(p);
  assert_int_equal(rc, CPH_EPOLICY);
  assert_int_equal(err.code, CPH_EPOLICY);
  assert_string_equal(err.msg, message);
}

static char *read_file(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f)
    fail_msg("cannot open %s", path);
  cph_buf b = CPH_BUF_INIT;
  char chunk[4096];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, f)) > 0)
    cph_buf_append(&b, chunk, n);
  fclose(f);
  char *s = cph_buf_steal(&b);
  assert_non_null(s);
  return s;
}

static char *example_path(void) {
  const char *dir = getenv("CPH_SOURCE_DIR");
  if (!dir)
    fail_msg("CPH_SOURCE_DIR is not set");
  static const char name[] = "/cephalon.policy.edn.example";
  char *path = malloc(strlen(dir) + sizeof name);
  assert_non_null(path);
  strcpy(path, dir);
  strcat(path, name);
  return path;
}

static char *write_policy(const cph_policy *p) {
  cph_buf b = CPH_BUF_INIT;
  cph_policy_write_edn(p, &b);
  assert_int_equal(cph_buf_error(&b), CPH_OK);
  char *s = cph_buf_steal(&b);
  assert_non_null(s);
  return s;
}

static cph_edn *parse_edn(const char *text) {
  cph_edn *v = NULL;
  cph_edn_error e;
  if (cph_edn_parse(text, strlen(text), NULL, &v, &e) != CPH_OK)
    fail_msg("EDN parse failed at %u:%u: %s", e.line, e.column, e.message);
  return v;
}

/* Every keyword key of `want` (recursively, through maps and the first element of vectors)
 * is present at the same path in `have`. */
static void assert_keys_present(const cph_edn *want, const cph_edn *have, const char *path) {
  if (want->type == CPH_EDN_VECTOR && have->type == CPH_EDN_VECTOR && want->u.coll.count &&
      have->u.coll.count) {
    assert_keys_present(&want->u.coll.items[0], &have->u.coll.items[0], path);
    return;
  }
  if (want->type != CPH_EDN_MAP)
    return;
  if (have->type != CPH_EDN_MAP)
    fail_msg("%s is not a map in the example", path);
  for (size_t i = 0; i < want->u.coll.count; i++) {
    const cph_edn *k = &want->u.coll.items[2 * i];
    if (k->type != CPH_EDN_KEYWORD)
      continue; /* channel ids: the defaults have none */
    char sub[512];
    snprintf(sub, sizeof sub, "%s :%s", path, k->u.str.ptr);
    const cph_edn *hv = cph_edn_map_get_keyword(have, k->u.str.ptr);
    if (!hv)
      fail_msg("key%s is missing from the example", sub);
    assert_keys_present(&want->u.coll.items[2 * i + 1], hv, sub);
  }
}

/* Every default of the keys the seed policy does not set (values from the schema brief). */
static void assert_non_seed_defaults(const cph_policy *p) {
  assert_string_equal(p->server.listen, "127.0.0.1:7070");
  assert_string_equal(p->server.data_dir, "var");
  assert_int_equal(p->server.map_size_mb, 1024);
  assert_int_equal(p->server.max_body_bytes, 8388608);
  assert_int_equal(p->server.max_events_per_request, 1000);
  assert_int_equal(p->server.max_string_bytes, 65536);
  assert_int_equal(p->server.max_long_polls_per_client, 64);
  assert_int_equal(p->server.max_wait_ms, 30000);
  assert_int_equal(p->server.timeout_seconds, 60);
  assert_int_equal(p->server.header_timeout_seconds, 10);
  assert_int_equal(p->server.body_timeout_seconds, 30);
  assert_int_equal(p->server.log_level, CPH_POLICY_LOG_INFO);
  assert_false(p->auth_enabled);
  assert_null(p->auth.tokens);
  assert_int_equal(p->auth.token_count, 0);
  assert_int_equal(p->store.sync, CPH_POLICY_SYNC_ALWAYS);
  assert_int_equal(p->store.sync_interval_ms, 100);
  assert_int_equal(p->scheduler.tick_ms, 5);
  assert_int_equal(p->leases.ttl_seconds, 30);
  assert_int_equal(p->leases.max_attempts, 5);
  assert_int_equal(p->sessions.max_queue, 1000);
  assert_int_equal(p->sessions.max_batch, 64);
  assert_int_equal(p->sessions.context_window_tokens, 8192);
  assert_true(p->sessions.janitor);
  assert_int_equal(p->dedupe.window_seconds, 300);
  assert_int_equal(p->dedupe.key_window_seconds, 86400);
  assert_int_equal(p->dedupe.min_length, 12);
  assert_int_equal(p->dedupe.near_distance, 10);
  assert_int_equal(p->dedupe.shingle_words, 1);
  assert_null(p->dedupe.bulk);
  assert_int_equal(p->dedupe.bulk_count, 0);
  assert_true(p->gc.min_age_hours == 24.0);
  assert_int_equal(p->gc.max_access, 1);
  assert_int_equal(p->gc.group_max_tokens, 2000);
  assert_int_equal(p->gc.plan_interval_s, 3600);
  assert_int_equal(p->gc.max_groups_per_plan, 100);
  assert_int_equal(p->maintenance.workers, 1);
  assert_int_equal(p->maintenance.outbox.backoff_base_ms, 1000);
  assert_int_equal(p->maintenance.outbox.backoff_max_ms, 300000);
  assert_int_equal(p->maintenance.outbox.drain_interval_s, 10);
  assert_int_equal(p->maintenance.embeddings.batch_size, 32);
  assert_int_equal(p->maintenance.retention.channel_count, 0);
  assert_int_equal(p->maintenance.retention.interval_s, 3600);
  assert_int_equal(p->backpressure.interval_s, 10);
  assert_int_equal(p->backpressure.recover_intervals, 3);
  assert_int_equal(p->backpressure.report_delay_factor, 4);
  assert_null(p->backpressure.defaults.channel);
  assert_int_equal(p->backpressure.defaults.max_events_per_minute, 0);
  assert_int_equal(p->backpressure.defaults.max_family_growth_per_minute, 0);
  assert_false(p->backpressure.defaults.degrade_to_aggregate_only);
  assert_int_equal(p->backpressure.defaults.max_step, 5);
  assert_int_equal(p->providers.embeddings.kind, CPH_POLICY_PROVIDER_BUILTIN);
  assert_string_equal(p->providers.embeddings.url, "");
  assert_string_equal(p->providers.embeddings.model, "builtin-hash-256");
  assert_string_equal(p->providers.embeddings.api_key_env, "");
  assert_int_equal(p->providers.embeddings.dimensions, 256);
  assert_int_equal(p->providers.embeddings.timeout_ms, 10000);
  assert_int_equal(p->providers.summarizer.kind, CPH_POLICY_PROVIDER_BUILTIN);
  assert_string_equal(p->providers.summarizer.url, "");
  assert_string_equal(p->providers.summarizer.model, "builtin-extractive");
  assert_string_equal(p->providers.summarizer.api_key_env, "");
  assert_int_equal(p->providers.summarizer.timeout_ms, 30000);
  assert_int_equal(p->providers.summarizer.max_tokens, 256);
  assert_int_equal(p->vector_index.kind, CPH_POLICY_INDEX_EMBEDDED);
  assert_string_equal(p->vector_index.url, "");
  assert_int_equal(p->vector_index.shards, 1);
  assert_int_equal(p->vector_index.timeout_ms, 5000);
  assert_true(p->metrics.enabled);
  assert_int_equal(p->metrics.top_families, 10);
}

/* The seed's numbers (which are also the defaults of those keys). */
static void assert_seed_numbers(const cph_policy *p) {
  assert_int_equal(p->scheduler.concurrency, 4);
  assert_int_equal(p->scheduler.lanes[CPH_LANE_INTERACTIVE].turns, 60);
  assert_int_equal(p->scheduler.lanes[CPH_LANE_OPERATIONAL].turns, 30);
  assert_int_equal(p->scheduler.lanes[CPH_LANE_MAINTENANCE].turns, 10);
  assert_int_equal(p->scheduler.lanes[CPH_LANE_INTERACTIVE].tool_calls, 120);
  assert_int_equal(p->scheduler.lanes[CPH_LANE_OPERATIONAL].tool_calls, 60);
  assert_int_equal(p->scheduler.lanes[CPH_LANE_MAINTENANCE].tool_calls, 20);
  assert_true(p->scheduler.credits.refill_per_second == 1.0);
  assert_true(p->scheduler.credits.max == 30.0);
  assert_true(p->scheduler.credits.min == -30.0);
  assert_true(p->scheduler.credits.cost[CPH_LANE_INTERACTIVE] == 2.0);
  assert_true(p->scheduler.credits.cost[CPH_LANE_OPERATIONAL] == 1.0);
  assert_true(p->scheduler.credits.cost[CPH_LANE_MAINTENANCE] == 1.0);
  assert_int_equal(p->maintenance.outbox.min_batches_per_minute, 1);
  assert_int_equal(p->maintenance.outbox.batch_size, 50);
  assert_int_equal(p->maintenance.embeddings.max_queue, 5000);
  assert_true(p->maintenance.embeddings.pause_on_backpressure);
  assert_int_equal(p->maintenance.retention.events.payload_keep_days, 14);
  assert_int_equal(p->maintenance.retention.events.metadata_keep_days, 180);
}

/* The seed's single channel override, merged over the defaults. */
static void assert_seed_channel(const cph_policy *p) {
  assert_int_equal(p->backpressure.channel_count, 1);
  const cph_policy_channel *c = &p->backpressure.channels[0];
  assert_string_equal(c->channel, "367156652140658699");
  assert_int_equal(c->max_events_per_minute, 600);
  assert_true(c->degrade_to_aggregate_only);
  assert_int_equal(c->max_family_growth_per_minute, 0);
  assert_int_equal(c->max_step, 5);
  assert_ptr_equal(cph_policy_backpressure_for(p, "367156652140658699"), c);
}

/* ---- loading good policies ---------------------------------------------------------------- */

static void test_seed_policy_loads_with_every_number(void **state) {
  (void)state;
  cph_policy *p = must_load(seed_policy);
  assert_string_equal(p->source, "test.edn");
  assert_seed_numbers(p);
  assert_seed_channel(p);
  assert_non_seed_defaults(p);
  cph_policy_free(p);
}

static void test_defaults_hold_every_documented_value(void **state) {
  (void)state;
  cph_policy *p = cph_policy_new_default();
  assert_non_null(p);
  assert_seed_numbers(p); /* the seed's values are also the defaults */
  assert_int_equal(p->backpressure.channel_count, 0);
  assert_non_seed_defaults(p);
  /* the schema's default is the scheduler's (policy/ may not include lanes/) */
  assert_int_equal(p->scheduler.tenant_run_max, CPH_SCHED_TENANT_RUN_DEFAULT);
  cph_policy *empty = must_load("{}");
  assert_true(cph_policy_equal(p, empty));
  cph_policy_free(empty);
  cph_policy_free(p);
}

static void test_example_file_loads_to_the_seed_plus_defaults(void **state) {
  (void)state;
  char *path = example_path();
  cph_policy *p = NULL;
  cph_err err = {0};
  int rc = cph_policy_load_file(path, &p, &err);
  if (rc != CPH_OK)
    fail_msg("example does not load: %s", err.msg);
  assert_string_equal(p->source, path);
  assert_seed_numbers(p);
  assert_seed_channel(p);
  assert_non_seed_defaults(p);
  cph_policy *seed = must_load(seed_policy);
  assert_true(cph_policy_equal(p, seed));
  cph_policy_free(seed);
  cph_policy_free(p);
  free(path);
}

/* A line without its trailing comment, spaces and closing brackets. */
static size_t line_core(const char *line, size_t len) {
  const char *semi = memchr(line, ';', len);
  if (semi)
    len = (size_t)(semi - line);
  while (len > 0 && (line[len - 1] == ' ' || line[len - 1] == '}'))
    len--;
  return len;
}

/* The commented-out section of the example that starts at marker (";; :auth {"), its ";;"
 * removed, as a policy map text in *block. */
static void uncomment_block(const char *example, const char *marker, cph_buf *block) {
  const char *start = strstr(example, marker);
  assert_non_null(start);
  while (start > example && start[-1] != '\n')
    start--;
  cph_buf_putc(block, '{');
  int depth = 0;
  bool opened = false;
  for (const char *line = start; *line && !(opened && depth == 0);) {
    const char *nl = strchr(line, '\n');
    size_t len = nl ? (size_t)(nl - line) : strlen(line);
    const char *mark = strstr(line, ";;");
    assert_true(mark && mark < line + len);
    cph_buf_append(block, line, (size_t)(mark - line));
    cph_buf_puts(block, "  ");
    const char *code = mark + 2;
    for (const char *c = code; c < line + len && *c != ';'; c++) {
      if (*c == '{' || *c == '[')
        depth++, opened = true;
      else if (*c == '}' || *c == ']')
        depth--;
    }
    cph_buf_append(block, code, (size_t)(line + len - code));
    cph_buf_putc(block, '\n');
    line = nl ? nl + 1 : line + len;
  }
  cph_buf_putc(block, '}');
  assert_int_equal(cph_buf_error(block), CPH_OK);
}

/* The example is the seed plus additions: every seed line (bar closing brackets that had to
 * move down) is a line of the example, in order, and the seed text is a subsequence. */
static void test_example_keeps_the_seed_lines(void **state) {
  (void)state;
  char *path = example_path();
  char *example = read_file(path);
  const char *e = example;
  for (const char *s = seed_policy; *s; s++) {
    e = strchr(e, *s);
    if (!e)
      fail_msg("seed character %ld is missing from the example", (long)(s - seed_policy));
    e++;
  }
  const char *cursor = example;
  for (const char *line = seed_policy; *line;) {
    const char *nl = strchr(line, '\n');
    size_t want = line_core(line, (size_t)(nl - line));
    bool found = false;
    while (*cursor && !found) {
      const char *enl = strchr(cursor, '\n');
      size_t elen = enl ? (size_t)(enl - cursor) : strlen(cursor);
      found = line_core(cursor, elen) == want && memcmp(cursor, line, want) == 0;
      cursor += elen + (enl != NULL);
    }
    if (!found)
      fail_msg("seed line <%.*s> not found (in order) in the example", (int)want, line);
    line = nl + 1;
  }
  free(example);
  free(path);
}

/* Walks the defaults as printed (one key per schema entry) against the example's EDN. */
static void test_every_schema_key_is_in_the_example(void **state) {
  (void)state;
  char *path = example_path();
  char *example = read_file(path);
  cph_edn *have = parse_edn(example);

  cph_policy *defaults = cph_policy_new_default();
  assert_non_null(defaults);
  char *printed = write_policy(defaults);
  cph_edn *want = parse_edn(printed);
  assert_keys_present(want, have, "");

  /* :auth is absent by default, so the example shows it commented out; that block, with
   * its ";;" removed, must load and hold every :auth key. */
  cph_buf block = CPH_BUF_INIT;
  uncomment_block(example, ";; :auth {", &block);

  cph_policy *with_auth = must_load(block.data);
  assert_true(with_auth->auth_enabled);
  assert_int_equal(with_auth->auth.token_count, 1);
  assert_string_equal(with_auth->auth.tokens[0].name, "connector");
  assert_string_equal(with_auth->auth.tokens[0].sha256, SHA_CHANGE_ME);
  assert_int_equal(with_auth->auth.tokens[0].scopes,
                   CPH_POLICY_SCOPE_INGEST | CPH_POLICY_SCOPE_READ);
  char *printed_auth = write_policy(with_auth);
  cph_edn *want_auth = parse_edn(printed_auth);
  cph_edn *have_auth = parse_edn(block.data);
  assert_non_null(cph_edn_map_get_keyword(want_auth, "auth"));
  assert_keys_present(cph_edn_map_get_keyword(want_auth, "auth"),
                      cph_edn_map_get_keyword(have_auth, "auth"), " :auth");

  cph_edn_free(have_auth);
  cph_edn_free(want_auth);
  free(printed_auth);
  cph_policy_free(with_auth);
  cph_buf_free(&block);

  /* :cluster likewise: absent by default, shown commented out with every key. */
  cph_buf cblock = CPH_BUF_INIT;
  uncomment_block(example, ";; :cluster {", &cblock);
  cph_policy *with_cluster = must_load(cblock.data);
  assert_true(with_cluster->cluster_enabled);
  assert_string_equal(with_cluster->cluster.node, "a");
  assert_int_equal(with_cluster->cluster.etcd_count, 1);
  assert_int_equal(with_cluster->cluster.shards, 256);
  assert_int_equal(with_cluster->cluster.replicas, 3);
  assert_int_equal(with_cluster->cluster.lease_ttl_seconds, 5);
  assert_int_equal(with_cluster->cluster.log_dedupe_seconds, 0); /* the key window */
  assert_int_equal(with_cluster->cluster.log_trim_seconds, 10); /* trimming on */
  char *printed_cluster = write_policy(with_cluster);
  cph_edn *want_cluster = parse_edn(printed_cluster);
  cph_edn *have_cluster = parse_edn(cblock.data);
  assert_non_null(cph_edn_map_get_keyword(want_cluster, "cluster"));
  assert_keys_present(cph_edn_map_get_keyword(want_cluster, "cluster"),
                      cph_edn_map_get_keyword(have_cluster, "cluster"), " :cluster");
  cph_policy *reread = must_load(printed_cluster);
  assert_true(cph_policy_equal(reread, with_cluster));
  cph_policy_free(reread);
  cph_edn_free(have_cluster);
  cph_edn_free(want_cluster);
  free(printed_cluster);
  cph_policy_free(with_cluster);
  cph_buf_free(&cblock);
  cph_edn_free(want);
  free(printed);
  cph_policy_free(defaults);
  cph_edn_free(have);
  free(example);
  free(path);
}

static void test_credits_min_defaults_to_minus_max(void **state) {
  (void)state;
  cph_policy *p = must_load("{:scheduler {:credits {:max 50}}}");
  assert_true(p->scheduler.credits.max == 50.0);
  assert_true(p->scheduler.credits.min == -50.0);
  cph_policy_free(p);
  p = must_load("{:scheduler {:credits {:min 0 :max 12.5}}}");
  assert_true(p->scheduler.credits.max == 12.5);
  assert_true(p->scheduler.credits.min == 0.0);
  cph_policy_free(p);
}

static void test_numbers_take_integers_and_floats(void **state) {
  (void)state;
  cph_policy *p = must_load("{:gc {:min-age-hours 0.5} :scheduler {:credits {:refill-per-second 3}}}");
  assert_true(p->gc.min_age_hours == 0.5);
  assert_true(p->scheduler.credits.refill_per_second == 3.0);
  cph_policy_free(p);
}

static void test_keyword_choices_and_scopes(void **state) {
  (void)state;
  cph_policy *p = must_load(
      "{:server {:log-level :debug :listen \"[::1]:0\"}\n"
      " :store {:sync :batch}\n"
      " :vector-index {:kind :http :url \"http://index:9000\"}\n"
      " :providers {:embeddings {:kind :openai :url \"http://emb\" :api-key-env \"EMB_KEY\"}}\n"
      " :auth {:tokens [{:name \"w\" :sha256 \"" SHA_CHANGE_ME "\" :scopes [:worker :admin]}\n"
      "                 {:name \"r\" :sha256 \"" SHA_CHANGE_ME "\" :scopes #{:read}}]}}");
  assert_int_equal(p->server.log_level, CPH_POLICY_LOG_DEBUG);
  assert_string_equal(p->server.listen, "[::1]:0");
  assert_int_equal(p->store.sync, CPH_POLICY_SYNC_BATCH);
  assert_int_equal(p->vector_index.kind, CPH_POLICY_INDEX_HTTP);
  assert_string_equal(p->vector_index.url, "http://index:9000");
  assert_int_equal(p->providers.embeddings.kind, CPH_POLICY_PROVIDER_OPENAI);
  assert_string_equal(p->providers.embeddings.api_key_env, "EMB_KEY");
  assert_true(p->auth_enabled);
  assert_int_equal(p->auth.token_count, 2);
  assert_string_equal(p->auth.tokens[0].name, "w");
  assert_int_equal(p->auth.tokens[0].scopes, CPH_POLICY_SCOPE_WORKER | CPH_POLICY_SCOPE_ADMIN);
  assert_string_equal(p->auth.tokens[1].name, "r");
  assert_int_equal(p->auth.tokens[1].scopes, CPH_POLICY_SCOPE_READ);
  assert_string_equal(cph_policy_sync_name(p->store.sync), "batch");
  assert_string_equal(cph_policy_log_level_name(p->server.log_level), "debug");
  assert_string_equal(cph_policy_provider_kind_name(p->providers.embeddings.kind), "openai");
  assert_string_equal(cph_policy_index_kind_name(p->vector_index.kind), "http");
  cph_policy_free(p);
}

/* ---- string lists (:dedupe :bulk) and :backpressure :report-delay-factor ----------------- */

static void test_bulk_reads_a_vector_keeping_first_seen_order(void **state) {
  (void)state;
  cph_policy *p =
      must_load("{:dedupe {:bulk [\"nagios\" \"alerts\" \"nagios\" \"bot-7\" \"alerts\"]}\n"
                " :backpressure {:report-delay-factor 12}}");
  assert_int_equal(p->dedupe.bulk_count, 3);
  assert_string_equal(p->dedupe.bulk[0], "nagios");
  assert_string_equal(p->dedupe.bulk[1], "alerts");
  assert_string_equal(p->dedupe.bulk[2], "bot-7");
  assert_int_equal(p->backpressure.report_delay_factor, 12);
  /* The rest of :dedupe keeps its defaults. */
  assert_int_equal(p->dedupe.window_seconds, 300);
  cph_policy_free(p);

  p = must_load("{:dedupe {:bulk []} :backpressure {:report-delay-factor 1}}");
  assert_int_equal(p->dedupe.bulk_count, 0);
  assert_null(p->dedupe.bulk);
  assert_int_equal(p->backpressure.report_delay_factor, 1);
  cph_policy *d = cph_policy_new_default();
  d->backpressure.report_delay_factor = 1;
  assert_true(cph_policy_equal(p, d));
  cph_policy_free(d);
  cph_policy_free(p);

  /* Bounds: 1 and 256 bytes, 1000. */
  char doc[400];
  snprintf(doc, sizeof doc,
           "{:dedupe {:bulk [\"x\" \"%0256d\"]} :backpressure {:report-delay-factor 1000}}", 0);
  p = must_load(doc);
  assert_int_equal(p->dedupe.bulk_count, 2);
  assert_string_equal(p->dedupe.bulk[0], "x");
  assert_int_equal(strlen(p->dedupe.bulk[1]), 256);
  assert_int_equal(p->backpressure.report_delay_factor, 1000);
  cph_policy_free(p);
}

static void test_bulk_reads_a_set(void **state) {
  (void)state;
  cph_policy *p = must_load("{:dedupe {:bulk #{\"feed\" \"Alerts\" \"é\"}}}");
  assert_int_equal(p->dedupe.bulk_count, 3);
  /* A set has no order in EDN; the stored order is the order written. */
  assert_string_equal(p->dedupe.bulk[0], "feed");
  assert_string_equal(p->dedupe.bulk[1], "Alerts");
  assert_string_equal(p->dedupe.bulk[2], "é");
  cph_policy_free(p);
}

static void test_dedupe_is_bulk_matches_channel_or_sender_exactly(void **state) {
  (void)state;
  cph_policy *p = must_load("{:dedupe {:bulk [\"alerts\" \"nagios\"]}}");
  assert_true(cph_policy_dedupe_is_bulk(p, "alerts", "alice"));
  assert_true(cph_policy_dedupe_is_bulk(p, "general", "nagios"));
  assert_true(cph_policy_dedupe_is_bulk(p, "alerts", "nagios"));
  assert_true(cph_policy_dedupe_is_bulk(p, NULL, "nagios"));
  assert_true(cph_policy_dedupe_is_bulk(p, "alerts", NULL));
  assert_false(cph_policy_dedupe_is_bulk(p, "general", "alice"));
  assert_false(cph_policy_dedupe_is_bulk(p, "Alerts", "NAGIOS")); /* case-sensitive */
  assert_false(cph_policy_dedupe_is_bulk(p, "alert", "nagios2")); /* whole names only */
  assert_false(cph_policy_dedupe_is_bulk(p, "", ""));
  assert_false(cph_policy_dedupe_is_bulk(p, NULL, NULL));
  cph_policy_free(p);
  cph_policy *d = cph_policy_new_default();
  assert_false(cph_policy_dedupe_is_bulk(d, "alerts", "nagios"));
  cph_policy_free(d);
}

static void test_bulk_element_errors_name_the_index(void **state) {
  (void)state;
  /* The DESIGN §8 shape: line 4 is 4 spaces, :bulk 5-9, [ 11, "a" 12-14, "b" 16-18,
   * :foo at 20 (index 2). */
  cph_policy *p = (cph_policy *)1;
  cph_err err = {0};
  static const char doc[] = "{:server {:log-level :info}\n"
                            " :store {:sync :always}\n"
                            " :dedupe {:min-length 12\n"
                            "    :bulk [\"a\" \"b\" :foo]}}";
  assert_int_equal(load_exact("policy.edn", doc, &p, &err), CPH_EPOLICY);
  assert_null(p);
  assert_string_equal(err.msg, "policy.edn:4:20: :dedupe :bulk 2: expected a string, got :foo");

  /* { 1, :dedupe 2-8, { 10, :bulk 11-15, #{ 17-18, 42 at 19 */
  expect_error("{:dedupe {:bulk #{42}}}",
               "p.edn:1:19: :dedupe :bulk 0: expected a string, got 42");
  /* [ 17, "a" 18-20, "" at 22 */
  expect_error("{:dedupe {:bulk [\"a\" \"\"]}}",
               "p.edn:1:22: :dedupe :bulk 1: expected a string of 1 to 256 bytes, got \"\"");
  /* [ 17, the 257-byte string at 18, shown cut after 40 bytes */
  char doc257[400];
  snprintf(doc257, sizeof doc257, "{:dedupe {:bulk [\"%0257d\"]}}", 0);
  expect_error(doc257, "p.edn:1:18: :dedupe :bulk 0: expected a string of 1 to 256 bytes, got "
                       "\"000000000000000000000000000000000000000...");
  /* [ 17, "a\u0000b" at 18 */
  expect_error("{:dedupe {:bulk [\"a\\u0000b\"]}}",
               "p.edn:1:18: :dedupe :bulk 0: expected a string without NUL characters, got "
               "\"a\\u0000b\"");
  /* Not a collection: "alerts" at 17; a map at 17. */
  expect_error("{:dedupe {:bulk \"alerts\"}}",
               "p.edn:1:17: :dedupe :bulk: expected a set or vector of strings, got \"alerts\"");
  expect_error("{:dedupe {:bulk (\"alerts\")}}",
               "p.edn:1:17: :dedupe :bulk: expected a set or vector of strings, got (\"alerts\")");
  /* A repeat in a set is an error (EDN forbids it); #{ 17-18, "a" 19-21, "b" 23-25,
   * "a" at 27 */
  expect_error("{:dedupe {:bulk #{\"a\" \"b\" \"a\"}}}",
               "p.edn:1:27: :dedupe :bulk 2: duplicate set element, first given at line 1 "
               "column 19");
  /* Source order decides which problem is reported: the bad element at 23 comes before the
   * repeat at 26... */
  expect_error("{:dedupe {:bulk #{\"a\" 1 \"a\"}}}",
               "p.edn:1:23: :dedupe :bulk 1: expected a string, got 1");
  /* ...and the repeat at 23 before the bad element at 27. */
  expect_error("{:dedupe {:bulk #{\"a\" \"a\" 1}}}",
               "p.edn:1:23: :dedupe :bulk 1: duplicate set element, first given at line 1 "
               "column 19");
  /* A typo gets a did-you-mean. { 10, :bulks at 11 */
  expect_error("{:dedupe {:bulks []}}",
               "p.edn:1:11: :dedupe :bulks: unknown key, did you mean :bulk?");
}

static void test_report_delay_factor_range(void **state) {
  (void)state;
  /* { 1, :backpressure 2-14, { 16, :report-delay-factor 17-36, value at 38 */
  expect_error("{:backpressure {:report-delay-factor 0}}",
               "p.edn:1:38: :backpressure :report-delay-factor: expected an integer from 1 to "
               "1000, got 0");
  expect_error("{:backpressure {:report-delay-factor 1001}}",
               "p.edn:1:38: :backpressure :report-delay-factor: expected an integer from 1 to "
               "1000, got 1001");
  expect_error("{:backpressure {:report-delay-factor 2.5}}",
               "p.edn:1:38: :backpressure :report-delay-factor: expected a positive integer, got "
               "2.5");
  /* Top level of :backpressure only, not per channel (whatever the did-you-mean guesses).
   * { 16, :defaults 17-25, { 27, :report-delay-factor at 28 */
  static const char unknown[] = "p.edn:1:28: :backpressure :defaults :report-delay-factor: "
                                "unknown key";
  cph_policy *p = (cph_policy *)1;
  cph_err err = {0};
  assert_int_equal(load_exact("p.edn", "{:backpressure {:defaults {:report-delay-factor 2}}}", &p,
                              &err),
                   CPH_EPOLICY);
  assert_null(p);
  assert_memory_equal(err.msg, unknown, sizeof unknown - 1);
}

/* A reload compares the new policy with the old one: a change in :bulk must show. */
static void test_equal_sees_a_change_in_bulk(void **state) {
  (void)state;
  cph_policy *a = must_load("{:dedupe {:bulk [\"alerts\" \"nagios\"]}}");
  cph_policy *same_set = must_load("{:dedupe {:bulk #{\"alerts\" \"nagios\"}}}");
  cph_policy *repeated = must_load("{:dedupe {:bulk [\"alerts\" \"nagios\" \"alerts\"]}}");
  cph_policy *added = must_load("{:dedupe {:bulk [\"alerts\" \"nagios\" \"rss\"]}}");
  cph_policy *removed = must_load("{:dedupe {:bulk [\"alerts\"]}}");
  cph_policy *renamed = must_load("{:dedupe {:bulk [\"alerts\" \"Nagios\"]}}");
  cph_policy *none = must_load("{}");
  cph_policy *factor = must_load("{:dedupe {:bulk [\"alerts\" \"nagios\"]}\n"
                                 " :backpressure {:report-delay-factor 5}}");
  assert_true(cph_policy_equal(a, same_set));
  assert_true(cph_policy_equal(a, repeated));
  assert_false(cph_policy_equal(a, added));
  assert_false(cph_policy_equal(added, a));
  assert_false(cph_policy_equal(a, removed));
  assert_false(cph_policy_equal(a, renamed));
  assert_false(cph_policy_equal(a, none));
  assert_false(cph_policy_equal(none, a));
  assert_false(cph_policy_equal(a, factor));
  cph_policy_free(factor);
  cph_policy_free(none);
  cph_policy_free(renamed);
  cph_policy_free(removed);
  cph_policy_free(added);
  cph_policy_free(repeated);
  cph_policy_free(same_set);
  cph_policy_free(a);
}

/* ---- per-channel settings ------------------------------------------------------------------ */

static void test_channel_settings_merge_over_defaults(void **state) {
  (void)state;
  /* :channels comes before :defaults on purpose: entries still start from the defaults. */
  cph_policy *p = must_load(
      "{:backpressure {:channels {\"b\" {:max-step 1}\n"
      "                           \"a\" {:degrade-to-aggregate-only? true}}\n"
      "                :defaults {:max-events-per-minute 100 :max-step 3}}\n"
      " :maintenance {:retention {:channels {\"a\" {:payload-keep-days 2}}\n"
      "                           :events {:payload-keep-days 5 :metadata-keep-days 30}}}}");
  const cph_policy_channel *a = cph_policy_backpressure_for(p, "a");
  const cph_policy_channel *b = cph_policy_backpressure_for(p, "b");
  const cph_policy_channel *other = cph_policy_backpressure_for(p, "zzz");
  assert_string_equal(a->channel, "a");
  assert_int_equal(a->max_events_per_minute, 100);
  assert_int_equal(a->max_family_growth_per_minute, 0);
  assert_true(a->degrade_to_aggregate_only);
  assert_int_equal(a->max_step, 3);
  assert_string_equal(b->channel, "b");
  assert_int_equal(b->max_events_per_minute, 100);
  assert_false(b->degrade_to_aggregate_only);
  assert_int_equal(b->max_step, 1);
  assert_ptr_equal(other, &p->backpressure.defaults);
  assert_ptr_equal(cph_policy_backpressure_for(p, NULL), &p->backpressure.defaults);
  assert_int_equal(other->max_events_per_minute, 100);
  assert_int_equal(other->max_step, 3);
  /* Stored sorted by id. */
  assert_string_equal(p->backpressure.channels[0].channel, "a");
  assert_string_equal(p->backpressure.channels[1].channel, "b");

  const cph_policy_retention *ra = cph_policy_retention_for(p, "a");
  assert_string_equal(ra->channel, "a");
  assert_int_equal(ra->payload_keep_days, 2);
  assert_int_equal(ra->metadata_keep_days, 30);
  const cph_policy_retention *rz = cph_policy_retention_for(p, "z");
  assert_ptr_equal(rz, &p->maintenance.retention.events);
  assert_int_equal(rz->payload_keep_days, 5);
  cph_policy_free(p);
}

/* ---- printing ------------------------------------------------------------------------------ */

static void test_written_policy_loads_back_equal(void **state) {
  (void)state;
  cph_policy *p = must_load(
      "{:server {:data-dir \"d\\\"ir\\\\x\\tß\" :log-level :warn}\n"
      " :auth {:tokens [{:name \"ops\" :sha256 \"" SHA_CHANGE_ME "\" :scopes #{:admin :ingest}}]}\n"
      " :scheduler {:credits {:refill-per-second 0.1 :max 1e-3 :min -1000000}}\n"
      " :gc {:min-age-hours 1.25}\n"
      " :dedupe {:bulk #{\"nagios\" \"q\\\"uote\" \"tab\\there\" \"é\"}}\n"
      " :backpressure {:report-delay-factor 9\n"
      "                :channels {\"z\" {:max-step 0} \"é-chan\" {:max-events-per-minute 7}}}\n"
      " :maintenance {:retention {:channels {\"q\" {:metadata-keep-days 400}}}}}");
  char *text = write_policy(p);
  assert_true(text[0] == '{');
  assert_non_null(strstr(text, "\n :scheduler {:concurrency 4\n")); /* one key per line */
  /* A string list prints as a vector in the stored order. */
  assert_non_null(
      strstr(text, "\n          :bulk [\"nagios\" \"q\\\"uote\" \"tab\\there\" \"é\"]}\n"));
  assert_non_null(strstr(text, "\n                :report-delay-factor 9\n"));
  cph_policy *again = NULL;
  cph_err err = {0};
  if (load_exact("again.edn", text, &again, &err) != CPH_OK)
    fail_msg("written policy does not load: %s\n%s", err.msg, text);
  assert_true(cph_policy_equal(p, again));
  /* Spot checks against the input, not against p. */
  assert_string_equal(again->server.data_dir, "d\"ir\\x\tß");
  assert_int_equal(again->server.log_level, CPH_POLICY_LOG_WARN);
  assert_true(again->scheduler.credits.refill_per_second == 0.1);
  assert_true(again->scheduler.credits.max == 1e-3);
  assert_true(again->scheduler.credits.min == -1e6);
  assert_true(again->gc.min_age_hours == 1.25);
  assert_int_equal(again->dedupe.bulk_count, 4);
  assert_string_equal(again->dedupe.bulk[0], "nagios");
  assert_string_equal(again->dedupe.bulk[1], "q\"uote");
  assert_string_equal(again->dedupe.bulk[2], "tab\there");
  assert_string_equal(again->dedupe.bulk[3], "é");
  assert_int_equal(again->backpressure.report_delay_factor, 9);
  assert_int_equal(again->auth.tokens[0].scopes, CPH_POLICY_SCOPE_ADMIN | CPH_POLICY_SCOPE_INGEST);
  assert_int_equal(cph_policy_backpressure_for(again, "é-chan")->max_events_per_minute, 7);
  assert_int_equal(cph_policy_backpressure_for(again, "z")->max_step, 0);
  assert_int_equal(cph_policy_retention_for(again, "q")->metadata_keep_days, 400);
  assert_int_equal(cph_policy_retention_for(again, "q")->payload_keep_days, 14);
  /* Printing is a fixpoint. */
  char *text2 = write_policy(again);
  assert_string_equal(text, text2);
  free(text2);
  cph_policy_free(again);
  free(text);

  /* A changed value makes them unequal. */
  cph_policy *d = cph_policy_new_default();
  assert_false(cph_policy_equal(p, d));
  char *dtext = write_policy(d);
  cph_policy *d2 = must_load(dtext);
  assert_true(cph_policy_equal(d, d2));
  d2->backpressure.defaults.max_step = 4;
  assert_false(cph_policy_equal(d, d2));
  d2->backpressure.defaults.max_step = d->backpressure.defaults.max_step;
  assert_true(cph_policy_equal(d, d2));
  assert_non_null(strstr(dtext, "\n          :bulk []}\n")); /* the default prints as [] */
  cph_policy_free(d2);
  free(dtext);
  cph_policy_free(d);
  cph_policy_free(p);
}

/* ---- errors: exact messages ---------------------------------------------------------------- */

static void test_wrong_type_names_path_and_value(void **state) {
  (void)state;
  /* line 2: 13 spaces, :lanes at 14, { at 21, :interactive at 22, { at 35, :turns at 36,
   * "sixty" at 43 */
  expect_error("{:scheduler {:concurrency 4\n"
               "             :lanes {:interactive {:turns \"sixty\"}}}}",
               "p.edn:2:43: :scheduler :lanes :interactive :turns: expected a positive integer, "
               "got \"sixty\"");
  /* { 1, :leases 2-8, { 10, :ttl-seconds 11-22, 1.5 at 24: a float is not an integer */
  expect_error("{:leases {:ttl-seconds 1.5}}",
               "p.edn:1:24: :leases :ttl-seconds: expected a positive integer, got 1.5");
  /* { 1, :metrics 2-9, { 11, :enabled? 12-20, nil at 22 */
  expect_error("{:metrics {:enabled? nil}}",
               "p.edn:1:22: :metrics :enabled?: expected true or false, got nil");
  /* { 1, :gc 2-4, { 6, :min-age-hours 7-20, "1" at 22 */
  expect_error("{:gc {:min-age-hours \"1\"}}",
               "p.edn:1:22: :gc :min-age-hours: expected a number from 0 to 100000, got \"1\"");
  /* { 1, :server 2-8, { 10, :data-dir 11-19, 5 at 21 */
  expect_error("{:server {:data-dir 5}}",
               "p.edn:1:21: :server :data-dir: expected a string, got 5");
  /* { 1, :server 2-8, { 10, :listen 11-17, "localhost" at 19 */
  expect_error("{:server {:listen \"localhost\"}}",
               "p.edn:1:19: :server :listen: expected a string HOST:PORT, got \"localhost\"");
  /* { 1, :store 2-7, 1 at 9 */
  expect_error("{:store 1}", "p.edn:1:9: :store: expected a map, got 1");
  /* A long value is cut after 40 bytes: the quote and 39 a's. */
  expect_error("{:server {:listen \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}}",
               "p.edn:1:19: :server :listen: expected a string HOST:PORT, got "
               "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa...");
  /* { 1, :scheduler 2-11, { 13, "concurrency" at 14 */
  expect_error("{:scheduler {\"concurrency\" 4}}",
               "p.edn:1:14: :scheduler: expected a keyword key, got \"concurrency\"");
  /* { 1, :backpressure 2-14, { 16, :channels 17-25, { 27, :general at 28 */
  expect_error("{:backpressure {:channels {:general {:max-step 1}}}}",
               "p.edn:1:28: :backpressure :channels: expected a channel id (a non-empty string) "
               "as key, got :general");
}

static void test_unknown_key_suggests_the_closest(void **state) {
  (void)state;
  /* line 2: 13 spaces, :lane at 14 */
  expect_error("{:scheduler {:concurrency 4\n"
               "             :lane {:interactive {:turns 60}}}}",
               "p.edn:2:14: :scheduler :lane: unknown key, did you mean :lanes?");
  expect_error("{:schedular {}}", "p.edn:1:2: :schedular: unknown key, did you mean :scheduler?");
  /* Shared prefix. { 1, :backpressure 2-14, { 16, :defaults 17-25, { 27, :max-events at 28 */
  expect_error("{:backpressure {:defaults {:max-events 5}}}",
               "p.edn:1:28: :backpressure :defaults :max-events: unknown key, did you mean "
               ":max-events-per-minute?");
  /* Nothing close. { 1, :store 2-7, { 9, :flavour at 10 */
  expect_error("{:store {:flavour :always}}",
               "p.edn:1:10: :store :flavour: unknown key, expected one of :sync, :sync-interval-ms, :span-ms");
  /* Inside a channel entry. { 27, "c" 28-30, { 32, :max-stop at 33 */
  expect_error("{:backpressure {:channels {\"c\" {:max-stop 1}}}}",
               "p.edn:1:33: :backpressure :channels \"c\" :max-stop: unknown key, did you mean "
               ":max-step?");
}

static void test_out_of_range_values(void **state) {
  (void)state;
  /* { 1, :scheduler 2-11, { 13, :concurrency 14-25, 0 at 27 */
  expect_error("{:scheduler {:concurrency 0}}",
               "p.edn:1:27: :scheduler :concurrency: expected an integer from 1 to 100000, got 0");
  /* { 1, :scheduler 2-11, { 13, :credits 14-21, { 23, :max 24-27, 0 at 29 */
  expect_error("{:scheduler {:credits {:max 0}}}",
               "p.edn:1:29: :scheduler :credits :max: expected a number greater than 0 and at "
               "most 1000000, got 0");
  /* An integer beyond int64. { 1, :dedupe 2-8, { 10, :min-length 11-21, number at 23 */
  expect_error("{:dedupe {:min-length 99999999999999999999}}",
               "p.edn:1:23: :dedupe :min-length: expected an integer from 0 to 1000000, got "
               "99999999999999999999");
  /* { 1, :backpressure 2-14, { 16, :defaults 17-25, { 27, :max-step 28-36, 6 at 38 */
  expect_error("{:backpressure {:defaults {:max-step 6}}}",
               "p.edn:1:38: :backpressure :defaults :max-step: expected an integer from 0 to 5, "
               "got 6");
}

static void test_duplicate_keys_name_the_first(void **state) {
  (void)state;
  /* :concurrency at 1:14 and, after 13 spaces, at 2:14 */
  expect_error("{:scheduler {:concurrency 4\n"
               "             :concurrency 8}}",
               "p.edn:2:14: :scheduler :concurrency: duplicate key, first given at line 1 column 14");
  /* "a" at 1:28 and, after 27 spaces, at 2:28 */
  expect_error("{:backpressure {:channels {\"a\" {:max-step 1}\n"
               "                           \"a\" {:max-step 2}}}}",
               "p.edn:2:28: :backpressure :channels \"a\": duplicate key, first given at line 1 "
               "column 28");
  expect_error("{:gc {} :gc {}}", "p.edn:1:9: :gc: duplicate key, first given at line 1 column 2");
}

static void test_bad_keyword_choice(void **state) {
  (void)state;
  /* { 1, :store 2-7, { 9, :sync 10-14, :sometimes at 16 */
  expect_error("{:store {:sync :sometimes}}",
               "p.edn:1:16: :store :sync: expected one of :always, :batch, :none, got :sometimes");
  /* { 1, :server 2-8, { 10, :log-level 11-20, "info" at 22 */
  expect_error("{:server {:log-level \"info\"}}",
               "p.edn:1:22: :server :log-level: expected one of :debug, :info, :warn, :error, got "
               "\"info\"");
}

/* DESIGN §3.8–3.10: the scheduler's new keys load, default to rules 1–7, and their errors
 * name the keys. */
static void test_scheduler_tokens_seats_tenants(void **state) {
  (void)state;
  cph_policy *p = cph_policy_new_default();
  assert_non_null(p);
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    assert_int_equal(p->scheduler.lanes[i].tokens, 0);
    assert_int_equal(p->scheduler.lanes[i].seats, 0);
  }
  assert_int_equal(p->scheduler.credits.charge, CPH_POLICY_CHARGE_TURN);
  assert_int_equal(p->scheduler.credits.tokens_per_unit, 1000);
  assert_int_equal(p->scheduler.tenant_count, 0);
  cph_policy_free(p);

  const char *text = "{:scheduler {:concurrency 4\n"
                     "             :lanes {:interactive {:turns 60 :tool-calls 120\n"
                     "                                   :tokens 2000000 :seats 2}\n"
                     "                     :maintenance {:seats 1}}\n"
                     "             :credits {:charge :tokens :tokens-per-unit 500}\n"
                     "             :tenants {\"acme\" {:weight 3} \"beta\" {}}}}\n";
  cph_err err = {0};
  assert_int_equal(cph_policy_load_text("p.edn", text, strlen(text), &p, &err), CPH_OK);
  assert_int_equal(p->scheduler.lanes[CPH_LANE_INTERACTIVE].tokens, 2000000);
  assert_int_equal(p->scheduler.lanes[CPH_LANE_INTERACTIVE].seats, 2);
  assert_int_equal(p->scheduler.lanes[CPH_LANE_MAINTENANCE].seats, 1);
  assert_int_equal(p->scheduler.lanes[CPH_LANE_MAINTENANCE].turns, 10); /* defaults stay */
  assert_int_equal(p->scheduler.credits.charge, CPH_POLICY_CHARGE_TOKENS);
  assert_int_equal(p->scheduler.credits.tokens_per_unit, 500);
  assert_int_equal(p->scheduler.tenant_count, 2);
  assert_string_equal(p->scheduler.tenants[0].name, "acme");
  assert_true(p->scheduler.tenants[0].weight == 3);
  assert_string_equal(p->scheduler.tenants[1].name, "beta");
  assert_true(p->scheduler.tenants[1].weight == 1); /* a listed tenant's default */
  /* Printed and loaded back, equal (the tenants map included). */
  cph_buf b = CPH_BUF_INIT;
  cph_policy_write_edn(p, &b);
  cph_policy *q = NULL;
  assert_int_equal(cph_policy_load_text("printed", b.data, b.len, &q, &err), CPH_OK);
  assert_true(cph_policy_equal(p, q));
  cph_policy_free(q);
  cph_buf_free(&b);
  cph_policy_free(p);

  /* Seats over concurrency: the error points at :lanes and names every key involved.
   * { 1, :scheduler 2-11, { 13, :concurrency 14-25, 2 27, :lanes 29-34, { at 36 */
  expect_error("{:scheduler {:concurrency 2 :lanes {:interactive {:seats 2} "
               ":operational {:seats 1}}}}",
               "p.edn:1:36: :scheduler :lanes: seats reserved add up to 3 (:interactive :seats 2 "
               "+ :operational :seats 1 + :maintenance :seats 0), more than :concurrency 2");
  /* ... and without :lanes given, at the map (the default concurrency is 4: fine). */
  expect_error("{:scheduler {:concurrency 1 :lanes {:maintenance {:seats 2}}}}",
               "p.edn:1:36: :scheduler :lanes: seats reserved add up to 2 (:interactive :seats 0 "
               "+ :operational :seats 0 + :maintenance :seats 2), more than :concurrency 1");
  expect_error("{:scheduler {:tenants {\"acme\" {:weight 0}}}}",
               "p.edn:1:40: :scheduler :tenants \"acme\" :weight: expected a number from "
               "0.001 to 1000000, got 0");
  expect_error("{:scheduler {:tenants {:acme {:weight 2}}}}",
               "p.edn:1:24: :scheduler :tenants: expected a name (a non-empty string) as key, "
               "got :acme");
  expect_error("{:scheduler {:credits {:charge :dollars}}}",
               "p.edn:1:32: :scheduler :credits :charge: expected one of :turn, :tokens, got :dollars");
  expect_error("{:scheduler {:lanes {:operational {:tokens -1}}}}",
               "p.edn:1:44: :scheduler :lanes :operational :tokens: expected an integer from 0 "
               "to 100000000, got -1");
}

static void test_cross_field_checks_name_the_later_field(void **state) {
  (void)state;
  /* :max 10 at 29, :min 20 at 37 */
  expect_error("{:scheduler {:credits {:max 10 :min 20}}}",
               "p.edn:1:37: :scheduler :credits :min: expected a number <= :max (10), got 20");
  /* :min 20 at 29, :max 10 at 37 */
  expect_error("{:scheduler {:credits {:min 20 :max 10}}}",
               "p.edn:1:37: :scheduler :credits :max: expected a number >= :min (20), got 10");
  /* { 1, :maintenance 2-13, { 15, :outbox 16-22, { 24, :backoff-base-ms 25-40, 5000 42-45,
   * :backoff-max-ms 47-61, 100 at 63 */
  expect_error("{:maintenance {:outbox {:backoff-base-ms 5000 :backoff-max-ms 100}}}",
               "p.edn:1:63: :maintenance :outbox :backoff-max-ms: expected an integer >= "
               ":backoff-base-ms (5000), got 100");
  /* A channel override checked after merging: metadata 7 < the default payload 14.
   * { 1, :maintenance 2-13, { 15, :retention 16-25, { 27, :channels 28-36, { 38, "c" 39-41,
   * { 43, :metadata-keep-days 44-62, 7 at 64 */
  expect_error("{:maintenance {:retention {:channels {\"c\" {:metadata-keep-days 7}}}}}",
               "p.edn:1:64: :maintenance :retention :channels \"c\" :metadata-keep-days: expected "
               "an integer >= :payload-keep-days (14), got 7");
  /* { 1, :providers 2-11, { 13, :embeddings 14-24, { 26, :kind 27-31, :openai at 33 */
  expect_error("{:providers {:embeddings {:kind :openai}}}",
               "p.edn:1:33: :providers :embeddings :kind: expected :builtin unless :url is set, "
               "got :openai");
  /* ... :summarizer 14-24, { 26, :kind 27-31, :openai 33-39, :url 41-44, "" at 46 */
  expect_error("{:providers {:summarizer {:kind :openai :url \"\"}}}",
               "p.edn:1:46: :providers :summarizer :url: expected a non-empty URL when :kind is "
               ":openai, got \"\"");
  /* { 1, :auth 2-6, { 8, :tokens 9-15, [ 17, { 18, :name 19-23, "a" 25-27, :sha256 29-35,
   * "ABC" at 37 */
  expect_error("{:auth {:tokens [{:name \"a\" :sha256 \"ABC\" :scopes #{:read}}]}}",
               "p.edn:1:37: :auth :tokens 0 :sha256: expected a string of 64 lower-case hex "
               "characters, got \"ABC\"");
  /* Missing required key: at the token map, { at 18 */
  expect_error("{:auth {:tokens [{:name \"a\" :scopes #{:read}}]}}",
               "p.edn:1:18: :auth :tokens 0: missing required key :sha256");
  /* :sha256 29-35, its string 37-102, :scopes 104-110, #{ 112, :root at 114 */
  expect_error("{:auth {:tokens [{:name \"a\" :sha256 \"" SHA_CHANGE_ME "\" :scopes #{:root}}]}}",
               "p.edn:1:114: :auth :tokens 0 :scopes: expected one of :ingest, :worker, :admin, "
               ":read, got :root");
  /* [ at 17 */
  expect_error("{:auth {:tokens []}}",
               "p.edn:1:17: :auth :tokens: expected a vector of at least 1 map, got []");
}

static void test_syntax_error_and_top_level(void **state) {
  (void)state;
  /* { 1, :server 2-8, { 10, :listen 11-17, the string opens at 19 and never closes */
  expect_error("{:server {:listen \"127.0.0.1:7070}}", "p.edn:1:19: unterminated string");
  expect_error("[1 2]", "p.edn:1:1: expected a map at the top level, got [1 2]");
  expect_error(";; a comment\n  nil\n", "p.edn:2:3: expected a map at the top level, got nil");
}

static void test_unreadable_file_is_an_io_error(void **state) {
  (void)state;
  cph_policy *p = (cph_policy *)1;
  cph_err err = {0};
  int rc = cph_policy_load_file("/nonexistent-cephalon/policy.edn", &p, &err);
  assert_int_equal(rc, CPH_EIO);
  assert_null(p);
  assert_string_equal(err.msg, "/nonexistent-cephalon/policy.edn: No such file or directory");
  rc = cph_policy_load_file("/tmp", &p, &err);
  assert_int_equal(rc, CPH_EIO);
  assert_string_equal(err.msg, "/tmp: Is a directory");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_seed_policy_loads_with_every_number),
      cmocka_unit_test(test_defaults_hold_every_documented_value),
      cmocka_unit_test(test_example_file_loads_to_the_seed_plus_defaults),
      cmocka_unit_test(test_example_keeps_the_seed_lines),
      cmocka_unit_test(test_every_schema_key_is_in_the_example),
      cmocka_unit_test(test_credits_min_defaults_to_minus_max),
      cmocka_unit_test(test_numbers_take_integers_and_floats),
      cmocka_unit_test(test_keyword_choices_and_scopes),
      cmocka_unit_test(test_bulk_reads_a_vector_keeping_first_seen_order),
      cmocka_unit_test(test_bulk_reads_a_set),
      cmocka_unit_test(test_dedupe_is_bulk_matches_channel_or_sender_exactly),
      cmocka_unit_test(test_bulk_element_errors_name_the_index),
      cmocka_unit_test(test_report_delay_factor_range),
      cmocka_unit_test(test_equal_sees_a_change_in_bulk),
      cmocka_unit_test(test_channel_settings_merge_over_defaults),
      cmocka_unit_test(test_written_policy_loads_back_equal),
      cmocka_unit_test(test_wrong_type_names_path_and_value),
      cmocka_unit_test(test_unknown_key_suggests_the_closest),
      cmocka_unit_test(test_out_of_range_values),
      cmocka_unit_test(test_duplicate_keys_name_the_first),
      cmocka_unit_test(test_bad_keyword_choice),
      cmocka_unit_test(test_cross_field_checks_name_the_later_field),
      cmocka_unit_test(test_scheduler_tokens_seats_tenants),
      cmocka_unit_test(test_syntax_error_and_top_level),
      cmocka_unit_test(test_unreadable_file_is_an_io_error),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
