/* Private to policy/: what the files of the EDN reader and writer share. The public API and
 * its contract are in include/cephalon/edn.h; the format is https://github.com/edn-format/edn.
 *
 *   edn_value.c  the value tree: allocation (with the test seam), free, equality, hashing
 *   edn_text.c   UTF-8, numbers in the "C" locale, values shown in error messages
 *   edn_lex.c    the lexer: the cursor (line:column), whitespace and comments, tokens
 *                (strings, characters, keywords, numbers, symbols, ##Inf, #tag names), errors
 *   edn_read.c   the reader: the stack of open forms, tagged literals, #_ discard,
 *                duplicate keys, cph_edn_parse
 *   edn_print.c  the writer: cph_edn_write
 *
 * Calls go one way: edn_read.c -> edn_lex.c and edn_print.c (a duplicate key's message shows
 * the key) -> edn_text.c and edn_value.c. */
#ifndef CEPHALON_POLICY_EDN_INTERNAL_H
#define CEPHALON_POLICY_EDN_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cephalon/edn.h"

/* ---------------------------------------------------------------------------------------------
 * Values (edn_value.c)
 * ------------------------------------------------------------------------------------------- */

/* malloc and strndup through the test seam cph_edn__fail_alloc_countdown (edn_value.c):
 * every allocation of the reader goes through these or cph_edn__grow. */
void *cph_edn__malloc(size_t n);
char *cph_edn__strndup(const void *s, size_t n);

/* Returns ptr grown to at least `need` elements (doubling; *cap updated), or NULL with ptr
 * untouched. */
void *cph_edn__grow(void *ptr, size_t *cap, size_t need, size_t elem);

/* Frees what v owns, not v itself (collection items live inline in their parent's array). */
void cph_edn__free_contents(cph_edn *v);

/* Consistent with cph_edn_equal (equal values hash equally); linear in the size of v. */
uint64_t cph_edn__hash(const cph_edn *v);

/* ---------------------------------------------------------------------------------------------
 * Text (edn_text.c)
 * ------------------------------------------------------------------------------------------- */

/* Decodes one well-formed UTF-8 sequence (no overlongs, surrogates or values past U+10FFFF)
 * from s[0..n); returns its length, or 0 if the bytes are not one. */
size_t cph_edn__utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);

/* Encodes a code point <= U+10FFFF; returns the length (1-4). */
size_t cph_edn__utf8_encode(uint32_t cp, unsigned char out[4]);

/* strtod and printf in the "C" numeric locale, whatever setlocale() the process called. */
double cph_edn__strtod(const char *s);
/* Shortest of %.15g, %.16g, %.17g that reads back as d (%.17g always does). */
void cph_edn__format_double(double d, char *dst, size_t cap);

/* Renders s[0..n) for an error message into dst: at most ~40 bytes, control characters and
 * invalid UTF-8 as '?', "..." when cut. The result is always valid UTF-8 (messages end up in
 * JSON). Returns dst. */
const char *cph_edn__show(char *dst, size_t cap, const void *src, size_t n);

/* ---------------------------------------------------------------------------------------------
 * Lexer (edn_lex.c): the cursor over the input and the tokens
 * ------------------------------------------------------------------------------------------- */

typedef struct edn_lexer {
  const unsigned char *s;
  size_t len, off;
  uint32_t line, col; /* of s[off] */
  cph_edn_error *err; /* may be NULL */
} edn_lexer;

/* The byte k ahead of the cursor, or -1 past the end. Never reads past len. */
static inline int edn_peek_at(const edn_lexer *lx, size_t k) {
  return k < lx->len - lx->off ? lx->s[lx->off + k] : -1;
}

static inline int edn_peek(const edn_lexer *lx) { return edn_peek_at(lx, 0); }

/* Consumes one byte, keeping line and column: a column counts code points, so UTF-8
 * continuation bytes do not advance it. */
static inline void edn_bump(edn_lexer *lx) {
  unsigned char b = lx->s[lx->off++];
  if (b == '\n') {
    lx->line++;
    lx->col = 1;
  } else if ((b & 0xC0) != 0x80) {
    lx->col++;
  }
}

static inline void edn_bump_n(edn_lexer *lx, size_t n) {
  while (n--)
    edn_bump(lx);
}

static inline cph_edn_pos edn_here(const edn_lexer *lx) {
  return (cph_edn_pos){lx->line, lx->col};
}

/* Sets *lx->err (if any) to `at` and the message; returns CPH_EPARSE. */
int cph_edn__fail(edn_lexer *lx, cph_edn_pos at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* "out of memory" at the cursor; returns CPH_ENOMEM. */
int cph_edn__oom(edn_lexer *lx);

/* Skips whitespace, commas and ; comments (to the end of the line; their bytes are not
 * checked). */
void cph_edn__skip_space(edn_lexer *lx);

/* Reads the atom starting at the cursor, whose first byte is c: a string ("), a character
 * (\), a keyword (:), or nil, true, false, a number or a symbol. On failure v may hold
 * allocations: the caller frees its contents either way. */
int cph_edn__lex_atom(edn_lexer *lx, int c, cph_edn *v);

/* "##Inf", "##-Inf", "##NaN"; the cursor is on the first '#'. As cph_edn__lex_atom. */
int cph_edn__lex_symbolic(edn_lexer *lx, cph_edn *v);

/* The tag of "#tag" at `at` (the cursor is on '#'): on success *tag is its name (owned by the
 * caller) and *skip the bytes from '#' to its end; the cursor does not move. */
int cph_edn__lex_tag(edn_lexer *lx, cph_edn_pos at, char **tag, size_t *skip);

#endif
