/* The Cephalon policy: one EDN file (DESIGN §8) read into a plain struct.
 *
 * Contract:
 * - A cph_policy is always complete: every field holds either the file's value or the
 *   documented default (see cephalon.policy.edn.example, which lists every key). Readers may
 *   use any field directly; nothing is lazily defaulted.
 * - A policy is immutable once loaded; reload builds a new one and swaps it in, so a rejected
 *   file leaves the old policy in force.
 * - Loading fails on the first problem, in source order, with err->msg of the form
 *   `FILE:LINE:COL: <key path>: <what was expected>, got <what was found>`; the key path is
 *   the keywords (and quoted channel ids, vector and set indexes) from the root to the value.
 *   Unknown keys are errors (with a did-you-mean), so a typo never silently means "default".
 * - Strings are owned by the policy (freed by cph_policy_free); never NULL after a load or
 *   cph_policy_new_default. */
#ifndef CEPHALON_POLICY_H
#define CEPHALON_POLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cephalon/error.h"
#include "cephalon/lane.h"

typedef struct cph_buf cph_buf; /* common/buf.h */

typedef enum cph_policy_log_level {
  CPH_POLICY_LOG_DEBUG = 0,
  CPH_POLICY_LOG_INFO = 1,
  CPH_POLICY_LOG_WARN = 2,
  CPH_POLICY_LOG_ERROR = 3
} cph_policy_log_level;

/* :store :sync — when commits are fsynced (DESIGN §4 Durability). */
typedef enum cph_policy_sync {
  CPH_POLICY_SYNC_ALWAYS = 0, /* fsync every commit */
  CPH_POLICY_SYNC_BATCH = 1,  /* fsync at most every :sync-interval-ms */
  CPH_POLICY_SYNC_NONE = 2    /* leave it to the OS */
} cph_policy_sync;

/* :sessions :while-running — what a session does with what arrives while its turn runs
 * (DESIGN §4 "Arrivals during a running turn"); a per-class default, a session may set its
 * own (cph_session_info.while_running). */
typedef enum cph_policy_while_running {
  CPH_POLICY_WR_ENQUEUE = 0,   /* staged for its next turn (the default) */
  CPH_POLICY_WR_MERGE = 1,     /* the worker may take it into the running turn */
  CPH_POLICY_WR_INTERRUPT = 2, /* the worker is asked to stop at its next safe point */
  CPH_POLICY_WR_RESTART = 3,   /* the running lease is revoked; the turn runs again */
  CPH_POLICY_WR_REJECT = 4     /* refused with reason session_busy */
} cph_policy_while_running;
#define CPH_POLICY_WR_COUNT 5

typedef enum cph_policy_provider_kind {
  CPH_POLICY_PROVIDER_BUILTIN = 0, /* in-process, no network */
  CPH_POLICY_PROVIDER_OPENAI = 1   /* OpenAI-compatible HTTP endpoint at :url */
} cph_policy_provider_kind;

typedef enum cph_policy_index_kind {
  CPH_POLICY_INDEX_EMBEDDED = 0, /* vectors in the LMDB environment */
  CPH_POLICY_INDEX_HTTP = 1      /* external index at :url */
} cph_policy_index_kind;

/* Auth scopes, as a bitmask in cph_policy_token.scopes. */
enum {
  CPH_POLICY_SCOPE_INGEST = 1u << 0,
  CPH_POLICY_SCOPE_WORKER = 1u << 1,
  CPH_POLICY_SCOPE_ADMIN = 1u << 2,
  CPH_POLICY_SCOPE_READ = 1u << 3
};

typedef struct cph_policy_server {
  char *listen;                       /* HOST:PORT ("[v6addr]:PORT" for IPv6) */
  char *data_dir;                     /* LMDB environment directory */
  int64_t map_size_mb;                /* LMDB map size at open */
  int64_t max_map_size_mb;            /* the map grows up to this (DESIGN §13) */
  int64_t max_body_bytes;             /* largest accepted request body */
  int64_t max_events_per_request;     /* POST /v1/events batch cap */
  int64_t max_string_bytes;           /* longest accepted string field */
  int64_t request_threads;            /* server/offload.c's threads, read at start */
  int64_t max_long_polls_per_client;  /* concurrent lease/replies long-polls per client */
  int64_t max_wait_ms;                /* cap on a long-poll's wait_ms */
  int64_t timeout_seconds;            /* idle HTTP connection timeout */
  int64_t header_timeout_seconds;     /* a request head must arrive whole within this */
  int64_t body_timeout_seconds;       /* a request body must arrive whole within this */
  cph_policy_log_level log_level;
} cph_policy_server;

