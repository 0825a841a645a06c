/* Conformance tests for the EDN reader/writer (policy/edn.h).
 *
 * Every document is parsed from an exact-size heap copy without a trailing NUL, so
 * AddressSanitizer proves the reader never reads past len. Expected values are never produced
 * by the writer from the same parse: they are checked field by field or compared with a second,
 * hand-written document in canonical form. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <locale.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/error.h"
#include "policy/edn.h"

/* Test seam in policy/edn.c (not part of the API): the allocation that brings it to 0 fails. */
extern _Thread_local long cph_edn__fail_alloc_countdown;

#define LEN_AUTO ((size_t)-1)
#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* Parses doc[0..len) from a heap copy of exactly len bytes. */
static int parse_exact(const char *doc, size_t len, const cph_edn_options *opts, cph_edn **out,
                       cph_edn_error *err) {
  if (len == LEN_AUTO)
    len = strlen(doc);
  char *copy = malloc(len ? len : 1);
  assert_non_null(copy);
  memcpy(copy, doc, len);
  int rc = cph_edn_parse(copy, len, opts, out, err);
  free(copy);
  return rc;
}

static cph_edn *must_parse_opts(const char *doc, const cph_edn_options *opts) {
  cph_edn *v = NULL;
  cph_edn_error err;
  int rc = parse_exact(doc, LEN_AUTO, opts, &v, &err);
  if (rc != CPH_OK)
    fail_msg("parse of <%s> failed at %u:%u: %s", doc, err.line, err.column, err.message);
  assert_non_null(v);
  return v;
}

static cph_edn *must_parse(const char *doc) { return must_parse_opts(doc, NULL); }

/* Writes v and returns the text (free it). */
static char *write_to_string(const cph_edn *v) {
  cph_buf b = CPH_BUF_INIT;
  cph_edn_write(v, &b);
  assert_int_equal(cph_buf_error(&b), CPH_OK);
  char *s = cph_buf_steal(&b);
  assert_non_null(s);
  return s;
}

/* ---------------------------------------------------------------------------------------------
 * Valid documents compared with a hand-written canonical equivalent
 * ------------------------------------------------------------------------------------------- */

typedef struct equiv_case {
  const char *doc;
  const char *canonical;
  cph_edn_type type;
} equiv_case;

static const equiv_case equiv_cases[] = {
    {"nil", "nil", CPH_EDN_NIL},
    {"  \t\n nil \r\n", "nil", CPH_EDN_NIL},
    {"true", "true", CPH_EDN_BOOL},
    {"[1 2 3]", "[1,2,3]", CPH_EDN_VECTOR},
    {"(1 2 3)", "(1\n2\n3)", CPH_EDN_LIST},
    {"{:a 1, :b 2}", "{:b 2 :a 1}", CPH_EDN_MAP},
    {"#{1 2 3}", "#{3 2 1}", CPH_EDN_SET},
    {"[ ]", "[]", CPH_EDN_VECTOR},
    {"( )", "()", CPH_EDN_LIST},
    {"{ }", "{}", CPH_EDN_MAP},
    {"#{ }", "#{}", CPH_EDN_SET},
    {",,,[,1,,2,],,,", "[1 2]", CPH_EDN_VECTOR},
    {"[1\r\n2]", "[1 2]", CPH_EDN_VECTOR},
    {"[1 #_2]", "[1]", CPH_EDN_VECTOR},
    {"[1 #_ 2 3]", "[1 3]", CPH_EDN_VECTOR},
    {"[#_1]", "[]", CPH_EDN_VECTOR},
    {"#_ #_ a b c", "c", CPH_EDN_SYMBOL},
    {"[#_ #_ 1 2]", "[]", CPH_EDN_VECTOR},
    {"[#_ #_ 1 2 3]", "[3]", CPH_EDN_VECTOR},
    {"[a #_ [nested [deep {:x #{1}}]] b]", "[a b]", CPH_EDN_VECTOR},
    {"#_ {:x 1} 42", "42", CPH_EDN_INT},
    {"42 #_ 43", "42", CPH_EDN_INT},
    {"42 #_43 ; trailing comment", "42", CPH_EDN_INT},
    {"{:a #_ :ignored 1}", "{:a 1}", CPH_EDN_MAP},
    {"{:a 1 #_:b}", "{:a 1}", CPH_EDN_MAP},
    {"; leading comment\n[1 2] ; trailing", "[1 2]", CPH_EDN_VECTOR},
    {"[1 2] ; comment at EOF without a newline", "[1 2]", CPH_EDN_VECTOR},
    {"{:a ; comment inside\n 1}", "{:a 1}", CPH_EDN_MAP},
    {"[1;no space before the comment\n2]", "[1 2]", CPH_EDN_VECTOR},
    {"[a(b)c]", "[a (b) c]", CPH_EDN_VECTOR},
    {"[\"a\"\"b\"]", "[\"a\" \"b\"]", CPH_EDN_VECTOR},
    {"[\\a\\b]", "[\\a \\b]", CPH_EDN_VECTOR},
    {"[1[2]{3 4}#{5}]", "[1 [2] {3 4} #{5}]", CPH_EDN_VECTOR},
    {"(\\( \\) \\[ \\] \\{ \\})", "(\\u0028 \\u0029 \\u005B \\u005D \\u007B \\u007D)",
     CPH_EDN_LIST},
    {"[nil true false]", "[nil,true,false]", CPH_EDN_VECTOR},
    {"[1N +1 -0]", "[1 1 0]", CPH_EDN_VECTOR},
    {"[##Inf ##-Inf ##NaN]", "[##Inf,##-Inf,##NaN]", CPH_EDN_VECTOR},
    {"\"multi\nline\"", "\"multi\\nline\"", CPH_EDN_STRING},
    {"\"\\u00e9\\u20AC\"", "\"\xc3\xa9\xe2\x82\xac\"", CPH_EDN_STRING},
    {"#{#{1 2} #{3}}", "#{#{3} #{2 1}}", CPH_EDN_SET},
    {"{[1 2] :vec-key, {:m 1} :map-key, #{1} :set-key, \"s\" 1, 1.5 2, \\c 3, nil 4}",
     "{nil 4 \\c 3 1.5 2 \"s\" 1 #{1} :set-key {:m 1} :map-key [1 2] :vec-key}", CPH_EDN_MAP},
    {"#inst \"1985-04-12T23:20:50.52Z\"", "#inst   \"1985-04-12T23:20:50.52Z\"", CPH_EDN_TAGGED},
    {"#myapp/Foo{:a 1}", "#myapp/Foo {:a 1}", CPH_EDN_TAGGED},
    {"#uuid \"f81d4fae-7dec-11d0-a765-00a0c91e6bf6\"",
     "#uuid\t\"f81d4fae-7dec-11d0-a765-00a0c91e6bf6\"", CPH_EDN_TAGGED},
    {"#a #b 1", "#a\n#b\n1", CPH_EDN_TAGGED},
    {"#foo #_ 1 2", "#foo 2", CPH_EDN_TAGGED},
    {"[- + / -a +b .b ->x a.b* a'b a#b]", "[-,+,/,-a,+b,.b,->x,a.b*,a'b,a#b]", CPH_EDN_VECTOR},
    {"[:a :ns/name :a:b :<=>]", "[:a,:ns/name,:a:b,:<=>]", CPH_EDN_VECTOR},
    {"{:scheduler {:concurrency 4\n"
     "             :lanes {:interactive {:turns 60 :tool-calls 120}\n"
     "                     :operational {:turns 30 :tool-calls 60}}\n"
     "             :credits {:refill-per-second 1.0 :max 30}}\n"
     " :backpressure {:channels {\"367156652140658699\" {:max-events-per-minute 600\n"
     "                                                 :degrade-to-aggregate-only? true}}}}",
     "{:backpressure {:channels {\"367156652140658699\" {:degrade-to-aggregate-only? true, "
     ":max-events-per-minute 600}}}, :scheduler {:credits {:max 30, :refill-per-second 1.0}, "
     ":lanes {:operational {:tool-calls 60, :turns 30}, :interactive {:tool-calls 120, :turns "
     "60}}, :concurrency 4}}",
     CPH_EDN_MAP},
};

