/* Writing a policy as EDN (cph_policy_write_edn), and the string and number formats that
 * messages use too. */
#include "cephalon/policy.h"

#include <inttypes.h>
#include <locale.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "policy/policy_internal.h"

/* ======================================================================================
 * Strings and numbers.
 * ==================================================================================== */

void cph__policy_write_string(cph_buf *b, const char *s, size_t len) {
  cph_buf_putc(b, '"');
  for (size_t i = 0; i < len; i++) {
    unsigned char ch = (unsigned char)s[i];
    switch (ch) {
    case '"':
      cph_buf_puts(b, "\\\"");
      break;
    case '\\':
      cph_buf_puts(b, "\\\\");
      break;
    case '\n':
      cph_buf_puts(b, "\\n");
      break;
    case '\t':
      cph_buf_puts(b, "\\t");
      break;
    case '\r':
      cph_buf_puts(b, "\\r");
      break;
    default:
      if (ch < 0x20)
        cph_buf_printf(b, "\\u%04x", ch);
      else
        cph_buf_putc(b, (char)ch);
    }
  }
  cph_buf_putc(b, '"');
}

/* The "C" numeric locale, created once: printed numbers must use '.' whatever locale the
 * embedding program set (the EDN reader parses them the same way). (locale_t)0 if it cannot
 * be created, which leaves the current locale in effect. */
static locale_t c_numeric(void) {
  static _Atomic(locale_t) cached;
  locale_t loc = atomic_load(&cached);
  if (loc)
    return loc;
  locale_t fresh = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
  if (!fresh)
    return (locale_t)0;
  locale_t expected = (locale_t)0;
  if (atomic_compare_exchange_strong(&cached, &expected, fresh))
    return fresh;
  freelocale(fresh);
  return expected;
}

void cph__policy_shortest_double(double d, char *out, size_t cap) {
  locale_t loc = c_numeric();
  locale_t old = loc ? uselocale(loc) : (locale_t)0;
  for (int prec = 15; prec <= 17; prec++) {
    snprintf(out, cap, "%.*g", prec, d);
    if (strtod(out, NULL) == d)
      break;
  }
  if (loc)
    uselocale(old);
}

/* d as an EDN float literal ("30.0", "0.25"), so it reads back as a number. */
static void format_float(double d, char *out, size_t cap) {
  cph__policy_shortest_double(d, out, cap);
  if (!strpbrk(out, ".eEni")) {
    size_t n = strlen(out);
    if (n + 2 < cap)
      memcpy(out + n, ".0", 3);
  }
}

/* ======================================================================================
 * Printing: Clojure-style layout — the first key right after "{", every other key on its
 * own line under the first, nested maps starting after their key. col is the column of
 * the opening bracket.
 * ==================================================================================== */

static void indent(cph_buf *b, size_t col) {
  static const char spaces[] = "                                ";
  while (col > 0) {
    size_t n = col < sizeof spaces - 1 ? col : sizeof spaces - 1;
    cph_buf_append(b, spaces, n);
    col -= n;
  }
}

/* Columns taken by bytes written since `from` (code points, not bytes). */
static size_t width_since(const cph_buf *b, size_t from) {
  size_t w = 0;
  for (size_t i = from; b->data && i < b->len; i++)
    w += ((unsigned char)b->data[i] & 0xC0) != 0x80;
  return w;
}

static void write_section(cph_buf *b, const ps_table *t, const void *base, size_t col);

static void write_value(cph_buf *b, const ps_field *f, const void *base, size_t col) {
  char num[40];
  switch (f->kind) {
  case PS_INT:
    cph_buf_printf(b, "%" PRId64, get_int(base, f->off));
    break;
  case PS_NUM:
    format_float(get_num(base, f->off), num, sizeof num);
    cph_buf_puts(b, num);
    break;
  case PS_BOOL:
    cph_buf_puts(b, get_bool(base, f->off) ? "true" : "false");
    break;
  case PS_STR: {
    const char *s = get_str(base, f->off);
    s = s ? s : "";
    cph__policy_write_string(b, s, strlen(s));
    break;
  }
  case PS_CHOICE:
    cph_buf_printf(b, ":%s", f->choices[get_choice(base, f->off)]);
    break;
  case PS_SCOPES: {
    unsigned mask = get_scopes(base, f->off);
    bool first = true;
    cph_buf_puts(b, "#{");
    for (int i = 0; f->choices[i]; i++) {
      if (!(mask & (1u << i)))
        continue;
      cph_buf_printf(b, "%s:%s", first ? "" : " ", f->choices[i]);
      first = false;
    }
    cph_buf_putc(b, '}');
    break;
  }
  case PS_SECTION:
    write_section(b, f->child, cat(base, f->off), col);
    break;
  case PS_CHANNELS: {
    const void *arr = get_ptr(base, f->off);
    size_t n = get_size(base, f->count_off);
    cph_buf_putc(b, '{');
    for (size_t i = 0; i < n; i++) {
      const void *elem = celement(arr, f->child, i);
      const char *id = get_str(elem, f->child->id_off);
      if (i) {
        cph_buf_putc(b, '\n');
        indent(b, col + 1);
      }
      size_t start = b->len;
      cph__policy_write_string(b, id, strlen(id));
      size_t w = width_since(b, start);
      cph_buf_putc(b, ' ');
      write_section(b, f->child, elem, col + 1 + w + 1);
    }
    cph_buf_putc(b, '}');
    break;
  }
  case PS_VECTOR: {
    const void *arr = get_ptr(base, f->off);
    size_t n = get_size(base, f->count_off);
    cph_buf_putc(b, '[');
    for (size_t i = 0; i < n; i++) {
      if (i) {
        cph_buf_putc(b, '\n');
        indent(b, col + 1);
      }
      write_section(b, f->child, celement(arr, f->child, i), col + 1);
    }
    cph_buf_putc(b, ']');
    break;
  }
  case PS_STRINGS: {
    /* A vector, not a set: it keeps the stored (first-seen) order, so printing is stable. */
    char *const *arr = get_ptr(base, f->off);
    size_t n = get_size(base, f->count_off);
    cph_buf_putc(b, '[');
    for (size_t i = 0; i < n; i++) {
      if (i)
        cph_buf_putc(b, ' ');
      cph__policy_write_string(b, arr[i], strlen(arr[i]));
    }
    cph_buf_putc(b, ']');
    break;
  }
  }
}

static void write_section(cph_buf *b, const ps_table *t, const void *base, size_t col) {
  bool first = true, ends_in_comment = false;
  cph_buf_putc(b, '{');
  for (size_t i = 0; i < t->count; i++) {
    const ps_field *f = &t->fields[i];
    if (!first) {
      cph_buf_putc(b, '\n');
      indent(b, col + 1);
    }
    first = false;
    /* An absent optional section has no EDN value that means "absent"; say so in a
     * comment so the output still shows every key. */
    if ((f->flags & PS_OPTIONAL) && !get_bool(base, f->present_off)) {
      cph_buf_printf(b, ";; :%s is not set: %s", f->name, f->absent ? f->absent : f->doc);
      ends_in_comment = true;
      continue;
    }
    ends_in_comment = false;
    cph_buf_printf(b, ":%s ", f->name);
    write_value(b, f, base, col + 1 + 1 + strlen(f->name) + 1);
  }
  if (ends_in_comment) {
    cph_buf_putc(b, '\n');
    indent(b, col);
  }
  cph_buf_putc(b, '}');
}

void cph_policy_write_edn(const cph_policy *p, cph_buf *out) {
  write_section(out, &cph__policy_schema, p, 0);
  cph_buf_putc(out, '\n');
}
