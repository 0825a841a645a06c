/* server/emit.c: the same calls written as JSON and as msgpack read back (jansson, and the
 * daemon's own msgpack reader) to the same document, built here by hand; JSON escapes, and
 * ill-formed UTF-8 repaired to U+FFFD in both forms; and, as a property, thousands of random
 * strings (plain runs of every length around the 8- and 16-byte skips, escapes, UTF-8, bad
 * bytes) read back as a reference repair of them says. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/emit.h"
#include "server/mpjson.h"
#include "tests/support/prop.h"

#define FFFD "\xef\xbf\xbd"

/* The strings written, and what a reader must get back. */
static const struct {
  const char *in, *out;
} STRINGS[] = {
    {"plain", "plain"},
    {"quote\" back\\ nl\n cr\r tab\t ctrl\x01 del\x7f", "quote\" back\\ nl\n cr\r tab\t ctrl\x01 del\x7f"},
    {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"},
    {"bad \xff end", "bad " FFFD " end"},
    {"cut \xe2\x82", "cut " FFFD FFFD},
    {"overlong \xc0\xaf", "overlong " FFFD FFFD},
    {"surrogate \xed\xa0\x80", "surrogate " FFFD FFFD FFFD},
    {"", ""},
    /* every special byte at every offset of a word, among plain ones */
    {"abcdefg\"hijklmn\\opqrstu\x1fvwxyz01\xc3\xa9" "234567\x7f" "89abcdef",
     "abcdefg\"hijklmn\\opqrstu\x1fvwxyz01\xc3\xa9" "234567\x7f" "89abcdef"},
    {"0123456\n0123456\xff" "0123456\"", "0123456\n0123456" FFFD "0123456\""},
    {"\"1234567\\1234567\x01", "\"1234567\\1234567\x01"},
};
#define N_STRINGS (sizeof STRINGS / sizeof STRINGS[0])

static void write_doc(cph_emit *w) {
  cph_emit_object(w, 4);
  cph_emit_key(w, "strings");
  cph_emit_array(w, N_STRINGS + 1);
  for (size_t i = 0; i < N_STRINGS; i++)
    cph_emit_str(w, STRINGS[i].in);
  cph_emit_str(w, NULL);
  cph_emit_end(w);
  cph_emit_key(w, "numbers");
  cph_emit_object(w, 9);
  cph_emit_key(w, "zero");
  cph_emit_i64(w, 0);
  cph_emit_key(w, "min");
  cph_emit_i64(w, INT64_MIN);
  cph_emit_key(w, "seven");
  cph_emit_u64(w, 7);
  cph_emit_key(w, "big");
  cph_emit_u64(w, UINT64_MAX);
  cph_emit_key(w, "neg");
  cph_emit_i64(w, -42);
  cph_emit_key(w, "half");
  cph_emit_real(w, 0.5);
  cph_emit_key(w, "three");
  cph_emit_real(w, 3.0);
  cph_emit_key(w, "huge");
  cph_emit_real(w, 1e300);
  cph_emit_key(w, "tenth");
  cph_emit_real(w, 0.1);
  cph_emit_end(w);
  cph_emit_key(w, "flags");
  cph_emit_array(w, 2);
  cph_emit_bool(w, true);
  cph_emit_bool(w, false);
  cph_emit_end(w);
  cph_emit_key(w, "empty");
  cph_emit_array(w, 0);
  cph_emit_end(w);
  cph_emit_end(w);
}

static json_t *expected_doc(void) {
  json_t *strings = json_array();
  for (size_t i = 0; i < N_STRINGS; i++)
    json_array_append_new(strings, json_string(STRINGS[i].out));
  json_array_append_new(strings, json_null());
  return json_pack("{s:o, s:{s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:f}, s:[b,b], s:[]}", "strings", strings,
                   "numbers", "zero", (json_int_t)0, "min", (json_int_t)INT64_MIN, "seven", (json_int_t)7, "big", (json_int_t)INT64_MAX, "neg", (json_int_t)-42, "half", 0.5,
                   "three", 3.0, "huge", 1e300, "tenth", 0.1, "flags", 1, 0, "empty");
}

static void test_json_reads_back_to_the_document(void **state) {
  (void)state;
  cph_buf b = CPH_BUF_INIT;
  cph_emit w;
  cph_emit_init(&w, &b, false);
  write_doc(&w);
  assert_int_equal(cph_buf_error(&b), 0);
  json_error_t jerr;
  json_t *got = json_loadb(b.data, b.len, JSON_DECODE_ANY, &jerr);
  if (!got)
    fail_msg("not JSON (%s) at %d: %s", jerr.text, jerr.position, b.data);
  json_t *want = expected_doc();
  assert_non_null(want);
  if (!json_equal(got, want)) {
    char *g = json_dumps(got, JSON_COMPACT), *x = json_dumps(want, JSON_COMPACT);
    fail_msg("got  %s\nwant %s", g, x);
  }
  /* reals stay reals, control characters use the short or \u form */
  assert_true(json_is_real(json_object_get(json_object_get(got, "numbers"), "three")));
  assert_non_null(strstr(b.data, "ctrl\\u0001"));
  assert_non_null(strstr(b.data, "nl\\n cr\\r tab\\t"));
  json_decref(got);
  json_decref(want);
  cph_buf_free(&b);
}

static void test_msgpack_reads_back_to_the_same_document(void **state) {
  (void)state;
  cph_buf b = CPH_BUF_INIT;
  cph_emit w;
  cph_emit_init(&w, &b, true);
  write_doc(&w);
  assert_int_equal(cph_buf_error(&b), 0);
  char err[256];
  json_t *got = cph_mpjson_read(b.data, b.len, err, sizeof err);
  if (!got)
    fail_msg("not msgpack: %s", err);
  json_t *want = expected_doc();
  if (!json_equal(got, want)) {
    char *g = json_dumps(got, JSON_COMPACT), *x = json_dumps(want, JSON_COMPACT);
    fail_msg("got  %s\nwant %s", g, x);
  }
  json_decref(got);
  json_decref(want);
  cph_buf_free(&b);
}

/* The reference repair, written apart from emit.c: each well-formed UTF-8 sequence (RFC 3629:
 * no overlongs, no surrogates, nothing above U+10FFFF) kept, every other byte one U+FFFD. */
static size_t ref_seq(const uint8_t *p, size_t avail) {
  static const struct {
    uint8_t lo_lead, hi_lead, lo2, hi2, n;
  } FORMS[] = {{0xc2, 0xdf, 0x80, 0xbf, 2}, {0xe0, 0xe0, 0xa0, 0xbf, 3},
               {0xe1, 0xec, 0x80, 0xbf, 3}, {0xed, 0xed, 0x80, 0x9f, 3},
               {0xee, 0xef, 0x80, 0xbf, 3}, {0xf0, 0xf0, 0x90, 0xbf, 4},
               {0xf1, 0xf3, 0x80, 0xbf, 4}, {0xf4, 0xf4, 0x80, 0x8f, 4}};
  for (size_t f = 0; f < sizeof FORMS / sizeof FORMS[0]; f++) {
    if (p[0] < FORMS[f].lo_lead || p[0] > FORMS[f].hi_lead)
      continue;
    size_t n = FORMS[f].n;
    if (avail < n || p[1] < FORMS[f].lo2 || p[1] > FORMS[f].hi2)
      return 0;
    for (size_t i = 2; i < n; i++)
      if (p[i] < 0x80 || p[i] > 0xbf)
        return 0;
    return n;
  }
  return 0;
}

static size_t ref_repair(const uint8_t *in, size_t len, char *out) {
  size_t o = 0;
  for (size_t i = 0; i < len;) {
    size_t n = in[i] < 0x80 ? 1 : ref_seq(in + i, len - i);
    if (n) {
      memcpy(out + o, in + i, n);
      o += n;
      i += n;
    } else {
      memcpy(out + o, FFFD, 3);
      o += 3;
      i++;
    }
  }
  out[o] = '\0';
  return o;
}

static void test_random_strings_read_back_repaired(void **state) {
  (void)state;
  static const char *const PIECES[] = {"\"", "\\", "\n", "\x01", "\x1f", "\x7f", "\xc3\xa9",
                                       "\xe2\x82\xac", "\xf0\x9f\x98\x80", "\xff", "\xe2\x82",
                                       "\xc0\xaf", "\xed\xa0\x80", "\x80"};
  uint64_t seed;
  long cases;
  cph_property_run(20261125, 5000, &seed, &cases);
  for (long c = 0; c < cases; c++) {
    rng r = {seed + (uint64_t)c};
    uint8_t in[256];
    size_t len = 0, target = below(&r, 120);
    while (len < target) { /* a plain run of any length, then now and then a special piece */
      size_t run = below(&r, 4) == 0 ? below(&r, 40) : below(&r, 4);
      for (size_t i = 0; i < run && len < sizeof in - 8; i++)
        in[len++] = (uint8_t)(0x20 + below(&r, 0x5f));
      const char *piece = PIECES[below(&r, sizeof PIECES / sizeof PIECES[0])];
      if (below(&r, 3) == 0 && len + strlen(piece) < sizeof in)
        for (const char *q = piece; *q; q++)
          in[len++] = (uint8_t)*q;
      if (len >= sizeof in - 8)
        break;
    }
    in[len] = '\0';
    char want[3 * sizeof in + 1];
    ref_repair(in, len, want);
    cph_buf b = CPH_BUF_INIT;
    cph_emit w;
    cph_emit_init(&w, &b, false);
    cph_emit_array(&w, 1);
    cph_emit_str(&w, (const char *)in); /* NUL-terminated: no NUL inside */
    cph_emit_end(&w);
    json_error_t jerr;
    json_t *got = json_loadb(b.data, b.len, 0, &jerr);
    if (!got || !json_is_string(json_array_get(got, 0)) ||
        strcmp(json_string_value(json_array_get(got, 0)), want) != 0)
      fail_msg("case seed %llu: %zu bytes written as %s (%s)", (unsigned long long)(seed + c), len,
               b.data, got ? "read back differently" : jerr.text);
    json_decref(got);
    cph_buf_free(&b);
  }
}

/* Integers of every length and sign, written as JSON, against printf's decimal: 20,000 seeded
 * values (every power of ten and its neighbours too), each alone in an array. */
static void test_integers_match_printf(void **state) {
  (void)state;
  rng r = {777};
  for (int i = 0; i < 20000; i++) {
    int64_t v;
    if (i < 19 * 3) { /* 10^k - 1, 10^k, 10^k + 1 */
      int64_t p = 1;
      for (int k = 0; k < i / 3; k++)
        p *= 10;
      v = p - 1 + i % 3;
    } else {
      uint64_t x = next(&r);
      v = (int64_t)(x >> below(&r, 64)); /* every magnitude */
      if (below(&r, 2))
        v = v == INT64_MIN ? v : -v;
      if (i == 19 * 3)
        v = INT64_MIN;
    }
    cph_buf out = CPH_BUF_INIT;
    cph_emit w;
    cph_emit_init(&w, &out, false);
    cph_emit_array(&w, 1);
    cph_emit_i64(&w, v);
    cph_emit_end(&w);
    char want[32];
    snprintf(want, sizeof want, "[%lld]", (long long)v);
    cph_buf_putc(&out, '\0');
    if (strcmp(out.data, want) != 0)
      fail_msg("%lld written as %s", (long long)v, out.data);
    cph_buf_free(&out);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_json_reads_back_to_the_document),
      cmocka_unit_test(test_msgpack_reads_back_to_the_same_document),
      cmocka_unit_test(test_random_strings_read_back_repaired),
      cmocka_unit_test(test_integers_match_printf),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