typedef struct cph_policy_token {
  char *name;      /* who holds it; shown in logs */
  char *sha256;    /* hex SHA-256 of the bearer token: 64 lower-case hex characters */
  unsigned scopes; /* CPH_POLICY_SCOPE_* bits; never 0 */
} cph_policy_token;

typedef struct cph_policy_auth {
  cph_policy_token *tokens; /* token_count >= 1 when cph_policy.auth_enabled */
  size_t token_count;
} cph_policy_auth;

typedef struct cph_policy_store {
  cph_policy_sync sync;
  int64_t sync_interval_ms; /* used by CPH_POLICY_SYNC_BATCH */
  int64_t span_ms; /* :always: how long one LMDB write txn spans passes; 0 = none (store.h) */
} cph_policy_store;

typedef struct cph_policy_lane_budget {
  int64_t turns;      /* turns started per minute (token bucket capacity, DESIGN §3.1) */
  int64_t tool_calls; /* tool calls per minute */
  int64_t tokens;     /* model tokens per minute, charged at completion (§3.8); 0 = no budget */
  int64_t seats;      /* concurrency seats reserved for the lane (§3.10) */
} cph_policy_lane_budget;

/* What a completed turn costs in credits (DESIGN §3.8). */
typedef enum cph_policy_charge {
  CPH_POLICY_CHARGE_TURN,  /* :turn — cost[lane] */
  CPH_POLICY_CHARGE_TOKENS /* :tokens — cost[lane] × tokens / tokens_per_unit */
} cph_policy_charge;

typedef struct cph_policy_credits {
  double refill_per_second;
  double max;                  /* > 0; a new session starts here */
  double min;                  /* <= max; -max unless given */
  double cost[CPH_LANE_COUNT]; /* charged per completed turn, indexed by cph_lane */
  cph_policy_charge charge;
  int64_t tokens_per_unit;     /* :charge :tokens: tokens that cost cost[lane] */
} cph_policy_credits;

/* A tenant's share inside a lane (DESIGN §3.9). */
typedef struct cph_policy_tenant {
  char *name;
  double weight;
} cph_policy_tenant;

typedef struct cph_policy_scheduler {
  int64_t concurrency; /* turns running at once, over all lanes */
  int64_t tick_ms;     /* scheduler pass timer */
  cph_policy_lane_budget lanes[CPH_LANE_COUNT]; /* indexed by cph_lane */
  cph_policy_credits credits;
  cph_policy_tenant *tenants;                   /* sorted by name; others weigh 1 */
  size_t tenant_count;
  int64_t tenant_run_max; /* §3.9: longest run of picks one tenant takes at machine rates */
} cph_policy_scheduler;

typedef struct cph_policy_leases {
  int64_t ttl_seconds;
  int64_t max_attempts; /* failed attempts on one input before the turn is parked */
} cph_policy_leases;

typedef struct cph_policy_sessions {
  int64_t max_queue;             /* pending inbox messages per session */
  int64_t max_batch;             /* staged messages per inbox turn */
  int64_t context_window_tokens; /* default for sessions that set none */
  int64_t warm_channels;         /* channels whose recent history stays in memory (chantail.h) */
  bool janitor;                  /* :janitor? — create the built-in maintenance session */
  /* :while-running {:interactive :enqueue ...}: per class (indexed by cph_lane), for the
   * sessions that set none of their own */
  cph_policy_while_running while_running[CPH_LANE_COUNT];
} cph_policy_sessions;

typedef struct cph_policy_context {
  int64_t keep_turns; /* turn contexts kept per session for the context explorer (0 = none) */
} cph_policy_context;

typedef struct cph_policy_dedupe {
  int64_t window_seconds;
  int64_t key_window_seconds;
  int64_t min_length;
  int64_t near_distance;
  int64_t shingle_words;
  /* :bulk — channel ids and sender names (1..256 bytes each, no duplicates, in the order
   * first written) whose traffic is bulk: near-duplicate folding applies to them (DESIGN §5).
   * bulk is NULL when bulk_count is 0. Ask cph_policy_dedupe_is_bulk rather than scanning. */
  char **bulk;
  size_t bulk_count;
} cph_policy_dedupe;