static void test_valid_documents_equal_their_canonical_form(void **state) {
  (void)state;
  for (size_t i = 0; i < COUNT(equiv_cases); i++) {
    const equiv_case *c = &equiv_cases[i];
    cph_edn *a = must_parse(c->doc);
    cph_edn *b = must_parse(c->canonical);
    if (a->type != c->type)
      fail_msg("<%s>: type %s, want %s", c->doc, cph_edn_type_name(a->type),
               cph_edn_type_name(c->type));
    if (!cph_edn_equal(a, b))
      fail_msg("<%s> is not equal to <%s>", c->doc, c->canonical);
    cph_edn_free(a);
    cph_edn_free(b);
  }
}

/* ---------------------------------------------------------------------------------------------
 * Scalars checked field by field
 * ------------------------------------------------------------------------------------------- */

typedef struct int_case {
  const char *doc;
  cph_edn_type type;
  int64_t value; /* INT only */
} int_case;

static const int_case int_cases[] = {
    {"0", CPH_EDN_INT, 0},
    {"-0", CPH_EDN_INT, 0},
    {"+42", CPH_EDN_INT, 42},
    {"-17", CPH_EDN_INT, -17},
    {"42N", CPH_EDN_INT, 42},
    {"0N", CPH_EDN_INT, 0},
    {"9223372036854775807", CPH_EDN_INT, INT64_MAX},
    {"+9223372036854775807N", CPH_EDN_INT, INT64_MAX},
    {"-9223372036854775808", CPH_EDN_INT, INT64_MIN},
    {"9223372036854775808", CPH_EDN_BIGINT, 0},
    {"-9223372036854775809", CPH_EDN_BIGINT, 0},
    {"18446744073709551616", CPH_EDN_BIGINT, 0},
    {"12345678901234567890123", CPH_EDN_BIGINT, 0},
    {"-12345678901234567890123N", CPH_EDN_BIGINT, 0},
};

static void test_integers_fit_int64_or_become_bigint_with_text(void **state) {
  (void)state;
  for (size_t i = 0; i < COUNT(int_cases); i++) {
    const int_case *c = &int_cases[i];
    cph_edn *v = must_parse(c->doc);
    if (v->type != c->type)
      fail_msg("<%s>: type %s, want %s", c->doc, cph_edn_type_name(v->type),
               cph_edn_type_name(c->type));
    if (c->type == CPH_EDN_INT && v->u.integer != c->value)
      fail_msg("<%s>: value %lld", c->doc, (long long)v->u.integer);
    assert_non_null(v->text);
    assert_string_equal(v->text, c->doc); /* the literal exactly as written */
    cph_edn_free(v);
  }
}

typedef struct float_case {
  const char *doc;
  double value;
} float_case;

static const float_case float_cases[] = {
    {"1.5", 1.5},       {"-0.25", -0.25},  {"+2.0", 2.0},     {"0.0", 0.0},
    {"1e10", 1e10},     {"1.5E-3", 1.5e-3}, {"1E+2", 100.0},  {"12.5e1", 125.0},
    {"0e0", 0.0},       {"1M", 1.0},       {"1.25M", 1.25},   {"3.0e-2M", 0.03},
    {"##Inf", INFINITY}, {"##-Inf", -INFINITY},
};

static void test_floats_parse_fraction_exponent_suffix_and_symbolic_values(void **state) {
  (void)state;
  for (size_t i = 0; i < COUNT(float_cases); i++) {
    const float_case *c = &float_cases[i];
    cph_edn *v = must_parse(c->doc);
    if (v->type != CPH_EDN_FLOAT || v->u.floating != c->value)
      fail_msg("<%s>: %s %g", c->doc, cph_edn_type_name(v->type), v->u.floating);
    assert_non_null(v->text);
    assert_string_equal(v->text, c->doc);
    cph_edn_free(v);
  }
  cph_edn *nan = must_parse("##NaN");
  assert_int_equal(nan->type, CPH_EDN_FLOAT);
  assert_true(isnan(nan->u.floating));
  cph_edn_free(nan);
  cph_edn *negzero = must_parse("-0.0");
  assert_true(negzero->u.floating == 0.0 && signbit(negzero->u.floating));
  cph_edn_free(negzero);
}

typedef struct string_case {
  const char *doc;
  const char *bytes;
  size_t len;
} string_case;

static const string_case string_cases[] = {
    {"\"\"", "", 0},
    {"\"abc\"", "abc", 3},
    {"\"a\\tb\\rc\\nd\\\\e\\\"f\\bg\\fh\\/i\"", "a\tb\rc\nd\\e\"f\bg\fh/i", 17},
    {"\"\\u00e9\"", "\xc3\xa9", 2},
    {"\"\\u20AC\"", "\xe2\x82\xac", 3},
    {"\"\\uD83D\\uDE00\"", "\xf0\x9f\x98\x80", 4},
    {"\"x\\ud83d\\ude00y\"", "x\xf0\x9f\x98\x80y", 6},
    {"\"\\u0000\"", "\0", 1},
    {"\"a\\u0000b\"", "a\0b", 3},
    {"\"raw\nnewline\"", "raw\nnewline", 11},
    {"\"raw\ttab\"", "raw\ttab", 7},
    {"\"\xc3\xa9\xf0\x9f\x98\x80\"", "\xc3\xa9\xf0\x9f\x98\x80", 6},
    {"\"; not a comment\"", "; not a comment", 15},
    {"\"#_ not a discard, [not a vector\"", "#_ not a discard, [not a vector", 31},
    {"\"\\\\\"", "\\", 1},
};

static void test_strings_decode_every_escape_and_utf8(void **state) {
  (void)state;
  for (size_t i = 0; i < COUNT(string_cases); i++) {
    const string_case *c = &string_cases[i];
    cph_edn *v = must_parse(c->doc);
    assert_int_equal(v->type, CPH_EDN_STRING);
    if (v->u.str.len != c->len || memcmp(v->u.str.ptr, c->bytes, c->len) != 0)
      fail_msg("<%s>: got %zu bytes <%s>", c->doc, v->u.str.len, v->u.str.ptr);
    assert_int_equal(v->u.str.ptr[v->u.str.len], '\0');
    assert_null(v->text);
    cph_edn_free(v);
  }
}

