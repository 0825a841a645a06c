/* libFuzzer target: the EDN reader (policy/edn.h).
 *
 * Input: any bytes, parsed as one EDN value. Beyond "no crash, no leak, no UB" it checks the
 * reader/writer contract: a value that parses is written back (cph_edn_write) to text that
 * parses to an equal value (cph_edn_equal), and writing that second value gives the same
 * text again (the writer is a fixed point after one round). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/error.h"
#include "policy/edn.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Aborts with what went wrong, so libFuzzer saves the input as a crash. */
static void fuzz_fail(const char *what, const char *text) {
  fprintf(stderr, "fuzz_edn: %s\n%s\n", what, text ? text : "");
  abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  cph_edn *v = NULL;
  cph_edn_error err;
  /* First with a tiny depth limit and duplicates allowed, so those paths run too. */
  cph_edn_options tight = {4, true};
  if (cph_edn_parse((const char *)data, size, &tight, &v, &err) == CPH_OK)
    cph_edn_free(v);
  v = NULL;
  if (cph_edn_parse((const char *)data, size, NULL, &v, &err) != CPH_OK) {
    if (v)
      fuzz_fail("parse failed but left a value", NULL);
    if (err.message[0] == '\0')
      fuzz_fail("parse failed without a message", NULL);
    return 0;
  }
  cph_buf out = CPH_BUF_INIT;
  cph_edn_write(v, &out);
  if (cph_buf_error(&out) != CPH_OK)
    fuzz_fail("write ran out of memory", NULL);
  /* Reparse with the most permissive options: the writer may emit what the first parse's
   * caller-chosen limits allowed. */
  cph_edn_options again = {CPH_EDN_MAX_DEPTH_LIMIT, true};
  cph_edn *w = NULL;
  if (cph_edn_parse(out.data ? out.data : "", out.len, &again, &w, &err) != CPH_OK) {
    char msg[256];
    snprintf(msg, sizeof msg, "written text does not parse: %u:%u: %s", err.line, err.column,
             err.message);
    fuzz_fail(msg, out.data);
  }
  if (!cph_edn_equal(v, w))
    fuzz_fail("written text reads back unequal", out.data);
  cph_buf out2 = CPH_BUF_INIT;
  cph_edn_write(w, &out2);
  if (out.len != out2.len || (out.len && memcmp(out.data, out2.data, out.len) != 0))
    fuzz_fail("second write differs from the first", out2.data);
  cph_buf_free(&out2);
  cph_buf_free(&out);
  cph_edn_free(w);
  cph_edn_free(v);
  return 0;
}
