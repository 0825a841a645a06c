#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/trees.h"
#include "engine_fixture.h"
#include "store/store.h"
#include "trees_check.h"

static const cph_pact_tree *sort_tree; /* qsort has no context argument */

static int by_seq(const void *a, const void *b) {
  const cph_pact_node *x = &sort_tree->nodes[*(const size_t *)a];
  const cph_pact_node *y = &sort_tree->nodes[*(const size_t *)b];
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

static size_t *seq_order(const cph_pact_tree *t) {
  size_t *idx = malloc((t->n ? t->n : 1) * sizeof *idx);
  assert_non_null(idx);
  for (size_t i = 0; i < t->n; i++)
    idx[i] = i;
  sort_tree = t;
  qsort(idx, t->n, sizeof *idx, by_seq);
  return idx;
}

static bool str_eq(const char *a, const char *b) {
  return a == b || (a && b && strcmp(a, b) == 0);
}

static const char *node_diff(const cph_pact_node *a, const cph_pact_node *b) {
  if (a->id != b->id)
    return "id";
  if (a->at.depth != b->at.depth || a->at.position != b->at.position ||
      a->at.offset != b->at.offset)
    return "coordinates";
  if (!str_eq(a->content, b->content))
    return "content";
  if (!str_eq(a->role, b->role))
    return "role";
  if (a->ttl != b->ttl || a->cadence != b->cadence)
    return "ttl or cadence";
  if (a->n_lifecycle != b->n_lifecycle || a->stage != b->stage)
    return "lifecycle or stage";
  for (uint32_t i = 0; i < a->n_lifecycle; i++)
    if (memcmp(&a->lifecycle[i], &b->lifecycle[i], sizeof a->lifecycle[i]) != 0)
      return "a lifecycle stage";
  if (!str_eq(a->key, b->key))
    return "key";
  if (a->n_tags != b->n_tags)
    return "tag count";
  for (uint32_t i = 0; i < a->n_tags; i++)
    if (!str_eq(a->tags[i], b->tags[i]))
      return "a tag";
  if (a->created_at_episode != b->created_at_episode)
    return "created_at_episode";
  if (a->seq != b->seq)
    return "seq";
  if (a->waiting != b->waiting)
    return "waiting";
  return NULL;
}

bool cph_test_trees_equal(const cph_pact_tree *want, const cph_pact_tree *got, bool shift,
                          char *why, size_t why_size) {
  if (want->episode != got->episode || want->next_id != got->next_id ||
      want->next_seq != got->next_seq || (shift && want->shift != got->shift)) {
    snprintf(why, why_size,
             "header: episode %llu/%llu next_id %llu/%llu next_seq %llu/%llu shift %lld/%lld",
             (unsigned long long)want->episode, (unsigned long long)got->episode,
             (unsigned long long)want->next_id, (unsigned long long)got->next_id,
             (unsigned long long)want->next_seq, (unsigned long long)got->next_seq,
             (long long)want->shift, (long long)got->shift);
    return false;
  }
  if (want->n != got->n) {
    snprintf(why, why_size, "%zu nodes wanted, %zu found", want->n, got->n);
    return false;
  }
  size_t *a = seq_order(want), *b = seq_order(got);
  bool same = true;
  for (size_t i = 0; i < want->n && same; i++) {
    const cph_pact_node *x = &want->nodes[a[i]], *y = &got->nodes[b[i]];
    const char *d = node_diff(x, y);
    if (d) {
      char at_x[48], at_y[48];
      cph_coord_format(&x->at, at_x);
      cph_coord_format(&y->at, at_y);
      snprintf(why, why_size, "node %zu (seq %llu): %s differs (id %llu at %s / id %llu at %s)",
               i, (unsigned long long)x->seq, d, (unsigned long long)x->id, at_x,
               (unsigned long long)y->id, at_y);
      same = false;
    }
  }
  free(a);
  free(b);
  return same;
}

size_t cph_test_write_schema2(const char *dir) {
  cph_store *st = cph_fixture_store_open(dir);
  cph_txn t;
  assert_int_equal(cph_txn_begin(st, true, &t), CPH_OK);
  /* the sessions with a tree: the header keys (no seq after the session's NUL) */
  char **sessions = NULL;
  size_t n = 0;
  cph_cursor c;
  assert_int_equal(cph_cursor_open(&t, CPH_DB_CONTEXT, &c), CPH_OK);
  cph_val k;
  for (int rc = cph_cursor_seek(&c, NULL, &k, NULL); rc == CPH_OK;
       rc = cph_cursor_next(&c, &k, NULL)) {
    if (memchr(k.data, '\0', k.len) != (const char *)k.data + k.len - 1)
      continue; /* a node */
    sessions = realloc(sessions, (n + 1) * sizeof *sessions);
    assert_non_null(sessions);
    sessions[n++] = strdup(k.data);
  }
  cph_cursor_close(&c);
  cph_trees tr;
  trees_init(&tr);
  cph_buf b = CPH_BUF_INIT;
  for (size_t i = 0; i < n; i++) {
    cph_pact_tree tree;
    assert_int_equal(trees_load(&tr, &t, sessions[i], &tree), CPH_OK);
    assert_int_equal(trees_delete(&tr, &t, sessions[i]), CPH_OK);
    cph_buf_reset(&b);
    assert_int_equal(trees_v2_encode(&tree, &b), CPH_OK);
    cph_key key;
    cph_key_reset(&key);
    cph_key_str(&key, sessions[i]);
    assert_int_equal(cph_txn_put(&t, CPH_DB_CONTEXT, &key, b.data, b.len), CPH_OK);
    cph_pact_tree_free(&tree);
    free(sessions[i]);
  }
  free(sessions);
  cph_buf_free(&b);
  trees_free(&tr);
  cph_key vk;
  cph_key_reset(&vk);
  memcpy(vk.data, "schema_version", 14);
  vk.len = 14;
  uint8_t v2[4] = {0, 0, 0, 2};
  assert_int_equal(cph_txn_put(&t, CPH_DB_META, &vk, v2, sizeof v2), CPH_OK);
  assert_int_equal(cph_txn_commit(&t), CPH_OK);
  cph_store_close(st);
  return n;
}
