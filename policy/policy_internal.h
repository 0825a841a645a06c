/* Private to policy/: what the policy's files share. Each walks the schema tables
 * (policy/schema.h) and knows no individual key:
 *
 *   policy_fields.c  defaults, free, copy and equality of the structs a table describes
 *   policy_load.c    reading and validating a policy file (cph_policy_load_*)
 *   policy_print.c   writing a policy as EDN (cph_policy_write_edn)
 *   policy.c         the rest of the public API: new, free, equal, per-channel lookups
 *
 * Calls go one way: policy.c -> policy_fields.c; policy_load.c -> policy_fields.c and
 * policy_print.c (messages quote strings and numbers as the printer writes them). */
#ifndef CEPHALON_POLICY_POLICY_INTERNAL_H
#define CEPHALON_POLICY_POLICY_INTERNAL_H

#include <assert.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "cephalon/edn.h"
#include "policy/schema.h"

/* ======================================================================================
 * Field access. Values are copied in and out with memcpy so that a table can address any
 * field type through one byte offset without breaking aliasing rules.
 * ==================================================================================== */

static inline void *at(void *base, size_t off) { return (char *)base + off; }
static inline const void *cat(const void *base, size_t off) { return (const char *)base + off; }

#define ACCESSORS(suffix, type)                                                                    \
  static inline type get_##suffix(const void *base, size_t off) {                                  \
    type v;                                                                                        \
    memcpy(&v, cat(base, off), sizeof v);                                                          \
    return v;                                                                                      \
  }                                                                                                \
  static inline void set_##suffix(void *base, size_t off, type v) {                                \
    memcpy(at(base, off), &v, sizeof v);                                                           \
  }
ACCESSORS(int, int64_t)
ACCESSORS(num, double)
ACCESSORS(bool, bool)
ACCESSORS(choice, int)
ACCESSORS(scopes, unsigned)
ACCESSORS(str, char *)
ACCESSORS(ptr, void *)
ACCESSORS(size, size_t)
#undef ACCESSORS

static inline int find_field(const ps_table *t, const char *name) {
  for (size_t i = 0; i < t->count; i++)
    if (strcmp(t->fields[i].name, name) == 0)
      return (int)i;
  return -1;
}

/* The sibling named `name`, which the schema guarantees exists. */
static inline const ps_field *sibling(const ps_table *t, const char *name) {
  int i = find_field(t, name);
  assert(i >= 0);
  return &t->fields[i];
}

static inline void *element(void *arr, const ps_table *t, size_t i) {
  return (char *)arr + i * t->size;
}
static inline const void *celement(const void *arr, const ps_table *t, size_t i) {
  return (const char *)arr + i * t->size;
}

/* ======================================================================================
 * Defaults, free, copy, equality (policy_fields.c).
 * ==================================================================================== */

/* Frees what the struct owns (strings, arrays) and leaves those pointers NULL. */
void cph__policy_free_fields(const ps_table *t, void *base);
/* Frees the PS_CHANNELS / PS_VECTOR array, or the PS_STRINGS array, of field f; empty after. */
void cph__policy_free_array(const ps_field *f, void *base);
void cph__policy_free_strings(const ps_field *f, void *base);

/* Fields with neg_of that were not given (given == NULL: none was) become minus their
 * sibling. Runs after the sibling has its final value. */
void cph__policy_derive_defaults(const ps_table *t, void *base, const cph_edn *const *given);

/* Sets every field to its default. base must be zeroed, so that a failure part-way leaves
 * a struct cph__policy_free_fields can release. CPH_OK or CPH_ENOMEM. */
int cph__policy_init_fields(const ps_table *t, void *base);

/* Deep copy of src into dst. dst must be zeroed (same reason). CPH_OK or CPH_ENOMEM. */
int cph__policy_copy_fields(const ps_table *t, void *dst, const void *src);

bool cph__policy_equal_fields(const ps_table *t, const void *a, const void *b);

/* ======================================================================================
 * Text, as the printer writes it (policy_print.c).
 * ==================================================================================== */

/* An EDN string literal. The policy's own strings never hold NUL (the loader refuses it). */
void cph__policy_write_string(cph_buf *b, const char *s, size_t len);

/* Shortest text that reads back as exactly d (%.17g always does), in the "C" locale. */
void cph__policy_shortest_double(double d, char *out, size_t cap);

#endif