typedef struct char_case {
  const char *doc;
  uint32_t codepoint;
} char_case;

static const char_case char_cases[] = {
    {"\\c", 'c'},          {"\\newline", '\n'},  {"\\return", '\r'},    {"\\space", ' '},
    {"\\tab", '\t'},       {"\\formfeed", '\f'}, {"\\backspace", '\b'}, {"\\u0041", 'A'},
    {"\\u00e9", 0xE9},     {"\\\xc3\xa9", 0xE9}, {"\\\xf0\x9f\x98\x80", 0x1F600},
    {"\\\\", '\\'},        {"\\\"", '"'},        {"\\(", '('},          {"\\;", ';'},
    {"\\u", 'u'},          {"\\n", 'n'},         {"\\#", '#'},
};

static void test_characters_read_single_named_and_unicode_forms(void **state) {
  (void)state;
  for (size_t i = 0; i < COUNT(char_cases); i++) {
    const char_case *c = &char_cases[i];
    cph_edn *v = must_parse(c->doc);
    if (v->type != CPH_EDN_CHAR || v->u.codepoint != c->codepoint)
      fail_msg("<%s>: %s U+%04X", c->doc, cph_edn_type_name(v->type), v->u.codepoint);
    cph_edn_free(v);
  }
}

typedef struct name_case {
  const char *doc;
  cph_edn_type type;
  const char *name;
} name_case;

static const name_case name_cases[] = {
    {":a", CPH_EDN_KEYWORD, "a"},
    {":ns/name", CPH_EDN_KEYWORD, "ns/name"},
    {":my.app/pause-on-backpressure?", CPH_EDN_KEYWORD, "my.app/pause-on-backpressure?"},
    {":a:b", CPH_EDN_KEYWORD, "a:b"},
    {":-", CPH_EDN_KEYWORD, "-"},
    {"sym", CPH_EDN_SYMBOL, "sym"},
    {"/", CPH_EDN_SYMBOL, "/"},
    {"ns/name", CPH_EDN_SYMBOL, "ns/name"},
    {"+", CPH_EDN_SYMBOL, "+"},
    {"-", CPH_EDN_SYMBOL, "-"},
    {"-a", CPH_EDN_SYMBOL, "-a"},
    {"+.5", CPH_EDN_SYMBOL, "+.5"},
    {".b", CPH_EDN_SYMBOL, ".b"},
    {"a'", CPH_EDN_SYMBOL, "a'"},
    {"nil/x", CPH_EDN_SYMBOL, "nil/x"},
    {"truex", CPH_EDN_SYMBOL, "truex"},
    {"nilly", CPH_EDN_SYMBOL, "nilly"},
    {"*ns*/x!", CPH_EDN_SYMBOL, "*ns*/x!"},
    {"<=>", CPH_EDN_SYMBOL, "<=>"},
    {"a1", CPH_EDN_SYMBOL, "a1"},
};

static void test_keywords_and_symbols_keep_their_full_name(void **state) {
  (void)state;
  for (size_t i = 0; i < COUNT(name_cases); i++) {
    const name_case *c = &name_cases[i];
    cph_edn *v = must_parse(c->doc);
    if (v->type != c->type || strcmp(v->u.str.ptr, c->name) != 0)
      fail_msg("<%s>: %s <%s>", c->doc, cph_edn_type_name(v->type),
               v->type == CPH_EDN_KEYWORD || v->type == CPH_EDN_SYMBOL ? v->u.str.ptr : "");
    assert_int_equal(v->u.str.len, strlen(c->name));
    cph_edn_free(v);
  }
}

static void test_nil_and_booleans_are_exact_tokens(void **state) {
  (void)state;
  cph_edn *v = must_parse("[nil true false]");
  assert_int_equal(v->type, CPH_EDN_VECTOR);
  assert_int_equal(v->u.coll.count, 3);
  assert_int_equal(v->u.coll.items[0].type, CPH_EDN_NIL);
  assert_int_equal(v->u.coll.items[1].type, CPH_EDN_BOOL);
  assert_true(v->u.coll.items[1].u.boolean);
  assert_int_equal(v->u.coll.items[2].type, CPH_EDN_BOOL);
  assert_false(v->u.coll.items[2].u.boolean);
  cph_edn_free(v);
}

static void test_tagged_literals_keep_tag_and_value(void **state) {
  (void)state;
  cph_edn *v = must_parse("#inst \"1985-04-12T23:20:50.52Z\"");
  assert_int_equal(v->type, CPH_EDN_TAGGED);
  assert_string_equal(v->u.tagged.tag, "inst");
  assert_int_equal(v->u.tagged.value->type, CPH_EDN_STRING);
  assert_string_equal(v->u.tagged.value->u.str.ptr, "1985-04-12T23:20:50.52Z");
  cph_edn_free(v);

  v = must_parse("#myapp/Foo {:a 1}");
  assert_string_equal(v->u.tagged.tag, "myapp/Foo");
  assert_int_equal(v->u.tagged.value->type, CPH_EDN_MAP);
  const cph_edn *a = cph_edn_map_get_keyword(v->u.tagged.value, "a");
  assert_non_null(a);
  assert_int_equal(a->u.integer, 1);
  cph_edn_free(v);

  v = must_parse("#a #b 1");
  assert_string_equal(v->u.tagged.tag, "a");
  assert_int_equal(v->u.tagged.value->type, CPH_EDN_TAGGED);
  assert_string_equal(v->u.tagged.value->u.tagged.tag, "b");
  assert_int_equal(v->u.tagged.value->u.tagged.value->u.integer, 1);
  cph_edn_free(v);
}

static void test_collections_keep_source_order_and_map_layout(void **state) {
  (void)state;
  cph_edn *v = must_parse("{:b 2 :a 1}");
  assert_int_equal(v->type, CPH_EDN_MAP);
  assert_int_equal(v->u.coll.count, 2);
  assert_string_equal(v->u.coll.items[0].u.str.ptr, "b");
  assert_int_equal(v->u.coll.items[1].u.integer, 2);
  assert_string_equal(v->u.coll.items[2].u.str.ptr, "a");
  assert_int_equal(v->u.coll.items[3].u.integer, 1);
  cph_edn_free(v);

  v = must_parse("#{3 1 2}");
  assert_int_equal(v->type, CPH_EDN_SET);
  assert_int_equal(v->u.coll.count, 3);
  assert_int_equal(v->u.coll.items[0].u.integer, 3);
  cph_edn_free(v);
}

