/* cephalonctl turns lease | complete — act as a worker by hand, for debugging; turns list |
 * show — a session's ended turns and one turn's record (GET /v1/turns?session=S and
 * GET /v1/turns/{id}). */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"

#define MAX_WAIT_MS 3600000ULL /* an hour: longer waits are better done in a loop */

static void turns_usage(FILE *out) {
  fprintf(out,
          "usage: cephalonctl turns lease --worker W [--lanes interactive,operational] "
          "[--wait-ms N]\n"
          "       cephalonctl turns complete ID --lease L [--tokens N] [--tool-calls N]\n"
          "                                    [--reply TEXT] [--reply-channel C]\n"
          "       cephalonctl turns list --session S [--limit N]\n"
          "       cephalonctl turns show ID\n"
          "  lease     asks for the next turn, waiting up to N ms; prints the turn, or\n"
          "            \"no turn\" and exits 3\n"
          "  complete  completes a leased turn with its cost and an optional reply\n"
          "  list      a session's ended turns (however they ended), newest first, with\n"
          "            their cost\n"
          "  show      one turn's record\n");
}

static int usage_error(void) {
  turns_usage(stderr);
  return CLI_EXIT_USAGE;
}

/* After cli_parse_args returned r: true to go on; false when the command is done, *status its
 * exit status (help printed: 0; a bad argument: the usage on stderr, 2). */
static bool parsed(int r, int *status) {
  if (r == 1) {
    turns_usage(stdout);
    *status = CLI_EXIT_OK;
    return false;
  }
  if (r < 0) {
    *status = usage_error();
    return false;
  }
  return true;
}

/* ---------------------------------------------------------------- lease */

/* Splits "interactive,operational" into a JSON array; -1 on an empty name. */
static int split_lanes(const char *text, json_t *out) {
  for (const char *p = text;;) {
    size_t n = strcspn(p, ",");
    if (n == 0)
      return -1;
    if (json_array_append_new(out, json_stringn(p, n)) != 0)
      return -1;
    if (p[n] == '\0')
      return 0;
    p += n + 1;
  }
}

/* "  " + text, with every continuation line indented the same. */
static void print_indented(const char *text) {
  fputs("  ", stdout);
  for (const char *p = text; *p; p++) {
    unsigned char c = (unsigned char)*p;
    if (c == '\n')
      fputs("\n  ", stdout);
    else
      fputc(c < 0x20 && c != '\t' ? '?' : c, stdout);
  }
  fputc('\n', stdout);
}

static void print_turn(const json_t *turn) {
  cph_buf b = CPH_BUF_INIT;
  cli_format_value(&b, json_object_get(turn, "id"));
  fputs("turn ", stdout);
  cli_put_clean(stdout, b.data ? b.data : "-");
  fputs(" lease ", stdout);
  cli_put_clean(stdout, cli_json_string(turn, "lease") ? cli_json_string(turn, "lease") : "-");
  fputc('\n', stdout);

  static const char *const fields[] = {"session", "lane", "kind", "episode"};
  for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
    cph_buf_reset(&b);
    cli_format_value(&b, json_object_get(turn, fields[i]));
    printf("%s%s ", i ? ", " : "", fields[i]);
    cli_put_clean(stdout, b.data ? b.data : "-");
  }
  double deadline;
  if (cli_json_number(turn, "deadline_ms", &deadline)) {
    /* Wall-clock milliseconds: shown as local time like the rest of the CLI. */
    time_t t = (time_t)(deadline / 1000.0);
    struct tm tm;
    char when[16];
    if (deadline > 1e12 && localtime_r(&t, &tm) && strftime(when, sizeof when, "%H:%M:%S", &tm))
      printf(", deadline %s", when);
    else
      printf(", deadline_ms %.0f", deadline);
  }
  fputc('\n', stdout);

  const json_t *staged = json_object_get(turn, "staged");
  if (json_is_array(staged) && json_array_size(staged) > 0) {
    printf("staged:\n");
    size_t i;
    const json_t *m;
    json_array_foreach(staged, i, m) {
      cph_buf_reset(&b);
      cli_format_value(&b, json_object_get(m, "event_id"));
      const char *channel = cli_json_string(m, "channel"), *sender = cli_json_string(m, "sender");
      const char *body = cli_json_string(m, "body");
      fputs("  event ", stdout);
      cli_put_clean(stdout, b.data ? b.data : "-");
      fputs(" in ", stdout);
      cli_put_clean(stdout, channel ? channel : "-");
      fputs(" from ", stdout);
      cli_put_clean(stdout, sender ? sender : "-");
      if (json_is_true(json_object_get(m, "mentioned")))
        fputs(" (mentioned)", stdout);
      fputs(": ", stdout);
      cli_put_clean(stdout, body ? body : "");
      fputc('\n', stdout);
    }
  }
  const char *input = cli_json_string(turn, "input");
  if (input) {
    printf("input:\n");
    print_indented(input);
  }
  cph_buf_free(&b);
}

