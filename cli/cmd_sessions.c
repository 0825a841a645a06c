/* cephalonctl sessions list | show ID | why ID, and cephalonctl why ID */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"

static void sessions_usage(FILE *out) {
  fprintf(out,
          "usage: cephalonctl sessions list [--class C] [--state S] [--after ID] [--limit N]\n"
          "       cephalonctl sessions show ID\n"
          "       cephalonctl sessions why ID\n"
          "  list  sessions in id order (class interactive|operational|maintenance,\n"
          "        state idle|queued|running|paused; --after ID pages on)\n"
          "  show  one session's fields\n"
          "  why   why the session is or is not running, one line per reason\n");
}

static int usage_error(void) {
  sessions_usage(stderr);
  return CLI_EXIT_USAGE;
}

/* Formats a value into a cell, or "-" on allocation failure (which the table reports). */
static char *format_cell(cph_buf *b, const json_t *v) {
  cph_buf_reset(b);
  cli_format_value(b, v);
  return b->data && !b->failed ? b->data : "-";
}

/* ---------------------------------------------------------------- list */

static int print_session_table(const json_t *list) {
  static const char *const headers[] = {"ID", "CLASS", "STATE", "CREDITS", "EPISODE", "SUBSCRIBE"};
  cli_table t;
  cli_table_init(&t, 6, headers, 0x18);
  cph_buf episode = CPH_BUF_INIT, subscribe = CPH_BUF_INIT;
  size_t i;
  const json_t *s;
  json_array_foreach(list, i, s) {
    char credits_text[32] = "-";
    double c;
    if (cli_json_number(s, "credits", &c))
      snprintf(credits_text, sizeof credits_text, "%.1f", c);
    cli_table_add(&t, (const char *const[]){
                          cli_json_string(s, "id"), cli_json_string(s, "class"),
                          cli_json_string(s, "state"), credits_text,
                          format_cell(&episode, json_object_get(s, "episode")),
                          format_cell(&subscribe, json_object_get(s, "subscribe"))});
  }
  int rc = cli_table_print(&t, stdout);
  cli_table_free(&t);
  cph_buf_free(&episode);
  cph_buf_free(&subscribe);
  return rc;
}

static int sessions_list(const cli_ctx *ctx, int argc, char **argv) {
  const char *klass = NULL, *state = NULL, *after = NULL;
  cli_uint limit = {0};
  const cli_opt opts[] = {
      {"--class", CLI_OPT_STRING, &klass, 0},
      {"--state", CLI_OPT_STRING, &state, 0},
      {"--after", CLI_OPT_STRING, &after, 0},
      {"--limit", CLI_OPT_UINT, &limit, 1000000},
  };
  const char *pos[1];
  size_t npos;
  int r = cli_parse_args(argc, argv, opts, sizeof opts / sizeof opts[0], pos, 0, &npos);
  if (r == 1) {
    sessions_usage(stdout);
    return CLI_EXIT_OK;
  }
  if (r < 0)
    return usage_error();

  cph_buf path = CPH_BUF_INIT;
  cph_buf_puts(&path, "/v1/sessions");
  if (klass)
    cli_query_param(&path, "class", klass);
  if (state)
    cli_query_param(&path, "state", state);
  if (after)
    cli_query_param(&path, "after", after);
  if (limit.set)
    cli_query_u64(&path, "limit", limit.value);
  cli_reply reply;
  bool printed;
  int rc = cli_get(ctx, &path, &reply, &printed);
  if (rc != CLI_EXIT_OK || printed)
    goto out;
  /* {"sessions": [...], "next"?: ...}; a bare array is accepted too. */
  const json_t *list = json_is_array(reply.json) ? reply.json
                                                 : json_object_get(reply.json, "sessions");
  if (!json_is_array(list)) {
    fprintf(stderr, "cephalonctl: GET /v1/sessions: unexpected answer (no \"sessions\" list)\n");
    rc = CLI_EXIT_FAIL;
    goto out;
  }
  if (json_array_size(list) == 0) {
    printf("no sessions\n");
  } else if ((rc = print_session_table(list)) != 0) {
    goto out;
  }
  const json_t *next = json_is_object(reply.json) ? json_object_get(reply.json, "next") : NULL;
  if ((json_is_string(next) && json_string_length(next) > 0) || json_is_integer(next)) {
    cph_buf b = CPH_BUF_INIT;
    cli_format_value(&b, next);
    printf("more: cephalonctl sessions list --after ");
    cli_put_clean(stdout, b.data ? b.data : "-");
    fputc('\n', stdout);
    cph_buf_free(&b);
  }
  rc = cli_finish_output();
out:
  cph_buf_free(&path);
  cli_reply_free(&reply);
  return rc;
}

