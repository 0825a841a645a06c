/* Private to store/. */
#ifndef CEPHALON_STORE_INTERNAL_H
#define CEPHALON_STORE_INTERNAL_H

#include <lmdb.h>

#include "store.h"

#define CPH_META_SCHEMA_KEY "schema_version"

struct cph_store {
  MDB_env *env;
  MDB_dbi dbi[CPH_DB_COUNT];
  char *dir;
  int lock_fd;
  cph_sync_mode sync;
};

#endif