static void test_values_record_the_position_of_their_first_character(void **state) {
  (void)state;
  /* Line 2 starts with a tab and a string holding a two-byte character: columns count code
   * points, a tab is one column. */
  cph_edn *v = must_parse("{:a [1\n\t\"\xc3\xa9\" x #{2} #t 3]}");
  assert_int_equal(v->pos.line, 1);
  assert_int_equal(v->pos.column, 1);
  assert_int_equal(v->u.coll.items[0].pos.column, 2); /* :a */
  const cph_edn *vec = cph_edn_map_get_keyword(v, "a");
  assert_non_null(vec);
  assert_int_equal(vec->pos.line, 1);
  assert_int_equal(vec->pos.column, 5);
  static const struct {
    cph_edn_type type;
    uint32_t line, column;
  } want[] = {{CPH_EDN_INT, 1, 6},    {CPH_EDN_STRING, 2, 2}, {CPH_EDN_SYMBOL, 2, 6},
              {CPH_EDN_SET, 2, 8},    {CPH_EDN_TAGGED, 2, 13}};
  assert_int_equal(vec->u.coll.count, COUNT(want));
  for (size_t i = 0; i < COUNT(want); i++) {
    const cph_edn *x = &vec->u.coll.items[i];
    if (x->type != want[i].type || x->pos.line != want[i].line ||
        x->pos.column != want[i].column)
      fail_msg("item %zu: %s at %u:%u", i, cph_edn_type_name(x->type), x->pos.line,
               x->pos.column);
  }
  const cph_edn *tagged = &vec->u.coll.items[4];
  assert_int_equal(tagged->u.tagged.value->pos.column, 16);
  assert_int_equal(vec->u.coll.items[3].u.coll.items[0].pos.column, 10);
  cph_edn_free(v);
}

/* ---------------------------------------------------------------------------------------------
 * Invalid documents: exact position and a message substring
 * ------------------------------------------------------------------------------------------- */

typedef struct invalid_case {
  const char *doc;
  size_t len; /* LEN_AUTO: strlen(doc) */
  uint32_t line, column;
  const char *message;
} invalid_case;

static const invalid_case invalid_cases[] = {
    /* nothing to read */
    {"", LEN_AUTO, 1, 1, "no value"},
    {"   ", LEN_AUTO, 1, 4, "no value"},
    {"; only a comment", LEN_AUTO, 1, 17, "no value"},
    {";\n;\n", LEN_AUTO, 3, 1, "no value"},
    {"#_ 1", LEN_AUTO, 1, 5, "no value"},
    /* unterminated forms, reported where they open */
    {"\"abc", LEN_AUTO, 1, 1, "unterminated string"},
    {"[1 \"abc]", LEN_AUTO, 1, 4, "unterminated string"},
    {"{:a \"x\n\nyz", LEN_AUTO, 1, 5, "unterminated string"},
    {"\"abc\\", LEN_AUTO, 1, 1, "unterminated string"},
    {"(\"a\" \"b", LEN_AUTO, 1, 6, "unterminated string"},
    {"(1 2", LEN_AUTO, 1, 1, "unterminated list"},
    {"[1 [2 3]", LEN_AUTO, 1, 1, "unterminated vector"},
    {"{:a 1", LEN_AUTO, 1, 1, "unterminated map"},
    {"#{1 2", LEN_AUTO, 1, 1, "unterminated set"},
    {"[1 #{2 (3", LEN_AUTO, 1, 8, "unterminated list"},
    {"[1 2 3]", 6, 1, 1, "unterminated vector"}, /* len cuts off the ']' */
    /* closing brackets */
    {")", LEN_AUTO, 1, 1, "unexpected ')'"},
    {"[1 2)", LEN_AUTO, 1, 5, "unexpected ')', expected ']' to close the vector at 1:1"},
    {"{:a 1]", LEN_AUTO, 1, 6, "unexpected ']'"},
    {"1 ]", LEN_AUTO, 1, 3, "unexpected ']'"},
    {"{:a 1\n :b [1 2\n  3}", LEN_AUTO, 3, 4, "unexpected '}'"},
    /* string escapes and encoding */
    {"\"a\\qb\"", LEN_AUTO, 1, 3, "bad escape \\q in string"},
    {"\"\\x41\"", LEN_AUTO, 1, 2, "bad escape \\x in string"},
    {"\"\\U0041\"", LEN_AUTO, 1, 2, "bad escape \\U in string"},
    {"\"\\u12G4\"", LEN_AUTO, 1, 2, "bad escape \\u"},
    {"\"\\u12\"", LEN_AUTO, 1, 2, "bad escape \\u"},
    {"\"\\uD83D\"", LEN_AUTO, 1, 2, "unpaired surrogate \\uD83D"},
    {"\"\\uDE00\"", LEN_AUTO, 1, 2, "unpaired surrogate \\uDE00"},
    {"\"\\uD83D\\u0041\"", LEN_AUTO, 1, 2, "unpaired surrogate"},
    {"\"ab\\uD83Dx\"", LEN_AUTO, 1, 4, "unpaired surrogate"},
    {"\"ab\xff\"", LEN_AUTO, 1, 4, "invalid UTF-8"},
    {"\"\xc0\xaf\"", LEN_AUTO, 1, 2, "invalid UTF-8"},
    {"\"\xed\xa0\x80\"", LEN_AUTO, 1, 2, "invalid UTF-8"},
    {"\"\xe2\x82\"", LEN_AUTO, 1, 2, "invalid UTF-8"},
    {"\"\xf4\x90\x80\x80\"", LEN_AUTO, 1, 2, "invalid UTF-8"},
    {"\"a\0b\"", 5, 1, 3, "NUL byte in string"},
    /* maps and sets */
    {"{:a}", LEN_AUTO, 1, 1, "map literal must contain an even number of forms"},
    {"{:a 1 :b}", LEN_AUTO, 1, 1, "map literal must contain an even number of forms"},
    {"[{:a 1 :b}]", LEN_AUTO, 1, 2, "map literal must contain an even number of forms"},
    {"{:a 1 :a 2}", LEN_AUTO, 1, 7, "duplicate map key :a"},
    {"{\"k\" 1\n \"k\" 2}", LEN_AUTO, 2, 2, "duplicate map key \"k\""},
    {"{1 :x 1N :y}", LEN_AUTO, 1, 7, "duplicate map key 1N"},
    {"#{1 2 1}", LEN_AUTO, 1, 7, "duplicate set element 1"},
    {"#{{:a 1 :b 2} {:b 2 :a 1}}", LEN_AUTO, 1, 15, "duplicate set element {:b 2, :a 1}"},
    {"#{[1 2] (1 2)}", LEN_AUTO, 1, 9, "duplicate set element (1 2)"},
    {"#{##NaN ##NaN}", LEN_AUTO, 1, 9, "duplicate set element ##NaN"},
    {"#{0.0 -0.0}", LEN_AUTO, 1, 7, "duplicate set element -0.0"},
    {"#{#t 1 #t 1}", LEN_AUTO, 1, 8, "duplicate set element #t 1"},
    /* numbers */
    {"012", LEN_AUTO, 1, 1, "invalid number 012"},
    {"-012", LEN_AUTO, 1, 1, "invalid number -012"},
    {"00", LEN_AUTO, 1, 1, "invalid number 00"},
    {"1e", LEN_AUTO, 1, 1, "invalid number 1e"},
    {"1.5e+", LEN_AUTO, 1, 1, "invalid number 1.5e+"},
    {"1.", LEN_AUTO, 1, 1, "invalid number 1."},
    {"1.5.2", LEN_AUTO, 1, 1, "invalid number 1.5.2"},
    {"1.5N", LEN_AUTO, 1, 1, "invalid number 1.5N"},
    {"1NM", LEN_AUTO, 1, 1, "invalid number 1NM"},
    {"0x1F", LEN_AUTO, 1, 1, "invalid number 0x1F"},
    {"1/2", LEN_AUTO, 1, 1, "invalid number 1/2"},
    {"[1 -1a]", LEN_AUTO, 1, 4, "invalid number -1a"},
    {"1e999", LEN_AUTO, 1, 1, "float out of range 1e999"},
    /* symbols and keywords */
    {".5", LEN_AUTO, 1, 1, "invalid symbol .5"},
    {"a/b/c", LEN_AUTO, 1, 1, "invalid symbol a/b/c"},
    {"foo/", LEN_AUTO, 1, 1, "invalid symbol foo/"},
    {"/foo", LEN_AUTO, 1, 1, "invalid symbol /foo"},
    {"ns/1a", LEN_AUTO, 1, 1, "invalid symbol ns/1a"},
    {":", LEN_AUTO, 1, 1, "invalid keyword :"},
    {"::x", LEN_AUTO, 1, 1, "invalid keyword ::x"},
    {":/", LEN_AUTO, 1, 1, "invalid keyword :/"},
    {":/a", LEN_AUTO, 1, 1, "invalid keyword :/a"},
    {"[:a/]", LEN_AUTO, 1, 2, "invalid keyword :a/"},
    {"'quoted", LEN_AUTO, 1, 1, "unexpected character '''"},
    {"^meta", LEN_AUTO, 1, 1, "unexpected character '^'"},
    {"[1 @x]", LEN_AUTO, 1, 4, "unexpected character '@'"},
    {"\xc3\xa9t\xc3\xa9", LEN_AUTO, 1, 1, "unexpected character '\xc3\xa9'"},
    {"\xff", LEN_AUTO, 1, 1, "invalid UTF-8"},
    {"\0", 1, 1, 1, "unexpected control character 0x00"},
    /* characters */
    {"\\", LEN_AUTO, 1, 1, "backslash must be followed by a character"},
    {"[\\ ]", LEN_AUTO, 1, 2, "backslash must be followed by a character"},
    {"\\\n", LEN_AUTO, 1, 1, "backslash must be followed by a character"},
    {"\\,", LEN_AUTO, 1, 1, "backslash must be followed by a character"},
    {"\\abc", LEN_AUTO, 1, 1, "invalid character \\abc"},
    {"\\uD800", LEN_AUTO, 1, 1, "invalid character \\uD800"},
    {"\\u12", LEN_AUTO, 1, 1, "invalid character \\u12"},
    {"\\\xff", LEN_AUTO, 1, 2, "invalid UTF-8"},
    /* discard and tags */
    {"#_", LEN_AUTO, 1, 1, "discard with nothing to discard"},
    {"1 #_", LEN_AUTO, 1, 3, "discard with nothing to discard"},
    {"[1 #_]", LEN_AUTO, 1, 4, "discard with nothing to discard"},
    {"#_ #_ 1", LEN_AUTO, 1, 1, "discard with nothing to discard"},
    {"#inst", LEN_AUTO, 1, 1, "tagged literal #inst has no value"},
    {"[#foo]", LEN_AUTO, 1, 2, "tagged literal #foo has no value"},
    {"#1 2", LEN_AUTO, 1, 1, "'#' must be followed by a tag"},
    {"# x", LEN_AUTO, 1, 1, "'#' must be followed by a tag"},
    {"#:ns{:a 1}", LEN_AUTO, 1, 1, "'#' must be followed by a tag"},
    {"#", LEN_AUTO, 1, 1, "'#' must be followed by a tag"},
    {"##Foo", LEN_AUTO, 1, 1, "invalid symbolic value ##Foo"},
    {"##inf", LEN_AUTO, 1, 1, "invalid symbolic value ##inf"},
    {"#a/b/c 1", LEN_AUTO, 1, 1, "invalid tag #a/b/c"},
    /* trailing data */
    {"1 2", LEN_AUTO, 1, 3, "unexpected data after the value"},
    {"{:a 1} {:b 2}", LEN_AUTO, 1, 8, "unexpected data after the value"},
    {"nil nil", LEN_AUTO, 1, 5, "unexpected data after the value"},
    {"1 ; c\n 2", LEN_AUTO, 2, 2, "unexpected data after the value"},
    {"[1 2]\0", 6, 1, 6, "unexpected data after the value"},
    {"1 #_2 3", LEN_AUTO, 1, 7, "unexpected data after the value"},
    /* positions: line 3 holds a tab and a two-byte character before the error at column 7 */
    {"[1\n 2\n\t\"\xc3\xa9\"  012]", LEN_AUTO, 3, 7, "invalid number 012"},
    {"{:a\n\t\xf0\x9f\x98\x80 :b}", LEN_AUTO, 2, 2, "unexpected character '\xf0\x9f\x98\x80'"},
};

