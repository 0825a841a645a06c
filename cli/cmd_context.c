/* cephalonctl context show SESSION [--select SEL] | context step SESSION [--episodes N]
 * (DESIGN §6): print a session's PACT tree, or what the next N episodes would do to it without
 * changing anything. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static void context_usage(FILE *out) {
  fprintf(out, "usage: cephalonctl context show SESSION [--select SEL]\n"
               "       cephalonctl context step SESSION [--episodes N]\n"
               "  show  the live nodes in render order (SEL: \"d1..3, 1, *\", {key=K}, {tag=T},\n"
               "        {id=N})\n"
               "  step  the tree after each of the next N episodes (default 1); changes nothing\n");
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

int cli_cmd_context(const cli_ctx *ctx, int argc, char **argv) {
  if (argc < 2) {
    context_usage(stderr);
    return CLI_EXIT_USAGE;
  }
  const char *sub = argv[1];
  bool show = strcmp(sub, "show") == 0, step = strcmp(sub, "step") == 0;
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
