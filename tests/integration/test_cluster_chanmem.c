/* Cluster mode: a channel's memories move whole with its shard (server/clusterflow.h 16.) — a
 * real etcd, one NATS server and two cephalond on 127.0.0.1.
 *
 * A channel whose shard n1 owns, and the one session subscribed to it, on n1 too. 1,200 notes
 * are posted to the channel (requests of 100: a batch message each in the log), after 750 to
 * the session itself (its direct channel: their memories go as one item a message under the
 * session's shard; one request carries both kinds), and the session's turns on n1 consume them
 * all; n1 made a raw memory of each; then one more question, leased on n1 and left. Another
 * session of n1 is told a note and deleted, and a third told 30 notes it has not consumed when
 * n1 dies (their item is left to the rebuild's delivery of them: each found once), then, in one
 * request, one more with a note to a fourth on its shard, which consumes it (that item is
 * imported: mate's note found once, the other's once, 1,953 loaded). n0 holds nothing of the
 * channel. n1 is killed -9: n0 takes both shards over. A session's state carries only the
 * newest raw memories of its scopes (576 at most); the memories items carry all of them. So on
 * n0 the session's memory search finds the oldest note and the oldest direct note, n0 loads all
 * 1,953 memories (log.channel_memories.loaded; not the deleted session's note), and the
 * question, delivered again by the rebuild after the import, finds its memory by its origin:
 * the search finds it once. Without the items (checked by taking their import out) n0 holds
 * only what the state carried and the search does not find the oldest note; without the direct
 * ones' import, the oldest direct note; without the check of the session, n0 loads 1,954;
 * leaving every pending message's item to the delivery, 1,951; importing them all, 1,983.
 *
 * Twice: the session on another of n1's shards than the channel (n0 reads the channel's items
 * for the session's rebuild, and the channel's shard brings them again: held), and on the
 * channel's own shard. There the rebuild stores the channel's items — 1,201 memories: two
 * steps of CPH_CHANNEL_IMPORT_STEP — and must wait for the last step before the session's
 * state and events: checked by taking the wait out, when they came between the steps and n0
 * loaded 1,200 of the 1,201. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/support/api.h"
#include "tests/support/cluster_fixture.h"
#include "tests/support/testutil.h"

#define NODES 2
#define SHARDS 16
#define TTL_S 2
#define NOTES 1200
/* notes to the session itself, before the others (its direct channel): more than its state
 * carries of them (the newest 576 at most) */
#define DIRECT 750 /* the eighth request carries 50 of them and 50 channel notes */
#define PER_POST 100
#define PENDING 30 /* to the session alone, not consumed when n1 dies */
#define OTHER_LAST "pending last: errand elast beside the mate's note"

/* the maintenance lane's budget too: n0's janitor embeds the 1,200 memories it takes over */
static const char EXTRA[] = ":scheduler {:lanes {:interactive {:turns 1000000} "
                            ":maintenance {:turns 1000000 :tool-calls 1000000}}}";

/* The first of ids "<prefix>0".."<prefix>15" whose shard node n owns, found by creating a
 * session of that id (a channel's shard is its id's, as a session's is), into out. */
static void id_of_class_owned_by(cph_test_cluster *c, int n, const char *prefix,
                                 const char *class, char *out, size_t cap, int *created) {
  for (int i = 0; i < 16; i++) {
    snprintf(out, cap, "%s%d", prefix, i);
    char body[128];
    snprintf(body, sizeof body, "{\"id\":\"%s\",\"class\":\"%s\"}", out, class);
    int owner = cph_tc_post_on_owner(c, 0, "/v1/sessions", body);
    (*created)++;
    if (owner == n)
      return;
  }
  fail_msg("none of %s0..%s15 is on n%d's shards", prefix, prefix, n);
}

static void id_owned_by(cph_test_cluster *c, int n, const char *prefix, char *out, size_t cap,
                        int *created) {
  id_of_class_owned_by(c, n, prefix, "interactive", out, cap, created);
}

