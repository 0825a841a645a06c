/* Turning a schema-5 data dir's rows back into schema 4's forms, as the previous build wrote
 * them (store/store.h): for the tests that open such a directory. Each works in a write txn
 * of the caller's and fails the running test on any error. */
#ifndef CEPHALON_TESTS_SCHEMA4_H
#define CEPHALON_TESTS_SCHEMA4_H

#include <stddef.h>

#include "store/store.h"

/* Every embed-queue range of several ids becomes one row per id (an empty value). Returns how
 * many ranges it split. */
size_t cph_test_embed_rows_of_one(cph_txn *t);
/* Every row of exact-dedupe entries becomes schema 4's time-ordered entries, one per copy
 * (key 0xFF be64(last_ms) sha256, value v1: family, event id, first_ms, last_ms, simhash):
 * rows in order, so a later copy with the same key is the one kept. Returns how many entries
 * it wrote. */
size_t cph_test_dedupe_rows_to_entries(cph_txn *t);
/* Records schema version 4 in meta. */
void cph_test_set_schema4(cph_txn *t);

#endif
