/* Metrics (DESIGN §10). Private to core/. Two parts:
 *
 * 1. A small registry and the Prometheus text exposition writer (format 0.0.4). A registry
 *    holds families in the order they were added; a family has a name (units in it:
 *    `_seconds`, `_bytes`, counters end in `_total`), a HELP text, a type and up to
 *    METRIC_LABELS_MAX labels; a series is one sample, with a value for each label. Counters hold exact integers (uint64,
 *    saturating), gauges doubles, histograms fixed buckets (metric_hist). The writer emits
 *    `# HELP` and `# TYPE` for every family — also one without series — then its samples;
 *    histograms as cumulative `_bucket{le=...}` lines ending in `le="+Inf"`, then `_sum` and
 *    `_count`. HELP text escapes `\` and newline; label values escape `\`, `"` and newline,
 *    and invalid UTF-8 becomes U+FFFD (Prometheus requires UTF-8). A registry is a scratch
 *    object: the engine builds one per scrape and frees it. No locking: one thread.
 *
 * 2. The engine's metrics: the live counters and histograms the engine bumps where things
 *    happen (metrics_* below, O(1) each, never per session), and the scrape
 *    (cph_engine_metrics_text) that reads them together with gauges taken from engine state.
 *
 * Counting follows the pass's commit: metrics_pass_begin() saves the live values and
 * metrics_pass_rollback() puts them back when the pass's commit failed, so nothing that did
 * not land is counted (the operations of that pass all failed too). The exceptions, by
 * nature: passes and storage-full errors count the failed pass, and the counters the engine
 * keeps elsewhere (dedupe, compaction) follow their owners, which rebuild from the store
 * after a failed commit (a counter reset to Prometheus, which rate() handles). */
#ifndef CEPHALON_CORE_METRICS_H
#define CEPHALON_CORE_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cephalon/cephalon.h"
#include "common/buf.h"
#include "env.h"

/* ---------------------------------------------------------------- registry and writer */

typedef enum metric_type { METRIC_COUNTER, METRIC_GAUGE, METRIC_HISTOGRAM } metric_type;

#define METRIC_HIST_MAX_BOUNDS 24

/* A histogram with fixed buckets: bounds[0..n_bounds) are the upper bounds, ascending and
 * finite; the +Inf bucket is implicit. counts[i] counts observations in bucket i alone
 * (counts[n_bounds] those above the last bound); the writer makes them cumulative. A plain
 * value: copying it copies the histogram (bounds point to storage that outlives it). */
typedef struct metric_hist {
  const double *bounds;
  size_t n_bounds;
  uint64_t counts[METRIC_HIST_MAX_BOUNDS + 1];
  uint64_t count;
  double sum;
} metric_hist;

/* n_bounds is clamped to METRIC_HIST_MAX_BOUNDS. */
void metric_hist_init(metric_hist *h, const double *bounds, size_t n_bounds);
/* O(log n_bounds). An observation equal to a bound falls in that bound's bucket (le). NaN is
 * ignored. */
void metric_hist_observe(metric_hist *h, double v);

typedef struct metric_registry metric_registry;
typedef struct metric_family metric_family;
typedef struct metric_series metric_series;

metric_registry *metric_registry_new(void);
void metric_registry_free(metric_registry *r);

#define METRIC_LABELS_MAX 2

/* Adds a family. name, help and label (NULL: no label) are borrowed: they must outlive the
 * registry. For a histogram, bounds/n_bounds give its buckets (borrowed likewise; ignored
 * otherwise). NULL on out of memory (the registry then reports it at write). */
metric_family *metric_family_add(metric_registry *r, const char *name, metric_type type,
                                 const char *help, const char *label, const double *bounds,
                                 size_t n_bounds);

/* Appends a label name (borrowed) to a family that has no series yet; false when it has or
 * already has METRIC_LABELS_MAX labels. */
bool metric_family_add_label(metric_family *f, const char *label);

/* Appends a series. label_value is copied (NULL for a family without a label). A family
 * keeps series in the order added and does not look for repeats: each label value once.
 * NULL on out of memory. */
metric_series *metric_series_add(metric_family *f, const char *label_value);
/* The same for a family with several labels: one value per label, in the labels' order. */
metric_series *metric_series_addv(metric_family *f, const char *const *label_values);

/* Sample values; each applies to the series' type only (a mismatch is ignored). */
void metric_counter_set(metric_series *s, uint64_t v);
void metric_gauge_set(metric_series *s, double v);
/* The series' histogram (initialised with the family's bounds), to observe into or copy
 * over; NULL for another type. */
