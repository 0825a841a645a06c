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
} cph_field;

struct cph_record_desc {
  const char *name;
  uint32_t version; /* bump when the field table changes */
  size_t size;      /* sizeof the record struct */
  const cph_field *fields;
  size_t n_fields;
  /* Compatible reading: a record written at old_version (non-zero) holds only the first
   * old_n_fields fields (the rest were appended since) and decodes with the rest zero —
   * NULL strings, empty arrays. It is written back at the current version. */
  uint32_t old_version;
  size_t old_n_fields;
};

#endif
