/* cephalonctl backup DIR — an online backup: asks cephalond to copy its store into DIR (POST
 * /v1/admin/backup) and follows it (GET /v1/admin/backup) until it is done, printing the bytes
 * written. The daemon keeps serving meanwhile; start a daemon on DIR to restore. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"

#define POLL_MS 200

static void backup_usage(FILE *out) {
  fprintf(out, "usage: cephalonctl backup DIR\n"
               "  Copies cephalond's store, consistent and compacted, into DIR (an absolute\n"
               "  path that does not exist or is an empty directory) while it keeps serving,\n"
               "  and waits for the copy, printing its progress. Restore: start cephalond with\n"
               "  --data DIR (or :server :data-dir).\n");
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

int cli_cmd_backup(const cli_ctx *ctx, int argc, char **argv) {
  const char *pos[1];
  size_t npos;
  int pr = cli_parse_args(argc - 1, argv + 1, NULL, 0, pos, 1, &npos);
  if (pr == 1) {
    backup_usage(stdout);
    return CLI_EXIT_OK;
  }
  if (pr < 0 || npos != 1) {
    backup_usage(stderr);
    return CLI_EXIT_USAGE;
  }
  json_t *body = json_pack("{s:s}", "dir", pos[0]);
  cli_reply r;
  int rc = cli_call(ctx, "POST", "/v1/admin/backup", body, CLI_TIMEOUT_MS, 0, &r);
  json_decref(body);
  if (rc != CLI_EXIT_OK)
    return rc;
  cli_reply_free(&r);
  for (;;) {
    rc = cli_call(ctx, "GET", "/v1/admin/backup", NULL, CLI_TIMEOUT_MS, 0, &r);
    if (rc != CLI_EXIT_OK)
      return rc;
    const char *state = cli_json_string(r.json, "state");
    double bytes = 0;
    cli_json_number(r.json, "bytes", &bytes);
    if (!state || strcmp(state, "running") != 0) {
      if (ctx->json) {
        rc = cli_print_reply_json(&r);
      } else if (state && strcmp(state, "done") == 0) {
        printf("backup done: %.0f bytes in %s\n", bytes, pos[0]);
      } else {
        const char *why = cli_json_string(r.json, "error");
        fputs("cephalonctl: backup failed: ", stderr);
        cli_put_clean(stderr, why ? why : (state ? state : "no state in the answer"));
        fputc('\n', stderr);
        rc = CLI_EXIT_FAIL;
      }
      cli_reply_free(&r);
      return rc == CLI_EXIT_OK ? cli_finish_output() : rc;
    }
    if (!ctx->json) {
      printf("backup running: %.0f bytes written\n", bytes);
      fflush(stdout);
    }
    cli_reply_free(&r);
    sleep_ms(POLL_MS);
  }
}