/* ---------------------------------------------------------------- show */

/* The session fields of DESIGN §9 in their order; any other field follows. */
static const char *const session_fields[] = {
    "id",      "class", "state",  "credits",  "episode", "subscribe", "member", "autonomy_interval_s",
    "report_interval_s", "context_window_tokens", "system", "tools"};
#define SESSION_FIELD_COUNT (sizeof session_fields / sizeof session_fields[0])

static bool is_known_field(const char *key) {
  for (size_t i = 0; i < SESSION_FIELD_COUNT; i++)
    if (strcmp(key, session_fields[i]) == 0)
      return true;
  return false;
}

/* "key:   value", continuation lines of a multi-line value indented under the value. */
static void print_field(const char *key, const json_t *v, int width, cph_buf *b) {
  cph_buf_reset(b);
  cli_format_value(b, v);
  printf("%s:%*s", key, width - (int)strlen(key) + 1, "");
  const char *s = b->data ? b->data : "-";
  for (const char *nl; (nl = strchr(s, '\n')); s = nl + 1) {
    fwrite(s, 1, (size_t)(nl - s), stdout);
    printf("\n%*s", width + 2, "");
  }
  printf("%s\n", s);
}

static int print_session(const json_t *s) {
  int width = 0;
  const char *key;
  const json_t *v;
  json_object_foreach((json_t *)s, key, v) {
    if ((int)strlen(key) > width)
      width = (int)strlen(key);
  }
  for (size_t i = 0; i < SESSION_FIELD_COUNT; i++)
    if (json_object_get(s, session_fields[i]) && (int)strlen(session_fields[i]) > width)
      width = (int)strlen(session_fields[i]);
  cph_buf b = CPH_BUF_INIT;
  for (size_t i = 0; i < SESSION_FIELD_COUNT; i++) {
    const json_t *field = json_object_get(s, session_fields[i]);
    if (field)
      print_field(session_fields[i], field, width, &b);
  }
  json_object_foreach((json_t *)s, key, v) {
    if (!is_known_field(key))
      print_field(key, v, width, &b);
  }
  bool failed = b.failed;
  cph_buf_free(&b);
  if (failed) {
    fprintf(stderr, "cephalonctl: out of memory\n");
    return CLI_EXIT_FAIL;
  }
  return cli_finish_output();
}

/* GET /v1/sessions/{id}[suffix] into *reply; prints --json output itself. Returns the exit
 * code; *printed tells whether the output is done. */
static int get_session_resource(const cli_ctx *ctx, const char *id, const char *suffix,
                                cli_reply *reply, bool *printed) {
  cph_buf path = CPH_BUF_INIT;
  cph_buf_puts(&path, "/v1/sessions/");
  cli_path_segment(&path, id);
  cph_buf_puts(&path, suffix);
  int rc = cli_get(ctx, &path, reply, printed);
  cph_buf_free(&path);
  return rc;
}

static int sessions_show(const cli_ctx *ctx, const char *id) {
  cli_reply reply;
  bool printed;
  int rc = get_session_resource(ctx, id, "", &reply, &printed);
  if (rc == 0 && !printed) {
    const json_t *s = reply.json;
    /* Accept {"session": {...}} as well as the bare session object. */
    if (json_is_object(s) && !json_object_get(s, "id") && json_is_object(json_object_get(s, "session")))
      s = json_object_get(s, "session");
    if (json_is_object(s)) {
      rc = print_session(s);
    } else {
      fprintf(stderr, "cephalonctl: GET /v1/sessions/%s: unexpected answer (not an object)\n", id);
      rc = CLI_EXIT_FAIL;
    }
  }
  cli_reply_free(&reply);
  return rc;
}

/* ---------------------------------------------------------------- why */

