/* common/: the slab allocators and the id index the engine keeps a million sessions in. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/error.h"
#include "common/arena.h"
#include "common/idmap.h"
#include "common/slab.h"

/* ---------------------------------------------------------------- slab */

static void test_slab_objects_are_zeroed_distinct_and_reused_after_free(void **state) {
  (void)state;
  cph_slab s;
  cph_slab_init(&s, 20); /* rounded up to 24 */
  assert_int_equal(s.size, 24);
  enum { N = 10000 }; /* several chunks */
  unsigned char **p = calloc(N, sizeof *p);
  for (int i = 0; i < N; i++) {
    p[i] = cph_slab_alloc(&s);
    assert_non_null(p[i]);
    assert_int_equal((uintptr_t)p[i] % 8, 0);
    for (int b = 0; b < 20; b++)
      assert_int_equal(p[i][b], 0);
    memset(p[i], 0xA5, 20);
    memcpy(p[i], &i, sizeof i);
  }
  assert_true(s.n_chunks > 1);
  assert_int_equal(s.live, N);
  for (int i = 0; i < N; i++) { /* nobody overlapped anybody */
    int v;
    memcpy(&v, p[i], sizeof v);
    assert_int_equal(v, i);
    assert_int_equal(p[i][19], 0xA5);
  }
  size_t chunks = s.n_chunks;
  for (int i = 0; i < N; i += 2)
    cph_slab_free(&s, p[i]);
  assert_int_equal(s.live, N / 2);
  for (int i = 0; i < N; i += 2) { /* the freed objects come back, zeroed; no new chunk */
    p[i] = cph_slab_alloc(&s);
    for (int b = 0; b < 20; b++)
      assert_int_equal(p[i][b], 0);
  }
  assert_int_equal(s.n_chunks, chunks);
  assert_int_equal(s.live, N);
  cph_slab_destroy(&s);
  assert_int_equal(s.live, 0);
  assert_non_null(cph_slab_alloc(&s)); /* usable again */
  cph_slab_destroy(&s);
  free(p);
}

static void test_strslab_copies_every_length_and_takes_them_back(void **state) {
  (void)state;
  cph_strslab pool;
  cph_strslab_init(&pool);
  char src[400];
  char *copies[400];
  for (int n = 0; n < 400; n++) { /* every size class, and past the largest (malloc) */
    for (int i = 0; i < n; i++)
      src[i] = (char)('a' + (n + i) % 26);
    src[n] = '\0';
    copies[n] = cph_strslab_dup(&pool, src);
    assert_non_null(copies[n]);
    assert_string_equal(copies[n], src);
  }
  for (int n = 0; n < 400; n++) {
    assert_int_equal(strlen(copies[n]), n);
    if (n)
      assert_int_equal(copies[n][n - 1], 'a' + (2 * n - 1) % 26);
  }
  for (int n = 0; n < 400; n++)
    cph_strslab_free(&pool, copies[n]);
  for (size_t k = 0; k < CPH_STRSLAB_CLASSES; k++)
    assert_int_equal(pool.classes[k].live, 0);
  cph_strslab_free(&pool, NULL);
  cph_strslab_destroy(&pool);
}

/* ---------------------------------------------------------------- idmap */

typedef struct keys {
  char (*k)[24]; /* handle -> key */
} keys;

static const char *key_of(const void *ctx, uint32_t h) { return ((const keys *)ctx)->k[h]; }

static void test_idmap_matches_a_reference_under_random_puts_and_deletes(void **state) {
  (void)state;
  enum { N = 20000 };
  keys ks = {calloc(N, sizeof *ks.k)};
  bool *in = calloc(N, sizeof *in);
  for (int i = 0; i < N; i++)
    snprintf(ks.k[i], sizeof ks.k[i], "session-%d", i * 7919 % N);
  cph_idmap m;
  cph_idmap_init(&m, key_of, &ks);
  assert_int_equal(cph_idmap_get(&m, "nobody"), CPH_IDMAP_NONE);
  assert_false(cph_idmap_del(&m, "nobody"));
  uint64_t rng = 42;
  size_t live = 0;
  for (int step = 0; step < 200000; step++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t h = (uint32_t)(rng >> 33) % N;
    if ((rng >> 20) % 3) {
      assert_int_equal(cph_idmap_put(&m, ks.k[h], h), CPH_OK);
      live += !in[h];
      in[h] = true;
    } else {
      assert_int_equal(cph_idmap_del(&m, ks.k[h]), in[h]);
      live -= in[h];
      in[h] = false;
    }
    assert_int_equal(m.len, live);
    if (step % 1000 == 0) /* every key where the reference says, and only those */
      for (uint32_t i = 0; i < N; i++)
        assert_int_equal(cph_idmap_get(&m, ks.k[i]), in[i] ? i : CPH_IDMAP_NONE);
  }
  cph_idmap_free(&m);
  free(in);
  free(ks.k);
}