static void test_invalid_documents_report_position_and_message(void **state) {
  (void)state;
  for (size_t i = 0; i < COUNT(invalid_cases); i++) {
    const invalid_case *c = &invalid_cases[i];
    cph_edn *v = (cph_edn *)&v; /* must be reset to NULL */
    cph_edn_error err;
    int rc = parse_exact(c->doc, c->len, NULL, &v, &err);
    if (rc != CPH_EPARSE || v != NULL)
      fail_msg("case %zu <%s>: rc %d, want a parse error", i, c->doc, rc);
    if (err.line != c->line || err.column != c->column || !strstr(err.message, c->message))
      fail_msg("case %zu <%s>: got %u:%u \"%s\", want %u:%u \"%s\"", i, c->doc, err.line,
               err.column, err.message, c->line, c->column, c->message);
  }
}

/* ---------------------------------------------------------------------------------------------
 * Nesting limits
 * ------------------------------------------------------------------------------------------- */

static char *nested(size_t depth, const char *inner) {
  size_t n = strlen(inner);
  char *s = malloc(2 * depth + n + 1);
  assert_non_null(s);
  memset(s, '[', depth);
  memcpy(s + depth, inner, n);
  memset(s + depth + n, ']', depth);
  s[2 * depth + n] = '\0';
  return s;
}

static void test_nesting_at_the_default_limit_is_accepted(void **state) {
  (void)state;
  char *doc = nested(CPH_EDN_DEFAULT_MAX_DEPTH, "1");
  cph_edn *v = must_parse(doc);
  const cph_edn *x = v;
  for (int i = 0; i < CPH_EDN_DEFAULT_MAX_DEPTH; i++) {
    assert_int_equal(x->type, CPH_EDN_VECTOR);
    assert_int_equal(x->u.coll.count, 1);
    x = &x->u.coll.items[0];
  }
  assert_int_equal(x->type, CPH_EDN_INT);
  cph_edn_free(v);
  free(doc);
}

