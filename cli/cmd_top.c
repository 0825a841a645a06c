/* cephalonctl top [--interval SECONDS] [--limit N] [--once]
 *
 * A live view of cephalond from GET /v1/top: lanes, the busiest sessions, maintenance (outbox,
 * embedding queue, compaction) and the channels under backpressure. Without --once it clears
 * the screen (ANSI "ESC[H ESC[2J") and redraws every interval until SIGINT or SIGTERM, then
 * exits 0; a failed fetch is reported on stderr and retried at the next interval. With --once
 * it prints one frame without any escape sequence and exits (1 if the fetch failed), for
 * scripts and tests. With the global --json each frame is the daemon's JSON, never cleared.
 *
 * Every string the daemon sends is printed with control characters replaced, so an answer
 * (a channel name, say) cannot move the cursor or rewrite the terminal. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <time.h>

#include "cli/cli.h"

#define TOP_DEFAULT_INTERVAL_S 2.0
#define TOP_MIN_INTERVAL_S 0.1
#define TOP_MAX_INTERVAL_S 86400.0
#define TOP_MAX_LIMIT 100 /* the daemon's cap (CPH_TOP_SESSIONS_MAX) */

#define ANSI_CLEAR "\033[H\033[2J"

static void top_usage(FILE *out) {
  fprintf(out,
          "usage: cephalonctl top [--interval SECONDS] [--limit N] [--once]\n"
          "  A live view of lanes, the busiest sessions, maintenance and backpressure,\n"
          "  redrawn every --interval seconds (default 2, at least 0.1) until Ctrl-C.\n"
          "  --limit N  how many of the busiest sessions to show (default 10, at most %d)\n"
          "  --once     print one frame without clearing the screen, then exit\n",
          TOP_MAX_LIMIT);
}

/* ---------------------------------------------------------------- stopping */

static volatile sig_atomic_t top_stop;
static sigset_t top_unblocked; /* the mask before install_stop_handlers: used while sleeping */

static void on_stop_signal(int sig) {
  (void)sig;
  top_stop = 1;
}

/* SIGINT/SIGTERM set top_stop. They stay blocked except while sleeping between frames
 * (pselect swaps the mask atomically), so a signal can never slip in between the check of
 * top_stop and the sleep: one that arrives while a frame is fetched or drawn is delivered
 * as the sleep begins, which then ends at once. */
static void install_stop_handlers(void) {
  cli_on_stop_signals(on_stop_signal);
  sigset_t block;
  sigemptyset(&block);
  sigaddset(&block, SIGINT);
  sigaddset(&block, SIGTERM);
  sigprocmask(SIG_BLOCK, &block, &top_unblocked);
  sigdelset(&top_unblocked, SIGINT);
  sigdelset(&top_unblocked, SIGTERM);
}

/* Sleeps `seconds`, or less when a stop signal comes. */
static void sleep_interval(double seconds) {
  struct timespec ts;
  ts.tv_sec = (time_t)seconds;
  ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
  if (!top_stop)
    pselect(0, NULL, NULL, NULL, &ts, &top_unblocked);
}

/* ---------------------------------------------------------------- rendering */

/* s with control characters replaced by '?', in b (reset first). NULL and "" print "-". */
static const char *clean(cph_buf *b, const char *s) {
  cph_buf_reset(b);
  if (!s || !*s)
    return "-";
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    cph_buf_putc(b, c < 0x20 || c == 0x7f ? '?' : (char)c);
  }
  return b->failed || !b->data ? "-" : b->data;
}

/* The number at obj[key] with `decimals` decimals, or "-" when absent. */
static const char *num(char *dst, size_t n, const json_t *obj, const char *key, int decimals) {
  double v;
  if (cli_json_number(obj, key, &v))
    snprintf(dst, n, "%.*f", decimals, v);
  else
    snprintf(dst, n, "-");
  return dst;
}

/* Returns 0 or CLI_EXIT_FAIL (out of memory, reported). */
static int render_lanes(FILE *f, const json_t *top) {
  static const char *const headers[] = {"LANE",     "TURNS_LEFT", "TURNS/MIN", "TOOL_CALLS_LEFT",
                                        "RUNNABLE", "RUNNING"};
  const json_t *conc = json_object_get(top, "concurrency");
  char in_use[32], limit[32];
  fprintf(f, "concurrency: %s of %s in use\n\n", num(in_use, sizeof in_use, conc, "in_use", 0),
          num(limit, sizeof limit, conc, "limit", 0));
  cli_table t;
  cli_table_init(&t, 6, headers, 0x3e);
  cph_buf name = CPH_BUF_INIT;
  size_t i;
  const json_t *lane;
  json_array_foreach(json_object_get(top, "lanes"), i, lane) {
    const json_t *budget = json_object_get(lane, "budget");
    char left[32], per_min[32], tools[32], runnable[32], running[32];
    cli_table_add(&t, (const char *const[]){
                          clean(&name, cli_json_string(lane, "name")),
                          num(left, sizeof left, lane, "turns_left", 1),
                          num(per_min, sizeof per_min, budget, "turns", 0),
                          num(tools, sizeof tools, lane, "tool_calls_left", 1),
                          num(runnable, sizeof runnable, lane, "runnable", 0),
                          num(running, sizeof running, lane, "running", 0)});
  }
  int rc = cli_table_print(&t, f);
  cli_table_free(&t);
  cph_buf_free(&name);
  return rc;
}