/* Lane name of a reason: a string, or the lane's index in DESIGN §2 order. */
static const char *why_lane(const json_t *w) {
  const json_t *lane = json_object_get(w, "lane");
  if (json_is_string(lane))
    return json_string_value(lane);
  static const char *const names[] = {"interactive", "operational", "maintenance"};
  if (json_is_integer(lane) && json_integer_value(lane) >= 0 && json_integer_value(lane) < 3)
    return names[json_integer_value(lane)];
  return NULL;
}

/* DESIGN §3.11: a second line for a queued session, e.g.
 *   s1: position 3 in interactive (2 of 4 for tenant acme), 5 turns ahead, start in ~12.3 s
 * nothing when the answer has no position (not queued, or an older daemon). */
static void print_forecast_line(const char *id, const json_t *w) {
  double position, tpos, tof, ahead, in_s, est_ms;
  if (!cli_json_number(w, "position", &position))
    return;
  const char *lane = why_lane(w), *tenant = cli_json_string(w, "tenant");
  cli_put_clean(stdout, id);
  printf(": position %.0f", position);
  if (lane) {
    fputs(" in ", stdout);
    cli_put_clean(stdout, lane);
  }
  if (cli_json_number(w, "tenant_position", &tpos) &&
      cli_json_number(w, "tenant_runnable", &tof)) {
    printf(" (%.0f of %.0f for ", tpos, tof);
    if (tenant && tenant[0]) {
      fputs("tenant ", stdout);
      cli_put_clean(stdout, tenant);
    } else {
      fputs("the default tenant", stdout);
    }
    fputc(')', stdout);
  }
  if (cli_json_number(w, "turns_ahead", &ahead))
    printf(", %.0f turn%s ahead", ahead, ahead == 1 ? "" : "s");
  if (cli_json_number(w, "est_start_in_s", &in_s)) {
    printf(", start in ~%.1f s", in_s);
    if (cli_json_number(w, "est_start_ms", &est_ms) && est_ms > 0) {
      time_t t = (time_t)(est_ms / 1000.0);
      struct tm tm;
      char when[16];
      if (localtime_r(&t, &tm) && strftime(when, sizeof when, "%H:%M:%S", &tm))
        printf(" (%s)", when);
    }
  } else {
    fputs(", no estimate yet (no recent completions in the lane)", stdout);
  }
  fputc('\n', stdout);
}

/* One human line for one reason object, e.g.
 *   s1: runnable, rank 2 of 5 in interactive (credits 28.0, waiting 1.2 s)
 *   s1: lane out of budget until 09:31:05 (interactive) */
static void print_why_line(const char *id, const json_t *w) {
  const char *reason = cli_json_string(w, "reason");
  if (!reason)
    reason = cli_json_string(w, "state");
  const char *lane = why_lane(w);
  double rank, of, credits, waiting, until_ms, ahead, pending;
  cli_put_clean(stdout, id);
  fputs(": ", stdout);
  if (!reason) {
    fputs("(no reason given)\n", stdout);
    return;
  }
  if (strcmp(reason, "runnable") == 0) {
    fputs("runnable", stdout);
    if (cli_json_number(w, "rank", &rank)) {
      printf(", rank %.0f", rank);
      if (cli_json_number(w, "lane_runnable", &of) || cli_json_number(w, "of", &of))
        printf(" of %.0f", of);
    }
    if (lane) {
      fputs(" in ", stdout);
      cli_put_clean(stdout, lane);
    }
    bool has_credits = cli_json_number(w, "credits", &credits);
    bool has_wait = cli_json_number(w, "waiting_s", &waiting);
    if (!has_wait && cli_json_number(w, "waiting_ms", &waiting)) {
      has_wait = true;
      waiting /= 1000.0;
    }
    bool has_ahead = cli_json_number(w, "ahead_in_higher_lanes", &ahead) && ahead > 0;
    if (has_credits || has_wait || has_ahead) {
      const char *sep = " (";
      if (has_credits) {
        printf("%scredits %.1f", sep, credits);
        sep = ", ";
      }
      if (has_wait) {
        printf("%swaiting %.1f s", sep, waiting);
        sep = ", ";
      }
      if (has_ahead)
        printf("%s%.0f ahead in higher lanes", sep, ahead);
      fputc(')', stdout);
    }
  } else if (strcmp(reason, "lane_out_of_budget") == 0) {
    fputs("lane out of budget", stdout);
    if (cli_json_number(w, "until_ms", &until_ms) && until_ms > 0) {
      time_t t = (time_t)(until_ms / 1000.0);
      struct tm tm;
      char when[16];
      if (localtime_r(&t, &tm) && strftime(when, sizeof when, "%H:%M:%S", &tm))
        printf(" until %s", when);
    }
    if (lane) {
      fputs(" (", stdout);
      cli_put_clean(stdout, lane);
      fputc(')', stdout);
    }
  } else {
    /* no_input, paused, running, concurrency_full, or a reason added later: words. */
    for (const char *p = reason; *p; p++)
      fputc(*p == '_' ? ' ' : (unsigned char)*p < 0x20 ? '?' : *p, stdout);
    if (strcmp(reason, "no_input") == 0 && cli_json_number(w, "pending", &pending) && pending > 0)
      printf(" (%.0f pending, staged on the next pass)", pending);
    const char *message = cli_json_string(w, "message");
    if (message) {
      fputs(": ", stdout);
      cli_put_clean(stdout, message);
    }
  }
  fputc('\n', stdout);
  print_forecast_line(id, w);
}