static void test_nesting_one_past_the_default_limit_is_an_error(void **state) {
  (void)state;
  char *doc = nested(CPH_EDN_DEFAULT_MAX_DEPTH + 1, "1");
  cph_edn *v = NULL;
  cph_edn_error err;
  assert_int_equal(parse_exact(doc, LEN_AUTO, NULL, &v, &err), CPH_EPARSE);
  assert_null(v);
  assert_int_equal(err.line, 1);
  assert_int_equal(err.column, CPH_EDN_DEFAULT_MAX_DEPTH + 1);
  assert_string_equal(err.message, "nesting deeper than 128");
  free(doc);
}

static void test_hundred_thousand_open_brackets_fail_cleanly(void **state) {
  (void)state;
  size_t n = 100000;
  char *doc = malloc(n);
  assert_non_null(doc);
  memset(doc, '[', n);
  cph_edn *v = NULL;
  cph_edn_error err;
  assert_int_equal(parse_exact(doc, n, NULL, &v, &err), CPH_EPARSE);
  assert_null(v);
  assert_int_equal(err.column, 129);
  assert_string_equal(err.message, "nesting deeper than 128");

  /* A larger limit is clamped to CPH_EDN_MAX_DEPTH_LIMIT, so free/equal/write, which recurse
   * per level, stay within a bounded stack. */
  cph_edn_options opts = {.max_depth = 1000000};
  assert_int_equal(parse_exact(doc, n, &opts, &v, &err), CPH_EPARSE);
  assert_null(v);
  assert_int_equal(err.column, CPH_EDN_MAX_DEPTH_LIMIT + 1);
  assert_string_equal(err.message, "nesting deeper than 10000");
  free(doc);
}

static void test_tags_and_discards_count_toward_depth(void **state) {
  (void)state;
  cph_edn_options opts = {.max_depth = 2};
  cph_edn *v = NULL;
  cph_edn_error err;
  v = must_parse_opts("[#foo 1]", &opts);
  cph_edn_free(v);
  v = must_parse_opts("[[1] #_ 2]", &opts);
  cph_edn_free(v);

  assert_int_equal(parse_exact("[#foo [1]]", LEN_AUTO, &opts, &v, &err), CPH_EPARSE);
  assert_int_equal(err.column, 7);
  assert_string_equal(err.message, "nesting deeper than 2");
  assert_int_equal(parse_exact("[[#_ 1]]", LEN_AUTO, &opts, &v, &err), CPH_EPARSE);
  assert_int_equal(err.column, 3);
  assert_int_equal(parse_exact("#a #b #c 1", LEN_AUTO, &opts, &v, &err), CPH_EPARSE);
  assert_int_equal(err.column, 7);
  assert_int_equal(parse_exact("[[[1]]]", LEN_AUTO, &opts, &v, &err), CPH_EPARSE);
  assert_int_equal(err.column, 3);
  assert_string_equal(err.message, "nesting deeper than 2");
}

/* ---------------------------------------------------------------------------------------------
 * Duplicates, options, API edges
 * ------------------------------------------------------------------------------------------- */

static void test_duplicates_are_allowed_when_the_caller_asks(void **state) {
  (void)state;
  cph_edn_options opts = {.allow_duplicate_keys = true};
  cph_edn *v = must_parse_opts("{:a 1 :a 2}", &opts);
  assert_int_equal(v->u.coll.count, 2);
  const cph_edn *a = cph_edn_map_get_keyword(v, "a");
  assert_non_null(a);
  assert_int_equal(a->u.integer, 1); /* the first occurrence */
  cph_edn_free(v);
  v = must_parse_opts("#{1 1 1}", &opts);
  assert_int_equal(v->u.coll.count, 3);
  cph_edn_free(v);
}

static void test_large_set_of_distinct_elements_is_accepted(void **state) {
  (void)state;
  /* Duplicate detection is hashed, so 20,000 elements are quick; the last one is a duplicate. */
  cph_buf b = CPH_BUF_INIT;
  cph_buf_puts(&b, "#{");
  for (int i = 0; i < 20000; i++)
    cph_buf_printf(&b, "[%d \"s%d\"] ", i, i);
  cph_buf_puts(&b, "}");
  cph_edn *v = must_parse(b.data);
  assert_int_equal(v->u.coll.count, 20000);
  cph_edn_free(v);

  b.len -= 1;
  cph_buf_puts(&b, "[7 \"s7\"]}");
  cph_edn_error err;
  assert_int_equal(parse_exact(b.data, b.len, NULL, &v, &err), CPH_EPARSE);
  assert_string_equal(err.message, "duplicate set element [7 \"s7\"]");
  cph_buf_free(&b);
}

static void test_parse_rejects_missing_output_and_tolerates_missing_error(void **state) {
  (void)state;
  cph_edn_error err;
  assert_int_equal(cph_edn_parse("1", 1, NULL, NULL, &err), CPH_EINVAL);
  cph_edn *v = NULL;
  assert_int_equal(cph_edn_parse("[", 1, NULL, &v, NULL), CPH_EPARSE);
  assert_null(v);
  assert_int_equal(cph_edn_parse(NULL, 0, NULL, &v, &err), CPH_EPARSE);
  assert_string_equal(err.message, "no value");
  cph_edn_free(NULL);
}

static void test_long_tokens_are_shortened_in_messages(void **state) {
  (void)state;
  char doc[400];
  memset(doc, '7', sizeof doc);
  doc[0] = '0';
  cph_edn *v = NULL;
  cph_edn_error err;
  assert_int_equal(parse_exact(doc, sizeof doc, NULL, &v, &err), CPH_EPARSE);
  assert_non_null(strstr(err.message, "invalid number 0777"));
  assert_non_null(strstr(err.message, "..."));
  assert_true(strlen(err.message) < 80);
}

static void test_map_get_keyword_finds_only_keyword_keys(void **state) {
  (void)state;
  cph_edn *v = must_parse("{\"a\" 1, a 2, :a 3, :ns/a 4}");
  const cph_edn *x = cph_edn_map_get_keyword(v, "a");
  assert_non_null(x);
  assert_int_equal(x->u.integer, 3);
  x = cph_edn_map_get_keyword(v, "ns/a");
  assert_non_null(x);
  assert_int_equal(x->u.integer, 4);
  assert_null(cph_edn_map_get_keyword(v, "b"));
  assert_null(cph_edn_map_get_keyword(&v->u.coll.items[1], "a")); /* not a map */
  assert_null(cph_edn_map_get_keyword(NULL, "a"));
  cph_edn_free(v);
}

static void test_type_names_read_well_in_messages(void **state) {
  (void)state;
  static const struct {
    cph_edn_type t;
    const char *name;
  } names[] = {
      {CPH_EDN_NIL, "nil"},          {CPH_EDN_BOOL, "a boolean"},
      {CPH_EDN_STRING, "a string"},  {CPH_EDN_CHAR, "a character"},
      {CPH_EDN_INT, "an integer"},   {CPH_EDN_BIGINT, "a big integer"},
      {CPH_EDN_FLOAT, "a float"},    {CPH_EDN_KEYWORD, "a keyword"},
      {CPH_EDN_SYMBOL, "a symbol"},  {CPH_EDN_LIST, "a list"},
      {CPH_EDN_VECTOR, "a vector"},  {CPH_EDN_MAP, "a map"},
      {CPH_EDN_SET, "a set"},        {CPH_EDN_TAGGED, "a tagged literal"},
  };
  for (size_t i = 0; i < COUNT(names); i++)
    assert_string_equal(cph_edn_type_name(names[i].t), names[i].name);
}

