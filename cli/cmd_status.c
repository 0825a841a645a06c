/* cephalonctl status — is the daemon up, which policy, how busy — and cephalonctl lanes. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static void status_usage(FILE *out) {
  fprintf(out, "usage: cephalonctl status\n"
               "  Checks /healthz and /readyz and prints the policy generation, the\n"
               "  concurrency in use and each lane's budget left and queue.\n");
}

static void lanes_usage(FILE *out) {
  fprintf(out, "usage: cephalonctl lanes\n"
               "  Prints each lane's budget left and per minute, runnable and running\n"
               "  sessions, and the concurrency in use.\n");
}

/* A command that takes no arguments: 0 to go on, or the exit code. */
static int no_args(int argc, char **argv, void (*usage)(FILE *), bool *done) {
  const char *pos[1];
  size_t npos;
  int r = cli_parse_args(argc - 1, argv + 1, NULL, 0, pos, 0, &npos);
  *done = r != 0;
  if (r == 1) {
    usage(stdout);
    return CLI_EXIT_OK;
  }
  if (r < 0) {
    usage(stderr);
    return CLI_EXIT_USAGE;
  }
  return CLI_EXIT_OK;
}

/* The number at obj[key] with `decimals` decimals, or "-" when absent. */
static void num_cell(char *dst, size_t n, const json_t *obj, const char *key, int decimals) {
  double v;
  if (cli_json_number(obj, key, &v))
    snprintf(dst, n, "%.*f", decimals, v);
  else
    snprintf(dst, n, "-");
}

/* Checks the DESIGN §9 lanes shape enough to print it. */
static const json_t *lanes_array(const json_t *body) {
  const json_t *lanes = json_is_object(body) ? json_object_get(body, "lanes") : NULL;
  if (!json_is_array(lanes)) {
    fprintf(stderr, "cephalonctl: GET /v1/lanes: unexpected answer (no \"lanes\" list)\n");
    return NULL;
  }
  return lanes;
}

static void print_concurrency(const json_t *body) {
  const json_t *c = json_object_get(body, "concurrency");
  char in_use[32], limit[32];
  num_cell(in_use, sizeof in_use, c, "in_use", 0);
  num_cell(limit, sizeof limit, c, "limit", 0);
  printf("concurrency: %s of %s in use\n", in_use, limit);
}

/* The lanes table; with_budget adds the per-minute budgets. */
static int print_lanes(const json_t *lanes, bool with_budget) {
  static const char *const short_headers[] = {"LANE", "TURNS_LEFT", "TOOL_CALLS_LEFT", "RUNNABLE",
                                              "RUNNING"};
  static const char *const long_headers[] = {"LANE",           "TURNS_LEFT", "TURNS/MIN",
                                             "TOOL_CALLS_LEFT", "TOOL_CALLS/MIN", "RUNNABLE",
                                             "RUNNING"};
  cli_table t;
  if (with_budget)
    cli_table_init(&t, 7, long_headers, 0x7e);
  else
    cli_table_init(&t, 5, short_headers, 0x1e);
  size_t i;
  const json_t *lane;
  json_array_foreach(lanes, i, lane) {
    const json_t *budget = json_object_get(lane, "budget");
    char turns[32], tools[32], runnable[32], running[32], bturns[32], btools[32];
    num_cell(turns, sizeof turns, lane, "turns_left", 1);
    num_cell(tools, sizeof tools, lane, "tool_calls_left", 1);
    num_cell(runnable, sizeof runnable, lane, "runnable", 0);
    num_cell(running, sizeof running, lane, "running", 0);
    num_cell(bturns, sizeof bturns, budget, "turns", 0);
    num_cell(btools, sizeof btools, budget, "tool_calls", 0);
    const char *name = cli_json_string(lane, "name");
    if (with_budget)
      cli_table_add(&t, (const char *const[]){name, turns, bturns, tools, btools, runnable,
                                              running});
    else
      cli_table_add(&t, (const char *const[]){name, turns, tools, runnable, running});
  }
  int rc = cli_table_print(&t, stdout);
  cli_table_free(&t);
  return rc;
}

int cli_cmd_lanes(const cli_ctx *ctx, int argc, char **argv) {
  bool done;
  int rc = no_args(argc, argv, lanes_usage, &done);
  if (done)
    return rc;
  cli_reply r;
  if ((rc = cli_call(ctx, "GET", "/v1/lanes", NULL, CLI_TIMEOUT_MS, 0, &r)) != 0)
    goto out;
  if (ctx->json) {
    rc = cli_print_reply_json(&r);
    goto out;
  }
  const json_t *lanes = lanes_array(r.json);
  if (!lanes) {
    rc = CLI_EXIT_FAIL;
    goto out;
  }
  if ((rc = print_lanes(lanes, true)) == 0) {
    print_concurrency(r.json);
    rc = cli_finish_output();
  }
out:
  cli_reply_free(&r);
  return rc;
}

/* --json: the three answers in one object, each body as the daemon sent it. */
static int print_status_json(const cli_ctx *ctx, const cli_reply *health, const cli_reply *ready,
                             const cli_reply *lanes) {
  json_t *all = json_pack("{s:s, s:O?, s:O?, s:O?}", "url", ctx->url, "healthz", health->json,
                          "readyz", ready->json, "lanes", lanes->json);
  if (!all) {
    fprintf(stderr, "cephalonctl: out of memory\n");
    return CLI_EXIT_FAIL;
  }
  int rc = cli_print_json(all);
  json_decref(all);
  return rc;
}

int cli_cmd_status(const cli_ctx *ctx, int argc, char **argv) {
  bool done;
  int rc = no_args(argc, argv, status_usage, &done);
  if (done)
    return rc;
  cli_reply health, ready, lanes;
  memset(&ready, 0, sizeof ready);
  memset(&lanes, 0, sizeof lanes);
  if ((rc = cli_call(ctx, "GET", "/healthz", NULL, CLI_TIMEOUT_MS, 0, &health)) != 0)
    goto out;
  /* Not ready (503) is a state to report, not a failed call. */
  if ((rc = cli_call(ctx, "GET", "/readyz", NULL, CLI_TIMEOUT_MS, CLI_CALL_ANY_STATUS, &ready)) !=
      0)
    goto out;
  bool is_ready = ready.status >= 200 && ready.status < 300;
  if (is_ready && (rc = cli_call(ctx, "GET", "/v1/lanes", NULL, CLI_TIMEOUT_MS, 0, &lanes)) != 0)
    goto out;

  if (ctx->json) {
    rc = print_status_json(ctx, &health, &ready, &lanes);
  } else {
    const char *state = cli_json_string(ready.json, "status");
    printf("cephalond at %s: reachable, ", ctx->url);
    cli_put_clean(stdout, is_ready ? (state ? state : "ready") : "not ready");
    fputc('\n', stdout);
    double generation;
    if (cli_json_number(ready.json, "policy_generation", &generation))
      printf("policy generation: %.0f\n", generation);
    const json_t *lane_list = is_ready ? lanes_array(lanes.json) : NULL;
    if (is_ready && !lane_list)
      rc = CLI_EXIT_FAIL;
    if (lane_list) {
      print_concurrency(lanes.json);
      rc = print_lanes(lane_list, false);
    }
    if (rc == 0)
      rc = cli_finish_output();
  }
  if (rc == 0 && !is_ready) {
    cli_print_http_error(&ready);
    rc = CLI_EXIT_FAIL;
  }
out:
  cli_reply_free(&health);
  cli_reply_free(&ready);
  cli_reply_free(&lanes);
  return rc;
}
