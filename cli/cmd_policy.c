/* cephalonctl policy check FILE — validates a policy without a daemon (like `nginx -t`). */
#include <stdio.h>
#include <string.h>

#include "cephalon/policy.h"
#include "cli/cli.h"
#include "common/buf.h"

static void policy_usage(FILE *out) {
  fprintf(out, "usage: cephalonctl policy check FILE\n"
               "       cephalonctl policy reload\n"
               "  check   prints the effective policy (every key, defaults filled in) and exits\n"
               "          0, or prints FILE:LINE:COL: <key path>: <problem> to stderr and exits 1;\n"
               "          needs no daemon\n"
               "  reload  asks cephalond to reload its policy file; an invalid file is rejected\n"
               "          and the old policy stays in force\n");
}

/* Prints the effective policy to stdout, or the load error to stderr. */
static int policy_check(const char *path) {
  cph_err err = {0};
  cph_policy *p = NULL;
  if (cph_policy_load_file(path, &p, &err) != CPH_OK) {
    fprintf(stderr, "%s\n", err.msg);
    return CLI_EXIT_FAIL;
  }
  cph_buf out = CPH_BUF_INIT;
  cph_policy_write_edn(p, &out);
  cph_policy_free(p);
  if (cph_buf_error(&out) != CPH_OK) {
    cph_buf_free(&out);
    fprintf(stderr, "cephalonctl: out of memory\n");
    return CLI_EXIT_FAIL;
  }
  size_t written = fwrite(out.data, 1, out.len, stdout);
  bool ok = written == out.len && fflush(stdout) == 0;
  cph_buf_free(&out);
  if (!ok) {
    perror("cephalonctl: writing the policy");
    return CLI_EXIT_FAIL;
  }
  return CLI_EXIT_OK;
}

/* POST /v1/admin/policy/reload: prints the new generation and any note from the daemon
 * (settings that wait for a restart). */
static int policy_reload(const cli_ctx *ctx) {
  cli_reply r;
  int rc = cli_call(ctx, "POST", "/v1/admin/policy/reload", NULL, CLI_TIMEOUT_MS, 0, &r);
  if (rc != 0 || ctx->json) {
    if (rc == 0)
      rc = cli_print_reply_json(&r);
    cli_reply_free(&r);
    return rc;
  }
  double generation;
  fputs("policy reloaded", stdout);
  if (cli_json_number(r.json, "policy_generation", &generation) ||
      cli_json_number(r.json, "generation", &generation))
    printf(", generation %.0f", generation);
  fputc('\n', stdout);
  static const char *const notes[] = {"message", "note", "warning"};
  for (size_t i = 0; i < sizeof notes / sizeof notes[0]; i++) {
    const char *note = cli_json_string(r.json, notes[i]);
    if (note && note[0]) {
      fputs("note: ", stdout);
      cli_put_clean(stdout, note);
      fputc('\n', stdout);
    }
  }
  cli_reply_free(&r);
  return cli_finish_output();
}

int cli_cmd_policy(const cli_ctx *ctx, int argc, char **argv) {
  /* check: --json does not apply, the policy is EDN and needs no daemon */
  if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
                    strcmp(argv[1], "help") == 0)) {
    policy_usage(stdout);
    return CLI_EXIT_OK;
  }
  if (argc == 3 && strcmp(argv[1], "check") == 0)
    return policy_check(argv[2]);
  if (argc == 2 && strcmp(argv[1], "reload") == 0)
    return policy_reload(ctx);
  policy_usage(stderr);
  return CLI_EXIT_USAGE;
}
