/* EDN reader and writer (https://github.com/edn-format/edn), used for the policy file and by
 * cephalon-worker for its --config file. Implemented in policy/ (edn_*.c).
 *
 * Supported: nil, true/false, strings (escapes \t \r \n \\ \" \b \f \/ and \uXXXX, decoded to
 * UTF-8), characters (\c, \newline, \return, \space, \tab, \formfeed, \backspace, \uXXXX),
 * integers (optional sign, optional N suffix), floats (fraction and/or exponent, optional M
 * suffix, and the symbolic ##Inf ##-Inf ##NaN), keywords (:name, :ns/name), symbols, lists (),
 * vectors [], maps {}, sets #{}, comments (; to end of line), discard (#_ form), tagged
 * literals (#tag form), commas as whitespace.
 *
 * Positions are 1-based; a column counts Unicode code points from the start of the line
 * (a tab is one column). */
#ifndef CEPHALON_EDN_H
#define CEPHALON_EDN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct cph_buf cph_buf; /* common/buf.h */

typedef enum cph_edn_type {
  CPH_EDN_NIL,
  CPH_EDN_BOOL,
  CPH_EDN_STRING,
  CPH_EDN_CHAR,
  CPH_EDN_INT,    /* fits in int64_t; u.integer (text keeps the literal digits, e.g. "42N") */
  CPH_EDN_BIGINT, /* an integer outside int64_t; only text is meaningful */
  CPH_EDN_FLOAT,  /* u.floating; for an M suffix text keeps the exact literal */
  CPH_EDN_KEYWORD,
  CPH_EDN_SYMBOL,
  CPH_EDN_LIST,
  CPH_EDN_VECTOR,
  CPH_EDN_MAP,
  CPH_EDN_SET,
  CPH_EDN_TAGGED
} cph_edn_type;

typedef struct cph_edn_pos {
  uint32_t line;
  uint32_t column;
} cph_edn_pos;

typedef struct cph_edn cph_edn;

struct cph_edn {
  cph_edn_type type;
  cph_edn_pos pos; /* where the value's first character is */
  /* Literal text for numbers (INT, BIGINT, FLOAT) exactly as written, including any sign
   * and N/M suffix; NULL for other types. */
  char *text;
  union {
    bool boolean;      /* BOOL */
    int64_t integer;   /* INT */
    double floating;   /* FLOAT */
    uint32_t codepoint; /* CHAR */
    /* STRING: decoded UTF-8 bytes (may contain NUL only if written as \u0000).
     * KEYWORD / SYMBOL: the name without the leading ':', namespace included ("ns/name"). */
    struct {
      char *ptr; /* NUL-terminated */
      size_t len;
    } str;
    /* LIST, VECTOR, SET: count items. MAP: count is the number of entries and items holds
     * 2*count values laid out key0, val0, key1, val1, ... in source order. */
    struct {
      cph_edn *items;
      size_t count;
    } coll;
    /* TAGGED: tag is the symbol after '#' (e.g. "inst", "myapp/Person"). */
    struct {
      char *tag;
      cph_edn *value;
    } tagged;
  } u;
};

typedef struct cph_edn_error {
  uint32_t line;
  uint32_t column;
  char message[160];
} cph_edn_error;

typedef struct cph_edn_options {
  unsigned max_depth;         /* collections nested deeper than this are an error; 0 = 128 */
  bool allow_duplicate_keys;  /* let the caller report duplicate map keys / set elements */
} cph_edn_options;

#define CPH_EDN_DEFAULT_MAX_DEPTH 128
/* The parser itself never recurses, but cph_edn_free/equal/write recurse once per level, so
 * max_depth is clamped to this to keep their stack use bounded. */
#define CPH_EDN_MAX_DEPTH_LIMIT 10000

/* Parses exactly one EDN value from text[0..len) (whitespace, commas, comments and discards
 * around it are allowed). On success returns CPH_OK and *out (free with cph_edn_free). On
 * failure returns CPH_EPARSE (or CPH_ENOMEM), *out = NULL and err says where and what, e.g.
 * {3, 14, "unterminated string"}. opts may be NULL for defaults. Never reads past len. */
int cph_edn_parse(const char *text, size_t len, const cph_edn_options *opts, cph_edn **out,
                  cph_edn_error *err);

void cph_edn_free(cph_edn *v);

/* Structural equality as EDN defines it: maps and sets compare without regard to order;
 * INT and BIGINT compare by value; FLOAT compares by value (NaN equals NaN); positions and
 * literal text are ignored. */
bool cph_edn_equal(const cph_edn *a, const cph_edn *b);

/* Writes v as EDN text that reads back equal (cph_edn_equal). Compact: one space between
 * items, maps as {k v, k v}. Appends to out. */
void cph_edn_write(const cph_edn *v, cph_buf *out);

/* For a MAP: the value for a keyword key named `name` (without ':'), or NULL. */
const cph_edn *cph_edn_map_get_keyword(const cph_edn *map, const char *name);

/* Human name of a type for error messages: "a string", "an integer", "a map", ... */
const char *cph_edn_type_name(cph_edn_type t);

#endif
