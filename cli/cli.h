/* cephalonctl internals shared by main.c and the cmd_*.c files (private to cli/). */
#ifndef CEPHALON_CLI_CLI_H
#define CEPHALON_CLI_CLI_H

#include <stdbool.h>
#include <stdio.h>

/* Exit codes: every command returns one of these. */
enum { CLI_EXIT_OK = 0, CLI_EXIT_FAIL = 1, CLI_EXIT_USAGE = 2 };

#define CLI_DEFAULT_URL "http://127.0.0.1:7070"

/* Global options, parsed once before the command runs. */
typedef struct cli_ctx {
  const char *url;   /* --url, else $CEPHALON_URL, else CLI_DEFAULT_URL */
  const char *token; /* --token, else $CEPHALON_TOKEN, else NULL (no Authorization header) */
  bool json;         /* --json: print the daemon's JSON instead of a table */
} cli_ctx;

/* One command: argv[0] is the command's own name; returns a CLI_EXIT_* code. Usage errors
 * print the command's usage to stderr and return CLI_EXIT_USAGE. */
typedef struct cli_command {
  const char *name;
  int (*run)(const cli_ctx *ctx, int argc, char **argv);
  const char *usage;   /* "policy check FILE" */
  const char *summary; /* one line for the command list */
} cli_command;

int cli_cmd_policy(const cli_ctx *ctx, int argc, char **argv);

#endif