static int turns_lease(const cli_ctx *ctx, int argc, char **argv) {
  const char *worker = NULL, *lanes = NULL;
  cli_uint wait_ms = {0};
  const cli_opt opts[] = {
      {"--worker", CLI_OPT_STRING, &worker, 0},
      {"--lanes", CLI_OPT_STRING, &lanes, 0},
      {"--wait-ms", CLI_OPT_UINT, &wait_ms, MAX_WAIT_MS},
  };
  const char *pos[1];
  size_t npos;
  int r = cli_parse_args(argc, argv, opts, sizeof opts / sizeof opts[0], pos, 0, &npos);
  if (!parsed(r, &r))
    return r;
  if (!worker) {
    fprintf(stderr, "cephalonctl: turns lease needs --worker\n");
    return usage_error();
  }

  int rc = CLI_EXIT_FAIL;
  cli_reply reply = {0};
  json_t *body = json_pack("{s:s}", "worker", worker);
  json_t *lane_list = json_array();
  if (!body || !lane_list) {
    fprintf(stderr, "cephalonctl: cannot build the request (arguments must be UTF-8)\n");
    goto out;
  }
  if (lanes) {
    if (split_lanes(lanes, lane_list) != 0) {
      fprintf(stderr, "cephalonctl: --lanes wants names separated by commas, like "
                      "interactive,operational\n");
      rc = usage_error();
      goto out;
    }
    json_object_set(body, "lanes", lane_list);
  }
  if (wait_ms.set)
    json_object_set_new(body, "wait_ms", json_integer((json_int_t)wait_ms.value));
  /* The daemon holds a long-poll up to wait_ms before answering, so the read timeout is the
   * wait plus the usual margin. Without --wait-ms the daemon's default wait applies, which
   * the contract does not fix: allow it another 30 s. */
  int timeout_ms = CLI_TIMEOUT_MS + (wait_ms.set ? (int)wait_ms.value : 30000);
  if ((rc = cli_call(ctx, "POST", "/v1/turns/lease", body, timeout_ms, 0, &reply)) != 0)
    goto out;
  if (reply.status == 204) {
    if (ctx->json) /* keep stdout empty: there is no JSON to print */
      fputs("cephalonctl: no turn\n", stderr);
    else
      printf("no turn\n");
    rc = cli_finish_output() == 0 ? CLI_EXIT_NO_TURN : CLI_EXIT_FAIL;
    goto out;
  }
  if (ctx->json) {
    rc = cli_print_reply_json(&reply);
    goto out;
  }
  const json_t *turn = json_object_get(reply.json, "turn");
  if (!json_is_object(turn)) {
    fprintf(stderr, "cephalonctl: POST /v1/turns/lease: unexpected answer (no \"turn\")\n");
    rc = CLI_EXIT_FAIL;
    goto out;
  }
  print_turn(turn);
  rc = cli_finish_output();
out:
  json_decref(body);
  json_decref(lane_list);
  cli_reply_free(&reply);
  return rc;
}

/* ---------------------------------------------------------------- complete */

