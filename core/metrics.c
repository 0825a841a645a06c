/* Metrics (DESIGN §10): the registry and exposition writer, and the engine's live counters.
 * Contract in metrics.h; the scrape is metrics_scrape.c. */
#include "metrics.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics_internal.h"

/* ================================================================ registry */

struct metric_series {
  char *label_values[METRIC_LABELS_MAX]; /* one per label of the family */
  uint64_t counter;
  double gauge;
  metric_hist *hist; /* histograms only */
};

struct metric_family {
  const char *name, *help;
  const char *labels[METRIC_LABELS_MAX];
  size_t n_labels;
  metric_type type;
  const double *bounds;
  size_t n_bounds;
  metric_series *series;
  size_t n_series, cap_series;
  bool failed; /* a series could not be added */
};

struct metric_registry {
  metric_family **families;
  size_t n, cap;
  bool failed; /* a family could not be added */
};

void metric_hist_init(metric_hist *h, const double *bounds, size_t n_bounds) {
  memset(h, 0, sizeof *h);
  h->bounds = bounds;
  h->n_bounds = n_bounds < METRIC_HIST_MAX_BOUNDS ? n_bounds : METRIC_HIST_MAX_BOUNDS;
}

void metric_hist_observe(metric_hist *h, double v) {
  if (isnan(v))
    return;
  size_t lo = 0, hi = h->n_bounds; /* the first bound >= v; n_bounds = the +Inf bucket */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (h->bounds[mid] < v)
      lo = mid + 1;
    else
      hi = mid;
  }
  h->counts[lo]++;
  h->count++;
  h->sum += v;
}

metric_registry *metric_registry_new(void) { return calloc(1, sizeof(metric_registry)); }

void metric_registry_free(metric_registry *r) {
  if (!r)
    return;
  for (size_t i = 0; i < r->n; i++) {
    metric_family *f = r->families[i];
    for (size_t j = 0; j < f->n_series; j++) {
      for (size_t k = 0; k < f->n_labels; k++)
        free(f->series[j].label_values[k]);
      free(f->series[j].hist);
    }
    free(f->series);
    free(f);
  }
  free(r->families);
  free(r);
}

metric_family *metric_family_add(metric_registry *r, const char *name, metric_type type,
                                 const char *help, const char *label, const double *bounds,
                                 size_t n_bounds) {
  if (r->n == r->cap) {
    size_t cap = r->cap ? r->cap * 2 : 32;
    metric_family **p = realloc(r->families, cap * sizeof *p);
    if (!p) {
      r->failed = true;
      return NULL;
    }
    r->families = p;
    r->cap = cap;
  }
  metric_family *f = calloc(1, sizeof *f);
  if (!f) {
    r->failed = true;
    return NULL;
  }
  f->name = name;
  f->help = help;
  if (label)
    f->labels[f->n_labels++] = label;
  f->type = type;
  if (type == METRIC_HISTOGRAM) {
    f->bounds = bounds;
    f->n_bounds = n_bounds;
  }
  r->families[r->n++] = f;
  return f;
}

bool metric_family_add_label(metric_family *f, const char *label) {
  if (!f || f->n_series || f->n_labels == METRIC_LABELS_MAX)
    return false;
  f->labels[f->n_labels++] = label;
  return true;
}

metric_series *metric_series_add(metric_family *f, const char *label_value) {
  return metric_series_addv(f, &label_value);
}

metric_series *metric_series_addv(metric_family *f, const char *const *label_values) {
  if (!f)
    return NULL;
  if (f->n_series == f->cap_series) {
    size_t cap = f->cap_series ? f->cap_series * 2 : 4;
    metric_series *p = realloc(f->series, cap * sizeof *p);
    if (!p) {
      f->failed = true;
      return NULL;
    }
    f->series = p;
    f->cap_series = cap;
  }
  metric_series s = {0};
  for (size_t k = 0; k < f->n_labels; k++)
    if (!(s.label_values[k] = strdup(label_values[k] ? label_values[k] : ""))) {
      while (k-- > 0)
        free(s.label_values[k]);
      f->failed = true;
      return NULL;
    }
  if (f->type == METRIC_HISTOGRAM) {
    if (!(s.hist = malloc(sizeof *s.hist))) {
      for (size_t k = 0; k < f->n_labels; k++)
        free(s.label_values[k]);
      f->failed = true;
      return NULL;
    }
    metric_hist_init(s.hist, f->bounds, f->n_bounds);
  }
  f->series[f->n_series] = s;
  return &f->series[f->n_series++];
}

