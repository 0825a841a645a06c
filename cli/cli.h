/* cephalonctl internals shared by main.c and the cmd_*.c files (private to cli/). */
#ifndef CEPHALON_CLI_CLI_H
#define CEPHALON_CLI_CLI_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/buf.h"

/* Exit codes: every command returns one of these. */
enum {
  CLI_EXIT_OK = 0,
  CLI_EXIT_FAIL = 1,   /* any error: unreachable daemon, HTTP error, bad answer */
  CLI_EXIT_USAGE = 2,  /* bad usage; the usage went to stderr */
  CLI_EXIT_NO_TURN = 3 /* turns lease: the daemon had no turn to hand out (204) */
};

#define CLI_DEFAULT_URL "http://127.0.0.1:7070"
#define CLI_TIMEOUT_MS 30000 /* one whole request; long-polls add their wait to it */

/* Global options, parsed once before the command runs. */
typedef struct cli_ctx {
  const char *url;   /* --url, else $CEPHALON_URL, else CLI_DEFAULT_URL */
  const char *token; /* --token, else $CEPHALON_TOKEN, else NULL (no Authorization header);
                        sent only in that header, never printed */
  bool json;         /* --json: print the daemon's JSON instead of a table */
  /* NULL, or asked about once a second while a call waits: non-zero abandons the call, which
   * then fails without a message (a long-poll cut short by Ctrl-C). */
  int (*cancel)(void *arg);
  void *cancel_arg;
} cli_ctx;

/* One command: argv[0] is the command's own name; returns a CLI_EXIT_* code. Usage errors
 * print the command's usage to stderr and return CLI_EXIT_USAGE. */
typedef struct cli_command {
  const char *name;
  int (*run)(const cli_ctx *ctx, int argc, char **argv);
  const char *usage;   /* "policy check FILE"; several forms are separated by '\n' */
  const char *summary; /* one line for the command list */
} cli_command;

int cli_cmd_policy(const cli_ctx *ctx, int argc, char **argv);
int cli_cmd_status(const cli_ctx *ctx, int argc, char **argv);
int cli_cmd_lanes(const cli_ctx *ctx, int argc, char **argv);
int cli_cmd_sessions(const cli_ctx *ctx, int argc, char **argv);
/* cephalonctl why SESSION: `sessions why SESSION` (the forecast of DESIGN §3.11 included). */
int cli_cmd_why(const cli_ctx *ctx, int argc, char **argv);
int cli_cmd_events(const cli_ctx *ctx, int argc, char **argv);
int cli_cmd_turns(const cli_ctx *ctx, int argc, char **argv);
int cli_cmd_context(const cli_ctx *ctx, int argc, char **argv);
int cli_cmd_top(const cli_ctx *ctx, int argc, char **argv);
int cli_cmd_backup(const cli_ctx *ctx, int argc, char **argv);
int cli_cmd_replies(const cli_ctx *ctx, int argc, char **argv);

/* ---------------------------------------------------------------- talking to cephalond (api.c) */

/* One answer of the daemon. */
typedef struct cli_reply {
  int status;      /* HTTP status */
  char reason[64]; /* its reason phrase */
  char *body;      /* raw body, NUL-terminated; "" when empty */
  size_t body_len;
  json_t *json; /* the parsed body; NULL when the body is empty (or not JSON on an error) */
} cli_reply;

/* cli_call flags. */
enum { CLI_CALL_ANY_STATUS = 1 }; /* hand back every HTTP answer; the caller judges it */

/* Sends `method path` with an optional JSON body to ctx->url, waiting up to timeout_ms for
 * the whole exchange. Returns CLI_EXIT_OK with *out filled when the daemon answered 2xx (any
 * status with CLI_CALL_ANY_STATUS). Otherwise prints exactly one line on stderr — cannot
 * reach, timed out, or the server's error code, message and field — and returns
 * CLI_EXIT_FAIL (CLI_EXIT_USAGE for a malformed --url or token). A non-empty 2xx body that
 * is not JSON is an error. *out is always safe to free. A 421 `misdirected` (cluster mode:
 * another node owns the session's shard) is followed once to the owner its error names. */
int cli_call(const cli_ctx *ctx, const char *method, const char *path, const json_t *body,
             int timeout_ms, int flags, cli_reply *out);
