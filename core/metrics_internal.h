/* The engine's live counters as the counting side (metrics.c) and the scrape
 * (metrics_scrape.c) share them. Private to those two files. */
#ifndef CEPHALON_CORE_METRICS_INTERNAL_H
#define CEPHALON_CORE_METRICS_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "metrics.h"

#define N_OF(a) (sizeof(a) / sizeof((a)[0]))
/* The histograms' bucket bounds (metrics.h); the live histograms point into these. */
extern const double metrics_pick_wait_bounds[17];
extern const double metrics_inclusion_bounds[10];
#define N_STATUS (CPH_EV_REJECTED + 1)

/* Everything counted as it happens: plain values, so saving and restoring around a pass is
 * one struct copy (about 1.5 KB). */
typedef struct metrics_live {
  uint64_t started[CPH_LANE_COUNT], completed[CPH_LANE_COUNT], failed[CPH_LANE_COUNT],
      expired[CPH_LANE_COUNT];
  metric_hist pick_wait[CPH_LANE_COUNT];
  metric_hist inclusion;
  uint64_t events[N_STATUS];
  uint64_t tool_valid, tool_invalid, tool_repairs, guard_denies;
  uint64_t tokens[CPH_LANE_COUNT]; /* completions' cost.tokens */
  uint64_t passes, storage_full, reload_failures;
} metrics_live;

/* Per-tool counts from completions' tool_stats.tools, by result. Kept beside `live` (too big
 * to copy every pass): a pass that touches them saves a copy first (tools_saved), and a
 * rollback puts it back. Names beyond METRICS_TOOLS_MAX distinct ones count as "_other". */
#define METRICS_TOOLS_MAX 128
enum { TOOL_VALID, TOOL_INVALID, TOOL_ERROR, TOOL_RESULTS };
extern const char *const metrics_tool_result_names[TOOL_RESULTS]; /* "valid", ... */

typedef struct tool_count {
  char name[129];
  uint64_t n[TOOL_RESULTS];
} tool_count;

struct cph_metrics {
  metrics_live live;
  metrics_live saved; /* at the start of the current pass */
  uint64_t scrapes;   /* rotates the credits sample (see add_credits) */
  tool_count tools[METRICS_TOOLS_MAX];
  size_t n_tools;
  tool_count tools_saved[METRICS_TOOLS_MAX]; /* valid while tools_dirty */
  size_t n_tools_saved;
  bool tools_dirty; /* this pass changed tools[] */
};

#endif
