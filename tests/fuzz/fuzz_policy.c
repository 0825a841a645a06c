/* libFuzzer target: the policy loader (cph_policy_load_text, include/cephalon/policy.h).
 *
 * Input: any bytes, loaded as a policy file. Checks the loader's contract: a rejected text
 * yields no policy and an error message naming the file; an accepted one writes back
 * (cph_policy_write_edn) to text that loads to an equal policy (cph_policy_equal). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/policy.h"
#include "common/buf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_fail(const char *what, const char *text) {
  fprintf(stderr, "fuzz_policy: %s\n%s\n", what, text ? text : "");
  abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  cph_policy *p = NULL;
  cph_err err = {0};
  int rc = cph_policy_load_text("fuzz.edn", (const char *)data, size, &p, &err);
  if (rc != CPH_OK) {
    if (p)
      fuzz_fail("load failed but left a policy", NULL);
    if (rc != CPH_EPOLICY && rc != CPH_ENOMEM)
      fuzz_fail("load failed with an undocumented code", err.msg);
    if (strncmp(err.msg, "fuzz.edn", 8) != 0)
      fuzz_fail("error message does not name the file", err.msg);
    return 0;
  }
  cph_buf out = CPH_BUF_INIT;
  cph_policy_write_edn(p, &out);
  if (cph_buf_error(&out) != CPH_OK)
    fuzz_fail("write ran out of memory", NULL);
  cph_policy *q = NULL;
  if (cph_policy_load_text("written.edn", out.data, out.len, &q, &err) != CPH_OK)
    fuzz_fail(err.msg, out.data);
  if (!cph_policy_equal(p, q))
    fuzz_fail("written policy loads back unequal", out.data);
  /* Lookups used on every ingest: any channel name must give a setting. */
  if (!cph_policy_backpressure_for(p, "general") || !cph_policy_retention_for(p, "general"))
    fuzz_fail("lookup returned NULL", NULL);
  cph_policy_free(q);
  cph_policy_free(p);
  cph_buf_free(&out);
  return 0;
}