/* The texts the session's memory search on node n finds for query (a JSON array, owned). */
static json_t *search(cph_test_cluster *c, int n, const char *session, const char *query) {
  char path[160];
  snprintf(path, sizeof path, "/v1/memories/search?session=%s&q=%s&k=100", session, query);
  cph_test_response r = cph_test_api(c->port[n], "GET", path, NULL, NULL);
  if (r.status != 200)
    fail_msg("searching '%s' on n%d: %d %s", query, n, r.status, r.body ? r.body : "");
  json_t *j = cph_test_json(&r);
  cph_test_response_free(&r);
  json_t *texts = json_array();
  json_t *hits = json_object_get(j, "memories");
  for (size_t i = 0; i < json_array_size(hits); i++)
    json_array_append(texts, json_object_get(json_array_get(hits, i), "text"));
  json_decref(j);
  return texts;
}

static int count_text(json_t *texts, const char *text) {
  int count = 0;
  for (size_t i = 0; i < json_array_size(texts); i++)
    count += strcmp(json_string_value(json_array_get(texts, i)), text) == 0;
  return count;
}

/* How many times session's memory search on n0 for query finds text, once it finds it or
 * after 20 s (an old memory is found by its vector, once n0's janitor embedded it). */
static int found_on_n0(cph_test_cluster *c, const char *session, const char *query,
                       const char *text) {
  int found = 0;
  for (int waited = 0; waited <= 20000; waited += 250) {
    json_t *hits = search(c, 0, session, query);
    found = count_text(hits, text);
    json_decref(hits);
    if (found)
      break;
    cph_tc_sleep_ms(250);
  }
  return found;
}

/* The texts of the raw memories of turn's memory section (sections.recent_memory), in order,
 * as one string, but the memory of the turn's own question. (That one the old owner lists: it
 * applied the question twice, as the channel's `in` event and as the session's forward, and the
 * turn skips only the memory of the event it shows; the new owner applies the forward alone.
 * Its aggregates differ likewise.) */
static char *memory_section(json_t *turn) {
  json_t *mem = json_object_get(json_object_get(turn, "sections"), "recent_memory");
  size_t cap = 1, at = 0;
  for (size_t i = 0; i < json_array_size(mem); i++)
    cap += strlen(json_string_value(json_object_get(json_array_get(mem, i), "text"))) + 1;
  char *out = malloc(cap);
  assert_non_null(out);
  out[0] = '\0';
  for (size_t i = 0; i < json_array_size(mem); i++) {
    json_t *m = json_array_get(mem, i);
    const char *kind = json_string_value(json_object_get(m, "kind"));
    const char *text = json_string_value(json_object_get(m, "text"));
    if (kind && strcmp(kind, "raw") == 0 && strcmp(text, "what ships next?") != 0)
      at += (size_t)snprintf(out + at, cap - at, "%s\n",
                             json_string_value(json_object_get(m, "text")));
  }
  return out;
}

static void direct_note(int i, char *out, size_t cap) {
  snprintf(out, cap, "direct %03d: reminder r%03d for the reader", i, i);
}

static void pending_note(int i, char *out, size_t cap) {
  snprintf(out, cap, "pending %02d: errand e%02d before the takeover", i, i);
}

static void note(int i, char *out, size_t cap) {
  snprintf(out, cap, "note %03d: project q%03d ships on day %d", i, i, i + 1);
}

/* A session id on chan's shard ("<prefix><j>"), created on n0 (the owner answers), into out. */
static void id_on_shard_of(cph_test_cluster *c, const char *chan, const char *prefix, char *out,
                           size_t cap, int *created) {
  for (int j = 0; j < 1000; j++) {
    snprintf(out, cap, "%s%d", prefix, j);
    if (cph_tc_shard_of(out, SHARDS) != cph_tc_shard_of(chan, SHARDS))
      continue;
    char body[96];
    snprintf(body, sizeof body, "{\"id\":\"%s\",\"class\":\"interactive\"}", out);
    cph_tc_post_on_owner(c, 0, "/v1/sessions", body);
    (*created)++;
    return;
  }
  fail_msg("no %s0..%s999 on the shard of %s", prefix, prefix, chan);
}

