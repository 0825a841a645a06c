/* Shared checks for the tree store (core/trees.h): comparing two PACT trees field by field,
 * and turning a data dir back into the schema-2 layout, as a previous build wrote it. */
#ifndef CEPHALON_TESTS_TREES_CHECK_H
#define CEPHALON_TESTS_TREES_CHECK_H

#include <stdbool.h>
#include <stddef.h>

#include "core/pact.h"

/* Whether got holds what want holds: episode, next id, next seq, and every node (matched in
 * seq order) field by field — id, coordinates, content, role, ttl, cadence, lifecycle, stage,
 * key, tags, created_at_episode, seq, waiting — and, with `shift`, the shift total too.
 * Change tracking (dirty, removed) is not compared. On a difference *why says the first. */
bool cph_test_trees_equal(const cph_pact_tree *want, const cph_pact_tree *got, bool shift,
                          char *why, size_t why_size);

/* Rewrites the data dir (engine closed, schema 3) as schema 2 had it: every session's tree as
 * one value (trees_v2_encode) at key session\0 and schema version 2 in meta. Returns how many
 * trees it rewrote. Fails the running test on any error. */
size_t cph_test_write_schema2(const char *dir);

#endif
