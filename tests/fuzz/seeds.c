/* Writes the generated part of the seed corpora (run once by hand, output committed):
 *
 *   cph_fuzz_seeds tests/fuzz/corpus
 *
 * - fuzz_records/: every record kind encoded by the real codec, once with every field set
 *   and once zero (empty arrays, nil optionals), each prefixed with its kind byte;
 * - fuzz_api_json/: the request bodies of DESIGN §9 for every body route, as JSON and as
 *   msgpack (fuzz_api.h input format), turn routes also against the harness's live turn;
 * - fuzz_msgpack_body/: the same bodies as msgpack alone.
 * The hand-written seeds (EDN, policies, selectors) are plain files next to these. */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_api.h"
#include "server/mpjson.h"
#include "store/records.h"

static const char *out_dir;

static void write_file(const char *sub, const char *name, const void *a, size_t alen,
                       const void *b, size_t blen) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s/%s", out_dir, sub, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(a, 1, alen, f) != alen || (blen && fwrite(b, 1, blen, f) != blen) ||
      fclose(f) != 0) {
    perror(path);
    exit(1);
  }
}

/* ---------------------------------------------------------------- records */

static void record_seed(uint8_t kind, const cph_record_desc *d, const void *rec,
                        const char *variant) {
  cph_buf b = CPH_BUF_INIT;
  if (cph_record_encode(d, rec, &b) != CPH_OK) {
    fprintf(stderr, "encoding %s failed\n", cph_record_name(d));
    exit(1);
  }
  char name[64];
  snprintf(name, sizeof name, "%02u-%s", kind, variant);
  write_file("fuzz_records", name, &kind, 1, b.data, b.len);
  cph_buf_free(&b);
}