/* ---------------------------------------------------------------------------------------------
 * Equality
 * ------------------------------------------------------------------------------------------- */

static bool docs_equal(const char *a, const char *b) {
  cph_edn_options opts = {.allow_duplicate_keys = true};
  cph_edn *va = must_parse_opts(a, &opts);
  cph_edn *vb = must_parse_opts(b, &opts);
  bool eq = cph_edn_equal(va, vb);
  assert_true(cph_edn_equal(vb, va) == eq); /* symmetric */
  cph_edn_free(va);
  cph_edn_free(vb);
  return eq;
}

static void test_equal_ignores_order_in_maps_and_sets_only(void **state) {
  (void)state;
  assert_true(docs_equal("{:a 1 :b 2}", "{:b 2 :a 1}"));
  assert_true(docs_equal("#{1 2 3}", "#{3 1 2}"));
  assert_true(docs_equal("{#{1 2} [3]}", "{#{2 1} [3]}"));
  assert_false(docs_equal("[1 2]", "[2 1]"));
  assert_false(docs_equal("{:a 1 :b 2}", "{:a 2 :b 1}"));
  assert_false(docs_equal("{:a 1}", "{:a 1 :b 2}"));
  assert_false(docs_equal("#{1 2}", "{1 2}"));
  /* Multisets read with allow_duplicate_keys: the counts must match too. */
  assert_false(docs_equal("#{1 1 2}", "#{1 2 2}"));
  assert_true(docs_equal("#{1 2 1}", "#{1 1 2}"));
}

static void test_equal_compares_numbers_by_type_and_value(void **state) {
  (void)state;
  assert_false(docs_equal("1", "1.0"));
  assert_false(docs_equal("[1]", "[1.0]"));
  assert_true(docs_equal("1", "1N"));
  assert_true(docs_equal("-0", "0"));
  assert_true(docs_equal("9223372036854775808", "+9223372036854775808N"));
  assert_false(docs_equal("9223372036854775808", "-9223372036854775808"));
  assert_false(docs_equal("9223372036854775808", "9223372036854775809"));
  assert_true(docs_equal("1.5", "1.50"));
  assert_true(docs_equal("1.5", "1.5M"));
  assert_true(docs_equal("0.0", "-0.0"));
  assert_true(docs_equal("##NaN", "##NaN"));
  assert_false(docs_equal("##Inf", "##-Inf"));

  /* A BIGINT whose text fits int64 (built by hand) equals the INT of the same value. */
  cph_edn big = {.type = CPH_EDN_BIGINT, .text = "0042N"};
  cph_edn small = {.type = CPH_EDN_INT, .u.integer = 42};
  assert_true(cph_edn_equal(&big, &small));
  assert_true(cph_edn_equal(&small, &big));
  small.u.integer = -42;
  assert_false(cph_edn_equal(&big, &small));
}

static void test_equal_treats_lists_and_vectors_as_sequences(void **state) {
  (void)state;
  /* EDN spec, "equality": sequences are equal by count and elements, whatever the brackets. */
  assert_true(docs_equal("(1 2)", "[1 2]"));
  assert_false(docs_equal("(1 2)", "[1 2 3]"));
  assert_false(docs_equal("\"a\"", "a"));
  assert_false(docs_equal(":a", "a"));
  assert_false(docs_equal("\\a", "\"a\""));
  assert_true(docs_equal("#t [1]", "#t (1)"));
  assert_false(docs_equal("#t 1", "#u 1"));
  assert_false(docs_equal("nil", "false"));
  assert_true(cph_edn_equal(NULL, NULL));
}

/* ---------------------------------------------------------------------------------------------
 * Writer
 * ------------------------------------------------------------------------------------------- */

static const char *round_trip_docs[] = {
    "nil",
    "[true false nil]",
    "{:a 1, :b [1 2 3], :c #{:x :y}, \"str\" (a b c), [1 2] {:nested {:deep #{1}}}}",
    "\"plain\"",
    "\"esc \\\" \\\\ \\n \\r \\t \\b \\f / \\u0001 \\u001F \\u007F \\u0000 end\"",
    "\"utf-8: \xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \\uD83D\\uDE00\"",
    "[\\a \\newline \\return \\space \\tab \\formfeed \\backspace \\\\ \\\" \\( \\; \\u002C]",
    "[\\u0000 \\u0007 \\u00e9 \\u20AC \\\xf0\x9f\x98\x80 \\u007F \\u0085]",
    "[0 -0 42 -17 42N +5 9223372036854775807 -9223372036854775808]",
    "[9223372036854775808 -99999999999999999999999 123456789012345678901234567890N]",
    "[0.0 -0.0 1.0 1.5 0.1 -2.5e-3 1e10 1e300 5e-324 1.7976931348623157e308 3.141592653589793]",
    "[1.5M 1M 0.30000000000000004M ##Inf ##-Inf ##NaN]",
    "[:a :ns/name :a:b sym ns/sym / + - -a .b a' a#b]",
    "#inst \"1985-04-12T23:20:50.52Z\"",
    "[#myapp/Foo {:a 1} #a #b [1] #uuid \"f81d4fae-7dec-11d0-a765-00a0c91e6bf6\"]",
    "#{#{1 2} #{3} {:a #{}} [] {} \"\"}",
    "(() [[]] ([]))",
    "{nil 1, true 2, 1.5 3, \\c 4, (1) 5, #t x 6}",
};

static void test_write_then_read_gives_an_equal_value(void **state) {
  (void)state;
  for (size_t i = 0; i < COUNT(round_trip_docs); i++) {
    cph_edn *a = must_parse(round_trip_docs[i]);
    char *text = write_to_string(a);
    cph_edn *b = NULL;
    cph_edn_error err;
    if (parse_exact(text, LEN_AUTO, NULL, &b, &err) != CPH_OK)
      fail_msg("<%s> wrote <%s>, which does not read back: %u:%u %s", round_trip_docs[i], text,
               err.line, err.column, err.message);
    if (!cph_edn_equal(a, b))
      fail_msg("<%s> wrote <%s>, which reads back different", round_trip_docs[i], text);
    /* Types survive too (equality alone treats INT/BIGINT and list/vector alike). */
    char *again = write_to_string(b);
    assert_string_equal(text, again);
    free(again);
    free(text);
    cph_edn_free(a);
    cph_edn_free(b);
  }
}

typedef struct write_case {
  const char *doc;
  const char *expected;
} write_case;

