/* cephalonctl events post — posts one event as a connector would (POST /v1/events). */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

#define DEFAULT_SENDER "cephalonctl"

static void events_usage(FILE *out) {
  fprintf(out,
          "usage: cephalonctl events post --channel C [--sender S] [--session ID] [--mention ID]...\n"
          "                               [--key K] BODY\n"
          "  Posts one event and prints its id, status and the sessions it reached.\n"
          "  --session alone (no --channel) posts to the session's direct channel.\n"
          "  The sender defaults to \"" DEFAULT_SENDER "\"; put -- before a BODY that starts with '-'.\n");
}

static int usage_error(void) {
  events_usage(stderr);
  return CLI_EXIT_USAGE;
}

/* Prints "event 12: queued, sessions s1, s2" (or "stored, no session", or "duplicate,
 * already stored under this id") for one result, or reports a rejection on stderr. */
static int print_result(const json_t *res) {
  const char *status = cli_json_string(res, "status");
  const char *reason = cli_json_string(res, "reason");
  cph_buf id = CPH_BUF_INIT, sessions = CPH_BUF_INIT;
  cli_format_value(&id, json_object_get(res, "id"));
  cli_format_value(&sessions, json_object_get(res, "sessions"));
  int rc = CLI_EXIT_OK;
  if (cph_buf_error(&id) != 0 || cph_buf_error(&sessions) != 0) {
    fprintf(stderr, "cephalonctl: out of memory\n");
    rc = CLI_EXIT_FAIL;
  } else if (status && strcmp(status, "rejected") == 0) {
    const char *field = cli_json_string(res, "field");
    fputs("cephalonctl: event rejected", stderr);
    if (reason) {
      fputs(": ", stderr);
      cli_put_clean(stderr, reason);
    }
    if (field) {
      fputs(" (field: ", stderr);
      cli_put_clean(stderr, field);
      fputc(')', stderr);
    }
    fputc('\n', stderr);
    rc = CLI_EXIT_FAIL;
  } else {
    printf("event ");
    if (!json_is_null(json_object_get(res, "id"))) { /* null: logged, not yet applied */
      cli_put_clean(stdout, id.data);
      fputs(": ", stdout);
    }
    cli_put_clean(stdout, status ? status : "?");
    const json_t *list = json_object_get(res, "sessions");
    const json_t *pos = json_object_get(res, "pos"); /* cluster mode with a log (DESIGN §14) */
    if (json_is_integer(pos)) {
      printf(" at log position %lld", (long long)json_integer_value(pos));
      if (status && strcmp(status, "duplicate") == 0)
        fputs(", already logged under this key", stdout);
    } else if (status && strcmp(status, "duplicate") == 0) {
      fputs(", already stored under this id", stdout); /* DESIGN §4: the original id */
    } else if (json_is_array(list) && json_array_size(list) > 0) {
      fputs(", sessions ", stdout);
      cli_put_clean(stdout, sessions.data);
    } else {
      fputs(", no session", stdout);
    }
    if (reason) {
      fputs(" (", stdout);
      cli_put_clean(stdout, reason);
      fputc(')', stdout);
    }
    fputc('\n', stdout);
    rc = cli_finish_output();
  }
  cph_buf_free(&id);
  cph_buf_free(&sessions);
  return rc;
}

static int events_post(const cli_ctx *ctx, int argc, char **argv) {
  const char *channel = NULL, *sender = NULL, *session = NULL, *key = NULL;
  cli_list mentions = {.n = 0};
  const cli_opt opts[] = {
      {"--channel", CLI_OPT_STRING, &channel, 0}, {"--sender", CLI_OPT_STRING, &sender, 0},
      {"--session", CLI_OPT_STRING, &session, 0}, {"--mention", CLI_OPT_LIST, &mentions, 0},
      {"--key", CLI_OPT_STRING, &key, 0},
  };
  const char *pos[1];
  size_t npos;
  int r = cli_parse_args(argc, argv, opts, sizeof opts / sizeof opts[0], pos, 1, &npos);
  if (r == 1) {
    events_usage(stdout);
    return CLI_EXIT_OK;
  }
  if (r < 0)
    return usage_error();
  if (npos != 1) {
    fprintf(stderr, "cephalonctl: events post needs a BODY\n");
    return usage_error();
  }
  if (!channel && !session) { /* DESIGN §4: an event needs a channel or a session */
    fprintf(stderr, "cephalonctl: events post needs --channel (or --session)\n");
    return usage_error();
  }

  /* {"events": [event]}; every handle is released once at the end (containers hold refs). */
  json_t *event = json_object(), *events = json_array(), *body = json_object();
  json_t *mention_list = json_array();
  int rc = CLI_EXIT_FAIL;
  cli_reply reply = {0};
  bool ok = event && events && body && mention_list && json_array_append(events, event) == 0 &&
            json_object_set(body, "events", events) == 0;
  if (channel)
    ok = ok && json_object_set_new(event, "channel", json_string(channel)) == 0;
  ok = ok && json_object_set_new(event, "sender", json_string(sender ? sender : DEFAULT_SENDER)) == 0;
  ok = ok && json_object_set_new(event, "body", json_string(pos[0])) == 0;
  if (session)
    ok = ok && json_object_set_new(event, "session", json_string(session)) == 0;
  for (size_t i = 0; ok && i < mentions.n; i++)
    ok = json_array_append_new(mention_list, json_string(mentions.items[i])) == 0;
  if (mentions.n > 0 && ok) {
    ok = json_object_set(event, "mentions", mention_list) == 0;
  }
  if (key)
    ok = ok && json_object_set_new(event, "key", json_string(key)) == 0;
  if (!ok) {
    /* json_string() refuses text that is not UTF-8 as well as failing on memory. */
    fprintf(stderr, "cephalonctl: cannot build the event (arguments must be UTF-8)\n");
    goto out;
  }
  if ((rc = cli_call(ctx, "POST", "/v1/events", body, CLI_TIMEOUT_MS, 0, &reply)) != 0)
    goto out;
  if (ctx->json) {
    rc = cli_print_reply_json(&reply);
    goto out;
  }
  const json_t *results = json_object_get(reply.json, "results");
  if (!json_is_array(results) || json_array_size(results) != 1) {
    fprintf(stderr, "cephalonctl: POST /v1/events: unexpected answer (want one result)\n");
    rc = CLI_EXIT_FAIL;
    goto out;
  }
  rc = print_result(json_array_get(results, 0));
out:
  json_decref(event);
  json_decref(events);
  json_decref(body);
  json_decref(mention_list);
  cli_reply_free(&reply);
  return rc;
}

int cli_cmd_events(const cli_ctx *ctx, int argc, char **argv) {
  if (argc >= 2 && (strcmp(argv[1], "help") == 0 || strcmp(argv[1], "-h") == 0 ||
                    strcmp(argv[1], "--help") == 0)) {
    events_usage(stdout);
    return CLI_EXIT_OK;
  }
  if (argc >= 2 && strcmp(argv[1], "post") == 0)
    return events_post(ctx, argc - 2, argv + 2);
  fprintf(stderr, argc < 2 ? "cephalonctl: events needs a subcommand\n"
                           : "cephalonctl: unknown events subcommand\n");
  return usage_error();
}
