/* cephalonctl policy check FILE — validates a policy without a daemon (like `nginx -t`). */
#include <stdio.h>
#include <string.h>

#include "cephalon/policy.h"
#include "cli/cli.h"
#include "common/buf.h"

static void policy_usage(FILE *out) {
  fprintf(out, "usage: cephalonctl policy check FILE\n"
               "  Prints the effective policy (every key, defaults filled in) and exits 0,\n"
               "  or prints FILE:LINE:COL: <key path>: <problem> to stderr and exits 1.\n");
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

int cli_cmd_policy(const cli_ctx *ctx, int argc, char **argv) {
  (void)ctx; /* --json does not apply: the policy is EDN and needs no daemon */
  if (argc == 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
                    strcmp(argv[1], "help") == 0)) {
    policy_usage(stdout);
    return CLI_EXIT_OK;
  }
  if (argc == 3 && strcmp(argv[1], "check") == 0)
    return policy_check(argv[2]);
  policy_usage(stderr);
  return CLI_EXIT_USAGE;
}
