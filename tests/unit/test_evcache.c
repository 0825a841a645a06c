/* core/evcache.c: what is put is got back until evicted, dropped or cleared; ids sharing a
 * slot evict each other; nothing is allocated before the first put. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/evcache.h"

static void test_put_get_drop_clear_and_eviction(void **state) {
  (void)state;
  cph_evcache c;
  cph_evcache_init(&c, 6); /* rounded up to 8 slots */
  assert_int_equal(c.n_slots, 8);
  assert_null(cph_evcache_get(&c, 1));
  assert_null(c.slots); /* idle: nothing allocated */

  cph_evcache_put(&c, 1, 100, "ann", "hello");
  cph_evcache_put(&c, 2, 200, "bob", NULL); /* a redacted payload is cached as such */
  const cph_evcache_entry *e = cph_evcache_get(&c, 1);
  assert_non_null(e);
  assert_int_equal(e->ts_ms, 100);
  assert_string_equal(e->sender, "ann");
  assert_string_equal(e->body, "hello");
  e = cph_evcache_get(&c, 2);
  assert_non_null(e);
  assert_null(e->body);

  cph_evcache_put(&c, 9, 900, "cy", "evicts 1"); /* 9 & 7 == 1 */
  assert_null(cph_evcache_get(&c, 1));
  assert_string_equal(cph_evcache_get(&c, 9)->body, "evicts 1");

  cph_evcache_drop(&c, 1); /* not there: nothing happens to 9 */
  assert_non_null(cph_evcache_get(&c, 9));
  cph_evcache_drop(&c, 9);
  assert_null(cph_evcache_get(&c, 9));

  cph_evcache_clear(&c);
  assert_null(cph_evcache_get(&c, 2));
  cph_evcache_put(&c, 3, 300, "dee", "after a clear");
  assert_string_equal(cph_evcache_get(&c, 3)->body, "after a clear");
  cph_evcache_free(&c);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_put_get_drop_clear_and_eviction),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