static int sessions_why(const cli_ctx *ctx, const char *id) {
  cli_reply reply;
  bool printed;
  int rc = get_session_resource(ctx, id, "/why", &reply, &printed);
  if (rc != 0 || printed)
    goto out;
  /* The answer is one reason object, or {"reasons": [...]} / a bare array of them. */
  const json_t *body = reply.json;
  const json_t *list = json_is_array(body) ? body : json_object_get(body, "reasons");
  const char *sid = cli_json_string(body, "session");
  if (!sid)
    sid = id;
  if (json_is_array(list)) {
    size_t i;
    const json_t *w;
    json_array_foreach(list, i, w) print_why_line(sid, w);
    if (json_array_size(list) == 0)
      printf("%s: no reason given\n", sid);
  } else if (json_is_object(body)) {
    print_why_line(sid, body);
  } else {
    fprintf(stderr, "cephalonctl: GET /v1/sessions/%s/why: unexpected answer\n", id);
    rc = CLI_EXIT_FAIL;
    goto out;
  }
  rc = cli_finish_output();
out:
  cli_reply_free(&reply);
  return rc;
}

/* ---------------------------------------------------------------- dispatch */

/* show and why take exactly one ID. */
static int one_id(const char *sub, int argc, char **argv, const char **id) {
  const char *pos[1];
  size_t npos;
  int r = cli_parse_args(argc, argv, NULL, 0, pos, 1, &npos);
  if (r == 1) {
    sessions_usage(stdout);
    return -1;
  }
  if (r < 0 || npos != 1) {
    if (r == 0)
      fprintf(stderr, "cephalonctl: sessions %s needs one session ID\n", sub);
    return -2;
  }
  *id = pos[0];
  return 0;
}

int cli_cmd_sessions(const cli_ctx *ctx, int argc, char **argv) {
  if (argc < 2) {
    fprintf(stderr, "cephalonctl: sessions needs a subcommand\n");
    return usage_error();
  }
  const char *sub = argv[1];
  if (strcmp(sub, "help") == 0 || strcmp(sub, "-h") == 0 || strcmp(sub, "--help") == 0) {
    sessions_usage(stdout);
    return CLI_EXIT_OK;
  }
  if (strcmp(sub, "list") == 0)
    return sessions_list(ctx, argc - 2, argv + 2);
  if (strcmp(sub, "show") == 0 || strcmp(sub, "why") == 0) {
    const char *id = NULL;
    int r = one_id(sub, argc - 2, argv + 2, &id);
    if (r == -1)
      return CLI_EXIT_OK;
    if (r < 0)
      return usage_error();
    return sub[0] == 's' ? sessions_show(ctx, id) : sessions_why(ctx, id);
  }
  fprintf(stderr, "cephalonctl: unknown sessions subcommand '");
  cli_put_clean(stderr, sub);
  fputs("'\n", stderr);
  return usage_error();
}

int cli_cmd_why(const cli_ctx *ctx, int argc, char **argv) {
  const char *id = NULL;
  int r = one_id("why", argc - 1, argv + 1, &id);
  if (r == -1)
    return CLI_EXIT_OK;
  if (r < 0)
    return usage_error();
  return sessions_why(ctx, id);
}
