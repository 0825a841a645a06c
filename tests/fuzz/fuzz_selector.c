/* libFuzzer target: PACT selectors and coordinates (core/pact.h).
 *
 * Input: any bytes, as one NUL-terminated text (bytes after an embedded NUL are ignored, as a
 * C caller would). Parsed both as a selector and as a coordinate. Checks: a parsed selector
 * can be matched against nodes; a parsed coordinate formats (cph_coord_format) to text that
 * parses back to the same coordinate, and that text is also a selector matching a node at
 * exactly that coordinate. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/pact.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_fail(const char *what, const char *text) {
  fprintf(stderr, "fuzz_selector: %s\n%s\n", what, text ? text : "");
  abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1);
  if (!s)
    return 0;
  memcpy(s, data, size);
  s[size] = '\0';

  cph_err err = {0};
  cph_selector *sel = NULL;
  int rc = cph_selector_parse(s, &sel, &err);
  if (rc == CPH_OK) {
    char *tags[] = {"a", "b"};
    cph_pact_node nodes[] = {
        {.id = 1, .at = {-1, 0, 0}},
        {.id = 7, .at = {0, 1, -2}, .key = "k", .tags = tags, .n_tags = 2},
        {.id = UINT64_MAX, .at = {INT32_MAX, INT32_MAX, INT32_MIN}},
    };
    for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; i++)
      (void)cph_selector_match(sel, &nodes[i]);
    cph_selector_free(sel);
  } else if (sel) {
    fuzz_fail("selector parse failed but left a selector", s);
  } else if (err.msg[0] == '\0') {
    fuzz_fail("selector parse failed without a message", s);
  }

  cph_coord c;
  if (cph_coord_parse(s, &c, &err) == CPH_OK) {
    char text[48];
    cph_coord_format(&c, text);
    cph_coord back;
    if (cph_coord_parse(text, &back, &err) != CPH_OK)
      fuzz_fail("formatted coordinate does not parse", text);
    if (back.depth != c.depth || back.position != c.position || back.offset != c.offset)
      fuzz_fail("formatted coordinate parses to another one", text);
    cph_selector *exact = NULL;
    if (cph_selector_parse(text, &exact, &err) != CPH_OK)
      fuzz_fail("a coordinate is not a selector", text);
    cph_pact_node n = {.id = 1, .at = c};
    if (!cph_selector_match(exact, &n))
      fuzz_fail("a coordinate selector does not match its own coordinate", text);
    cph_selector_free(exact);
  }
  free(s);
  return 0;
}
