/* The cluster's session table (server/clustertable.h): what forwarding and adoption read. A
 * session's channels and shard, a channel's subscribers (each once) and its members (each once,
 * not the subscribed), the sessions of a shard, and the records of the key-value bucket as the
 * watch delivers them — puts that replace, deletes, malformed records. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "server/cluster.h"
#include "server/clustertable.h"

#define SHARDS 16

static bool has(const char *const *ids, size_t n, const char *id) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(ids[i], id) == 0)
      return true;
  return false;
}

static size_t in_shard(const cph_ctable *t, uint32_t shard, const char *id) {
  size_t found = 0;
  for (const cph_ctable_session *r = cph_ctable_shard_first(t, shard); r; r = r->shard_next)
    found += strcmp(r->id, id) == 0;
  return found;
}

static void
test_cluster_table_a_put_replaces_the_sessions_channels_and_keeps_each_once(void **state) {
  (void)state;
  cph_ctable *t = cph_ctable_new(SHARDS);
  assert_non_null(t);
  const char *a[] = {"general", "ops", "general"};
  assert_true(cph_ctable_put(t, "alice", a, 3, NULL));
  const char *b[] = {"general"};
  assert_true(cph_ctable_put(t, "bob", b, 1, NULL));
  const char *const *ids = NULL;
  assert_int_equal(cph_ctable_subscribers(t, "general", &ids), 2);
  assert_true(has(ids, 2, "alice") && has(ids, 2, "bob"));
  assert_int_equal(cph_ctable_subscribers(t, "ops", &ids), 1);
  assert_int_equal(cph_ctable_get(t, "alice")->n_subs, 2);
  uint32_t shard = cph_cluster_shard_of("alice", SHARDS);
  assert_int_equal(cph_ctable_get(t, "alice")->shard, shard);
  assert_int_equal(in_shard(t, shard, "alice"), 1);

  /* alice now listens to ops only: general keeps bob, nothing else moves */
  const char *a2[] = {"ops"};
  json_t *def = json_pack("{ss}", "class", "operational");
  assert_true(cph_ctable_put(t, "alice", a2, 1, def));
  json_decref(def);
  assert_int_equal(cph_ctable_subscribers(t, "general", &ids), 1);
  assert_string_equal(ids[0], "bob");
  assert_int_equal(in_shard(t, shard, "alice"), 1);
  assert_string_equal(json_string_value(json_object_get(cph_ctable_get(t, "alice")->def, "class")),
                      "operational");
  assert_int_equal(cph_ctable_count(t), 2);

  cph_ctable_remove(t, "bob");
  assert_int_equal(cph_ctable_subscribers(t, "general", &ids), 0);
  assert_null(cph_ctable_get(t, "bob"));
  assert_int_equal(in_shard(t, cph_cluster_shard_of("bob", SHARDS), "bob"), 0);
  cph_ctable_remove(t, "nobody"); /* unknown: nothing happens */
  assert_int_equal(cph_ctable_count(t), 1);
  cph_ctable_free(t);
}

static void test_cluster_table_bucket_records_put_delete_and_malformed(void **state) {
  (void)state;
  cph_ctable *t = cph_ctable_new(SHARDS);
  const char rec[] = "{\"subscribe\":[\"c1\",\"c2\"],\"def\":{\"class\":\"interactive\","
                     "\"subscribe\":[\"c1\",\"c2\"]}}";
  assert_true(cph_ctable_record(t, "s1", rec, strlen(rec)));
  const char *const *ids = NULL;
  assert_int_equal(cph_ctable_subscribers(t, "c2", &ids), 1);
  assert_non_null(cph_ctable_get(t, "s1")->def);
  /* a malformed record leaves the session unknown rather than half known */
  assert_false(cph_ctable_record(t, "s1", "{not json", 9));
  assert_null(cph_ctable_get(t, "s1"));
  assert_int_equal(cph_ctable_subscribers(t, "c1", &ids), 0);
  assert_true(cph_ctable_record(t, "s1", rec, strlen(rec)));
  assert_true(cph_ctable_record(t, "s1", NULL, 0)); /* deleted */
  assert_null(cph_ctable_get(t, "s1"));
  assert_int_equal(cph_ctable_count(t), 0);
  cph_ctable_free(t);
}