static int render_sessions(FILE *f, const json_t *top) {
  static const char *const headers[] = {"SESSION", "CLASS",   "STATE",
                                        "STAGED",  "PENDING", "CREDITS"};
  const json_t *list = json_object_get(top, "sessions");
  fputs("\nbusiest sessions (staged + pending):\n", f);
  if (json_array_size(list) == 0) {
    fputs("  none: no session has input waiting\n", f);
    return CLI_EXIT_OK;
  }
  cli_table t;
  cli_table_init(&t, 6, headers, 0x38);
  cph_buf id = CPH_BUF_INIT, klass = CPH_BUF_INIT, state = CPH_BUF_INIT;
  size_t i;
  const json_t *s;
  json_array_foreach(list, i, s) {
    char staged[32], pending[32], credits[32];
    cli_table_add(&t, (const char *const[]){clean(&id, cli_json_string(s, "id")),
                                            clean(&klass, cli_json_string(s, "class")),
                                            clean(&state, cli_json_string(s, "state")),
                                            num(staged, sizeof staged, s, "staged", 0),
                                            num(pending, sizeof pending, s, "pending", 0),
                                            num(credits, sizeof credits, s, "credits", 1)});
  }
  int rc = cli_table_print(&t, f);
  cli_table_free(&t);
  cph_buf_free(&id);
  cph_buf_free(&klass);
  cph_buf_free(&state);
  return rc;
}

static void render_maintenance(FILE *f, const json_t *top) {
  const json_t *m = json_object_get(top, "maintenance");
  char pending[32], age[32], embed[32], groups[32], deleted[32];
  fprintf(f,
          "\nmaintenance:\n"
          "  outbox: %s pending, oldest %s s   embedding queue: %s\n"
          "  compaction groups committed: %s   memories deleted: %s\n",
          num(pending, sizeof pending, m, "outbox_pending", 0),
          num(age, sizeof age, m, "outbox_oldest_age_seconds", 1),
          num(embed, sizeof embed, m, "embed_queue", 0),
          num(groups, sizeof groups, m, "groups_committed_total", 0),
          num(deleted, sizeof deleted, m, "memories_deleted_total", 0));
}

static int render_backpressure(FILE *f, const json_t *top) {
  static const char *const headers[] = {"CHANNEL", "STEP", "MEANING"};
  const json_t *list = json_object_get(top, "degraded_channels");
  fputs("\nbackpressure:\n", f);
  if (json_array_size(list) == 0) {
    fputs("  every channel at step 0 (normal)\n", f);
    return CLI_EXIT_OK;
  }
  cli_table t;
  cli_table_init(&t, 3, headers, 0x2);
  cph_buf chan = CPH_BUF_INIT, name = CPH_BUF_INIT;
  size_t i;
  const json_t *c;
  json_array_foreach(list, i, c) {
    char step[32];
    cli_table_add(&t, (const char *const[]){clean(&chan, cli_json_string(c, "channel")),
                                            num(step, sizeof step, c, "step", 0),
                                            clean(&name, cli_json_string(c, "step_name"))});
  }
  int rc = cli_table_print(&t, f);
  cli_table_free(&t);
  cph_buf_free(&chan);
  cph_buf_free(&name);
  double total;
  if (rc == CLI_EXIT_OK && cli_json_number(top, "degraded_channels_total", &total) &&
      total > (double)json_array_size(list))
    fprintf(f, "  ... and %.0f more degraded channels\n", total - (double)json_array_size(list));
  return rc;
}

/* The header line: where, when, which policy, how often. */
static void render_header(FILE *f, const cli_ctx *ctx, const json_t *top, double interval,
                          bool once) {
  char when[64] = "-";
  double ts_ms;
  if (cli_json_number(top, "ts_ms", &ts_ms)) {
    time_t secs = (time_t)(ts_ms / 1000.0);
    struct tm tm;
    if (localtime_r(&secs, &tm))
      strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S %Z", &tm);
  }
  char gen[32];
  cph_buf url = CPH_BUF_INIT;
  fprintf(f, "cephalond at %s  %s  policy generation %s", clean(&url, ctx->url), when,
          num(gen, sizeof gen, top, "policy_generation", 0));
  cph_buf_free(&url);
  if (!once)
    fprintf(f, "  (every %gs, Ctrl-C quits)", interval);
  fputc('\n', f);
}

/* Renders a whole frame into memory first, so the screen is cleared and redrawn in one
 * write. Returns CLI_EXIT_OK, or CLI_EXIT_FAIL with a message on stderr. */