static void record_seeds(void) {
  char *chans[] = {"general", "ops"};
  char *tags[] = {"note"};
  uint64_t ids[] = {1, 2, 300000};
  int64_t lc[] = {-1, 0, 5};
  uint8_t sha[32] = {0xde, 0xad, 0xbe, 0xef};

  cph_session_rec s = {.id = "alice-bot", .lane = 1, .state = 2, .credits = 12.5,
                       .credits_at_ms = 1700000000000, .episode = 3, .subscribe = chans,
                       .n_subscribe = 2, .member = chans, .n_member = 1,
                       .autonomy_interval_s = 60, .context_window_tokens = 8192,
                       .system = "You are helpful.", .tools = tags, .n_tools = 1,
                       .created_ms = 1, .updated_ms = 2};
  cph_event_rec e = {.id = 7, .channel = "general", .sender = "bob", .body = "hello",
                     .mentions = chans, .n_mentions = 1, .kind = "message", .key = "k-1",
                     .ts_ms = 1700000000000, .received_ms = 1700000000001, .status = 1,
                     .simhash = 0x123456789abcdefull, .family = 9};
  memcpy(e.body_sha256, sha, sizeof sha);
  cph_inbox_rec in = {.session = "alice-bot", .seq = 4, .event_id = 7, .status = 2,
                      .mentioned = true, .turn_id = 5, .attempts = 1, .created_ms = 3};
  cph_turn_rec t = {.id = 5, .session = "alice-bot", .lane = 0, .kind = 0, .state = 1,
                    .lease = {1, 2, 3}, .worker = "w1", .inbox_seqs = ids, .n_inbox_seqs = 3,
                    .episode = 2, .attempts = 1, .input = "inbox:hello", .created_ms = 10,
                    .deadline_ms = 20, .completed_ms = 15, .cost_tokens = 42, .tool_calls = 1,
                    .error = "none"};
  cph_reply_rec r = {.id = 1, .session = "alice-bot", .channel = "general", .body = "hi",
                     .source_inbox_ids = ids, .n_source_inbox_ids = 2, .turn_id = 5,
                     .ts_ms = 11};
  cph_memory_rec m = {.id = 8, .session = "alice-bot", .kind = 1, .text = "summary",
                      .tags = tags, .n_tags = 1, .tokens_est = 3, .created_ms = 1,
                      .last_access_ms = 2, .access_count = 4, .deleted = true,
                      .embed_status = 2, .replaced_by = 9, .source_event_id = 7, .gc_group = 1};
  cph_job_rec j = {.id = 2, .session = "janitor", .kind = 3, .state = 1, .args = "group=1",
                   .group_id = 1, .attempts = 2, .created_ms = 1, .run_after_ms = 2,
                   .finished_ms = 3, .error = "timeout"};
  cph_outbox_rec o = {.id = 3, .op = 0, .status = 1, .memory_id = 8, .model = "builtin",
                      .shard = 2, .attempts = 1, .created_ms = 1, .next_attempt_ms = 2,
                      .done_ms = 3, .last_error = "503"};
  cph_gc_group_rec g = {.id = 1, .session = "alice-bot", .state = 2, .source_ids = ids,
                        .n_source_ids = 3, .newest_ts_ms = 5, .total_tokens_est = 100,
                        .group_hash = "0123456789abcdef0123456789abcdef"
                                      "0123456789abcdef0123456789abcdef",
                        .summary_text = "they talked", .summary_id = 10, .created_ms = 1,
                        .updated_ms = 2};
  cph_aggregate_rec a = {.family = 9, .dup_count = 3, .sample = "buy now", .channels = chans,
                         .n_channels = 2, .first_ms = 1, .last_ms = 2, .simhash = 77};
  memcpy(a.body_sha256, sha, sizeof sha);
  cph_ctxnode_rec c = {.id = 4, .depth = 1, .position = 0, .offset = -1, .content = "rule",
                       .role = "user", .ttl = 3, .cadence = 2, .lc_depth = lc, .lc_position = lc,
                       .lc_offset = lc, .lc_ttl = lc, .n_lc_depth = 3, .n_lc_position = 3,
                       .n_lc_offset = 3, .n_lc_ttl = 3, .stage = 1, .key = "k", .tags = tags,
                       .n_tags = 1, .created_at_episode = 2, .seq = 5, .waiting = true,
                       .anchored = true};
  cph_ctxhead_rec ch = {.episode = 7, .next_id = 12, .next_seq = 9, .shift = -3, .count = 4};
  cph_seal_rec se = {.id = 1, .session = "alice-bot", .trigger = "manual", .episode = 2,
                     .created_ms = 3, .roles = chans, .n_roles = 2, .contents = chans,
                     .n_contents = 2, .coords = chans, .n_coords = 2};

  /* Same order as the kind table of fuzz_records.c. */
  const struct {
    const cph_record_desc *d;
    const void *full;
    size_t size;
  } kinds[] = {
      {&cph_session_desc, &s, sizeof s},    {&cph_event_desc, &e, sizeof e},
      {&cph_inbox_desc, &in, sizeof in},    {&cph_turn_desc, &t, sizeof t},
      {&cph_reply_desc, &r, sizeof r},      {&cph_memory_desc, &m, sizeof m},
      {&cph_job_desc, &j, sizeof j},        {&cph_outbox_desc, &o, sizeof o},
      {&cph_gc_group_desc, &g, sizeof g},   {&cph_aggregate_desc, &a, sizeof a},
      {&cph_ctxnode_desc, &c, sizeof c},    {&cph_seal_desc, &se, sizeof se},
      {&cph_ctxhead_desc, &ch, sizeof ch},  {&cph_ctxnode_v1_desc, &c, sizeof c},
  };
  static char zero[1024];
  for (uint8_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    if (kinds[k].size > sizeof zero)
      exit(1);
    record_seed(k, kinds[k].d, kinds[k].full, "full");
    record_seed(k, kinds[k].d, zero, "zero");
  }
}

/* ---------------------------------------------------------------- API bodies */