static void channels_memories_move_whole(bool on_the_channels_shard) {
  cph_test_cluster *c = cph_tc_new();
  cph_tc_start_etcd(c);
  cph_tc_start_nats(c, 1);
  cph_tc_ports(c, NODES);
  for (int n = 0; n < NODES; n++)
    cph_tc_start_node(c, n, SHARDS, TTL_S, EXTRA);
  cph_tc_settle(c, SHARDS, "start");
  char chan[32], session[32];
  int created = 0;
  id_owned_by(c, 1, "room", chan, sizeof chan, &created);
  if (on_the_channels_shard)
    id_on_shard_of(c, chan, "reader", session, sizeof session, &created);
  else
    for (int tries = 0; tries < 16; tries++) { /* a reader on another of n1's shards */
      char prefix[16];
      snprintf(prefix, sizeof prefix, "reader%c", 'a' + tries);
      id_owned_by(c, 1, prefix, session, sizeof session, &created);
      if (cph_tc_shard_of(session, SHARDS) != cph_tc_shard_of(chan, SHARDS))
        break;
    }
  assert_int_equal(cph_tc_shard_of(session, SHARDS) == cph_tc_shard_of(chan, SHARDS),
                   on_the_channels_shard);
  /* and one told a note of its own and deleted before the kill: its memory is in the log's
   * items, and n0 does not bring it back */
  char gone[32];
  id_owned_by(c, 1, "gone", gone, sizeof gone, &created);
  /* and one told PENDING notes of its own that it has not consumed when n1 dies (in the
   * operational lane: the leases below are of the interactive one) */
  char other[32];
  id_of_class_owned_by(c, 1, "other", "operational", other, sizeof other, &created);
  /* and one on its shard that consumes its note of a request that also tells `other` one */
  char mate[32];
  id_on_shard_of(c, other, "mate", mate, sizeof mate, &created);
  char path[96], body[320];
  snprintf(path, sizeof path, "/v1/sessions/%s", session);
  snprintf(body, sizeof body, "{\"subscribe\":[\"%s\"]}", chan);
  cph_test_response r = cph_test_api(c->port[1], "PUT", path, NULL, body);
  if (r.status != 200)
    fail_msg("subscribing %s to %s on n1: %d %s", session, chan, r.status, r.body ? r.body : "");
  cph_test_response_free(&r);
  cph_tc_wait_known(c, created);
  cph_tc_sleep_ms(500); /* the subscription, through the session table */

  for (int p = 0; p * PER_POST < NOTES + DIRECT; p++) {
    json_t *events = json_array();
    for (int i = p * PER_POST; i < (p + 1) * PER_POST && i < NOTES + DIRECT; i++) {
      char text[96];
      if (i >= DIRECT) {
        note(i - DIRECT, text, sizeof text);
        json_array_append_new(events, json_pack("{ssssss}", "channel", chan, "sender", "ann",
                                                "body", text));
      } else {
        direct_note(i, text, sizeof text);
        json_array_append_new(events, json_pack("{ssssss}", "session", session, "sender", "ann",
                                                "body", text));
      }
    }
    json_t *req = json_pack("{so}", "events", events);
    char *dump = json_dumps(req, JSON_COMPACT);
    r = cph_test_api(c->port[p % NODES], "POST", "/v1/events", NULL, dump);
    if (r.status != 200)
      fail_msg("posting notes through n%d: %d %s", p % NODES, r.status, r.body ? r.body : "");
    cph_test_response_free(&r);
    free(dump);
    json_decref(req);
  }
  /* the session's turns on n1 consume every note */
  int consumed = 0, turns = 0;
  for (; consumed < NOTES + DIRECT && turns < 600; turns++) {
    json_t *lease = cph_tc_lease_of(c, 1, session, "a lease of the notes");
    json_t *turn = json_object_get(lease, "turn");
    json_t *staged = json_object_get(turn, "staged");
    for (size_t i = 0; i < json_array_size(staged); i++) {
      json_t *count = json_object_get(json_array_get(staged, i), "count");
      consumed += json_is_integer(count) ? (int)json_integer_value(count) : 1;
    }
    cph_tc_complete(c, 1, turn, "noted");
    json_decref(lease);
  }
  if (consumed != NOTES + DIRECT)
    fail_msg("n1's turns consumed %d notes in %d turns, want %d", consumed, turns,
             NOTES + DIRECT);
  snprintf(body, sizeof body, "{\"events\":[{\"session\":\"%s\",\"sender\":\"ann\","
           "\"body\":\"a note for the reader to be deleted\"}]}", gone);
  r = cph_test_api(c->port[0], "POST", "/v1/events", NULL, body);
  if (r.status != 200)
    fail_msg("posting to %s: %d %s", gone, r.status, r.body ? r.body : "");
  cph_test_response_free(&r);
  /* n1's memories items are in the log (they are not waited for) */
  for (int waited = 0; cph_tc_log_counter(c, 1, "channel_memories", "items_put") <
                           (NOTES + DIRECT) / PER_POST + 1 ||
                       cph_tc_log_counter(c, 1, "items", "pending") > 0;
       waited += 100) {
    if (waited > 10000)
      fail_msg("n1 made %lld memories items in 10 s, want %d (one a post)",
               cph_tc_log_counter(c, 1, "channel_memories", "items_put"),
               (NOTES + DIRECT) / PER_POST + 1);
    cph_tc_sleep_ms(100);
  }
  snprintf(path, sizeof path, "/v1/sessions/%s", gone);
  r = cph_test_api(c->port[1], "DELETE", path, NULL, NULL);
  if (r.status != 200)
    fail_msg("deleting %s on n1: %d %s", gone, r.status, r.body ? r.body : "");
  cph_test_response_free(&r);
  for (int waited = 0;; waited += 50) { /* n0 knows of the deletion (the session table) */
    json_t *v = cph_tc_view(c, 0);
    json_int_t known =
        json_integer_value(json_object_get(json_object_get(v, "log"), "sessions_known"));
    json_decref(v);
    if (known == created - 1)
      break;
    if (waited > 10000)
      fail_msg("n0 knows %lld sessions 10 s after %s was deleted, want %d", (long long)known,
               gone, created - 1);
    cph_tc_sleep_ms(50);
  }
  /* and the shards' watermarks passed the consumed notes (put about once a second, 7.), so
   * n0's rebuild applies none of them again: what n0 holds of the channel then comes from the
   * session's state and the memories items alone, as after the log was trimmed. Waited for,
   * not guessed: n1 holds no event pending, and then its watermark puts stop coming (none for
   * two of its ticks) — a fixed 2.5 s was all this waited before, which a loaded machine can
   * outrun; at least 2.5 s still */
  for (int waited = 0; cph_tc_log_counter(c, 1, "rebuild", "pending") > 0; waited += 100) {
    if (waited > 10000)
      fail_msg("n1 still holds %lld events pending 10 s after the notes were consumed",
               cph_tc_log_counter(c, 1, "rebuild", "pending"));
    cph_tc_sleep_ms(100);
  }
  long long puts = cph_tc_log_counter(c, 1, "rebuild", "watermarks_put");
  for (int waited = 0, still = 0; waited < 2500 || still < 2500; waited += 250) {
    if (waited > 15000)
      fail_msg("n1 kept putting watermarks for 15 s (%lld)", puts);
    cph_tc_sleep_ms(250);
    long long now = cph_tc_log_counter(c, 1, "rebuild", "watermarks_put");
    still = now == puts ? still + 250 : 0;
    puts = now;
  }
  /* one more question, leased on n1 and not answered: its memory section */
  char ask[160];
  snprintf(ask, sizeof ask, "{\"events\":[{\"channel\":\"%s\",\"sender\":\"bo\",\"body\":"
           "\"what ships next?\"}]}", chan);
  r = cph_test_api(c->port[0], "POST", "/v1/events", NULL, ask);
  assert_int_equal(r.status, 200);
  cph_test_response_free(&r);
  json_t *lease = cph_tc_lease_of(c, 1, session, "the last question's lease on n1");
  char *was = memory_section(json_object_get(lease, "turn"));
  json_decref(lease);
  assert_true(strlen(was) > 0); /* the raw memories older than the history it shows */
  /* PENDING notes to `other` alone, in one request, applied on n1 and not consumed: n0's
   * rebuild delivers them again, so it leaves their item to the delivery */
  long long items_before = cph_tc_log_counter(c, 1, "channel_memories", "items_put");
  json_t *events = json_array();
  for (int i = 0; i < PENDING; i++) {
    char text[96];
    pending_note(i, text, sizeof text);
    json_array_append_new(events, json_pack("{ssssss}", "session", other, "sender", "ann",
                                            "body", text));
  }
  json_t *req = json_pack("{so}", "events", events);
  char *dump = json_dumps(req, JSON_COMPACT);
  r = cph_test_api(c->port[0], "POST", "/v1/events", NULL, dump);
  if (r.status != 200)
    fail_msg("posting the pending notes: %d %s", r.status, r.body ? r.body : "");
  cph_test_response_free(&r);
  free(dump);
  json_decref(req);
  /* one request with a note to `mate` and one more to `other`, one message of their shard:
   * mate's turn consumes its note, so n0 imports this item (the delivery of other's note then
   * finds its memory by origin) */
  snprintf(body, sizeof body, "{\"events\":[{\"session\":\"%s\",\"sender\":\"ann\","
           "\"body\":\"mate note: the keys are under the mat\"},{\"session\":\"%s\","
           "\"sender\":\"ann\",\"body\":\"%s\"}]}", mate, other, OTHER_LAST);
  r = cph_test_api(c->port[0], "POST", "/v1/events", NULL, body);
  if (r.status != 200)
    fail_msg("posting to %s and %s: %d %s", mate, other, r.status, r.body ? r.body : "");
  cph_test_response_free(&r);
  for (int waited = 0;
       cph_tc_log_counter(c, 1, "channel_memories", "items_put") < items_before + 2 ||
       cph_tc_log_counter(c, 1, "items", "pending") > 0;
       waited += 100) {
    if (waited > 10000)
      fail_msg("n1 made no items of the pending notes in 10 s");
    cph_tc_sleep_ms(100);
  }
  r = cph_test_api(c->port[1], "POST", "/v1/turns/lease", NULL,
                   "{\"worker\":\"w\",\"wait_ms\":5000,\"lanes\":[\"interactive\"]}");
  json_t *mates = r.status == 200 ? cph_test_json(&r) : NULL;
  cph_test_response_free(&r);
  const char *of = json_string_value(json_object_get(json_object_get(mates, "turn"), "session"));
  if (!of || strcmp(of, mate) != 0)
    fail_msg("the lease of %s's note on n1: a turn of '%s'", mate, of ? of : "(none)");
  cph_tc_complete(c, 1, json_object_get(mates, "turn"), "noted");
  json_decref(mates);

  cph_tc_kill_node(c, 1, false);
  cph_tc_settle(c, SHARDS, "after the kill");
  long long loaded = 0, held = 0;
  json_t *oldest = NULL;
  char first[96];
  note(0, first, sizeof first);
  for (int waited = 0;; waited += 200) {
    loaded = cph_tc_log_counter(c, 0, "channel_memories", "loaded");
    held = cph_tc_log_counter(c, 0, "channel_memories", "held");
    json_decref(oldest);
    oldest = search(c, 0, session, "q000");
    if ((loaded >= NOTES + 1 + DIRECT + 2 && count_text(oldest, first) > 0) || waited > 15000)
      break;
    cph_tc_sleep_ms(200);
  }
  printf("n0 took %lld of the channel's memories from the log and held %lld; a search for the "
         "oldest note finds it %d times\n",
         loaded, held, count_text(oldest, first));
  /* n0 held nothing of the channel: the first import stores every memory of the items — the
   * notes' and the last question's —, before the session's state (whose memories it then
   * holds); the rebuild's delivery of the question, after it, finds the question's memory by
   * its origin and mints none. With the session on another shard, the channel's and the
   * session's rebuilds each import the items: the second holds them all */
  if (loaded != NOTES + 1 + DIRECT + 2)
    fail_msg("n0 loaded %lld memories: want the channel's %d, the direct notes' %d and the two "
             "of the request to %s and %s", loaded, NOTES + 1, DIRECT, mate, other);
  if (cph_tc_log_counter(c, 0, "channel_memories", "direct_items_redelivered") < 1)
    fail_msg("n0 imported the item of the pending notes, which its rebuild delivers again");
  if (held != (on_the_channels_shard ? 0 : NOTES + 1))
    fail_msg("n0 held %lld of the memories, want %d", held, on_the_channels_shard ? 0 : NOTES + 1);
  /* the question's turn on n0 (its lease expired with n1) lists the memories it listed on n1,
   * in that order (then one more): the older ones came before the state's newer ones */
  r = cph_test_api(c->port[0], "POST", "/v1/turns/lease", NULL,
                   "{\"worker\":\"w\",\"wait_ms\":5000,\"lanes\":[\"interactive\"]}");
  if (r.status != 200)
    fail_msg("the last question's lease on n0: %d %s", r.status, r.body ? r.body : "");
  lease = cph_test_json(&r);
  cph_test_response_free(&r);
  const char *leased =
      json_string_value(json_object_get(json_object_get(lease, "turn"), "session"));
  if (!leased || strcmp(leased, session) != 0)
    fail_msg("the last question's lease on n0: a turn of '%s'", leased ? leased : "(none)");
  char *is = memory_section(json_object_get(lease, "turn"));
  json_decref(lease);
  if (strncmp(is, was, strlen(was)) != 0) /* n0 lists one more in the question's room */
    fail_msg("the memory section on n0:\n%.1500s\non n1:\n%.1500s", is, was);
  free(was);
  free(is);
  /* the last question, delivered again by the rebuild (n1's lease of it died with n1), has
   * its memory once: minted by that delivery, not taken from the items too */
  json_t *asked = NULL;
  for (int waited = 0; waited <= 10000; waited += 250) {
    json_decref(asked);
    asked = search(c, 0, session, "ships%20next");
    if (count_text(asked, "what ships next?"))
      break;
    cph_tc_sleep_ms(250);
  }
  if (count_text(asked, "what ships next?") != 1)
    fail_msg("the session's search on n0 finds the question delivered again %d times, want once",
             count_text(asked, "what ships next?"));
  json_decref(asked);
  if (count_text(oldest, first) != 1)
    fail_msg("the session's search on n0 finds the oldest note %d times, want once",
             count_text(oldest, first));
  for (int i = 0; i < NOTES; i += 37) { /* each once, old and new (embedded by n0's janitor) */
    char q[8], text[96];
    snprintf(q, sizeof q, "q%03d", i);
    note(i, text, sizeof text);
    int found = found_on_n0(c, session, q, text);
    if (found != 1) {
      cph_test_response t = cph_test_api(c->port[0], "GET", "/v1/top", NULL, NULL);
      fail_msg("the search for note %d on n0 finds it %d times, want once (GET /v1/top: %.300s)",
               i, found, t.body && strstr(t.body, "\"maintenance\":{") ? strstr(t.body, "\"maintenance\":{") : "");
    }
  }
  if (found_on_n0(c, mate, "mat", "mate note: the keys are under the mat") != 1 ||
      found_on_n0(c, other, "elast", OTHER_LAST) != 1)
    fail_msg("the notes of the request to %s and %s are not found once each on n0", mate, other);
  for (int i = 0; i < PENDING; i += 7) { /* minted by their delivery again, once */
    char q[8], text[96];
    snprintf(q, sizeof q, "e%02d", i);
    pending_note(i, text, sizeof text);
    int found = found_on_n0(c, other, q, text);
    if (found != 1)
      fail_msg("the search of %s for pending note %d on n0 finds it %d times, want once", other,
               i, found);
  }
  for (int i = 0; i < DIRECT; i += 53) { /* each direct note once, the oldest ones too */
    char q[8], text[96];
    snprintf(q, sizeof q, "r%03d", i);
    direct_note(i, text, sizeof text);
    int found = found_on_n0(c, session, q, text);
    if (found != 1)
      fail_msg("the search for direct note %d on n0 finds it %d times, want once", i, found);
  }
  json_decref(oldest);
  cph_tc_free(c);
}

static void test_cluster_chanmem_a_channels_memories_move_whole(void **state) {
  (void)state;
  channels_memories_move_whole(false);
}

static void test_cluster_chanmem_on_the_channels_shard_the_state_waits_for_the_import(
    void **state) {
  (void)state;
  channels_memories_move_whole(true);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_cluster_chanmem_a_channels_memories_move_whole),
      cmocka_unit_test(test_cluster_chanmem_on_the_channels_shard_the_state_waits_for_the_import),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