static const write_case write_cases[] = {
    {"{:a 1 :b 2}", "{:a 1, :b 2}"},
    {"[1,2,,3]", "[1 2 3]"},
    {"( a  b )", "(a b)"},
    {"#{ 1 }", "#{1}"},
    {"#inst   \"x\"", "#inst \"x\""},
    {"1.0", "1.0"},
    {"0.1", "0.1"},
    {"-0.0", "-0.0"},
    {"1e10", "10000000000.0"},
    {"1.5e300", "1.5e+300"},
    {"2.50M", "2.50M"},
    {"##-Inf", "##-Inf"},
    {"42N", "42N"},
    {"+7", "+7"},
    {"123456789012345678901234567890", "123456789012345678901234567890"},
    {"\"tab\there\\u0001\"", "\"tab\\there\\u0001\""},
    {"\"q\\\"b\\\\\"", "\"q\\\"b\\\\\""},
    {"\"\\/\"", "\"/\""},
    {"[\\newline \\u002C \\a \\\xc3\xa9 \\\xf0\x9f\x98\x80]",
     "[\\newline \\u002C \\a \\u00E9 \\\xf0\x9f\x98\x80]"},
    {":ns/kw", ":ns/kw"},
};

static void test_writer_output_is_compact_and_canonical(void **state) {
  (void)state;
  for (size_t i = 0; i < COUNT(write_cases); i++) {
    cph_edn *v = must_parse(write_cases[i].doc);
    char *text = write_to_string(v);
    if (strcmp(text, write_cases[i].expected) != 0)
      fail_msg("<%s> wrote <%s>, want <%s>", write_cases[i].doc, text, write_cases[i].expected);
    free(text);
    cph_edn_free(v);
  }
}

static void test_writer_formats_values_built_by_hand(void **state) {
  (void)state;
  cph_edn items[3] = {
      {.type = CPH_EDN_INT, .u.integer = INT64_MIN},
      {.type = CPH_EDN_FLOAT, .u.floating = 2.0},
      {.type = CPH_EDN_STRING, .u.str = {"a\0b", 3}},
  };
  cph_edn vec = {.type = CPH_EDN_VECTOR, .u.coll = {items, 3}};
  char *text = write_to_string(&vec);
  assert_string_equal(text, "[-9223372036854775808 2.0 \"a\\u0000b\"]");
  free(text);
  text = write_to_string(NULL);
  assert_string_equal(text, "nil");
  free(text);
}

static void test_numbers_ignore_the_process_locale(void **state) {
  (void)state;
  const char *locales[] = {"de_DE.UTF-8", "de_DE.utf8", "fr_FR.UTF-8", "C.UTF-8"};
  const char *set = NULL;
  for (size_t i = 0; i < COUNT(locales) && !set; i++)
    set = setlocale(LC_NUMERIC, locales[i]);
  cph_edn *v = must_parse("[1.5 2.25e1]");
  assert_true(v->u.coll.items[0].u.floating == 1.5);
  assert_true(v->u.coll.items[1].u.floating == 22.5);
  char *text = write_to_string(v);
  assert_string_equal(text, "[1.5 22.5]");
  free(text);
  cph_edn_free(v);
  setlocale(LC_NUMERIC, "C");
}

/* ---------------------------------------------------------------------------------------------
 * Allocation failure
 * ------------------------------------------------------------------------------------------- */

static void test_every_allocation_failure_returns_enomem_without_leaks(void **state) {
  (void)state;
  const char *doc =
      "{:a [1 2.5 \"str\\u00e9\" \\c :kw sym 99999999999999999999] :b #{1 2 #t {:x 1}} "
      "\"k\" (nil true) #_ [discarded \"x\"] :c #inst \"2020\" :d {[1] #{:s}}}";
  long failures = 0;
  for (long n = 1;; n++) {
    cph_edn_error err;
    cph_edn *v = (cph_edn *)&v;
    cph_edn__fail_alloc_countdown = n;
    int rc = parse_exact(doc, LEN_AUTO, NULL, &v, &err);
    bool untouched = cph_edn__fail_alloc_countdown > 0;
    cph_edn__fail_alloc_countdown = 0;
    if (rc == CPH_OK) {
      assert_true(untouched); /* succeeded only because the N-th allocation never happened */
      cph_edn_free(v);
      break;
    }
    assert_int_equal(rc, CPH_ENOMEM);
    assert_null(v);
    assert_string_equal(err.message, "out of memory");
    failures++;
  }
  assert_true(failures > 20);
  /* Error paths that allocate (duplicate messages) are covered the same way. */
  for (long n = 1; n < 40; n++) {
    cph_edn *v = NULL;
    cph_edn__fail_alloc_countdown = n;
    int rc = parse_exact("#{[1 \"a\"] {:b 2} [1 \"a\"]}", LEN_AUTO, NULL, &v, NULL);
    cph_edn__fail_alloc_countdown = 0;
    assert_true(rc == CPH_ENOMEM || rc == CPH_EPARSE);
    assert_null(v);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_valid_documents_equal_their_canonical_form),
      cmocka_unit_test(test_integers_fit_int64_or_become_bigint_with_text),
      cmocka_unit_test(test_floats_parse_fraction_exponent_suffix_and_symbolic_values),
      cmocka_unit_test(test_strings_decode_every_escape_and_utf8),
      cmocka_unit_test(test_characters_read_single_named_and_unicode_forms),
      cmocka_unit_test(test_keywords_and_symbols_keep_their_full_name),
      cmocka_unit_test(test_nil_and_booleans_are_exact_tokens),
      cmocka_unit_test(test_tagged_literals_keep_tag_and_value),
      cmocka_unit_test(test_collections_keep_source_order_and_map_layout),
      cmocka_unit_test(test_values_record_the_position_of_their_first_character),
      cmocka_unit_test(test_invalid_documents_report_position_and_message),
      cmocka_unit_test(test_nesting_at_the_default_limit_is_accepted),
      cmocka_unit_test(test_nesting_one_past_the_default_limit_is_an_error),
      cmocka_unit_test(test_hundred_thousand_open_brackets_fail_cleanly),
      cmocka_unit_test(test_tags_and_discards_count_toward_depth),
      cmocka_unit_test(test_duplicates_are_allowed_when_the_caller_asks),
      cmocka_unit_test(test_large_set_of_distinct_elements_is_accepted),
      cmocka_unit_test(test_parse_rejects_missing_output_and_tolerates_missing_error),
      cmocka_unit_test(test_long_tokens_are_shortened_in_messages),
      cmocka_unit_test(test_map_get_keyword_finds_only_keyword_keys),
      cmocka_unit_test(test_type_names_read_well_in_messages),
      cmocka_unit_test(test_equal_ignores_order_in_maps_and_sets_only),
      cmocka_unit_test(test_equal_compares_numbers_by_type_and_value),
      cmocka_unit_test(test_equal_treats_lists_and_vectors_as_sequences),
      cmocka_unit_test(test_write_then_read_gives_an_equal_value),
      cmocka_unit_test(test_writer_output_is_compact_and_canonical),
      cmocka_unit_test(test_writer_formats_values_built_by_hand),
      cmocka_unit_test(test_numbers_ignore_the_process_locale),
      cmocka_unit_test(test_every_allocation_failure_returns_enomem_without_leaks),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
