/* cephalonctl context show SESSION [--select SEL] | context step SESSION [--episodes N]
 * (DESIGN §6): print a session's PACT tree, or what the next N episodes would do to it without
 * changing anything. context turns SESSION | context diff SESSION FROM TO (the context
 * explorer): the session's kept turns, and what entered, left or changed between two of them,
 * with the reason (GET /v1/sessions/{id}/turns, GET /v1/sessions/{id}/context/diff). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static void context_usage(FILE *out) {
  fprintf(out, "usage: cephalonctl context show SESSION [--select SEL]\n"
               "       cephalonctl context step SESSION [--episodes N]\n"
               "       cephalonctl context turns SESSION\n"
               "       cephalonctl context diff SESSION FROM TO\n"
               "  show   the live nodes in render order (SEL: \"d1..3, 1, *\", {key=K}, {tag=T},\n"
               "         {id=N})\n"
               "  step   the tree after each of the next N episodes (default 1); changes nothing\n"
               "  turns  the turns whose context is kept (:context :keep-turns)\n"
               "  diff   what entered, left or changed from turn FROM to turn TO, and why\n");
}

/* One table of nodes: ID AT TTL CADENCE AGE CONTENT. */
static int print_nodes(const json_t *nodes, uint64_t episode) {
  static const char *const headers[] = {"ID", "AT", "TTL", "CADENCE", "SINCE", "CONTENT"};
  cli_table t;
  cli_table_init(&t, 6, headers, 0x1d);
  size_t i;
  const json_t *n;
  cph_buf id = CPH_BUF_INIT, ttl = CPH_BUF_INIT, cad = CPH_BUF_INIT, since = CPH_BUF_INIT;
  json_array_foreach(nodes, i, n) {
    cph_buf_reset(&id);
    cph_buf_reset(&ttl);
    cph_buf_reset(&cad);
    cph_buf_reset(&since);
    cli_format_value(&id, json_object_get(n, "id"));
    cli_format_value(&ttl, json_object_get(n, "ttl"));
    cli_format_value(&cad, json_object_get(n, "cadence"));
    double created = 0;
    if (cli_json_number(n, "created_at_episode", &created))
      cph_buf_printf(&since, "%llu", (unsigned long long)created);
    const char *content = cli_json_string(n, "content");
    char shown[72];
    if (content && strlen(content) > 60)
      snprintf(shown, sizeof shown, "%.57s...", content); /* one line per node */
    else
      snprintf(shown, sizeof shown, "%s", content ? content : "");
    for (char *p = shown; *p; p++)
      if (*p == '\n')
        *p = ' ';
    cli_table_add(&t, (const char *const[]){id.data, cli_json_string(n, "at"), ttl.data,
                                            cad.data, since.data, shown});
  }
  (void)episode;
  int rc = json_array_size(nodes) ? cli_table_print(&t, stdout) : (printf("(empty)\n"), 0);
  cli_table_free(&t);
  cph_buf_free(&id);
  cph_buf_free(&ttl);
  cph_buf_free(&cad);
  cph_buf_free(&since);
  return rc;
}

static int context_get(const cli_ctx *ctx, const char *session, const char *query_name,
                       const char *query_value, bool step) {
  cph_buf path = CPH_BUF_INIT;
  cph_buf_puts(&path, "/v1/sessions/");
  cli_path_segment(&path, session);
  cph_buf_puts(&path, step ? "/context/step" : "/context");
  if (query_value)
    cli_query_param(&path, query_name, query_value);
  cli_reply reply = {0};
  int rc = cph_buf_error(&path) ? CLI_EXIT_FAIL
                                : cli_call(ctx, "GET", path.data, NULL, CLI_TIMEOUT_MS, 0, &reply);
  if (rc == 0 && ctx->json) {
    rc = cli_print_reply_json(&reply);
  } else if (rc == 0 && !step) {
    double episode = 0;
    cli_json_number(reply.json, "episode", &episode);
    printf("%s at episode %llu\n", session, (unsigned long long)episode);
    rc = print_nodes(json_object_get(reply.json, "nodes"), (uint64_t)episode);
  } else if (rc == 0) {
    size_t i;
    const json_t *st;
    json_array_foreach(json_object_get(reply.json, "steps"), i, st) {
      double episode = 0;
      cli_json_number(st, "episode", &episode);
      printf("%sepisode %llu:\n", i ? "\n" : "", (unsigned long long)episode);
      if ((rc = print_nodes(json_object_get(st, "nodes"), (uint64_t)episode)) != 0)
        break;
    }
  }
  if (rc == 0)
    rc = cli_finish_output();
  cph_buf_free(&path);
  cli_reply_free(&reply);
  return rc;
}

