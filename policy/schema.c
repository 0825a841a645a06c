/* The policy schema table: every key, its type, range, default and one-line doc.
 * Keep cephalon.policy.edn.example in step (the unit tests check that every key is there). */
#include "policy/schema.h"

#include <stddef.h>
#include <stdio.h>

#include "cephalon/policy.h"

/* Choice fields are read and written as int (get_choice, policy_internal.h); these hold by the
 * enums' values. */
_Static_assert(sizeof(cph_policy_log_level) == sizeof(int), "enum is int-sized");
_Static_assert(sizeof(cph_policy_sync) == sizeof(int), "enum is int-sized");
_Static_assert(sizeof(cph_policy_provider_kind) == sizeof(int), "enum is int-sized");
_Static_assert(sizeof(cph_policy_index_kind) == sizeof(int), "enum is int-sized");
_Static_assert(sizeof(cph_policy_while_running) == sizeof(int), "enum is int-sized");
_Static_assert(sizeof(cph_policy_charge) == sizeof(int), "enum is int-sized");

/* Indexed by the enum values in cephalon/policy.h. */
const char *const cph__policy_log_levels[] = {"debug", "info", "warn", "error", NULL};
const char *const cph__policy_syncs[] = {"always", "batch", "none", NULL};
const char *const cph__policy_provider_kinds[] = {"builtin", "openai", NULL};
const char *const cph__policy_index_kinds[] = {"embedded", "http", NULL};
const char *const cph__policy_while_runnings[] = {"enqueue", "merge", "interrupt", "restart",
                                                  "reject", NULL};
static const char *const charge_names[] = {"turn", "tokens", NULL};
/* Bit i of cph_policy_token.scopes; matches CPH_POLICY_SCOPE_*. */
static const char *const scope_names[] = {"ingest", "worker", "admin", "read", NULL};

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* One descriptor per key. ST is the struct the table describes. */
#define INT(ST, key, m, lo, hi, def, text)                                                 \
  {.name = key, .kind = PS_INT, .off = offsetof(ST, m), .imin = (lo), .imax = (hi),       \
   .idef = (def), .doc = text}
#define NUM(ST, key, m, lo, hi, def, text)                                                 \
  {.name = key, .kind = PS_NUM, .off = offsetof(ST, m), .dmin = (lo), .dmax = (hi),       \
   .ddef = (def), .doc = text}
#define BOOL(ST, key, m, def, text)                                                        \
  {.name = key, .kind = PS_BOOL, .off = offsetof(ST, m), .idef = (def), .doc = text}
#define STR(ST, key, m, def, fl, text)                                                     \
  {.name = key, .kind = PS_STR, .flags = (fl), .off = offsetof(ST, m), .sdef = def,       \
   .doc = text}
#define CHOICE(ST, key, m, names, def, text)                                               \
  {.name = key, .kind = PS_CHOICE, .off = offsetof(ST, m), .choices = names, .idef = (def), \
   .doc = text}
#define SECTION(ST, key, m, table, text)                                                   \
  {.name = key, .kind = PS_SECTION, .off = offsetof(ST, m), .child = &(table), .doc = text}
#define CHANNELS(ST, key, m, n, table, seed_key, text)                                     \
  {.name = key, .kind = PS_CHANNELS, .off = offsetof(ST, m), .count_off = offsetof(ST, n), \
   .child = &(table), .seed = seed_key, .doc = text}
#define STRINGS(ST, key, m, n, lo, hi, text)                                               \
  {.name = key, .kind = PS_STRINGS, .off = offsetof(ST, m), .count_off = offsetof(ST, n),  \
   .imin = (lo), .imax = (hi), .doc = text}
#define TABLE(ST, f, id)                                                                   \
  {.fields = f, .count = COUNT(f), .size = sizeof(ST), .id_off = (id)}
#define TABLE_CHECKED(ST, f, id, c)                                                        \
  {.fields = f, .count = COUNT(f), .size = sizeof(ST), .id_off = (id), .checks = c,       \
   .check_count = COUNT(c)}