void metric_counter_set(metric_series *s, uint64_t v) {
  if (s && !s->hist)
    s->counter = v;
}

void metric_gauge_set(metric_series *s, double v) {
  if (s && !s->hist)
    s->gauge = v;
}

metric_hist *metric_series_hist(metric_series *s) { return s ? s->hist : NULL; }

void metric_add_counter(metric_registry *r, const char *name, const char *help, uint64_t v) {
  metric_counter_set(
      metric_series_add(metric_family_add(r, name, METRIC_COUNTER, help, NULL, NULL, 0), NULL),
      v);
}

void metric_add_gauge(metric_registry *r, const char *name, const char *help, double v) {
  metric_gauge_set(
      metric_series_add(metric_family_add(r, name, METRIC_GAUGE, help, NULL, NULL, 0), NULL), v);
}

/* ================================================================ writer */

const char *metric_format_double(double v, char buf[32]) {
  if (isnan(v))
    return strcpy(buf, "NaN");
  if (isinf(v))
    return strcpy(buf, v > 0 ? "+Inf" : "-Inf");
  if (v == 0)
    return strcpy(buf, "0"); /* also -0 */
  if (v == floor(v) && fabs(v) < 1e15) {
    snprintf(buf, 32, "%.0f", v);
    return buf;
  }
  for (int prec = 15; prec <= 17; prec++) { /* the shortest that reads back the same */
    snprintf(buf, 32, "%.*g", prec, v);
    if (strtod(buf, NULL) == v)
      break;
  }
  return buf;
}

/* Length of the well-formed UTF-8 sequence at s (RFC 3629: no overlongs, no surrogates,
 * at most U+10FFFF), or 0 if it is not one. */