/* One line of text for a table cell: newlines as spaces, at most max bytes ("..." when cut,
 * on a UTF-8 boundary). */
static void cell_text(char *out, size_t size, const char *s, size_t max) {
  size_t n = s ? strlen(s) : 0;
  bool cut = n > max;
  if (cut) {
    n = max;
    while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
      n--;
  }
  snprintf(out, size, "%.*s%s", (int)n, s ? s : "", cut ? "..." : "");
  for (char *p = out; *p; p++)
    if (*p == '\n' || *p == '\r' || *p == '\t')
      *p = ' ';
}

static cli_reply context_call(const cli_ctx *ctx, const char *session, const char *tail,
                              const char *from, const char *to, int *rc) {
  cph_buf path = CPH_BUF_INIT;
  cph_buf_puts(&path, "/v1/sessions/");
  cli_path_segment(&path, session);
  cph_buf_puts(&path, tail);
  if (from)
    cli_query_param(&path, "from", from);
  if (to)
    cli_query_param(&path, "to", to);
  cli_reply reply = {0};
  *rc = cph_buf_error(&path) ? CLI_EXIT_FAIL
                             : cli_call(ctx, "GET", path.data, NULL, CLI_TIMEOUT_MS, 0, &reply);
  cph_buf_free(&path);
  return reply;
}

static int context_turns(const cli_ctx *ctx, const char *session) {
  int rc;
  cli_reply reply = context_call(ctx, session, "/turns", NULL, NULL, &rc);
  if (rc == 0 && ctx->json) {
    rc = cli_print_reply_json(&reply);
  } else if (rc == 0) {
    static const char *const headers[] = {"TURN", "KIND", "EPISODE", "MESSAGES", "TOKENS",
                                          "INPUT"};
    cli_table t;
    cli_table_init(&t, 6, headers, 0x1d);
    size_t i;
    const json_t *turn;
    json_array_foreach(json_object_get(reply.json, "turns"), i, turn) {
      cph_buf id = CPH_BUF_INIT, ep = CPH_BUF_INIT, msgs = CPH_BUF_INIT, tok = CPH_BUF_INIT;
      cli_format_value(&id, json_object_get(turn, "id"));
      cli_format_value(&ep, json_object_get(turn, "episode"));
      cli_format_value(&msgs, json_object_get(turn, "messages"));
      cli_format_value(&tok, json_object_get(json_object_get(turn, "tokens"), "messages"));
      char input[80];
      cell_text(input, sizeof input, cli_json_string(turn, "input"), 50);
      cli_table_add(&t, (const char *const[]){id.data, cli_json_string(turn, "kind"), ep.data,
                                              msgs.data, tok.data, input});
      cph_buf_free(&id);
      cph_buf_free(&ep);
      cph_buf_free(&msgs);
      cph_buf_free(&tok);
    }
    rc = json_array_size(json_object_get(reply.json, "turns"))
             ? cli_table_print(&t, stdout)
             : (printf("no kept turns for %s (:context :keep-turns)\n", session), 0);
    cli_table_free(&t);
  }
  if (rc == 0)
    rc = cli_finish_output();
  cli_reply_free(&reply);
  return rc;
}

/* The parts of a diff answer, in the order printed, and the names of their items' fields. */
static const struct {
  const char *member, *label, *who, *where;
} DIFF_PARTS[] = {
    {"nodes", "node", "role", "at"},
    {"messages", "message", "role", "at"},
    {"conversation_history", "history", "sender", "channel"},
    {"recent_memory", "memory", "kind", "scope"},
    {"pending_obligations", "obligation", "role", "at"},
};

