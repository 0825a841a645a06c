/* libFuzzer target: the msgpack request-body reader of the API (server/mpjson.h).
 *
 * Input: any bytes, as an application/msgpack request body. Checks the reader's contract:
 * a refused body yields NULL and a message saying where; an accepted one is a JSON value
 * that cph_mpjson_write packs back to bytes that read to an equal value (json_equal), and
 * that jansson can dump as JSON text (what the JSON side of the API would see). */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/mpjson.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_fail(const char *what, const char *msg) {
  fprintf(stderr, "fuzz_msgpack_body: %s %s\n", what, msg ? msg : "");
  abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char err[256];
  json_t *v = cph_mpjson_read(data, size, err, sizeof err);
  if (!v) {
    if (strncmp(err, "invalid msgpack at byte ", 24) != 0)
      fuzz_fail("refused without saying where:", err);
    return 0;
  }
  size_t len = 0;
  char *packed = cph_mpjson_write(v, &len);
  if (!packed)
    fuzz_fail("packing an accepted value failed", NULL);
  json_t *w = cph_mpjson_read(packed, len, err, sizeof err);
  if (!w)
    fuzz_fail("the packed value does not read back:", err);
  if (!json_equal(v, w))
    fuzz_fail("the packed value reads back unequal", NULL);
  char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
  if (!text)
    fuzz_fail("an accepted value cannot be dumped as JSON", NULL);
  json_error_t je;
  json_t *x = json_loads(text, JSON_DECODE_ANY | JSON_REJECT_DUPLICATES, &je);
  if (!x)
    fuzz_fail("its JSON text does not load:", je.text);
  json_decref(x);
  free(text);
  json_decref(w);
  free(packed);
  json_decref(v);
  return 0;
}