static int turns_complete(const cli_ctx *ctx, int argc, char **argv) {
  const char *lease = NULL, *reply_text = NULL, *reply_channel = NULL;
  cli_uint tokens = {0}, tool_calls = {0};
  const cli_opt opts[] = {
      {"--lease", CLI_OPT_STRING, &lease, 0},
      {"--tokens", CLI_OPT_UINT, &tokens, 1000000000000ULL},
      {"--tool-calls", CLI_OPT_UINT, &tool_calls, 1000000000ULL},
      {"--reply", CLI_OPT_STRING, &reply_text, 0},
      {"--reply-channel", CLI_OPT_STRING, &reply_channel, 0},
  };
  const char *pos[1];
  size_t npos;
  int r = cli_parse_args(argc, argv, opts, sizeof opts / sizeof opts[0], pos, 1, &npos);
  if (!parsed(r, &r))
    return r;
  if (npos != 1 || !lease) {
    fprintf(stderr, "cephalonctl: turns complete needs a turn ID and --lease\n");
    return usage_error();
  }
  if (reply_channel && !reply_text) {
    fprintf(stderr, "cephalonctl: --reply-channel needs --reply\n");
    return usage_error();
  }

  int rc = CLI_EXIT_FAIL;
  cli_reply reply = {0};
  cph_buf path = CPH_BUF_INIT;
  /* Absent counts are reported as 0: the cost object is part of every completion. */
  json_t *body = json_pack("{s:s, s:{s:I, s:I}}", "lease", lease, "cost", "tokens",
                           (json_int_t)tokens.value, "tool_calls", (json_int_t)tool_calls.value);
  if (body && reply_text) {
    json_t *rep = json_pack("{s:s}", "body", reply_text);
    bool ok = rep && (!reply_channel ||
                      json_object_set_new(rep, "channel", json_string(reply_channel)) == 0);
    if (!ok || json_object_set(body, "reply", rep) != 0) {
      json_decref(body);
      body = NULL;
    }
    json_decref(rep);
  }
  if (!body) {
    fprintf(stderr, "cephalonctl: cannot build the request (arguments must be UTF-8)\n");
    goto out;
  }
  cph_buf_puts(&path, "/v1/turns/");
  cli_path_segment(&path, pos[0]);
  cph_buf_puts(&path, "/complete");
  if (cph_buf_error(&path) != 0) {
    fprintf(stderr, "cephalonctl: out of memory\n");
    goto out;
  }
  if ((rc = cli_call(ctx, "POST", path.data, body, CLI_TIMEOUT_MS, 0, &reply)) != 0)
    goto out;
  if (ctx->json) {
    rc = cli_print_reply_json(&reply);
    goto out;
  }
  fputs("turn ", stdout);
  cli_put_clean(stdout, pos[0]);
  fputs(" completed", stdout);
  if (json_is_true(json_object_get(reply.json, "already")))
    fputs(" (it had been completed before with this lease)", stdout);
  fputc('\n', stdout);
  rc = cli_finish_output();
out:
  json_decref(body);
  cph_buf_free(&path);
  cli_reply_free(&reply);
  return rc;
}

/* ---------------------------------------------------------------- list, show */

/* A cell: the value formatted, or "-" (null, absent, or out of memory: the table reports it). */
static const char *cell(cph_buf *b, const json_t *v) {
  cph_buf_reset(b);
  if (!v || json_is_null(v))
    return "-";
  cli_format_value(b, v);
  return b->data && !b->failed ? b->data : "-";
}

static int print_record_table(const json_t *list) {
  static const char *const headers[] = {"ID", "STATE", "KIND", "LANE", "TOKENS", "TOOL_CALLS",
                                        "WORKER", "ERROR"};
  enum { N_COLS = sizeof headers / sizeof headers[0] };
  cli_table t;
  cli_table_init(&t, N_COLS, headers, 0x31); /* ID, TOKENS and TOOL_CALLS right-aligned */
  cph_buf b[N_COLS];
  for (size_t c = 0; c < N_COLS; c++)
    b[c] = (cph_buf)CPH_BUF_INIT;
  size_t i;
  const json_t *tr;
  json_array_foreach(list, i, tr) {
    const json_t *cost = json_object_get(tr, "cost");
    const json_t *v[N_COLS] = {json_object_get(tr, "id"),       json_object_get(tr, "state"),
                               json_object_get(tr, "kind"),     json_object_get(tr, "lane"),
                               json_object_get(cost, "tokens"), json_object_get(cost, "tool_calls"),
                               json_object_get(tr, "worker"),   json_object_get(tr, "error")};
    const char *cells[N_COLS];
    for (size_t c = 0; c < N_COLS; c++)
      cells[c] = cell(&b[c], v[c]);
    cli_table_add(&t, cells);
  }
  int rc = cli_table_print(&t, stdout);
  cli_table_free(&t);
  for (size_t c = 0; c < N_COLS; c++)
    cph_buf_free(&b[c]);
  return rc;
}