typedef struct cph_policy_gc {
  double min_age_hours;
  int64_t max_access;
  int64_t group_max_tokens;
  int64_t plan_interval_s;
  int64_t max_groups_per_plan;
} cph_policy_gc;

typedef struct cph_policy_outbox {
  int64_t min_batches_per_minute; /* guaranteed trickle (DESIGN §3.5) */
  int64_t batch_size;
  int64_t backoff_base_ms; /* <= backoff_max_ms */
  int64_t backoff_max_ms;
  int64_t drain_interval_s;
} cph_policy_outbox;

typedef struct cph_policy_embedding_queue {
  int64_t max_queue;
  bool pause_on_backpressure; /* :pause-on-backpressure? */
  int64_t batch_size;
} cph_policy_embedding_queue;

/* Retention for one channel (or the :events defaults, channel == NULL). */
typedef struct cph_policy_retention {
  char *channel;
  int64_t payload_keep_days;
  int64_t metadata_keep_days; /* >= payload_keep_days */
} cph_policy_retention;

typedef struct cph_policy_retention_section {
  cph_policy_retention events;    /* defaults for every channel */
  cph_policy_retention *channels; /* overrides, already merged over `events`, sorted by id */
  size_t channel_count;
  int64_t interval_s;
} cph_policy_retention_section;

typedef struct cph_policy_maintenance {
  int64_t workers;
  cph_policy_outbox outbox;
  cph_policy_embedding_queue embeddings;
  cph_policy_retention_section retention;
} cph_policy_maintenance;

/* Backpressure settings for one channel (or the :defaults, channel == NULL). */
typedef struct cph_policy_channel {
  char *channel;
  int64_t max_events_per_minute;        /* 0 = no limit */
  int64_t max_family_growth_per_minute; /* 0 = no limit */
  bool degrade_to_aggregate_only;       /* :degrade-to-aggregate-only? — start at step 1 */
  int64_t max_step;                     /* deepest degrade step, 0..5 (DESIGN §5) */
} cph_policy_channel;

typedef struct cph_policy_backpressure {
  int64_t interval_s;        /* one degrade step per interval while a trigger holds */
  int64_t recover_intervals; /* calm intervals before stepping back (hysteresis) */
  int64_t report_delay_factor; /* 1..1000: step 4 multiplies the interval of reports covering
                                  the channel by this */
  cph_policy_channel defaults;
  cph_policy_channel *channels; /* overrides, already merged over `defaults`, sorted by id */
  size_t channel_count;
} cph_policy_backpressure;

typedef struct cph_policy_embedder {
  cph_policy_provider_kind kind;
  char *url; /* non-empty when kind is OPENAI */
  char *model;
  char *api_key_env; /* name of the environment variable holding the key, never the key */
  int64_t dimensions;
  int64_t timeout_ms;
} cph_policy_embedder;

typedef struct cph_policy_summarizer {
  cph_policy_provider_kind kind;
  char *url; /* non-empty when kind is OPENAI */
  char *model;
  char *api_key_env;
  int64_t timeout_ms;
  int64_t max_tokens;
} cph_policy_summarizer;

typedef struct cph_policy_providers {
  cph_policy_embedder embeddings;
  cph_policy_summarizer summarizer;
  char *ca_file; /* "" = the system CA bundle; else the PEM CA https provider URLs must chain to */
} cph_policy_providers;

typedef struct cph_policy_vector_index {
  cph_policy_index_kind kind;
  char *url; /* non-empty when kind is HTTP */
  int64_t shards;
  int64_t timeout_ms;
} cph_policy_vector_index;

typedef struct cph_policy_metrics {
  bool enabled;         /* :enabled? */
  int64_t top_families; /* families exported as aggregate_dup_count{family} */
} cph_policy_metrics;

/* :cluster (DESIGN §14): present only when the section is given (cph_policy.cluster_enabled);
 * read at start, a reload does not change it. */