/* ---- :server ---- */
static const ps_field server_fields[] = {
    STR(cph_policy_server, "listen", listen, "127.0.0.1:7070", PS_HOSTPORT,
        "address cephalond listens on, HOST:PORT (without :auth only loopback is allowed)"),
    STR(cph_policy_server, "data-dir", data_dir, "var", 0,
        "directory of the LMDB environment"),
    INT(cph_policy_server, "map-size-mb", map_size_mb, 1, 1048576, 1024,
        "LMDB map size in MiB at open; when full it grows while the daemon runs"),
    INT(cph_policy_server, "max-map-size-mb", max_map_size_mb, 1, 1048576, 1048576,
        "the map doubles when full up to this many MiB (and what the disk holds); "
        "writes answer 507 only there"),
    INT(cph_policy_server, "max-body-bytes", max_body_bytes, 1024, 1073741824, 8388608,
        "largest HTTP request body accepted (413 beyond it)"),
    INT(cph_policy_server, "max-events-per-request", max_events_per_request, 1, 100000, 1000,
        "most events in one POST /v1/events"),
    INT(cph_policy_server, "max-string-bytes", max_string_bytes, 16, 16777216, 65536,
        "longest string field accepted in a request"),
    INT(cph_policy_server, "request-threads", request_threads, 0, 16, 1,
        "threads that decode large POST /v1/events requests, hash their texts and write lease "
        "answers beside the event loop (0: the loop does it all); read at start"),
    INT(cph_policy_server, "max-long-polls-per-client", max_long_polls_per_client, 1, 100000,
        64, "long-polls (lease, replies) one client may hold open at once"),
    INT(cph_policy_server, "max-wait-ms", max_wait_ms, 0, 300000, 30000,
        "cap on a long-poll's wait_ms"),
    INT(cph_policy_server, "timeout-seconds", timeout_seconds, 1, 3600, 60,
        "idle HTTP connections are closed after this many seconds"),
    INT(cph_policy_server, "header-timeout-seconds", header_timeout_seconds, 1, 3600, 10,
        "a request head not received whole this long after the connection, or after its first "
        "byte on a kept-alive one, is dropped"),
    INT(cph_policy_server, "body-timeout-seconds", body_timeout_seconds, 1, 3600, 30,
        "a request body not received whole this long after its head is answered 408 and "
        "dropped"),
    CHOICE(cph_policy_server, "log-level", log_level, cph__policy_log_levels,
           CPH_POLICY_LOG_INFO, "least severe log level written: :debug :info :warn :error"),
};
static const ps_check server_checks[] = {{PS_CHECK_LE, "map-size-mb", "max-map-size-mb", 0}};
static const ps_table server_table =
    TABLE_CHECKED(cph_policy_server, server_fields, PS_NO_ID, server_checks);

/* ---- :auth ---- */
static const ps_field token_fields[] = {
    STR(cph_policy_token, "name", name, NULL, PS_REQUIRED | PS_NONEMPTY,
        "who holds the token (shown in logs)"),
    STR(cph_policy_token, "sha256", sha256, NULL, PS_REQUIRED | PS_HEX64,
        "hex SHA-256 of the bearer token; the token itself is never stored"),
    {.name = "scopes", .kind = PS_SCOPES, .flags = PS_REQUIRED,
     .off = offsetof(cph_policy_token, scopes), .choices = scope_names,
     .doc = "what the token may do: any of :ingest :worker :admin :read"},
};
static const ps_table token_table = TABLE(cph_policy_token, token_fields, PS_NO_ID);

static const ps_field auth_fields[] = {
    {.name = "tokens", .kind = PS_VECTOR, .flags = PS_REQUIRED,
     .off = offsetof(cph_policy_auth, tokens), .count_off = offsetof(cph_policy_auth, token_count),
     .imin = 1, .child = &token_table,
     .doc = "bearer tokens accepted: [{:name \"...\" :sha256 \"...\" :scopes #{...}}]"},
};
static const ps_table auth_table = TABLE(cph_policy_auth, auth_fields, PS_NO_ID);

/* ---- :store ---- */
static const ps_field store_fields[] = {
    CHOICE(cph_policy_store, "sync", sync, cph__policy_syncs, CPH_POLICY_SYNC_ALWAYS,
           "fsync :always (each commit), :batch (every :sync-interval-ms) or :none"),
    INT(cph_policy_store, "sync-interval-ms", sync_interval_ms, 1, 60000, 100,
        "fsync interval under :sync :batch"),
    INT(cph_policy_store, "span-ms", span_ms, 0, 1000, 100,
        "under :sync :always, the longest one LMDB write transaction spans passes (each pass "
        "committed into it and written to the log); 0 = a transaction per pass"),
};
static const ps_table store_table = TABLE(cph_policy_store, store_fields, PS_NO_ID);