static const struct {
  const char *route; /* fuzz_api_routes[].name */
  unsigned param;    /* FUZZ_API_PARAM choice */
  const char *body;
} bodies[] = {
    {"session_create", 0,
     "{\"id\":\"alice-bot\",\"class\":\"interactive\",\"subscribe\":[\"general\"],"
     "\"member\":[\"random\"],\"autonomy_interval_s\":60,\"report_interval_s\":null,"
     "\"context_window_tokens\":4096,\"system\":\"You are a helpful assistant.\","
     "\"tools\":[\"search\"]}"},
    {"session_create", 0, "{\"id\":\"s9\",\"class\":\"maintenance\"}"},
    {"session_update", 0,
     "{\"id\":\"s1\",\"class\":\"operational\",\"subscribe\":[\"general\",\"ops\"],"
     "\"paused\":true,\"system\":null,\"tools\":[]}"},
    {"session_update", 1, "{\"paused\":false,\"context_window_tokens\":0}"},
    {"context_insert", 0,
     "{\"at\":\"d0, 1, 0\",\"content\":\"be brief\",\"ttl\":3,\"cadence\":2,\"key\":\"style\","
     "\"tags\":[\"rules\"]}"},
    {"context_insert", 0,
     "{\"content\":\"moves\",\"lifecycle\":[{\"at\":\"d-1, 0, 1\",\"ttl\":2},"
     "{\"at\":\"d2, 0, 0\"}]}"},
    {"seal", 0, "{\"trigger\":\"manual\"}"},
    {"events", 0,
     "{\"events\":[{\"channel\":\"general\",\"sender\":\"bob\","
     "\"body\":\"What is the capital of France?\"},"
     "{\"channel\":\"general\",\"sender\":\"ann\",\"body\":\"hi @s1\",\"mentions\":[\"s1\"],"
     "\"kind\":\"message\",\"ts_ms\":1700000000000,\"key\":\"ev-1\"},{\"session\":\"s2\","
     "\"sender\":\"ops\",\"body\":\"direct\"}]}"},
    {"lease", 0,
     "{\"worker\":\"w1\",\"lanes\":[\"interactive\",\"operational\"],\"wait_ms\":5000}"},
    {"lease", 0, "{\"worker\":\"w2\"}"},
    {"heartbeat", 0, "{\"lease\":\"" FUZZ_API_LEASE_MARK "\"}"},
    {"complete", 0,
     "{\"lease\":\"" FUZZ_API_LEASE_MARK "\",\"cost\":{\"tokens\":42,\"tool_calls\":1},"
     "\"reply\":{\"body\":\"Paris.\",\"channel\":\"general\"},\"memories\":[{\"text\":\"capital is "
     "Paris\",\"tags\":[\"geo\"]}],\"tool_stats\":{\"valid\":1,\"invalid\":0,\"repairs\":0,"
     "\"guard_denies\":0},\"enqueue\":[{\"job\":\"gc_plan\"},{\"job\":\"embed_memory\","
     "\"args\":{\"memories\":[1,2]}}]}"},
    {"complete", 1,
     "{\"lease\":\"0123456789abcdef0123456789abcdef\",\"cost\":{\"tokens\":1,\"tool_calls\":0}}"},
    {"fail", 0, "{\"lease\":\"" FUZZ_API_LEASE_MARK "\",\"error\":\"model timed out\"}"},
    {"requeue", 0, "{}"},
    {"requeue", 1, ""},
    {"job", 0, "{\"job\":\"gc_plan\"}"},
    {"job", 0, "{\"job\":\"gc_summarize\",\"args\":{\"group\":12}}"},
    {"job", 0, "{\"job\":\"outbox_drain\",\"args\":{\"model\":\"builtin\"}}"},
    {"job", 0, "{\"job\":\"gc_plan\",\"args\":{\"sources\":[1,2,3]}}"},
    {"job", 0, "{\"job\":\"aggregate_upsert\",\"args\":{\"family\":1}}"},
    {"job", 0, "{\"job\":\"gc_commit\",\"args\":{\"group\":1}}"},
    {"job", 0, "{\"job\":\"retention_redact_events\"}"},
};

static int route_index(const char *name) {
  for (size_t i = 0; i < FUZZ_API_ROUTES; i++)
    if (strcmp(fuzz_api_routes[i].name, name) == 0)
      return (int)i;
  fprintf(stderr, "no route %s\n", name);
  exit(1);
}

static void api_seeds(void) {
  for (size_t i = 0; i < sizeof bodies / sizeof bodies[0]; i++) {
    uint8_t head[2] = {(uint8_t)route_index(bodies[i].route), (uint8_t)(bodies[i].param << 2)};
    char name[64];
    snprintf(name, sizeof name, "%s-%zu.json", bodies[i].route, i);
    write_file("fuzz_api_json", name, head, 2, bodies[i].body, strlen(bodies[i].body));
    if (!bodies[i].body[0])
      continue;
    json_error_t je;
    json_t *v = json_loads(bodies[i].body, 0, &je);
    if (!v) {
      fprintf(stderr, "seed %zu: %s\n", i, je.text);
      exit(1);
    }
    size_t len;
    char *mp = cph_mpjson_write(v, &len);
    if (!mp)
      exit(1);
    head[1] |= FUZZ_API_MSGPACK_IN | FUZZ_API_MSGPACK_OUT;
    snprintf(name, sizeof name, "%s-%zu.msgpack", bodies[i].route, i);
    write_file("fuzz_api_json", name, head, 2, mp, len);
    snprintf(name, sizeof name, "%s-%zu", bodies[i].route, i);
    write_file("fuzz_msgpack_body", name, mp, len, NULL, 0);
    free(mp);
    json_decref(v);
  }
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: cph_fuzz_seeds CORPUS_DIR (tests/fuzz/corpus)\n");
    return 2;
  }
  out_dir = argv[1];
  record_seeds();
  api_seeds();
  return 0;
}