static void test_idmap_reserved_never_rehashes_and_a_new_handle_replaces(void **state) {
  (void)state;
  enum { N = 3000 };
  keys ks = {calloc(N + 1, sizeof *ks.k)};
  for (int i = 0; i < N; i++)
    snprintf(ks.k[i], sizeof ks.k[i], "s%d", i);
  cph_idmap m;
  cph_idmap_init(&m, key_of, &ks);
  assert_int_equal(cph_idmap_reserve(&m, N), CPH_OK);
  uint64_t *slots = m.slots;
  size_t cap = m.cap;
  assert_true(cap / 4 * 3 >= N);
  for (uint32_t i = 0; i < N; i++)
    assert_int_equal(cph_idmap_put(&m, ks.k[i], i), CPH_OK);
  assert_ptr_equal(m.slots, slots); /* loading what was reserved: no rehash */
  assert_int_equal(m.cap, cap);
  /* The same key under a new handle (a session re-registered under a new sid). */
  snprintf(ks.k[N], sizeof ks.k[N], "s%d", 17);
  assert_int_equal(cph_idmap_put(&m, "s17", N), CPH_OK);
  assert_int_equal(m.len, N);
  assert_int_equal(cph_idmap_get(&m, "s17"), N);
  assert_int_equal(cph_idmap_get(&m, "s18"), 18);
  /* reserving less than there is changes nothing */
  assert_int_equal(cph_idmap_reserve(&m, 10), CPH_OK);
  assert_int_equal(m.cap, cap);
  cph_idmap_free(&m);
  free(ks.k);
}

/* Strings and pointer lists mixed in one arena, across chunk boundaries and in chunks of their
 * own: every list is aligned for pointers and NULL, every string keeps its bytes, nothing
 * overlaps (each is filled, then all are checked). */
static void test_arena_lists_are_aligned_zeroed_and_apart_from_strings(void **state) {
  (void)state;
  struct cph_arena_chunk *a = NULL;
  enum { N = 3000 };
  char *strs[N];
  void **lists[N];
  size_t lens[N], ns[N];
  uint64_t r = 88172645463325252ull;
  for (int i = 0; i < N; i++) {
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    lens[i] = (size_t)(r % 41);
    ns[i] = 1 + (size_t)(r >> 20) % (i % 97 == 0 ? 5000 : 9); /* some bigger than a chunk */
    char text[41];
    memset(text, 'a' + i % 26, lens[i]);
    strs[i] = cph_arena_strndup(&a, text, lens[i]);
    lists[i] = cph_arena_ptrs(&a, ns[i]);
    assert_non_null(strs[i]);
    assert_non_null(lists[i]);
    assert_int_equal((uintptr_t)lists[i] % sizeof(void *), 0);
    for (size_t j = 0; j < ns[i]; j++) {
      assert_null(lists[i][j]);
      lists[i][j] = &lists[i][j];
    }
  }
  for (int i = 0; i < N; i++) {
    assert_int_equal(strlen(strs[i]), lens[i]);
    for (size_t j = 0; j < lens[i]; j++)
      assert_int_equal(strs[i][j], 'a' + i % 26);
    for (size_t j = 0; j < ns[i]; j++)
      assert_ptr_equal(lists[i][j], &lists[i][j]);
  }
  cph_arena_free(&a);
  assert_null(a);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_slab_objects_are_zeroed_distinct_and_reused_after_free),
      cmocka_unit_test(test_arena_lists_are_aligned_zeroed_and_apart_from_strings),
      cmocka_unit_test(test_strslab_copies_every_length_and_takes_them_back),
      cmocka_unit_test(test_idmap_matches_a_reference_under_random_puts_and_deletes),
      cmocka_unit_test(test_idmap_reserved_never_rehashes_and_a_new_handle_replaces),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
