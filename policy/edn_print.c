/* The EDN writer: cph_edn_write. Output reads back equal (cph_edn_equal); the writer
 * recurses only as deep as the value, which the reader bounds by max_depth. */
#include "policy/edn_internal.h"

#include <inttypes.h>
#include <math.h>
#include <string.h>

#include "common/buf.h"

/* ---------------------------------------------------------------------------------------------
 * Writer
 * ------------------------------------------------------------------------------------------- */

static void write_value(const cph_edn *v, cph_buf *out);

static void write_string(const cph_edn *v, cph_buf *out) {
  const unsigned char *s = (const unsigned char *)v->u.str.ptr;
  size_t n = v->u.str.len, run = 0;
  cph_buf_putc(out, '"');
  for (size_t i = 0; i < n; i++) {
    unsigned char c = s[i];
    const char *esc = NULL;
    switch (c) {
    case '"':
      esc = "\\\"";
      break;
    case '\\':
      esc = "\\\\";
      break;
    case '\n':
      esc = "\\n";
      break;
    case '\r':
      esc = "\\r";
      break;
    case '\t':
      esc = "\\t";
      break;
    case '\b':
      esc = "\\b";
      break;
    case '\f':
      esc = "\\f";
      break;
    default:
      if (c >= 0x20 && c != 0x7F)
        continue; /* part of the current run of literal bytes */
    }
    cph_buf_append(out, s + run, i - run);
    run = i + 1;
    if (esc)
      cph_buf_puts(out, esc);
    else
      cph_buf_printf(out, "\\u%04X", c);
  }
  cph_buf_append(out, s + run, n - run);
  cph_buf_putc(out, '"');
}

static void write_char(uint32_t cp, cph_buf *out) {
  static const struct {
    uint32_t cp;
    const char *name;
  } names[] = {{'\n', "newline"},  {'\r', "return"},   {' ', "space"},
               {'\t', "tab"},      {'\f', "formfeed"}, {'\b', "backspace"}};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    if (names[i].cp == cp) {
      cph_buf_putc(out, '\\');
      cph_buf_puts(out, names[i].name);
      return;
    }
  }
  /* ',' is whitespace to the reader, so "\," would not read back. */
  if (cp > 0x20 && cp < 0x7F && cp != ',') {
    cph_buf_putc(out, '\\');
    cph_buf_putc(out, (char)cp);
  } else if (cp >= 0x10000 && cp <= 0x10FFFF) {
    unsigned char u[4]; /* \uXXXX cannot express it; the raw character can */
    size_t n = cph_edn__utf8_encode(cp, u);
    cph_buf_putc(out, '\\');
    cph_buf_append(out, u, n);
  } else {
    cph_buf_printf(out, "\\u%04X", (unsigned)(cp <= 0xFFFF ? cp : 0xFFFD));
  }
}

static void write_float(const cph_edn *v, cph_buf *out) {
  double d = v->u.floating;
  size_t tn = v->text ? strlen(v->text) : 0;
  if (tn && v->text[tn - 1] == 'M') {
    cph_buf_puts(out, v->text); /* exact precision: keep the literal */
  } else if (isnan(d)) {
    cph_buf_puts(out, "##NaN");
  } else if (isinf(d)) {
    cph_buf_puts(out, d > 0 ? "##Inf" : "##-Inf");
  } else {
    char tmp[48];
    cph_edn__format_double(d, tmp, sizeof tmp);
    cph_buf_puts(out, tmp);
    if (!strpbrk(tmp, ".eE"))
      cph_buf_puts(out, ".0"); /* "1" would read back as an integer */
  }
}

static void write_items(const cph_edn *v, const char *open, const char *close, cph_buf *out) {
  cph_buf_puts(out, open);
  for (size_t i = 0; i < v->u.coll.count; i++) {
    if (i)
      cph_buf_puts(out, v->type == CPH_EDN_MAP ? ", " : " ");
    if (v->type == CPH_EDN_MAP) {
      write_value(&v->u.coll.items[2 * i], out);
      cph_buf_putc(out, ' ');
      write_value(&v->u.coll.items[2 * i + 1], out);
    } else {
      write_value(&v->u.coll.items[i], out);
    }
  }
  cph_buf_puts(out, close);
}

static void write_value(const cph_edn *v, cph_buf *out) {
  switch (v->type) {
  case CPH_EDN_NIL:
    cph_buf_puts(out, "nil");
    break;
  case CPH_EDN_BOOL:
    cph_buf_puts(out, v->u.boolean ? "true" : "false");
    break;
  case CPH_EDN_STRING:
    write_string(v, out);
    break;
  case CPH_EDN_CHAR:
    write_char(v->u.codepoint, out);
    break;
  case CPH_EDN_INT:
    if (v->text)
      cph_buf_puts(out, v->text);
    else
      cph_buf_printf(out, "%" PRId64, v->u.integer);
    break;
  case CPH_EDN_BIGINT:
    cph_buf_puts(out, v->text ? v->text : "0N");
    break;
  case CPH_EDN_FLOAT:
    write_float(v, out);
    break;
  case CPH_EDN_KEYWORD:
    cph_buf_putc(out, ':');
    cph_buf_append(out, v->u.str.ptr, v->u.str.len);
    break;
  case CPH_EDN_SYMBOL:
    cph_buf_append(out, v->u.str.ptr, v->u.str.len);
    break;
  case CPH_EDN_LIST:
    write_items(v, "(", ")", out);
    break;
  case CPH_EDN_VECTOR:
    write_items(v, "[", "]", out);
    break;
  case CPH_EDN_MAP:
    write_items(v, "{", "}", out);
    break;
  case CPH_EDN_SET:
    write_items(v, "#{", "}", out);
    break;
  case CPH_EDN_TAGGED:
    cph_buf_putc(out, '#');
    cph_buf_puts(out, v->u.tagged.tag);
    cph_buf_putc(out, ' ');
    if (v->u.tagged.value)
      write_value(v->u.tagged.value, out);
    else
      cph_buf_puts(out, "nil");
    break;
  }
}

void cph_edn_write(const cph_edn *v, cph_buf *out) {
  if (v)
    write_value(v, out);
  else
    cph_buf_puts(out, "nil");
}
