/* cephalonctl [--url URL] [--token TOKEN] [--json] COMMAND ...
 *
 * Global options come before the command; the command table below dispatches the rest, one
 * row per command. Every command but `policy check` is a client of cephalond's HTTP API
 * (DESIGN §9) and never calls the engine directly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static int cmd_help(const cli_ctx *ctx, int argc, char **argv);

static const cli_command commands[] = {
    {"status", cli_cmd_status, "status",
     "reachability, policy generation, concurrency and lane budgets"},
    {"sessions", cli_cmd_sessions,
     "sessions list [--class C] [--state S] [--after ID] [--limit N]\n"
     "sessions show ID\n"
     "sessions why ID",
     "list sessions, show one, say why one is (not) running"},
    {"why", cli_cmd_why, "why SESSION",
     "why a session is (not) running: its place in line, turns ahead, estimated start"},
    {"lanes", cli_cmd_lanes, "lanes", "lane budgets left, runnable and running sessions"},
    {"top", cli_cmd_top, "top [--interval SECONDS] [--limit N] [--once]",
     "live view of lanes, busiest sessions, outbox and backpressure (Ctrl-C quits)"},
    {"context", cli_cmd_context,
     "context show SESSION [--select SEL]\n"
     "context step SESSION [--episodes N]\n"
     "context turns SESSION\n"
     "context diff SESSION FROM TO",
     "a session's PACT context tree, what the next episodes would do to it, its kept turns "
     "and what changed between two of them"},
    {"events", cli_cmd_events, "events post --channel C [--sender S] [--session ID] "
                               "[--mention ID]... [--key K] BODY",
     "post one event as a connector would"},
    {"turns", cli_cmd_turns,
     "turns lease --worker W [--lanes L1,L2] [--wait-ms N]\n"
     "turns complete ID --lease L [--tokens N] [--tool-calls N] [--reply TEXT] "
     "[--reply-channel C]\n"
     "turns list --session S [--limit N]\n"
     "turns show ID",
     "lease and complete a turn by hand (exit 3: no turn); a session's ended turns with their "
     "cost, one turn's record"},
    {"replies", cli_cmd_replies, "replies [--after N] [--limit N] [--wait-ms N] [--follow]",
     "the replies stream connectors deliver; --follow keeps reading (in a cluster every "
     "node's, each reply once)"},
    {"backup", cli_cmd_backup, "backup DIR",
     "copy the store into DIR while cephalond serves (restore: start a daemon on DIR)"},
    {"policy", cli_cmd_policy, "policy check FILE\npolicy reload",
     "validate a policy file (no daemon needed); make cephalond reload its policy"},
    {"help", cmd_help, "help", "show this help"},
};

#define COMMAND_COUNT (sizeof commands / sizeof commands[0])

static void usage(FILE *out) {
  fprintf(out,
          "usage: cephalonctl [--url URL] [--token TOKEN] [--json] COMMAND ...\n"
          "\n"
          "options:\n"
          "  --url URL      cephalond address (default $CEPHALON_URL or %s)\n"
          "  --token TOKEN  bearer token (default $CEPHALON_TOKEN)\n"
          "  --json         print the daemon's JSON answers as they are\n"
          "  -h, --help     show this help\n"
          "\n"
          "commands:\n",
          CLI_DEFAULT_URL);
  /* Each form of a command on its own line, then what it does, indented. */
  for (size_t i = 0; i < COMMAND_COUNT; i++) {
    for (const char *u = commands[i].usage; *u;) {
      size_t n = strcspn(u, "\n");
      fprintf(out, "  %.*s\n", (int)n, u);
      u += n + (u[n] == '\n');
    }
    fprintf(out, "      %s\n", commands[i].summary);
  }
  fprintf(out, "\n"
               "exit status: 0 ok, 1 error, 2 usage, 3 no turn (turns lease)\n");
}

static int cmd_help(const cli_ctx *ctx, int argc, char **argv) {
  (void)ctx;
  (void)argv;
  if (argc != 1) {
    usage(stderr);
    return CLI_EXIT_USAGE;
  }
  usage(stdout);
  return CLI_EXIT_OK;
}

/* Matches "--name VALUE" (advancing *i) or "--name=VALUE". Returns 1 on a match with *value
 * set, 0 if arg is another option, -1 if the value is missing. */
static int option_value(int argc, char **argv, int *i, const char *name, const char **value) {
  size_t n = strlen(name);
  const char *arg = argv[*i];
  if (strncmp(arg, name, n) != 0)
    return 0;
  if (arg[n] == '=') {
    *value = arg + n + 1;
    return 1;
  }
  if (arg[n] != '\0')
    return 0;
  if (*i + 1 >= argc)
    return -1;
  *value = argv[++*i];
  return 1;
}

static const char *env_or(const char *name, const char *fallback) {
  const char *v = getenv(name);
  return v && v[0] ? v : fallback;
}

int main(int argc, char **argv) {
  cli_ctx ctx = {
      .url = env_or("CEPHALON_URL", CLI_DEFAULT_URL),
      .token = env_or("CEPHALON_TOKEN", NULL),
      .json = false,
  };
  int i = 1;
  for (; i < argc; i++) {
    const char *arg = argv[i];
    if (strcmp(arg, "--") == 0) {
      i++;
      break;
    }
    if (arg[0] != '-' || arg[1] == '\0')
      break;
    if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
      usage(stdout);
      return CLI_EXIT_OK;
    }
    if (strcmp(arg, "--json") == 0) {
      ctx.json = true;
      continue;
    }
    const char *value = NULL;
    int r = option_value(argc, argv, &i, "--url", &value);
    if (r > 0) {
      ctx.url = value;
      continue;
    }
    if (r == 0 && (r = option_value(argc, argv, &i, "--token", &value)) > 0) {
      ctx.token = value;
      continue;
    }
    if (r < 0)
      fprintf(stderr, "cephalonctl: %s needs a value\n", arg);
    else
      fprintf(stderr, "cephalonctl: unknown option %s\n", arg);
    usage(stderr);
    return CLI_EXIT_USAGE;
  }
  if (i >= argc) {
    fprintf(stderr, "cephalonctl: no command given\n");
    usage(stderr);
    return CLI_EXIT_USAGE;
  }
  for (size_t c = 0; c < COMMAND_COUNT; c++)
    if (strcmp(argv[i], commands[c].name) == 0)
      return commands[c].run(&ctx, argc - i, argv + i);
  fprintf(stderr, "cephalonctl: unknown command '%s'\n", argv[i]);
  usage(stderr);
  return CLI_EXIT_USAGE;
}
