/* Field tables behind cph_record_desc — private to store/. */
#ifndef CEPHALON_STORE_CODEC_INTERNAL_H
#define CEPHALON_STORE_CODEC_INTERNAL_H

#include "records.h"

typedef enum cph_field_type {
  CPH_F_U8,        /* uint8_t; `limit` (if non-zero) is the exclusive upper bound */
  CPH_F_BOOL,      /* bool */
  CPH_F_U32,       /* uint32_t */
  CPH_F_U64,       /* uint64_t */
  CPH_F_I64,       /* int64_t */
  CPH_F_F64,       /* double */
  CPH_F_STR,       /* char *, required (NULL is written as "") */
  CPH_F_OPT_STR,   /* char *, NULL <-> nil */
  CPH_F_STR_ARRAY, /* char **, count (uint32_t) at count_offset */
  CPH_F_U64_ARRAY, /* uint64_t *, count (uint32_t) at count_offset */
  CPH_F_I64_ARRAY, /* int64_t *, count (uint32_t) at count_offset */
  CPH_F_BYTES      /* uint8_t[limit]: fixed-size binary */
} cph_field_type;

typedef struct cph_field {
  const char *name;
  cph_field_type type;
  size_t offset;
  size_t count_offset;
  unsigned limit;
  uint32_t since; /* the record version that added it (0: the first); see cph_record_desc */
} cph_field;

/* Versions. A record is written at `version` with every field. It is read at any version
 * from `oldest` to `version`: a record of version v has exactly the fields with since <= v,
 * in table order, and the later ones read as zero — so a field added compatibly goes at the
 * end of its table with since = the new version, and its zero value must mean "as before"
 * (the session's while_running: 0 = its class's default). A table changed any other way
 * bumps both (oldest = version: older records are then refused, or migrated by the store). */
struct cph_record_desc {
  const char *name;
  uint32_t version; /* bump when the field table changes */
  size_t size;      /* sizeof the record struct */
  const cph_field *fields;
  size_t n_fields;
  uint32_t oldest; /* the oldest version still read; 0 means `version` */
};

#endif