/* Many sessions over few shards: every session is in exactly its shard's list, through puts,
 * replacements and removals in any order. */
static void test_cluster_table_shard_lists_hold_each_session_once(void **state) {
  (void)state;
  cph_ctable *t = cph_ctable_new(SHARDS);
  char id[32];
  const char *subs[] = {"x"};
  for (int round = 0; round < 3; round++)
    for (int i = 0; i < 200; i++) {
      snprintf(id, sizeof id, "s%d", i);
      if ((i + round) % 3 == 0)
        cph_ctable_remove(t, id);
      else
        assert_true(cph_ctable_put(t, id, subs, 1, NULL));
    }
  size_t total = 0;
  for (uint32_t s = 0; s < SHARDS; s++)
    for (const cph_ctable_session *r = cph_ctable_shard_first(t, s); r; r = r->shard_next) {
      assert_int_equal(r->shard, s);
      assert_ptr_equal(cph_ctable_get(t, r->id), r);
      if (r->shard_next)
        assert_ptr_equal(r->shard_next->shard_prev, r);
      total++;
    }
  assert_int_equal(total, cph_ctable_count(t));
  const char *const *ids = NULL;
  assert_int_equal(cph_ctable_subscribers(t, "x", &ids), total);
  cph_ctable_free(t);
}

/* Members come from the definition's "member": a channel's members are the sessions that read
 * it without subscribing (a subscriber listed as a member too is a subscriber only), each
 * once; a put that drops a membership and a remove take the session off. */
static void test_cluster_table_members_of_a_channel(void **state) {
  (void)state;
  cph_ctable *t = cph_ctable_new(SHARDS);
  const char rec[] = "{\"subscribe\":[\"ops\"],\"def\":{\"class\":\"interactive\","
                     "\"member\":[\"general\",\"ops\",\"general\",\"war-room\"]}}";
  assert_true(cph_ctable_record(t, "carol", rec, strlen(rec)));
  json_t *def = json_pack("{s[s]}", "member", "general");
  assert_true(cph_ctable_put(t, "dave", NULL, 0, def));
  json_decref(def);
  const char *const *ids = NULL;
  assert_int_equal(cph_ctable_members(t, "general", &ids), 2);
  assert_true(has(ids, 2, "carol") && has(ids, 2, "dave"));
  assert_int_equal(cph_ctable_members(t, "ops", &ids), 0); /* carol subscribes to it */
  assert_int_equal(cph_ctable_subscribers(t, "ops", &ids), 1);
  assert_int_equal(cph_ctable_members(t, "war-room", &ids), 1);
  assert_int_equal(cph_ctable_get(t, "carol")->n_members, 2);

  /* carol leaves general and the war room: only dave reads general as a member */
  const char rec2[] = "{\"subscribe\":[\"ops\"],\"def\":{\"class\":\"interactive\"}}";
  assert_true(cph_ctable_record(t, "carol", rec2, strlen(rec2)));
  assert_int_equal(cph_ctable_members(t, "general", &ids), 1);
  assert_string_equal(ids[0], "dave");
  assert_int_equal(cph_ctable_members(t, "war-room", &ids), 0);
  cph_ctable_remove(t, "dave");
  assert_int_equal(cph_ctable_members(t, "general", &ids), 0);
  assert_int_equal(cph_ctable_subscribers(t, "ops", &ids), 1);
  cph_ctable_free(t);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cluster_table_a_put_replaces_the_sessions_channels_and_keeps_each_once),
      cmocka_unit_test(test_cluster_table_bucket_records_put_delete_and_malformed),
      cmocka_unit_test(test_cluster_table_shard_lists_hold_each_session_once),
      cmocka_unit_test(test_cluster_table_members_of_a_channel),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