/* ---- :scheduler ---- */
/* One table per lane: the fields are the same but the defaults differ. */
#define LANE_BUDGET_TABLE(var, turns_def, tools_def)                                        \
  static const ps_field var##_fields[] = {                                                 \
      INT(cph_policy_lane_budget, "turns", turns, 1, 100000000, turns_def,                \
          "turns started per minute (token bucket capacity)"),                            \
      INT(cph_policy_lane_budget, "tool-calls", tool_calls, 1, 100000000, tools_def,      \
          "tool calls per minute, charged at completion"),                                \
      INT(cph_policy_lane_budget, "tokens", tokens, 0, 100000000, 0,                      \
          "model tokens per minute, charged at completion; 0 = no token budget"),         \
      INT(cph_policy_lane_budget, "seats", seats, 0, 100000, 0,                           \
          "concurrency seats reserved for the lane, lent while it has no work"),          \
  };                                                                                       \
  static const ps_table var = TABLE(cph_policy_lane_budget, var##_fields, PS_NO_ID)
LANE_BUDGET_TABLE(interactive_budget_table, 60, 120);
LANE_BUDGET_TABLE(operational_budget_table, 30, 60);
LANE_BUDGET_TABLE(maintenance_budget_table, 10, 20);

static const ps_field lanes_fields[] = {
    SECTION(cph_policy_scheduler, "interactive", lanes[CPH_LANE_INTERACTIVE],
            interactive_budget_table, "budget of the interactive lane (highest priority)"),
    SECTION(cph_policy_scheduler, "operational", lanes[CPH_LANE_OPERATIONAL],
            operational_budget_table, "budget of the operational lane"),
    SECTION(cph_policy_scheduler, "maintenance", lanes[CPH_LANE_MAINTENANCE],
            maintenance_budget_table, "budget of the maintenance lane (lowest priority)"),
};
/* The :lanes map lives inside cph_policy_scheduler itself (offsets are from its start). */
static const ps_table lanes_table = TABLE(cph_policy_scheduler, lanes_fields, PS_NO_ID);

static const ps_field cost_fields[] = {
    NUM(cph_policy_credits, "interactive", cost[CPH_LANE_INTERACTIVE], 0, 1e6, 2,
        "credits charged per completed interactive turn"),
    NUM(cph_policy_credits, "operational", cost[CPH_LANE_OPERATIONAL], 0, 1e6, 1,
        "credits charged per completed operational turn"),
    NUM(cph_policy_credits, "maintenance", cost[CPH_LANE_MAINTENANCE], 0, 1e6, 1,
        "credits charged per completed maintenance turn"),
};
static const ps_table cost_table = TABLE(cph_policy_credits, cost_fields, PS_NO_ID);

static const ps_field credits_fields[] = {
    NUM(cph_policy_credits, "refill-per-second", refill_per_second, 0, 1e6, 1.0,
        "credits every session regains per second"),
    {.name = "max", .kind = PS_NUM, .flags = PS_MIN_EXCLUSIVE,
     .off = offsetof(cph_policy_credits, max), .dmin = 0, .dmax = 1e6, .ddef = 30,
     .doc = "credits cap; a new session starts here"},
    {.name = "min", .kind = PS_NUM, .off = offsetof(cph_policy_credits, min), .dmin = -1e6,
     .dmax = 1e6, .ddef = -30, .neg_of = "max",
     .doc = "credits floor (at most :max); minus :max unless given"},
    {.name = "cost", .kind = PS_SECTION, .off = 0, .child = &cost_table,
     .doc = "credits charged per completed turn, by lane"},
    CHOICE(cph_policy_credits, "charge", charge, charge_names, CPH_POLICY_CHARGE_TURN,
           ":turn (a turn costs :cost) or :tokens (:cost x tokens / :tokens-per-unit)"),
    INT(cph_policy_credits, "tokens-per-unit", tokens_per_unit, 1, 1000000000, 1000,
        "under :charge :tokens, the tokens a turn burns to cost its lane's :cost"),
};
static const ps_check credits_checks[] = {{PS_CHECK_LE, "min", "max", 0}};
/* :cost is the credits struct's cost[] array, so its table also describes cph_policy_credits
 * (offset 0), like :lanes in the scheduler. */
static const ps_table credits_table =
    TABLE_CHECKED(cph_policy_credits, credits_fields, PS_NO_ID, credits_checks);

static const ps_field tenant_fields[] = {
    NUM(cph_policy_tenant, "weight", weight, 0.001, 1e6, 1,
        "the tenant's share of its lanes' turns, against the others' weights"),
};
static const ps_table tenant_table =
    TABLE(cph_policy_tenant, tenant_fields, offsetof(cph_policy_tenant, name));

/* §3.10: reservations are carved out of :concurrency, so they cannot add up to more. */
static int check_seats(const void *base, const char **key, char *msg, size_t cap) {
  const cph_policy_scheduler *s = base;
  int64_t sum = 0;
  for (int i = 0; i < CPH_LANE_COUNT; i++)
    sum += s->lanes[i].seats;
  if (sum <= s->concurrency)
    return 0;
  *key = "lanes";
  snprintf(msg, cap,
           "seats reserved add up to %lld (:interactive :seats %lld + :operational :seats %lld "
           "+ :maintenance :seats %lld), more than :concurrency %lld",
           (long long)sum, (long long)s->lanes[CPH_LANE_INTERACTIVE].seats,
           (long long)s->lanes[CPH_LANE_OPERATIONAL].seats,
           (long long)s->lanes[CPH_LANE_MAINTENANCE].seats, (long long)s->concurrency);
  return 1;
}

static const ps_field scheduler_fields[] = {
    INT(cph_policy_scheduler, "concurrency", concurrency, 1, 100000, 4,
        "most turns running at once, over all lanes"),
    INT(cph_policy_scheduler, "tick-ms", tick_ms, 1, 10000, 5,
        "scheduler pass timer; passes also run on ingest, lease and completion"),
    {.name = "lanes", .kind = PS_SECTION, .off = 0, .child = &lanes_table,
     .doc = "per-lane budgets per minute, refilled continuously"},
    SECTION(cph_policy_scheduler, "credits", credits, credits_table,
            "session credits: refill, bounds, cost per turn"),
    CHANNELS(cph_policy_scheduler, "tenants", tenants, tenant_count, tenant_table, NULL,
             "tenant weights by name: {\"acme\" {:weight 3}}; unlisted tenants weigh 1"),
    /* 16 and 1024: CPH_SCHED_TENANT_RUN_DEFAULT and _LIMIT of lanes/sched.h (test_policy) */
    INT(cph_policy_scheduler, "tenant-run-max", tenant_run_max, 1, 1024, 16,
        "most picks in a row one tenant takes in a lane, used only at machine rates (a run is "
        "at most 1/1000 of an average tenant's picks a minute); 1 = the exact tenant order"),
};
static const ps_table scheduler_table = {.fields = scheduler_fields,
                                         .count = COUNT(scheduler_fields),
                                         .size = sizeof(cph_policy_scheduler),
                                         .id_off = PS_NO_ID,
                                         .validate = check_seats};

/* ---- :leases ---- */
static const ps_field leases_fields[] = {
    INT(cph_policy_leases, "ttl-seconds", ttl_seconds, 1, 86400, 30,
        "a lease not completed or heartbeated within this many seconds ends"),
    INT(cph_policy_leases, "max-attempts", max_attempts, 1, 1000, 5,
        "failed attempts on the same input before the turn is parked"),
};
static const ps_table leases_table = TABLE(cph_policy_leases, leases_fields, PS_NO_ID);

/* ---- :sessions ---- */
/* :while-running, one mode per class: the map lives inside cph_policy_sessions (offsets are
 * from its start), like :lanes in the scheduler. */
#define WR_DOC ": :enqueue (staged for the next turn), :merge (the worker may take it into " \
               "the running turn), :interrupt (the worker stops at its next safe point), "    \
               ":restart (the lease is revoked, the turn runs again with all input) or "     \
               ":reject (answered rejected, reason session_busy)"
static const ps_field while_running_fields[] = {
    CHOICE(cph_policy_sessions, "interactive", while_running[CPH_LANE_INTERACTIVE],
           cph__policy_while_runnings, CPH_POLICY_WR_ENQUEUE,
           "what an interactive session does with what arrives while its turn runs" WR_DOC),
    CHOICE(cph_policy_sessions, "operational", while_running[CPH_LANE_OPERATIONAL],
           cph__policy_while_runnings, CPH_POLICY_WR_ENQUEUE,
           "the same for operational sessions"),
    CHOICE(cph_policy_sessions, "maintenance", while_running[CPH_LANE_MAINTENANCE],
           cph__policy_while_runnings, CPH_POLICY_WR_ENQUEUE,
           "the same for maintenance sessions (job turns always enqueue)"),
};
#undef WR_DOC
static const ps_table while_running_table =
    TABLE(cph_policy_sessions, while_running_fields, PS_NO_ID);

static const ps_field sessions_fields[] = {
    INT(cph_policy_sessions, "max-queue", max_queue, 1, 10000000, 1000,
        "queued inbox entries per session; beyond it the oldest un-mentioned fold into one "
        "counted overflow entry (never dropped)"),
    INT(cph_policy_sessions, "max-batch", max_batch, 1, 10000, 64,
        "staged messages carried by one inbox turn"),
    INT(cph_policy_sessions, "context-window-tokens", context_window_tokens, 256, 10000000, 8192,
        "context budget of sessions that set none"),
    INT(cph_policy_sessions, "warm-channels", warm_channels, 0, 1000000, 1024,
        "channels whose recent history (up to 512 entries each) stays in memory for turns, "
        "least recently used evicted; 0 reads it from the store every turn"),
    BOOL(cph_policy_sessions, "janitor?", janitor, 1,
         "create the built-in janitor maintenance session"),
    {.name = "while-running", .kind = PS_SECTION, .off = 0, .child = &while_running_table,
     .doc = "per class, what a session that sets no while_running of its own does with what "
            "arrives while its turn runs (DESIGN §4)"},
};
static const ps_table sessions_table = TABLE(cph_policy_sessions, sessions_fields, PS_NO_ID);

/* ---- :context ---- */
static const ps_field context_fields[] = {
    INT(cph_policy_context, "keep-turns", keep_turns, 0, 10000, 8,
        "turn contexts kept per session for the context explorer (GET /v1/sessions/{id}/turns, "
        "the context diff, /ui); older ones are deleted as new turns are leased; each costs "
        "about its messages' size in the store; 0 keeps none"),
};
static const ps_table context_table = TABLE(cph_policy_context, context_fields, PS_NO_ID);

/* ---- :dedupe ---- */
static const ps_field dedupe_fields[] = {
    INT(cph_policy_dedupe, "window-seconds", window_seconds, 0, 2592000, 300,
        "exact duplicates (same channel, sender, body) are caught within this window"),
    INT(cph_policy_dedupe, "key-window-seconds", key_window_seconds, 0, 31536000, 86400,
        "how long an idempotency key is remembered (then deleted from the store)"),
    INT(cph_policy_dedupe, "min-length", min_length, 0, 1000000, 12,
        "bodies shorter than this (bytes) are never deduplicated"),
    INT(cph_policy_dedupe, "near-distance", near_distance, 0, 64, 10,
        "simhash Hamming distance that still counts as a near duplicate"),
    INT(cph_policy_dedupe, "shingle-words", shingle_words, 1, 16, 1,
        "words per shingle for the simhash"),
    STRINGS(cph_policy_dedupe, "bulk", bulk, bulk_count, 1, 256,
            "channels and senders whose traffic is bulk (monitors, bots, feeds): near-duplicate "
            "folding applies to them (DESIGN §5)"),
};
static const ps_table dedupe_table = TABLE(cph_policy_dedupe, dedupe_fields, PS_NO_ID);

/* ---- :gc ---- */
static const ps_field gc_fields[] = {
    NUM(cph_policy_gc, "min-age-hours", min_age_hours, 0, 100000, 24,
        "raw memories younger than this are never compacted"),
    INT(cph_policy_gc, "max-access", max_access, 0, 1000000000, 1,
        "only memories accessed at most this many times are compacted"),
    INT(cph_policy_gc, "group-max-tokens", group_max_tokens, 64, 10000000, 2000,
        "token cap of one compaction group"),
    INT(cph_policy_gc, "plan-interval-s", plan_interval_s, 1, 31536000, 3600,
        "how often gc_plan runs"),
    INT(cph_policy_gc, "max-groups-per-plan", max_groups_per_plan, 1, 100000, 100,
        "most groups one gc_plan creates"),
};
static const ps_table gc_table = TABLE(cph_policy_gc, gc_fields, PS_NO_ID);

/* ---- :maintenance ---- */
static const ps_field outbox_fields[] = {
    INT(cph_policy_outbox, "min-batches-per-minute", min_batches_per_minute, 0, 6000, 1,
        "guaranteed trickle: batches drained per minute even when budgets are spent"),
    INT(cph_policy_outbox, "batch-size", batch_size, 1, 10000, 50, "items per outbox batch"),
    INT(cph_policy_outbox, "backoff-base-ms", backoff_base_ms, 1, 3600000, 1000,
        "first retry delay after a failed batch (doubles each time, with jitter)"),
    INT(cph_policy_outbox, "backoff-max-ms", backoff_max_ms, 1, 86400000, 300000,
        "longest retry delay (at least :backoff-base-ms)"),
    INT(cph_policy_outbox, "drain-interval-s", drain_interval_s, 1, 86400, 10,
        "how often outbox_drain is queued"),
};
static const ps_check outbox_checks[] = {{PS_CHECK_LE, "backoff-base-ms", "backoff-max-ms", 0}};
static const ps_table outbox_table =
    TABLE_CHECKED(cph_policy_outbox, outbox_fields, PS_NO_ID, outbox_checks);

static const ps_field embedding_queue_fields[] = {
    INT(cph_policy_embedding_queue, "max-queue", max_queue, 1, 100000000, 5000,
        "pending embeddings beyond which backpressure triggers"),
    BOOL(cph_policy_embedding_queue, "pause-on-backpressure?", pause_on_backpressure, 1,
         "stop embedding for channels under backpressure"),
    INT(cph_policy_embedding_queue, "batch-size", batch_size, 1, 4096, 32,
        "texts per embedding request"),
};
static const ps_table embedding_queue_table =
    TABLE(cph_policy_embedding_queue, embedding_queue_fields, PS_NO_ID);

/* Used both for :events (the defaults) and for each channel override. */
static const ps_field retention_fields[] = {
    INT(cph_policy_retention, "payload-keep-days", payload_keep_days, 0, 36500, 14,
        "event payloads older than this are removed (hash and metadata stay)"),
    INT(cph_policy_retention, "metadata-keep-days", metadata_keep_days, 0, 36500, 180,
        "events older than this are deleted (at least :payload-keep-days)"),
};
static const ps_check retention_checks[] = {
    {PS_CHECK_LE, "payload-keep-days", "metadata-keep-days", 0}};
static const ps_table retention_table =
    TABLE_CHECKED(cph_policy_retention, retention_fields, offsetof(cph_policy_retention, channel),
                  retention_checks);

static const ps_field retention_section_fields[] = {
    SECTION(cph_policy_retention_section, "events", events, retention_table,
            "retention for every channel"),
    CHANNELS(cph_policy_retention_section, "channels", channels, channel_count, retention_table,
             "events", "per-channel overrides of :events, by channel id"),
    INT(cph_policy_retention_section, "interval-s", interval_s, 1, 31536000, 3600,
        "how often retention_redact_events runs"),
};
static const ps_table retention_section_table =
    TABLE(cph_policy_retention_section, retention_section_fields, PS_NO_ID);

static const ps_field maintenance_fields[] = {
    INT(cph_policy_maintenance, "workers", workers, 1, 64, 1,
        "cephalond's own maintenance workers (jobs never go to external workers)"),
    SECTION(cph_policy_maintenance, "outbox", outbox, outbox_table,
            "vector-index outbox draining"),
    SECTION(cph_policy_maintenance, "embeddings", embeddings, embedding_queue_table,
            "embedding job queue"),
    SECTION(cph_policy_maintenance, "retention", retention, retention_section_table,
            "event retention (retention_redact_events)"),
};
static const ps_table maintenance_table =
    TABLE(cph_policy_maintenance, maintenance_fields, PS_NO_ID);

/* ---- :backpressure ---- */
/* Used both for :defaults and for each channel override. */
static const ps_field channel_fields[] = {
    INT(cph_policy_channel, "max-events-per-minute", max_events_per_minute, 0, 100000000, 0,
        "events per minute on a channel before it degrades; 0 = no limit"),
    INT(cph_policy_channel, "max-family-growth-per-minute", max_family_growth_per_minute, 0,
        100000000, 0, "duplicates joining one family per minute before degrading; 0 = no limit"),
    BOOL(cph_policy_channel, "degrade-to-aggregate-only?", degrade_to_aggregate_only, 0,
         "keep the channel at least at step 1 (aggregate-only)"),
    INT(cph_policy_channel, "max-step", max_step, 0, 5, 5,
        "deepest degrade step the channel may reach (0 = never degrade)"),
};
static const ps_table channel_table =
    TABLE(cph_policy_channel, channel_fields, offsetof(cph_policy_channel, channel));

static const ps_field backpressure_fields[] = {
    INT(cph_policy_backpressure, "interval-s", interval_s, 1, 3600, 10,
        "one degrade step per interval while a trigger holds"),
    INT(cph_policy_backpressure, "recover-intervals", recover_intervals, 1, 1000, 3,
        "calm intervals before stepping back one step (hysteresis)"),
    INT(cph_policy_backpressure, "report-delay-factor", report_delay_factor, 1, 1000, 4,
        "backpressure step 4 multiplies the interval of reports covering the channel by this"),
    SECTION(cph_policy_backpressure, "defaults", defaults, channel_table,
            "settings for every channel"),
    CHANNELS(cph_policy_backpressure, "channels", channels, channel_count, channel_table,
             "defaults", "per-channel overrides of :defaults, by channel id"),
};
static const ps_table backpressure_table =
    TABLE(cph_policy_backpressure, backpressure_fields, PS_NO_ID);

/* ---- :providers ---- */
static const ps_field embedder_fields[] = {
    CHOICE(cph_policy_embedder, "kind", kind, cph__policy_provider_kinds,
           CPH_POLICY_PROVIDER_BUILTIN,
           ":builtin feature hashing (no network) or :openai (/v1/embeddings at :url)"),
    STR(cph_policy_embedder, "url", url, "", 0, "base URL of the OpenAI-compatible endpoint"),
    STR(cph_policy_embedder, "model", model, "builtin-hash-256", 0, "embedding model name"),
    STR(cph_policy_embedder, "api-key-env", api_key_env, "", 0,
        "environment variable holding the API key (never the key itself)"),
    INT(cph_policy_embedder, "dimensions", dimensions, 8, 8192, 256, "embedding dimensions"),
    INT(cph_policy_embedder, "timeout-ms", timeout_ms, 1, 600000, 10000,
        "timeout of one embedding request"),
};
static const ps_check embedder_checks[] = {
    {PS_CHECK_URL_FOR, "kind", "url", CPH_POLICY_PROVIDER_OPENAI}};
static const ps_table embedder_table =
    TABLE_CHECKED(cph_policy_embedder, embedder_fields, PS_NO_ID, embedder_checks);

static const ps_field summarizer_fields[] = {
    CHOICE(cph_policy_summarizer, "kind", kind, cph__policy_provider_kinds,
           CPH_POLICY_PROVIDER_BUILTIN,
           ":builtin extractive or :openai (chat completions at :url)"),
    STR(cph_policy_summarizer, "url", url, "", 0, "base URL of the OpenAI-compatible endpoint"),
    STR(cph_policy_summarizer, "model", model, "builtin-extractive", 0, "summariser model name"),
    STR(cph_policy_summarizer, "api-key-env", api_key_env, "", 0,
        "environment variable holding the API key (never the key itself)"),
    INT(cph_policy_summarizer, "timeout-ms", timeout_ms, 1, 600000, 30000,
        "timeout of one summarise request"),
    INT(cph_policy_summarizer, "max-tokens", max_tokens, 16, 100000, 256,
        "longest summary, in tokens"),
};
static const ps_check summarizer_checks[] = {
    {PS_CHECK_URL_FOR, "kind", "url", CPH_POLICY_PROVIDER_OPENAI}};
static const ps_table summarizer_table =
    TABLE_CHECKED(cph_policy_summarizer, summarizer_fields, PS_NO_ID, summarizer_checks);

static const ps_field providers_fields[] = {
    SECTION(cph_policy_providers, "embeddings", embeddings, embedder_table,
            "embedding provider"),
    SECTION(cph_policy_providers, "summarizer", summarizer, summarizer_table,
            "summariser used by gc_summarize"),
    STR(cph_policy_providers, "ca-file", ca_file, "", 0,
        "PEM CA file trusted for https provider URLs (\"\" = the system bundle)"),
};
static const ps_table providers_table = TABLE(cph_policy_providers, providers_fields, PS_NO_ID);

/* ---- :vector-index ---- */
static const ps_field vector_index_fields[] = {
    CHOICE(cph_policy_vector_index, "kind", kind, cph__policy_index_kinds,
           CPH_POLICY_INDEX_EMBEDDED, ":embedded in LMDB or :http (an external index at :url)"),
    STR(cph_policy_vector_index, "url", url, "", 0, "base URL of the HTTP index"),
    INT(cph_policy_vector_index, "shards", shards, 1, 1024, 1,
        "index shards; outbox batches are per shard"),
    INT(cph_policy_vector_index, "timeout-ms", timeout_ms, 1, 600000, 5000,
        "timeout of one index request"),
};
static const ps_check vector_index_checks[] = {
    {PS_CHECK_URL_FOR, "kind", "url", CPH_POLICY_INDEX_HTTP}};
static const ps_table vector_index_table =
    TABLE_CHECKED(cph_policy_vector_index, vector_index_fields, PS_NO_ID, vector_index_checks);

/* ---- :metrics ---- */
static const ps_field metrics_fields[] = {
    BOOL(cph_policy_metrics, "enabled?", enabled, 1, "serve GET /metrics"),
    INT(cph_policy_metrics, "top-families", top_families, 0, 1000, 10,
        "duplicate families exported as aggregate_dup_count{family}"),
};
static const ps_table metrics_table = TABLE(cph_policy_metrics, metrics_fields, PS_NO_ID);

/* ---- :cluster ---- */
static const ps_field cluster_fields[] = {
    STR(cph_policy_cluster, "node", node, NULL, PS_REQUIRED | PS_NONEMPTY,
        "this node's name, unique in the cluster"),
    STR(cph_policy_cluster, "advertise", advertise, NULL, PS_REQUIRED | PS_NONEMPTY,
        "base URL other nodes and clients reach this node at (421 answers point there)"),
    {.name = "etcd", .kind = PS_STRINGS, .flags = PS_REQUIRED,
     .off = offsetof(cph_policy_cluster, etcd),
     .count_off = offsetof(cph_policy_cluster, etcd_count), .imin = 1, .imax = 1024,
     .doc = "etcd client URLs (its v3 JSON gateway) holding membership and shard ownership"},
    STRINGS(cph_policy_cluster, "nats", nats, nats_count, 1, 1024,
            "NATS URLs of the replicated log (JetStream); without it events are accepted only by their shard's owner"),
    INT(cph_policy_cluster, "shards", shards, 1, 65536, 256,
        "session and channel ids hash to this many shards"),
    INT(cph_policy_cluster, "replicas", replicas, 1, 5, 3,
        "replicas of the log's stream and bucket (3 in production; 1 for a single NATS server)"),
    INT(cph_policy_cluster, "lease-ttl-seconds", lease_ttl_seconds, 2, 600, 5,
        "TTL of this node's etcd lease; a node that cannot renew stops serving before it"),
    INT(cph_policy_cluster, "log-dedupe-seconds", log_dedupe_seconds, 0, 31536000, 0,
        "how long the log remembers an event's key to answer a repeat `duplicate` (NATS keeps "
        "the keys of that window in memory); 0 = :dedupe :key-window-seconds"),
    INT(cph_policy_cluster, "log-trim-seconds", log_trim_seconds, 0, 86400, 10,
        "a served shard's messages below its watermark (never needed again) are purged from the "
        "log at most this often; 0 = never (the log grows without bound)"),
    INT(cph_policy_cluster, "concurrency", concurrency, 0, 10000, 0,
        "turns running at once over the whole cluster, shared by the nodes by demand every "
        "second; 0 = :scheduler :concurrency on each node"),
};
static const ps_table cluster_table = TABLE(cph_policy_cluster, cluster_fields, PS_NO_ID);

/* ---- root ---- */
static const ps_field root_fields[] = {
    SECTION(cph_policy, "server", server, server_table, "HTTP listener, storage and limits"),
    {.name = "auth", .kind = PS_SECTION, .flags = PS_OPTIONAL, .off = offsetof(cph_policy, auth),
     .present_off = offsetof(cph_policy, auth_enabled), .child = &auth_table,
     .doc = "bearer tokens and their scopes",
     .absent = "no authentication, so cephalond serves loopback only"},
    SECTION(cph_policy, "store", store, store_table, "durability of commits"),
    SECTION(cph_policy, "scheduler", scheduler, scheduler_table,
            "concurrency, lane budgets and session credits"),
    SECTION(cph_policy, "leases", leases, leases_table, "turn leases"),
    SECTION(cph_policy, "sessions", sessions, sessions_table, "per-session limits"),
    SECTION(cph_policy, "context", context, context_table,
            "turn contexts kept for the context explorer"),
    SECTION(cph_policy, "dedupe", dedupe, dedupe_table, "duplicate detection"),
    SECTION(cph_policy, "gc", gc, gc_table, "memory compaction"),
    SECTION(cph_policy, "maintenance", maintenance, maintenance_table,
            "maintenance workers, outbox, embeddings, retention"),
    SECTION(cph_policy, "backpressure", backpressure, backpressure_table,
            "per-channel degradation under load"),
    SECTION(cph_policy, "providers", providers, providers_table,
            "embedding and summarising providers"),
    SECTION(cph_policy, "vector-index", vector_index, vector_index_table, "vector index"),
    SECTION(cph_policy, "metrics", metrics, metrics_table, "Prometheus metrics"),
    {.name = "cluster", .kind = PS_SECTION, .flags = PS_OPTIONAL,
     .off = offsetof(cph_policy, cluster), .present_off = offsetof(cph_policy, cluster_enabled),
     .child = &cluster_table, .doc = "cluster mode: shards owned through etcd (DESIGN §14)",
     .absent = "a single node, no etcd, no shards"},
};
const ps_table cph__policy_schema = TABLE(cph_policy, root_fields, PS_NO_ID);

#define FITS(f) _Static_assert(COUNT(f) <= PS_MAX_FIELDS, #f " has too many fields")
FITS(server_fields);
FITS(token_fields);
FITS(auth_fields);
FITS(store_fields);
FITS(lanes_fields);
FITS(cost_fields);
FITS(credits_fields);
FITS(scheduler_fields);
FITS(leases_fields);
FITS(sessions_fields);
FITS(while_running_fields);
FITS(context_fields);
FITS(dedupe_fields);
FITS(gc_fields);
FITS(outbox_fields);
FITS(embedding_queue_fields);
FITS(retention_fields);
FITS(retention_section_fields);
FITS(maintenance_fields);
FITS(channel_fields);
FITS(backpressure_fields);
FITS(embedder_fields);
FITS(summarizer_fields);
FITS(providers_fields);
FITS(vector_index_fields);
FITS(metrics_fields);
FITS(cluster_fields);
FITS(root_fields);