static size_t utf8_len(const unsigned char *s) {
  unsigned char c = s[0];
  if (c < 0x80)
    return 1;
  size_t n;
  uint32_t cp;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
    cp = c & 0x1F;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    cp = c & 0x0F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  for (size_t i = 1; i < n; i++) {
    if ((s[i] & 0xC0) != 0x80) /* also stops at the NUL */
      return 0;
    cp = cp << 6 | (s[i] & 0x3F);
  }
  if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
      (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
    return 0;
  return n;
}

/* HELP text: `\` and newline escaped. Label values also escape `"`. Both replace invalid
 * UTF-8 with U+FFFD. */
static void put_escaped(cph_buf *out, const char *text, bool label_value) {
  const unsigned char *s = (const unsigned char *)text;
  while (*s) {
    if (*s == '\\') {
      cph_buf_puts(out, "\\\\");
      s++;
    } else if (*s == '\n') {
      cph_buf_puts(out, "\\n");
      s++;
    } else if (*s == '"' && label_value) {
      cph_buf_puts(out, "\\\"");
      s++;
    } else {
      size_t n = utf8_len(s);
      if (n) {
        cph_buf_append(out, s, n);
        s += n;
      } else {
        cph_buf_puts(out, "\xEF\xBF\xBD");
        s++;
      }
    }
  }
}

static const char *type_name(metric_type t) {
  switch (t) {
  case METRIC_COUNTER: return "counter";
  case METRIC_GAUGE: return "gauge";
  case METRIC_HISTOGRAM: return "histogram";
  }
  return "untyped";
}

/* name[suffix]{label="value",...,le="bound"} — the braces only when there is a label. */
static void put_sample_name(cph_buf *out, const metric_family *f, const char *suffix,
                            const metric_series *s, const char *le) {
  cph_buf_puts(out, f->name);
  if (suffix)
    cph_buf_puts(out, suffix);
  /* A label whose value is empty is left out: Prometheus reads an empty label as absent, so
   * one family may hold series with and without it (cephalon_tool_calls_total's totals). */
  size_t written = 0;
  for (size_t k = 0; k < f->n_labels; k++) {
    if (!s->label_values[k] || !*s->label_values[k])
      continue;
    cph_buf_putc(out, written++ ? ',' : '{');
    cph_buf_puts(out, f->labels[k]);
    cph_buf_puts(out, "=\"");
    put_escaped(out, s->label_values[k], true);
    cph_buf_putc(out, '"');
  }
  if (le) {
    cph_buf_puts(out, written++ ? ",le=\"" : "{le=\"");
    cph_buf_puts(out, le);
    cph_buf_putc(out, '"');
  }
  if (written)
    cph_buf_putc(out, '}');
}

static void put_u64_line(cph_buf *out, uint64_t v) {
  cph_buf_printf(out, " %" PRIu64 "\n", v);
}

static void put_histogram(cph_buf *out, const metric_family *f, const metric_series *s) {
  const metric_hist *h = s->hist;
  char num[32];
  uint64_t cumulative = 0;
  for (size_t i = 0; i < h->n_bounds; i++) {
    cumulative += h->counts[i];
    put_sample_name(out, f, "_bucket", s, metric_format_double(h->bounds[i], num));
    put_u64_line(out, cumulative);
  }
  cumulative += h->counts[h->n_bounds];
  put_sample_name(out, f, "_bucket", s, "+Inf");
  put_u64_line(out, cumulative);
  put_sample_name(out, f, "_sum", s, NULL);
  cph_buf_printf(out, " %s\n", metric_format_double(h->sum, num));
  put_sample_name(out, f, "_count", s, NULL);
  put_u64_line(out, cumulative); /* == h->count: every observation is in one bucket */
}

int metric_registry_write(const metric_registry *r, cph_buf *out) {
  bool failed = r->failed;
  for (size_t i = 0; i < r->n; i++) {
    const metric_family *f = r->families[i];
    failed |= f->failed;
    cph_buf_printf(out, "# HELP %s ", f->name);
    put_escaped(out, f->help, false);
    cph_buf_printf(out, "\n# TYPE %s %s\n", f->name, type_name(f->type));
    for (size_t j = 0; j < f->n_series; j++) {
      const metric_series *s = &f->series[j];
      char num[32];
      switch (f->type) {
      case METRIC_COUNTER:
        put_sample_name(out, f, NULL, s, NULL);
        put_u64_line(out, s->counter);
        break;
      case METRIC_GAUGE:
        put_sample_name(out, f, NULL, s, NULL);
        cph_buf_printf(out, " %s\n", metric_format_double(s->gauge, num));
        break;
      case METRIC_HISTOGRAM:
        put_histogram(out, f, s);
        break;
      }
    }
  }
  return failed || cph_buf_error(out) ? CPH_ENOMEM : CPH_OK;
}

const double metrics_pick_wait_bounds[17] = METRICS_PICK_WAIT_BOUNDS;
const double metrics_inclusion_bounds[10] = METRICS_INCLUSION_BOUNDS;
const char *const metrics_tool_result_names[TOOL_RESULTS] = {"valid", "invalid", "error"};

static void add_sat(uint64_t *c, uint64_t n) { *c = *c > UINT64_MAX - n ? UINT64_MAX : *c + n; }

int metrics_open(cph_metrics **out) {
  cph_metrics *m = calloc(1, sizeof *m);
  if (!m)
    return CPH_ENOMEM;
  for (int i = 0; i < CPH_LANE_COUNT; i++)
    metric_hist_init(&m->live.pick_wait[i], metrics_pick_wait_bounds, N_OF(metrics_pick_wait_bounds));
  metric_hist_init(&m->live.inclusion, metrics_inclusion_bounds, N_OF(metrics_inclusion_bounds));
  m->saved = m->live;
  *out = m;
  return CPH_OK;
}

void metrics_close(cph_metrics *m) { free(m); }

void metrics_pass_begin(cph_metrics *m) {
  if (!m)
    return;
  m->live.passes++;
  m->saved = m->live;
  m->tools_dirty = false;
}

void metrics_pass_rollback(cph_metrics *m, int rc) {
  if (!m)
    return;
  metrics_live now = m->live;
  m->live = m->saved;
  m->live.passes = now.passes;
  m->live.storage_full = now.storage_full + (rc == CPH_EFULL);
  m->live.reload_failures = now.reload_failures;
  if (m->tools_dirty) {
    memcpy(m->tools, m->tools_saved, m->n_tools_saved * sizeof m->tools[0]);
    m->n_tools = m->n_tools_saved;
    m->tools_dirty = false;
  }
}

/* The slot of a tool name, added when new; the "_other" slot once the table is full. */
static tool_count *tool_slot(cph_metrics *m, const char *name) {
  char shown[129];
  snprintf(shown, sizeof shown, "%s", name);
  for (size_t i = 0; i < m->n_tools; i++)
    if (strcmp(m->tools[i].name, shown) == 0)
      return &m->tools[i];
  if (m->n_tools == METRICS_TOOLS_MAX - 1) /* the last slot is "_other" */
    snprintf(shown, sizeof shown, "_other");
  for (size_t i = 0; i < m->n_tools; i++)
    if (strcmp(m->tools[i].name, shown) == 0)
      return &m->tools[i];
  tool_count *t = &m->tools[m->n_tools++];
  memset(t, 0, sizeof *t);
  snprintf(t->name, sizeof t->name, "%s", shown);
  return t;
}

void metrics_event(cph_metrics *m, cph_ingest_status status) {
  if (m && (unsigned)status < N_STATUS)
    m->live.events[status]++;
}

void metrics_storage_full(cph_metrics *m) {
  if (m)
    m->live.storage_full++;
}

void metrics_turn_started(cph_metrics *m, cph_lane lane, int64_t waited_ns,
                          const cph_turn_info *ti) {
  if (!m || (unsigned)lane >= CPH_LANE_COUNT)
    return;
  m->live.started[lane]++;
  metric_hist_observe(&m->live.pick_wait[lane],
                      (double)(waited_ns > 0 ? waited_ns : 0) / (double)CPH_NS_PER_S);
  /* A lease that left the history or the memory out built none of it: nothing to count. */
  if (ti && ti->kind != CPH_KIND_JOB && !(ti->omit & (CPH_PART_HISTORY | CPH_PART_MEMORY)))
    metric_hist_observe(&m->live.inclusion, (double)(ti->n_memories + ti->n_history));
}

void metrics_turn_completed(cph_metrics *m, cph_lane lane, const cph_op *op) {
  if (!m || (unsigned)lane >= CPH_LANE_COUNT)
    return;
  m->live.completed[lane]++;
  add_sat(&m->live.tool_valid, op->u.turn.tool_stats.valid);
  add_sat(&m->live.tool_invalid, op->u.turn.tool_stats.invalid);
  add_sat(&m->live.tool_repairs, op->u.turn.tool_stats.repairs);
  add_sat(&m->live.guard_denies, op->u.turn.tool_stats.guard_denies);
  add_sat(&m->live.tokens[lane], op->u.turn.tokens);
  if (op->u.turn.tool_stats.n_tools && !m->tools_dirty) {
    memcpy(m->tools_saved, m->tools, m->n_tools * sizeof m->tools[0]);
    m->n_tools_saved = m->n_tools;
    m->tools_dirty = true;
  }
  for (size_t i = 0; i < op->u.turn.tool_stats.n_tools; i++) {
    const cph_tool_stat_in *in = &op->u.turn.tool_stats.tools[i];
    tool_count *t = tool_slot(m, in->name);
    /* A partition of the calls: refused for their arguments, ran and failed, ran fine. */
    uint64_t bad = in->invalid > in->calls ? in->calls : in->invalid;
    uint64_t err = in->errors > in->calls - bad ? in->calls - bad : in->errors;
    add_sat(&t->n[TOOL_INVALID], bad);
    add_sat(&t->n[TOOL_ERROR], err);
    add_sat(&t->n[TOOL_VALID], in->calls - bad - err);
  }
}

void metrics_turn_ended(cph_metrics *m, cph_lane lane, bool expired) {
  if (!m || (unsigned)lane >= CPH_LANE_COUNT)
    return;
  if (expired)
    m->live.expired[lane]++;
  else
    m->live.failed[lane]++;
}

void metrics_reload_failure(cph_metrics *m) {
  if (m)
    m->live.reload_failures++;
}

