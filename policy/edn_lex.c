/* The EDN lexer: whitespace and comments, and the tokens — strings, characters, keywords,
 * numbers, symbols, ##Inf/##-Inf/##NaN, tag names — with their positions (line:column) and
 * the errors that point at them. The cursor itself is in edn_internal.h; the forms the
 * tokens make up are the reader's (edn_read.c). */
#include "policy/edn_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/error.h"

/* ---------------------------------------------------------------------------------------------
 * Character classes
 * ------------------------------------------------------------------------------------------- */

static bool is_space(int c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' || c == ',';
}

/* Ends a symbol, keyword, number or tag. '#' and ':' do not (they are symbol constituents); '"',
 * ';' and '\' do, as in Clojure's reader, since none can appear inside a token. */
static bool is_delimiter(int c) {
  return c < 0 || is_space(c) || (c != 0 && strchr("()[]{}\";\\", c) != NULL);
}

static bool is_digit(int c) { return c >= '0' && c <= '9'; }

static bool is_alpha(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

static int hex_value(int c) {
  if (is_digit(c))
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

static void skip_token(edn_lexer *lx) {
  while (!is_delimiter(edn_peek(lx)))
    edn_bump(lx);
}

/* ---------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------- */

int cph_edn__fail(edn_lexer *lx, cph_edn_pos at, const char *fmt, ...) {
  if (lx->err) {
    lx->err->line = at.line;
    lx->err->column = at.column;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(lx->err->message, sizeof lx->err->message, fmt, ap);
    va_end(ap);
  }
  return CPH_EPARSE;
}

int cph_edn__oom(edn_lexer *lx) {
  cph_edn__fail(lx, edn_here(lx), "out of memory");
  return CPH_ENOMEM;
}

/* ---------------------------------------------------------------------------------------------
 * Whitespace and comments
 * ------------------------------------------------------------------------------------------- */

void cph_edn__skip_space(edn_lexer *lx) {
  for (;;) {
    int c = edn_peek(lx);
    if (is_space(c)) {
      edn_bump(lx);
    } else if (c == ';') {
      while (edn_peek(lx) >= 0 && edn_peek(lx) != '\n')
        edn_bump(lx);
    } else {
      return;
    }
  }
}

/* ---------------------------------------------------------------------------------------------
 * Strings and characters
 * ------------------------------------------------------------------------------------------- */

typedef struct bytes {
  unsigned char *p;
  size_t len, cap;
} bytes;

static bool bytes_put(bytes *b, const void *src, size_t n) {
  unsigned char *np = cph_edn__grow(b->p, &b->cap, b->len + n + 1, 1);
  if (!np)
    return false;
  b->p = np;
  memcpy(b->p + b->len, src, n);
  b->len += n;
  b->p[b->len] = '\0';
  return true;
}

/* The value of four hex digits at s[0..n); -1 if there are not four. */
static long hex4(const unsigned char *s, size_t n) {
  long v = 0;
  for (size_t i = 0; i < 4; i++) {
    int h = i < n ? hex_value(s[i]) : -1;
    if (h < 0)
      return -1;
    v = v << 4 | h;
  }
  return v;
}

/* XXXX of a \uXXXX escape k bytes ahead of the cursor; -1 if not four hex digits. */
static long hex4_at(const edn_lexer *lx, size_t k) {
  size_t left = lx->len - lx->off;
  return k <= left ? hex4(lx->s + lx->off + k, left - k) : -1;
}

/* The \u escape at the cursor (on the backslash) inside a string: a BMP character or a
 * surrogate pair written as two escapes, which together make one 4-byte UTF-8 sequence. */
static int read_u_escape(edn_lexer *lx, bytes *b) {
  cph_edn_pos at = edn_here(lx);
  long hi = hex4_at(lx, 2);
  if (hi < 0)
    return cph_edn__fail(lx, at, "bad escape \\u in string: expected 4 hex digits");
  uint32_t cp = (uint32_t)hi;
  size_t used = 6;
  if (hi >= 0xDC00 && hi <= 0xDFFF)
    return cph_edn__fail(lx, at, "unpaired surrogate \\u%04lX in string", hi);
  if (hi >= 0xD800 && hi <= 0xDBFF) {
    long lo = edn_peek_at(lx, 6) == '\\' && edn_peek_at(lx, 7) == 'u' ? hex4_at(lx, 8) : -1;
    if (lo < 0xDC00 || lo > 0xDFFF)
      return cph_edn__fail(lx, at, "unpaired surrogate \\u%04lX in string", hi);
    cp = 0x10000 + (((uint32_t)hi - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
    used = 12;
  }
  unsigned char u[4];
  if (!bytes_put(b, u, cph_edn__utf8_encode(cp, u)))
    return cph_edn__oom(lx);
  edn_bump_n(lx, used);
  return CPH_OK;
}

/* The escape at the cursor (on the backslash) inside the string that opened at start. */
static int read_escape(edn_lexer *lx, cph_edn_pos start, bytes *b) {
  cph_edn_pos at = edn_here(lx);
  int e = edn_peek_at(lx, 1);
  char c;
  switch (e) {
  case -1:
    return cph_edn__fail(lx, start, "unterminated string");
  case 'u':
    return read_u_escape(lx, b);
  case 't':
    c = '\t';
    break;
  case 'r':
    c = '\r';
    break;
  case 'n':
    c = '\n';
    break;
  case 'b':
    c = '\b';
    break;
  case 'f':
    c = '\f';
    break;
  case '\\':
  case '"':
  case '/':
    c = (char)e;
    break;
  default:
    if (e > 0x20 && e < 0x7F)
      return cph_edn__fail(lx, at, "bad escape \\%c in string", e);
    return cph_edn__fail(lx, at, "bad escape in string");
  }
  if (!bytes_put(b, &c, 1))
    return cph_edn__oom(lx);
  edn_bump_n(lx, 2);
  return CPH_OK;
}

/* Raw newlines are allowed (strings may span lines); a raw NUL is not, so that a NUL in a
 * decoded string always comes from \u0000. */
static int read_string(edn_lexer *lx, cph_edn *v) {
  cph_edn_pos start = edn_here(lx);
  bytes b = {NULL, 0, 0};
  int rc = CPH_OK;
  edn_bump(lx);
  for (;;) {
    int c = edn_peek(lx);
    if (c < 0) {
      rc = cph_edn__fail(lx, start, "unterminated string");
      goto fail;
    }
    if (c == '"')
      break;
    if (c == '\\') {
      if ((rc = read_escape(lx, start, &b)))
        goto fail;
      continue;
    }
    if (c == 0) {
      rc = cph_edn__fail(lx, edn_here(lx), "NUL byte in string (write \\u0000)");
      goto fail;
    }
    uint32_t cp;
    size_t k = cph_edn__utf8_decode(lx->s + lx->off, lx->len - lx->off, &cp);
    if (k == 0) {
      rc = cph_edn__fail(lx, edn_here(lx), "invalid UTF-8 in string");
      goto fail;
    }
    if (!bytes_put(&b, lx->s + lx->off, k)) {
      rc = cph_edn__oom(lx);
      goto fail;
    }
    edn_bump_n(lx, k);
  }
  if (!b.p && !bytes_put(&b, "", 0)) { /* "" still gets a NUL-terminated buffer */
    rc = cph_edn__oom(lx);
    goto fail;
  }
  edn_bump(lx);
  v->type = CPH_EDN_STRING;
  v->u.str.ptr = (char *)b.p;
  v->u.str.len = b.len;
  return CPH_OK;
fail:
  free(b.p);
  return rc;
}

static const struct {
  const char *name;
  uint32_t cp;
} char_names[] = {{"newline", '\n'}, {"return", '\r'},   {"space", ' '},
                  {"tab", '\t'},     {"formfeed", '\f'}, {"backspace", '\b'}};

/* \c, \newline ... or \uXXXX. The character right after the backslash is taken whatever it is
 * (so \( and \" work); a longer token must be a name or uXXXX. */
static int read_char(edn_lexer *lx, cph_edn *v) {
  cph_edn_pos at = edn_here(lx);
  char shown[64];
  edn_bump(lx);
  int c = edn_peek(lx);
  if (c < 0 || is_space(c))
    return cph_edn__fail(lx, at, "backslash must be followed by a character");
  const unsigned char *tok = lx->s + lx->off;
  uint32_t cp;
  size_t k = cph_edn__utf8_decode(tok, lx->len - lx->off, &cp);
  if (k == 0)
    return cph_edn__fail(lx, edn_here(lx), "invalid UTF-8");
  edn_bump_n(lx, k);
  skip_token(lx);
  size_t n = (size_t)(lx->s + lx->off - tok);
  if (n > k) {
    size_t i = 0, names = sizeof char_names / sizeof char_names[0];
    while (i < names && (strlen(char_names[i].name) != n || memcmp(char_names[i].name, tok, n)))
      i++;
    long u = n == 5 && tok[0] == 'u' ? hex4(tok + 1, 4) : -1;
    if (i < names)
      cp = char_names[i].cp;
    else if (u >= 0xD800 && u <= 0xDFFF)
      return cph_edn__fail(lx, at, "invalid character \\u%04lX: a lone surrogate", u);
    else if (u >= 0)
      cp = (uint32_t)u;
    else
      return cph_edn__fail(lx, at, "invalid character \\%s",
                           cph_edn__show(shown, sizeof shown, tok, n));
  }
  v->type = CPH_EDN_CHAR;
  v->u.codepoint = cp;
  return CPH_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Keywords, symbols, numbers, ##Inf
 * ------------------------------------------------------------------------------------------- */

/* A symbol's first character (EDN spec, "symbols"); '/' alone is handled by the caller. */
static bool is_symbol_start(int c) {
  return is_alpha(c) || (c != 0 && strchr(".*+!-_?$%&=<>", c) != NULL);
}

static bool is_symbol_char(int c) {
  return is_symbol_start(c) || is_digit(c) || c == ':' || c == '#' || c == '\'';
}

/* One part of a symbol: the prefix or the name around '/', or the whole symbol. If it starts
 * with '-', '+' or '.', the next character must not be a digit (that would be a number). */
static bool valid_symbol_part(const unsigned char *s, size_t n) {
  if (n == 0 || !is_symbol_start(s[0]))
    return false;
  if (n > 1 && strchr("+-.", s[0]) && is_digit(s[1]))
    return false;
  for (size_t i = 1; i < n; i++)
    if (!is_symbol_char(s[i]))
      return false;
  return true;
}

/* A symbol, or with keyword the part after ':'. "/" alone is a symbol but ":/" no keyword;
 * otherwise '/' appears at most once, between a non-empty prefix and name. */
static bool valid_symbol(const unsigned char *s, size_t n, bool keyword) {
  if (n == 1 && s[0] == '/')
    return !keyword;
  const unsigned char *slash = memchr(s, '/', n);
  if (!slash)
    return valid_symbol_part(s, n);
  size_t prefix = (size_t)(slash - s);
  return valid_symbol_part(s, prefix) && valid_symbol_part(slash + 1, n - prefix - 1);
}

static int set_name(edn_lexer *lx, cph_edn *v, cph_edn_type type, const unsigned char *s,
                    size_t n) {
  v->u.str.ptr = cph_edn__strndup(s, n);
  if (!v->u.str.ptr)
    return cph_edn__oom(lx);
  v->type = type;
  v->u.str.len = n;
  return CPH_OK;
}

static int read_keyword(edn_lexer *lx, cph_edn *v) {
  cph_edn_pos at = edn_here(lx);
  char shown[64];
  size_t start = lx->off;
  edn_bump(lx);
  skip_token(lx);
  const unsigned char *s = lx->s + start;
  size_t n = lx->off - start;
  if (!valid_symbol(s + 1, n - 1, true))
    return cph_edn__fail(lx, at, "invalid keyword %s", cph_edn__show(shown, sizeof shown, s, n));
  return set_name(lx, v, CPH_EDN_KEYWORD, s + 1, n - 1);
}

/* Matches the integer and floating-point grammars of the spec: [+-] (0 | [1-9][0-9]*), then
 * either an optional N (integer) or any of .digits, [eE][+-]digits and M (float). Sets
 * *is_float; false if the token is neither. */
static bool scan_number(const unsigned char *s, size_t n, bool *is_float) {
  size_t i = 0;
  if (s[i] == '+' || s[i] == '-')
    i++;
  if (i < n && s[i] == '0') {
    i++;
  } else if (i < n && is_digit(s[i])) {
    while (i < n && is_digit(s[i]))
      i++;
  } else {
    return false;
  }
  *is_float = false;
  if (i + 1 == n && s[i] == 'N')
    return true;
  if (i < n && s[i] == '.') {
    size_t d = ++i;
    while (i < n && is_digit(s[i]))
      i++;
    if (i == d)
      return false;
    *is_float = true;
  }
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    i++;
    if (i < n && (s[i] == '+' || s[i] == '-'))
      i++;
    size_t d = i;
    while (i < n && is_digit(s[i]))
      i++;
    if (i == d)
      return false;
    *is_float = true;
  }
  if (i + 1 == n && s[i] == 'M') {
    i++;
    *is_float = true;
  }
  return i == n;
}

/* An integer token already checked by scan_number: INT if it fits int64_t, else BIGINT
 * (not an error; the text keeps the value). */
static void convert_integer(const unsigned char *s, size_t n, cph_edn *v) {
  bool neg = s[0] == '-';
  size_t i = s[0] == '+' || s[0] == '-';
  uint64_t limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX, mag = 0;
  v->type = CPH_EDN_INT;
  for (; i < n && is_digit(s[i]); i++) {
    unsigned d = (unsigned)(s[i] - '0');
    if (mag > (limit - d) / 10) {
      v->type = CPH_EDN_BIGINT;
      return;
    }
    mag = mag * 10 + d;
  }
  v->u.integer = neg ? (int64_t)(0 - mag) : (int64_t)mag;
}

static int read_number(edn_lexer *lx, cph_edn_pos at, const unsigned char *s, size_t n,
                       cph_edn *v) {
  char shown[64];
  bool is_float;
  if (!scan_number(s, n, &is_float))
    return cph_edn__fail(lx, at, "invalid number %s", cph_edn__show(shown, sizeof shown, s, n));
  v->text = cph_edn__strndup(s, n);
  if (!v->text)
    return cph_edn__oom(lx);
  if (!is_float) {
    convert_integer(s, n, v);
    return CPH_OK;
  }
  v->type = CPH_EDN_FLOAT;
  if (s[n - 1] == 'M')
    v->text[n - 1] = '\0'; /* strtod must not see the suffix; restored below */
  v->u.floating = cph_edn__strtod(v->text);
  if (s[n - 1] == 'M')
    v->text[n - 1] = 'M';
  if (isinf(v->u.floating))
    return cph_edn__fail(lx, at, "float out of range %s", cph_edn__show(shown, sizeof shown, s, n));
  return CPH_OK;
}

/* nil, true, false, a number or a symbol. */
static int read_word(edn_lexer *lx, cph_edn *v) {
  cph_edn_pos at = edn_here(lx);
  char shown[64];
  size_t start = lx->off;
  skip_token(lx);
  const unsigned char *s = lx->s + start;
  size_t n = lx->off - start;
  if (is_digit(s[0]) || (n > 1 && (s[0] == '+' || s[0] == '-') && is_digit(s[1])))
    return read_number(lx, at, s, n, v);
  if (n == 3 && memcmp(s, "nil", 3) == 0) {
    v->type = CPH_EDN_NIL;
    return CPH_OK;
  }
  if ((n == 4 && memcmp(s, "true", 4) == 0) || (n == 5 && memcmp(s, "false", 5) == 0)) {
    v->type = CPH_EDN_BOOL;
    v->u.boolean = n == 4;
    return CPH_OK;
  }
  if (valid_symbol(s, n, false))
    return set_name(lx, v, CPH_EDN_SYMBOL, s, n);
  if (s[0] == '/' || is_symbol_start(s[0]))
    return cph_edn__fail(lx, at, "invalid symbol %s", cph_edn__show(shown, sizeof shown, s, n));
  uint32_t cp;
  size_t k = cph_edn__utf8_decode(s, n, &cp);
  if (k == 0)
    return cph_edn__fail(lx, at, "invalid UTF-8");
  if (cp < 0x20 || cp == 0x7F)
    return cph_edn__fail(lx, at, "unexpected control character 0x%02X", (unsigned)cp);
  return cph_edn__fail(lx, at, "unexpected character '%s'",
                       cph_edn__show(shown, sizeof shown, s, k));
}

int cph_edn__lex_symbolic(edn_lexer *lx, cph_edn *v) {
  static const struct {
    const char *name;
    double value;
  } known[] = {{"Inf", INFINITY}, {"-Inf", -INFINITY}, {"NaN", NAN}};
  cph_edn_pos at = edn_here(lx);
  char shown[64];
  size_t start = lx->off;
  edn_bump_n(lx, 2);
  skip_token(lx);
  const unsigned char *s = lx->s + start;
  size_t n = lx->off - start;
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
    if (strlen(known[i].name) == n - 2 && memcmp(known[i].name, s + 2, n - 2) == 0) {
      v->text = cph_edn__strndup(s, n);
      if (!v->text)
        return cph_edn__oom(lx);
      v->type = CPH_EDN_FLOAT;
      v->u.floating = known[i].value;
      return CPH_OK;
    }
  }
  return cph_edn__fail(lx, at, "invalid symbolic value %s",
                       cph_edn__show(shown, sizeof shown, s, n));
}

/* ---------------------------------------------------------------------------------------------
 * Tokens, for the reader
 * ------------------------------------------------------------------------------------------- */

int cph_edn__lex_atom(edn_lexer *lx, int c, cph_edn *v) {
  if (c == '"')
    return read_string(lx, v);
  if (c == '\\')
    return read_char(lx, v);
  if (c == ':')
    return read_keyword(lx, v);
  return read_word(lx, v);
}

int cph_edn__lex_tag(edn_lexer *lx, cph_edn_pos at, char **tag, size_t *skip) {
  char shown[64];
  *tag = NULL;
  if (!is_alpha(edn_peek_at(lx, 1)))
    return cph_edn__fail(lx, at, "'#' must be followed by a tag, '{', '_' or '#'");
  size_t start = lx->off + 1;
  size_t n = 0;
  while (!is_delimiter(edn_peek_at(lx, 1 + n)))
    n++;
  if (!valid_symbol(lx->s + start, n, false))
    return cph_edn__fail(lx, at, "invalid tag #%s",
                         cph_edn__show(shown, sizeof shown, lx->s + start, n));
  if (!(*tag = cph_edn__strndup(lx->s + start, n)))
    return cph_edn__oom(lx);
  *skip = 1 + n;
  return CPH_OK;
}