static int render_frame(const cli_ctx *ctx, const json_t *top, double interval, bool once,
                        char **text, size_t *len) {
  if (!json_is_object(top) || !json_is_array(json_object_get(top, "lanes"))) {
    fprintf(stderr, "cephalonctl: GET /v1/top: unexpected answer (no \"lanes\" list)\n");
    return CLI_EXIT_FAIL;
  }
  *text = NULL;
  *len = 0;
  FILE *f = open_memstream(text, len);
  if (!f) {
    fprintf(stderr, "cephalonctl: out of memory\n");
    return CLI_EXIT_FAIL;
  }
  render_header(f, ctx, top, interval, once);
  int rc = render_lanes(f, top);
  if (rc == CLI_EXIT_OK)
    rc = render_sessions(f, top);
  if (rc == CLI_EXIT_OK) {
    render_maintenance(f, top);
    rc = render_backpressure(f, top);
  }
  if (fclose(f) != 0 && rc == CLI_EXIT_OK) {
    fprintf(stderr, "cephalonctl: out of memory\n");
    rc = CLI_EXIT_FAIL;
  }
  if (rc != CLI_EXIT_OK) {
    free(*text);
    *text = NULL;
  }
  return rc;
}

/* One fetch and one frame on stdout. CLI_EXIT_OK, or CLI_EXIT_FAIL (reported on stderr). */
static int show_frame(const cli_ctx *ctx, const char *path, double interval, bool once) {
  cli_reply r;
  int rc = cli_call(ctx, "GET", path, NULL, CLI_TIMEOUT_MS, 0, &r);
  if (rc != CLI_EXIT_OK)
    goto out;
  if (ctx->json) {
    rc = cli_print_reply_json(&r);
    goto out;
  }
  char *text;
  size_t len;
  if ((rc = render_frame(ctx, r.json, interval, once, &text, &len)) != CLI_EXIT_OK)
    goto out;
  if (!once)
    fputs(ANSI_CLEAR, stdout);
  fwrite(text, 1, len, stdout);
  free(text);
  rc = cli_finish_output();
out:
  cli_reply_free(&r);
  return rc;
}

/* ---------------------------------------------------------------- the command */

/* "2", "0.5": a decimal number of seconds within the allowed range. */
static int parse_interval(const char *s, double *out) {
  char *end = NULL;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v) || v < TOP_MIN_INTERVAL_S ||
      v > TOP_MAX_INTERVAL_S) {
    fprintf(stderr, "cephalonctl: --interval wants seconds from %g to %g, got '",
            TOP_MIN_INTERVAL_S, TOP_MAX_INTERVAL_S);
    cli_put_clean(stderr, s);
    fputs("'\n", stderr);
    return -1;
  }
  *out = v;
  return 0;
}

int cli_cmd_top(const cli_ctx *ctx, int argc, char **argv) {
  /* --once is a flag, which cli_parse_args does not know: take it out first (only before a
   * "--", where options end). */
  char **args = calloc((size_t)argc + 1, sizeof *args);
  if (!args) {
    fprintf(stderr, "cephalonctl: out of memory\n");
    return CLI_EXIT_FAIL;
  }
  bool once = false, options_done = false;
  int nargs = 0;
  for (int i = 1; i < argc; i++) {
    if (!options_done && strcmp(argv[i], "--") == 0)
      options_done = true;
    if (!options_done && strcmp(argv[i], "--once") == 0)
      once = true;
    else
      args[nargs++] = argv[i];
  }
  const char *interval_text = NULL;
  cli_uint limit = {0};
  const cli_opt opts[] = {
      {"--interval", CLI_OPT_STRING, &interval_text, 0},
      {"--limit", CLI_OPT_UINT, &limit, TOP_MAX_LIMIT},
  };
  const char *pos[1];
  size_t npos;
  int r = cli_parse_args(nargs, args, opts, sizeof opts / sizeof opts[0], pos, 0, &npos);
  free(args);
  double interval = TOP_DEFAULT_INTERVAL_S;
  if (r == 0 && interval_text && parse_interval(interval_text, &interval) != 0)
    r = -1;
  if (r == 1) {
    top_usage(stdout);
    return CLI_EXIT_OK;
  }
  if (r < 0) {
    top_usage(stderr);
    return CLI_EXIT_USAGE;
  }

  cph_buf path = CPH_BUF_INIT;
  cph_buf_puts(&path, "/v1/top");
  if (limit.set)
    cli_query_u64(&path, "limit", limit.value);
  if (cph_buf_error(&path) != 0) {
    cph_buf_free(&path);
    fprintf(stderr, "cephalonctl: out of memory\n");
    return CLI_EXIT_FAIL;
  }

  int rc;
  if (once) {
    rc = show_frame(ctx, path.data, interval, true);
  } else {
    install_stop_handlers();
    rc = CLI_EXIT_OK;
    while (!top_stop) {
      int frc = show_frame(ctx, path.data, interval, false);
      if (frc != CLI_EXIT_OK && !top_stop) {
        if (frc == CLI_EXIT_USAGE) { /* a malformed --url or token never gets better */
          rc = frc;
          break;
        }
        fprintf(stderr, "cephalonctl: retrying in %gs (Ctrl-C quits)\n", interval);
      }
      sleep_interval(interval);
    }
    if (rc == CLI_EXIT_OK && !ctx->json)
      fputc('\n', stdout);
  }
  cph_buf_free(&path);
  return rc;
}