metric_hist *metric_series_hist(metric_series *s);

/* Shortcuts: one family with one unlabelled sample. */
void metric_add_counter(metric_registry *r, const char *name, const char *help, uint64_t v);
void metric_add_gauge(metric_registry *r, const char *name, const char *help, double v);

/* Appends the exposition of every family. CPH_OK, or CPH_ENOMEM when the registry or out
 * failed to allocate (out is then incomplete). */
int metric_registry_write(const metric_registry *r, cph_buf *out);

/* Prometheus number text: integers exactly, others the shortest text that reads back to
 * the same double; "NaN", "+Inf", "-Inf". buf holds at least 32 bytes. */
const char *metric_format_double(double v, char buf[32]);

/* ---------------------------------------------------------------- the engine's metrics */

typedef struct cph_metrics cph_metrics;

/* Buckets (upper bounds). Pick waits: 1 ms to 5 min. Context inclusion: items. */
#define METRICS_PICK_WAIT_BOUNDS                                                              \
  {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}
#define METRICS_INCLUSION_BOUNDS {0, 1, 2, 4, 8, 16, 32, 64, 128, 256}
/* Sessions whose credits one scrape samples at most (see metrics_text). */
#define METRICS_CREDITS_SAMPLE_MAX 10000
/* Tests only: the sample's bound from the next scrape on (0: METRICS_CREDITS_SAMPLE_MAX), so a
 * test covers the rotating sample with a thousand sessions rather than ten thousand (12,000
 * session creates took a minute under the sanitizers). Process-wide. */
void metrics_test_credits_sample_max(size_t n);
/* Degraded channels without a policy override exported as backpressure_step at most. */
#define METRICS_BP_CHANNELS_MAX 200

/* From cph_engine_open / cph_engine_close: the counters live as long as the engine (they are
 * kept across memory rebuilds). */
int metrics_open(cph_metrics **out);
void metrics_close(cph_metrics *m);

/* The pass (engine.c): begin counts the pass and saves the live values; rollback, after a
 * failed commit and before memory is rebuilt, restores them and counts a storage-full
 * commit (rc CPH_EFULL). */
void metrics_pass_begin(cph_metrics *m);
void metrics_pass_rollback(cph_metrics *m, int rc);

/* ingest.c: one event's result (after it landed in the pass txn, or was rejected). */
void metrics_event(cph_metrics *m, cph_ingest_status status);
/* A write failed because the store is full (507 on ingest). */
void metrics_storage_full(cph_metrics *m);

/* turns.c: a turn started (the pick's wait; the context's memories + history entries, not
 * observed for job turns, which carry no context); a turn completed (its tool_stats); a
 * lease ended without completion (failed by the worker, or expired). */
void metrics_turn_started(cph_metrics *m, cph_lane lane, int64_t waited_ns,
                          const cph_turn_info *ti);
void metrics_turn_completed(cph_metrics *m, cph_lane lane, const cph_op *op);
void metrics_turn_ended(cph_metrics *m, cph_lane lane, bool expired);
/* A policy reload was refused (cph_engine_note_reload_failure). */
void metrics_reload_failure(cph_metrics *m);

/* ---- the scrape (metrics_scrape.c) */

struct cph_sessions;
struct cph_backpressure;
struct cph_dedupe;

/* What a scrape reads: the counters, and the gauges of the modules that own them (the
 * engine gathers the lanes, maintenance and storage figures through its public reads). */
typedef struct metrics_sources {
  const cph_core_env *env;
  cph_metrics *metrics; /* the scrape rotates its credits sample here */
  const struct cph_sessions *sessions;
  struct cph_backpressure *bp;
  struct cph_dedupe *dedupe;
  uint64_t folded_total; /* cephalon_inbox_overflow_folded_total (ingest) */
  uint64_t prepared_total; /* cephalon_ingest_prepared_events_total (ingest) */
  cph_lane_info lanes[CPH_LANE_COUNT];
  uint32_t concurrency_limit, concurrency_in_use;
  cph_maint_stats maint;
  bool have_storage;
  cph_engine_storage storage;
} metrics_sources;

/* The Prometheus text (malloc'd; *len its length), NULL on out of memory. Cost: O(lanes +
 * METRICS_CREDITS_SAMPLE_MAX + top families + policy overrides + channels backpressure
 * tracks), never O(sessions); the text is a few KB plus one line per exported family and
 * channel. */
char *metrics_text(const metrics_sources *src, size_t *len);

#endif
