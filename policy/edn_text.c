/* EDN text: UTF-8, numbers in the "C" locale, and values shown in error messages. */
#include "policy/edn_internal.h"

#include <locale.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * Numbers and the C locale
 *
 * strtod and printf follow LC_NUMERIC, so a process that called setlocale() could read "1.5"
 * as 1 or write "1,5". Both go through a "C" numeric locale made once per process.
 * ------------------------------------------------------------------------------------------- */

static _Atomic(locale_t) c_numeric;

static locale_t c_locale(void) {
  locale_t loc = atomic_load(&c_numeric);
  if (loc)
    return loc;
  locale_t fresh = newlocale(LC_NUMERIC_MASK, "C", (locale_t)0);
  if (!fresh)
    return (locale_t)0; /* fall back to the current locale, "C" unless someone changed it */
  locale_t expected = (locale_t)0;
  if (atomic_compare_exchange_strong(&c_numeric, &expected, fresh))
    return fresh;
  freelocale(fresh);
  return expected;
}

double cph_edn__strtod(const char *s) {
  locale_t loc = c_locale();
  locale_t old = loc ? uselocale(loc) : (locale_t)0;
  double d = strtod(s, NULL);
  if (loc)
    uselocale(old);
  return d;
}

void cph_edn__format_double(double d, char *dst, size_t cap) {
  locale_t loc = c_locale();
  locale_t old = loc ? uselocale(loc) : (locale_t)0;
  for (int prec = 15; prec <= 17; prec++) {
    snprintf(dst, cap, "%.*g", prec, d);
    if (strtod(dst, NULL) == d)
      break;
  }
  if (loc)
    uselocale(old);
}

/* ---------------------------------------------------------------------------------------------
 * UTF-8
 * ------------------------------------------------------------------------------------------- */

size_t cph_edn__utf8_decode(const unsigned char *s, size_t n, uint32_t *cp) {
  if (n == 0)
    return 0;
  unsigned char b = s[0];
  size_t need;
  uint32_t v, min;
  if (b < 0x80) {
    *cp = b;
    return 1;
  } else if (b >= 0xC2 && b <= 0xDF) {
    need = 2, v = b & 0x1F, min = 0x80;
  } else if (b >= 0xE0 && b <= 0xEF) {
    need = 3, v = b & 0x0F, min = 0x800;
  } else if (b >= 0xF0 && b <= 0xF4) {
    need = 4, v = b & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (n < need)
    return 0;
  for (size_t i = 1; i < need; i++) {
    if ((s[i] & 0xC0) != 0x80)
      return 0;
    v = v << 6 | (s[i] & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
    return 0;
  *cp = v;
  return need;
}

size_t cph_edn__utf8_encode(uint32_t cp, unsigned char out[4]) {
  if (cp < 0x80) {
    out[0] = (unsigned char)cp;
    return 1;
  }
  if (cp < 0x800) {
    out[0] = (unsigned char)(0xC0 | cp >> 6);
    out[1] = (unsigned char)(0x80 | (cp & 0x3F));
    return 2;
  }
  if (cp < 0x10000) {
    out[0] = (unsigned char)(0xE0 | cp >> 12);
    out[1] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
    out[2] = (unsigned char)(0x80 | (cp & 0x3F));
    return 3;
  }
  out[0] = (unsigned char)(0xF0 | cp >> 18);
  out[1] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
  out[2] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
  out[3] = (unsigned char)(0x80 | (cp & 0x3F));
  return 4;
}

/* ---------------------------------------------------------------------------------------------
 * Error messages
 * ------------------------------------------------------------------------------------------- */

const char *cph_edn__show(char *dst, size_t cap, const void *src, size_t n) {
  const unsigned char *s = src;
  size_t o = 0, limit = cap < 48 ? cap : 48;
  for (size_t i = 0; i < n;) {
    uint32_t cp;
    size_t k = cph_edn__utf8_decode(s + i, n - i, &cp);
    if (o + (k ? k : 1) + 4 > limit) {
      memcpy(dst + o, "...", 3);
      o += 3;
      break;
    }
    if (k == 0 || cp < 0x20 || cp == 0x7F) {
      dst[o++] = '?';
      i += k ? k : 1;
    } else {
      memcpy(dst + o, s + i, k);
      o += k;
      i += k;
    }
  }
  dst[o] = '\0';
  return dst;
}