void cli_reply_free(cli_reply *r);
/* GET path (built by the caller, who frees it; a failed build is reported) into *reply, with
 * --json printing the answer itself. Returns the exit status; *printed tells whether the output
 * is done (--json), else a 0 leaves *reply for the caller to print. *reply is always safe to
 * free. */
int cli_get(const cli_ctx *ctx, const cph_buf *path, cli_reply *reply, bool *printed);

/* Prints "cephalonctl: STATUS CODE: MESSAGE (field: FIELD)" for an error answer, from the
 * DESIGN §9 error object when there is one, else from the status line and body. */
void cli_print_http_error(const cli_reply *r);

/* --json output: the body pretty-printed (the raw body if it is not JSON; nothing if it is
 * empty). Returns CLI_EXIT_OK, or CLI_EXIT_FAIL if stdout cannot be written. */
int cli_print_reply_json(const cli_reply *r);
int cli_print_json(const json_t *v);
/* Flushes stdout; CLI_EXIT_FAIL with a message if the output could not be written. */
int cli_finish_output(void);

/* Appends s percent-encoded as one URL path segment. */
void cli_path_segment(cph_buf *b, const char *s);
/* Appends "?name=value" or "&name=value" (value percent-encoded), by whether b has a '?'. */
void cli_query_param(cph_buf *b, const char *name, const char *value);
/* SIGINT and SIGTERM call handler (commands that run until interrupted: top, replies
 * --follow). */
void cli_on_stop_signals(void (*handler)(int sig));
/* The same with a number as the value. */
void cli_query_u64(cph_buf *b, const char *name, uint64_t value);

/* JSON readers: NULL / false when the key is absent or holds another type. */
const char *cli_json_string(const json_t *obj, const char *key);
bool cli_json_number(const json_t *obj, const char *key, double *out);
/* Appends a human form of v: strings as they are, integers exactly, reals with at most
 * three decimals, arrays of scalars joined by ", ", null/absent/empty as "-", objects as
 * compact JSON. */
void cli_format_value(cph_buf *b, const json_t *v);
/* Writes server-provided text to f with control characters replaced by '?', so an answer
 * cannot move the cursor or rewrite the terminal. */
void cli_put_clean(FILE *f, const char *s);

/* ---------------------------------------------------------------- command arguments (args.c) */

typedef enum cli_opt_kind {
  CLI_OPT_STRING, /* dest: const char ** (NULL when absent); given twice is an error */
  CLI_OPT_LIST,   /* dest: cli_list *; may repeat */
  CLI_OPT_UINT    /* dest: cli_uint *; decimal, 0..max */
} cli_opt_kind;

#define CLI_LIST_MAX 64
typedef struct cli_list {
  const char *items[CLI_LIST_MAX];
  size_t n;
} cli_list;

typedef struct cli_uint {
  bool set;
  uint64_t value;
} cli_uint;

typedef struct cli_opt {
  const char *name; /* "--class" */
  cli_opt_kind kind;
  void *dest;
  uint64_t max; /* CLI_OPT_UINT only */
} cli_opt;

/* Parses a command's arguments: options ("--name VALUE" or "--name=VALUE", anywhere) and up
 * to max_pos positionals (anything not starting with '-', and everything after "--").
 * Option values must be non-empty. Returns 0; 1 when -h/--help was given; or -1 after
 * printing the problem on stderr (the caller then prints its usage and exits 2). */
int cli_parse_args(int argc, char **argv, const cli_opt *opts, size_t nopts, const char **pos,
                   size_t max_pos, size_t *npos);

/* ---------------------------------------------------------------- tables (table.c) */

/* Rows of text cells printed with aligned columns, two spaces apart. */
typedef struct cli_table {
  size_t ncols;
  const char *const *headers;
  unsigned right_aligned; /* bit i set: column i is right-aligned (numbers) */
  char **cells;           /* rows * ncols owned strings */
  size_t rows, cap;
  bool failed; /* an allocation failed: print reports it */
} cli_table;

void cli_table_init(cli_table *t, size_t ncols, const char *const *headers,
                    unsigned right_aligned);
/* Copies ncols cells (NULL prints as "-"). */
void cli_table_add(cli_table *t, const char *const *cells);
/* CLI_EXIT_OK, or CLI_EXIT_FAIL (message printed) if an allocation failed. */
int cli_table_print(const cli_table *t, FILE *out);
void cli_table_free(cli_table *t);

#endif