static int turns_list(const cli_ctx *ctx, int argc, char **argv) {
  const char *session = NULL;
  cli_uint limit = {0};
  const cli_opt opts[] = {
      {"--session", CLI_OPT_STRING, &session, 0},
      {"--limit", CLI_OPT_UINT, &limit, 1000},
  };
  const char *pos[1];
  size_t npos;
  int r = cli_parse_args(argc, argv, opts, sizeof opts / sizeof opts[0], pos, 0, &npos);
  if (!parsed(r, &r))
    return r;
  if (!session) {
    fprintf(stderr, "cephalonctl: turns list needs --session\n");
    return usage_error();
  }
  cph_buf path = CPH_BUF_INIT;
  cph_buf_puts(&path, "/v1/turns");
  cli_query_param(&path, "session", session);
  if (limit.set)
    cli_query_u64(&path, "limit", limit.value);
  cli_reply reply;
  bool printed;
  int rc = cli_get(ctx, &path, &reply, &printed);
  if (rc != CLI_EXIT_OK || printed)
    goto out;
  const json_t *list = json_object_get(reply.json, "turns");
  if (!json_is_array(list)) {
    fprintf(stderr, "cephalonctl: GET /v1/turns: unexpected answer (no \"turns\" list)\n");
    rc = CLI_EXIT_FAIL;
    goto out;
  }
  if (json_array_size(list) == 0)
    printf("no ended turns\n");
  else if ((rc = print_record_table(list)) != 0)
    goto out;
  rc = cli_finish_output();
out:
  cph_buf_free(&path);
  cli_reply_free(&reply);
  return rc;
}

static int turns_show(const cli_ctx *ctx, int argc, char **argv) {
  const char *pos[1];
  size_t npos;
  int r = cli_parse_args(argc, argv, NULL, 0, pos, 1, &npos);
  if (!parsed(r, &r))
    return r;
  if (npos != 1) {
    fprintf(stderr, "cephalonctl: turns show needs a turn ID\n");
    return usage_error();
  }
  cph_buf path = CPH_BUF_INIT;
  cph_buf_puts(&path, "/v1/turns/");
  cli_path_segment(&path, pos[0]);
  cli_reply reply;
  bool printed;
  int rc = cli_get(ctx, &path, &reply, &printed);
  if (rc != CLI_EXIT_OK || printed)
    goto out;
  /* one "field  value" line each, in the answer's order (the cost's two as cost.tokens...) */
  cph_buf b = CPH_BUF_INIT;
  const char *key;
  const json_t *v;
  json_object_foreach(reply.json, key, v) {
    if (json_is_object(v)) {
      const char *sub;
      const json_t *sv;
      json_object_foreach((json_t *)v, sub, sv) {
        printf("%s.", key);
        cli_put_clean(stdout, sub);
        fputs("  ", stdout);
        cli_put_clean(stdout, cell(&b, sv));
        fputc('\n', stdout);
      }
      continue;
    }
    cli_put_clean(stdout, key);
    fputs("  ", stdout);
    cli_put_clean(stdout, cell(&b, v));
    fputc('\n', stdout);
  }
  cph_buf_free(&b);
  rc = cli_finish_output();
out:
  cph_buf_free(&path);
  cli_reply_free(&reply);
  return rc;
}

int cli_cmd_turns(const cli_ctx *ctx, int argc, char **argv) {
  if (argc >= 2 && (strcmp(argv[1], "help") == 0 || strcmp(argv[1], "-h") == 0 ||
                    strcmp(argv[1], "--help") == 0)) {
    turns_usage(stdout);
    return CLI_EXIT_OK;
  }
  if (argc >= 2 && strcmp(argv[1], "lease") == 0)
    return turns_lease(ctx, argc - 2, argv + 2);
  if (argc >= 2 && strcmp(argv[1], "complete") == 0)
    return turns_complete(ctx, argc - 2, argv + 2);
  if (argc >= 2 && strcmp(argv[1], "list") == 0)
    return turns_list(ctx, argc - 2, argv + 2);
  if (argc >= 2 && strcmp(argv[1], "show") == 0)
    return turns_show(ctx, argc - 2, argv + 2);
  fprintf(stderr, argc < 2 ? "cephalonctl: turns needs a subcommand\n"
                           : "cephalonctl: unknown turns subcommand\n");
  return usage_error();
}
