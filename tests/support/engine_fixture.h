/* An engine for unit tests: a fresh LMDB in a temp dir, a policy from EDN text and a virtual
 * clock (starting at 1000 s), driven through the engine's public API. Every failure fails the
 * running cmocka test with what went wrong. */
#ifndef CEPHALON_TESTS_ENGINE_FIXTURE_H
#define CEPHALON_TESTS_ENGINE_FIXTURE_H

#include <stdbool.h>
#include <stddef.h>

#include "cephalon/cephalon.h"
#include "cephalon/policy.h"
#include "common/clock.h"

typedef struct cph_fixture {
  char *dir;
  char *policy; /* EDN text (a copy), read again by every cph_fixture_open */
  cph_clock clock;
  cph_engine *e; /* NULL while closed */
} cph_fixture;

/* A new fixture with its engine open; `tag` names the temp dir. */
cph_fixture *cph_fixture_new(const char *tag, const char *policy_edn);
/* Opens f->e on f->dir with f->policy (after cph_engine_close, to test a restart). */
void cph_fixture_open(cph_fixture *f);
/* What the run's environment changes in a fixture's policy (applied by cph_fixture_open; a
 * test loading a policy of its own for a reload applies it too): CPH_TEST_SPAN_MS replaces
 * :store :span-ms. The sanitized runs of the slow engine tests set it to 0 (CMakeLists.txt:
 * under AddressSanitizer every pass's LMDB child txn maps its 3 MiB of page lists afresh). */
void cph_fixture_policy_for_run(cph_policy *p);
/* Closes the engine if open, removes the temp dir, frees f. */
void cph_fixture_free(cph_fixture *f);

/* The family of stored event id (cph_engine_get_event; fails the test when it cannot be read). */
uint64_t cph_test_event_family(cph_engine *e, uint64_t id);

/* Submits op, runs one pass, checks op was answered exactly once; returns op->rc. */
int cph_fixture_run(cph_fixture *f, cph_op *op);
/* Submits op and runs passes until it is answered (an operation in steps: a channel
 * memories import), at most 100,000; returns op->rc, the passes it took in *passes (NULL:
 * not wanted). */
int cph_fixture_run_steps(cph_fixture *f, cph_op *op, int *passes);
/* Creates session id in lane, subscribed to subscribe[0..n) (may be NULL with n 0); fails the
 * running test on an error. */
void cph_fixture_create_session(cph_fixture *f, const char *id, cph_lane lane,
                                const char *const *subscribe, size_t n);
/* One ingest request of events[0..n) into *op; fails the running test on an error. The caller
 * reads op->u.ingest.results, then calls cph_op_clear_results(op). */
void cph_fixture_ingest(cph_fixture *f, cph_event_in *events, size_t n, cph_op *op);
/* The same, with each event's status and id into st[0..n) and ids[0..n) (the op cleared). */
void cph_fixture_ingest_results(cph_fixture *f, cph_event_in *events, size_t n,
                                cph_ingest_status *st, uint64_t *ids);
/* A lease for worker into *op, waiting up to 5 s of the fixture's clock; fails the running test
 * unless a turn was leased. The caller calls cph_op_clear_results(op). */
void cph_fixture_lease(cph_fixture *f, const char *worker, cph_op *op);
/* A memory search of session's scopes for query, at most k hits, into *op (asserted CPH_OK):
 * the caller reads op->u.search.hits and calls cph_op_clear_results. */
void cph_fixture_search(cph_fixture *f, const char *session, const char *query, size_t k,
                        cph_op *op);
/* A memory search of session's scopes for query (k 50) as text, one line per hit: "id kind
 * text\n", in the answer's order, into out[0..cap); fails the running test on an error. */
void cph_fixture_search_lines(cph_fixture *f, const char *session, const char *query, char *out,
                              size_t cap);
/* An op `done` callback that counts calls in *(int *)ctx. */
void cph_fixture_count_done(cph_op *op, void *ctx);

/* Runs cephalond's maintenance turns as its worker threads do (lease internal, execute the
 * job, complete) until three leases in a row find nothing, at most 500; each completion op is
 * handed to on_done (NULL: none) before its results are cleared. Returns how many ran; fails
 * the running test when a completion fails. */
int cph_fixture_run_maintenance(cph_fixture *f, void (*on_done)(cph_op *done, void *ctx),
                                void *ctx);

/* Seals session's context with this trigger into *op (CPH_OP_CONTEXT_SEAL, asserted CPH_OK):
 * the caller reads its results (seal id, state, items) and calls cph_op_clear_results. */
void cph_fixture_seal(cph_fixture *f, const char *session, const char *trigger, cph_op *op);

/* Items gathered from ops' results (server/clusterflow.h 13.): take moves from's items in
 * (their names and data; from is left empty) and fails the running test out of memory. */
typedef struct cph_fixture_items {
  cph_state_item *v;
  size_t n;
} cph_fixture_items;
void cph_fixture_items_take(cph_fixture_items *l, cph_state_items *from);
void cph_fixture_items_free(cph_fixture_items *l);
/* Keeps of l's items what the log's bucket keeps (history 1 per key): the last of each name,
 * in their order. */
void cph_fixture_items_last_per_name(cph_fixture_items *l);

/* Opens the store in dir (its engine closed) for a test to read or write directly; fails the
 * running test when it will not open. cph_store_close it. */
struct cph_store *cph_fixture_store_open(const char *dir);
/* Copies from's LMDB data file over to's, both engines closed (to's directory is then a copy
 * of from's, for a test to rewrite in an older layout). */
void cph_fixture_copy_store(const cph_fixture *from, const cph_fixture *to);
/* Checks that a plain store open refuses dir, which holds schema `version` (only the engine
 * migrates), naming that version; fails the running test otherwise. */
void cph_fixture_expect_schema(const char *dir, int version);

/* f's live raw memories of scope ("#channel" or a session): how many, and the most memories
 * that have one text (*most). Closes f's engine for the read and opens it again. */
size_t cph_fixture_scope_raw_memories(cph_fixture *f, const char *scope, int *most);

/* Opens the store in dir (the engine closed) and calls fn for every entry of db, in key order;
 * returns how many calls answered true. Fails the running test when the store will not open. */
size_t cph_fixture_store_each(const char *dir, int db,
                              bool (*fn)(void *ctx, const void *key, size_t key_len,
                                         const void *val, size_t val_len),
                              void *ctx);

#endif