typedef struct cph_policy_cluster {
  char *node;      /* this node's name, unique in the cluster */
  char *advertise; /* the base URL other nodes and clients reach this node at */
  char **etcd;     /* etcd client URLs (v3 JSON gateway), at least one */
  size_t etcd_count;
  char **nats; /* NATS URLs of the replicated log (JetStream); none: no log */
  size_t nats_count;
  int64_t shards;            /* session and channel ids hash to this many shards */
  int64_t replicas;          /* replicas of the log's stream and bucket */
  int64_t lease_ttl_seconds; /* the etcd lease TTL that holds membership and ownership */
  /* The log's deduplication window (JetStream keeps every message id of it in memory); 0 =
   * :dedupe :key-window-seconds. A repeat after it is logged again and answered `accepted`;
   * its owner still applies it once (the engine's idempotency key), unless the shard moved. */
  int64_t log_dedupe_seconds;
  /* A served shard's log is trimmed below its watermark at most this often (server/clusterflow.h
   * 12.); 0: never. */
  int64_t log_trim_seconds;
  /* Turns running at once over the whole cluster (0: :scheduler :concurrency per node); each
   * node runs on its share, worked out every second from the nodes' demand (cluster.c). */
  int64_t concurrency;
} cph_policy_cluster;

typedef struct cph_policy {
  char *source; /* the file (or name) it was loaded from; "(defaults)" for new_default */
  cph_policy_server server;
  bool auth_enabled; /* an :auth section was given; without it only loopback is served */
  cph_policy_auth auth;
  cph_policy_store store;
  cph_policy_scheduler scheduler;
  cph_policy_leases leases;
  cph_policy_sessions sessions;
  cph_policy_context context;
  cph_policy_dedupe dedupe;
  cph_policy_gc gc;
  cph_policy_maintenance maintenance;
  cph_policy_backpressure backpressure;
  cph_policy_providers providers;
  cph_policy_vector_index vector_index;
  cph_policy_metrics metrics;
  bool cluster_enabled; /* a :cluster section was given; without it a node is alone */
  cph_policy_cluster cluster;
} cph_policy;

/* Reads and validates the policy file at path. On success returns CPH_OK and *out (free with
 * cph_policy_free). On failure *out = NULL and returns CPH_EIO (file unreadable; err->msg is
 * "PATH: <strerror>"), CPH_EPOLICY (syntax or schema error, message as above) or
 * CPH_ENOMEM. */
int cph_policy_load_file(const char *path, cph_policy **out, cph_err *err);

/* As cph_policy_load_file for text[0..len) (need not be NUL-terminated); name stands for the
 * file in messages and becomes p->source. */
int cph_policy_load_text(const char *name, const char *text, size_t len, cph_policy **out,
                         cph_err *err);

/* A policy holding every default (auth off); NULL on out-of-memory. */
cph_policy *cph_policy_new_default(void);

void cph_policy_free(cph_policy *p); /* NULL is fine */

/* Appends the effective policy as pretty-printed EDN: one key per line, nested maps indented,
 * every key present (an absent :auth is written as a comment), ending in a newline. Loading
 * the text back gives a policy equal to p (cph_policy_equal). Out-of-memory is reported
 * through the buffer (cph_buf_error). */
void cph_policy_write_edn(const cph_policy *p, cph_buf *out);

/* True when every setting is the same (source is ignored). */
bool cph_policy_equal(const cph_policy *a, const cph_policy *b);

/* The effective backpressure settings for a channel: its override (merged over :defaults)
 * if it has one, else &p->backpressure.defaults. Never NULL. O(log channels). */
const cph_policy_channel *cph_policy_backpressure_for(const cph_policy *p, const char *channel);

/* The effective retention for a channel: its override (merged over :events) if it has one,
 * else &p->maintenance.retention.events. Never NULL. O(log channels). */
const cph_policy_retention *cph_policy_retention_for(const cph_policy *p, const char *channel);

/* True when channel or sender is listed in :dedupe :bulk (exact, case-sensitive byte
 * match). Either may be NULL, which matches nothing. O(bulk_count) string compares: the list
 * is short (a few monitors and bots) and kept in the order written, so a linear scan beats
 * keeping a second, sorted copy. */
bool cph_policy_dedupe_is_bulk(const cph_policy *p, const char *channel, const char *sender);

/* Keyword names (without ':') for the enum values: "info", "batch", "openai", "http". */
const char *cph_policy_log_level_name(cph_policy_log_level v);
const char *cph_policy_sync_name(cph_policy_sync v);
const char *cph_policy_provider_kind_name(cph_policy_provider_kind v);
const char *cph_policy_index_kind_name(cph_policy_index_kind v);
/* "enqueue", "merge", "interrupt", "restart", "reject" */
const char *cph_policy_while_running_name(cph_policy_while_running v);
/* The mode named name (one of the above): CPH_OK, or CPH_EINVAL. */
int cph_policy_while_running_parse(const char *name, cph_policy_while_running *out);

#endif