static int context_diff(const cli_ctx *ctx, const char *session, const char *from,
                        const char *to) {
  int rc;
  cli_reply reply = context_call(ctx, session, "/context/diff", from, to, &rc);
  if (rc == 0 && ctx->json) {
    rc = cli_print_reply_json(&reply);
  } else if (rc == 0) {
    const json_t *a = json_object_get(reply.json, "from"), *b = json_object_get(reply.json, "to");
    double ea = 0, eb = 0;
    cli_json_number(a, "episode", &ea);
    cli_json_number(b, "episode", &eb);
    printf("%s: turn %s (%s, episode %llu) -> turn %s (%s, episode %llu)\n", session, from,
           cli_json_string(a, "kind"), (unsigned long long)ea, to, cli_json_string(b, "kind"),
           (unsigned long long)eb);
    static const char *const headers[] = {"PART", "CHANGE", "ID", "REASON", "WHERE", "WHAT",
                                          "WHY"};
    static const char *const changes[] = {"left", "entered", "changed"};
    cli_table t;
    cli_table_init(&t, 7, headers, 0x4);
    size_t rows = 0;
    for (size_t p = 0; p < sizeof DIFF_PARTS / sizeof DIFF_PARTS[0]; p++) {
      const json_t *part = json_object_get(reply.json, DIFF_PARTS[p].member);
      for (size_t c = 0; c < 3; c++) {
        size_t i;
        const json_t *x;
        json_array_foreach(json_object_get(part, changes[c]), i, x) {
          cph_buf id = CPH_BUF_INIT, what = CPH_BUF_INIT;
          cli_format_value(&id, json_object_get(x, "id"));
          const char *who = cli_json_string(x, DIFF_PARTS[p].who);
          if (who)
            cph_buf_printf(&what, "[%s] ", who);
          cph_buf_puts(&what, cli_json_string(x, "content") ? cli_json_string(x, "content") : "");
          char where[120], text[120], why[160];
          const char *at = cli_json_string(x, DIFF_PARTS[p].where);
          const char *was = cli_json_string(x, "from_at");
          char moved[100];
          snprintf(moved, sizeof moved, "%s -> %s", was ? was : "", at ? at : "");
          cell_text(where, sizeof where, was ? moved : at, 40);
          cell_text(text, sizeof text, what.data, 50);
          cell_text(why, sizeof why, cli_json_string(x, "detail"), 90);
          cli_table_add(&t, (const char *const[]){DIFF_PARTS[p].label, changes[c], id.data,
                                                  cli_json_string(x, "reason"), where, text,
                                                  why});
          rows++;
          cph_buf_free(&id);
          cph_buf_free(&what);
        }
      }
    }
    rc = rows ? cli_table_print(&t, stdout) : (printf("no difference\n"), 0);
    cli_table_free(&t);
    const json_t *omitted[] = {json_object_get(a, "omitted"), json_object_get(b, "omitted")};
    for (int k = 0; k < 2 && rc == 0; k++) {
      size_t i;
      const json_t *name;
      if (json_array_size(omitted[k]))
        printf("turn %s left out (not compared):", k ? to : from);
      json_array_foreach(omitted[k], i, name) printf(" %s", json_string_value(name));
      if (json_array_size(omitted[k]))
        printf("\n");
    }
  }
  if (rc == 0)
    rc = cli_finish_output();
  cli_reply_free(&reply);
  return rc;
}

static bool turn_arg(const char *s) {
  if (!s || !*s)
    return false;
  for (const char *p = s; *p; p++)
    if (*p < '0' || *p > '9')
      return false;
  return true;
}

int cli_cmd_context(const cli_ctx *ctx, int argc, char **argv) {
  if (argc < 2) {
    context_usage(stderr);
    return CLI_EXIT_USAGE;
  }
  const char *sub = argv[1];
  bool show = strcmp(sub, "show") == 0, step = strcmp(sub, "step") == 0;
  if (strcmp(sub, "turns") == 0 || strcmp(sub, "diff") == 0) {
    bool diff = sub[0] == 'd';
    const char *pos[3];
    size_t npos;
    int r = cli_parse_args(argc - 2, argv + 2, NULL, 0, pos, 3, &npos);
    if (r == 1) {
      context_usage(stdout);
      return CLI_EXIT_OK;
    }
    if (r < 0 || npos != (diff ? 3u : 1u) || (diff && (!turn_arg(pos[1]) || !turn_arg(pos[2])))) {
      context_usage(stderr);
      return CLI_EXIT_USAGE;
    }
    return diff ? context_diff(ctx, pos[0], pos[1], pos[2]) : context_turns(ctx, pos[0]);
  }
  if (!show && !step) {
    context_usage(strcmp(sub, "--help") == 0 || strcmp(sub, "-h") == 0 ? stdout : stderr);
    return strcmp(sub, "--help") == 0 || strcmp(sub, "-h") == 0 ? CLI_EXIT_OK : CLI_EXIT_USAGE;
  }
  const char *select = NULL;
  cli_uint episodes = {0};
  const cli_opt show_opts[] = {{"--select", CLI_OPT_STRING, &select, 0}};
  const cli_opt step_opts[] = {{"--episodes", CLI_OPT_UINT, &episodes, 1000}};
  const char *pos[1];
  size_t npos;
  int r = cli_parse_args(argc - 2, argv + 2, show ? show_opts : step_opts, 1, pos, 1, &npos);
  if (r == 1) {
    context_usage(stdout);
    return CLI_EXIT_OK;
  }
  if (r < 0 || npos != 1) {
    context_usage(stderr);
    return CLI_EXIT_USAGE;
  }
  if (show)
    return context_get(ctx, pos[0], "select", select, false);
  char n[24];
  snprintf(n, sizeof n, "%llu", (unsigned long long)(episodes.set ? episodes.value : 1));
  return context_get(ctx, pos[0], "episodes", n, true);
}
