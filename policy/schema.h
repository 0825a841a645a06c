/* The policy schema: one descriptor per key (private to policy/).
 *
 * Every policy key is one ps_field in a ps_table; a table describes one C struct and a
 * nested section points at its child table. The policy_*.c files (policy_internal.h) walk
 * these tables — and nothing else — to set defaults, validate, print, compare, copy and
 * free, and to find did-you-mean candidates, so adding a key is one line here plus the
 * struct field in include/cephalon/policy.h. */
#ifndef CEPHALON_POLICY_SCHEMA_H
#define CEPHALON_POLICY_SCHEMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Most fields one table may have (parse keeps per-field state in fixed arrays). */
#define PS_MAX_FIELDS 16

typedef enum ps_kind {
  PS_INT,      /* int64_t in [imin, imax]; EDN integers only */
  PS_NUM,      /* double in [dmin, dmax]; EDN integers or floats */
  PS_BOOL,     /* bool; true/false only */
  PS_STR,      /* char * (owned); EDN string */
  PS_CHOICE,   /* enum (int-sized) = index into choices; EDN keyword */
  PS_SCOPES,   /* unsigned bitmask, bit i = choices[i]; EDN set or vector of keywords */
  PS_SECTION,  /* nested struct described by child; EDN map with keyword keys */
  PS_CHANNELS, /* array of child structs at off, size_t count at count_off; EDN map from
                  channel id (or other name) string to a child map; entries start as a copy
                  of the sibling section named by seed (or, without seed, at the child
                  table's defaults), are kept sorted by id, and hold the id at
                  child->id_off */
  PS_VECTOR,   /* array of child structs at off, size_t count at count_off; EDN vector of
                  maps, at least imin of them */
  PS_STRINGS   /* char ** array at off (array and each string owned), size_t count at
                  count_off; EDN set or vector of strings of imin..imax bytes. A vector's
                  duplicates collapse to the first; a set's are an error (EDN forbids them).
                  Kept in first-seen order; default empty (NULL, 0) */
} ps_kind;

enum {
  PS_REQUIRED = 1u << 0,      /* no default: the key must be given */
  PS_MIN_EXCLUSIVE = 1u << 1, /* PS_NUM: value must be > dmin */
  PS_HOSTPORT = 1u << 2,      /* PS_STR: HOST:PORT */
  PS_HEX64 = 1u << 3,         /* PS_STR: 64 lower-case hex characters */
  PS_NONEMPTY = 1u << 4,      /* PS_STR: not "" */
  PS_OPTIONAL = 1u << 5       /* PS_SECTION: absent by default; bool at present_off says
                                 whether it was given */
};

typedef struct ps_table ps_table;

typedef struct ps_field {
  const char *name; /* the keyword without ':' */
  ps_kind kind;
  unsigned flags;
  size_t off;         /* offset of the value in the table's struct */
  size_t count_off;   /* PS_CHANNELS, PS_VECTOR, PS_STRINGS: offset of the size_t count */
  size_t present_off; /* PS_OPTIONAL: offset of the bool "was given" */
  int64_t imin, imax; /* PS_INT range; PS_VECTOR: imin = fewest elements; PS_STRINGS:
                         bytes per string */
  int64_t idef;       /* PS_INT default; PS_BOOL default (0/1); PS_CHOICE default index */
  double dmin, dmax, ddef;     /* PS_NUM range and default */
  const char *sdef;            /* PS_STR default; NULL only with PS_REQUIRED */
  const char *const *choices;  /* PS_CHOICE, PS_SCOPES: keyword names, NULL-terminated */
  const ps_table *child;       /* PS_SECTION, PS_CHANNELS, PS_VECTOR */
  const char *seed;            /* PS_CHANNELS: sibling section that entries start from */
  const char *neg_of;          /* PS_NUM: when absent, defaults to minus this sibling */
  const char *absent;          /* PS_OPTIONAL: what leaving the section out means */
  const char *doc;             /* one line: what the key does */
} ps_field;

typedef enum ps_check_kind {
  PS_CHECK_LE,     /* value of field a <= value of field b (PS_INT or PS_NUM) */
  PS_CHECK_URL_FOR /* when choice field a is choices[choice], string field b is non-empty */
} ps_check_kind;

/* A constraint between two fields of one table, checked once the whole map is read (and,
 * for channel entries, merged over their seed). */
typedef struct ps_check {
  ps_check_kind kind;
  const char *a;
  const char *b;
  int64_t choice;
} ps_check;

#define PS_NO_ID ((size_t)-1)

struct ps_table {
  const ps_field *fields;
  size_t count;
  size_t size;  /* sizeof the struct the table describes */
  size_t id_off; /* offset of the char * channel id in channel entries, or PS_NO_ID */
  const ps_check *checks;
  size_t check_count;
  /* A constraint the checks cannot say, run after them on the table's final values: returns
   * 0, or non-zero with a message in msg and *key naming the field the error points at (its
   * value when given, else the map). */
  int (*validate)(const void *base, const char **key, char *msg, size_t cap);
};

/* The root table: describes cph_policy. */
extern const ps_table cph__policy_schema;

extern const char *const cph__policy_log_levels[];
extern const char *const cph__policy_syncs[];
extern const char *const cph__policy_provider_kinds[];
extern const char *const cph__policy_index_kinds[];
extern const char *const cph__policy_while_runnings[];

#endif
