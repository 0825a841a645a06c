/* The accounting rule of DESIGN §5, cluster-wide, as the cluster tests check it (on the bench
 * of cluster_fixture.h). A world is CPH_TCW_SESSIONS interactive sessions s00..s23 (each
 * subscribed to channel c<i % CPH_TCW_CHANNELS>), created on their owners, and a list of
 * events posted through random nodes: to a channel (its subscribers), to a named session (with
 * or without a channel), or to a channel with two mentions. Every body is distinct, so nothing
 * folds and each delivery is its own staged entry. Leasing and completing on the nodes counts
 * what each session was handed; the check is: every event the log acknowledged reached each
 * session it is routed to exactly once, and no session got one it was not routed to. */
#ifndef CEPHALON_TESTS_CLUSTER_WORLD_H
#define CEPHALON_TESTS_CLUSTER_WORLD_H

#include <stdbool.h>
#include <stdint.h>

#include "cluster_fixture.h"

#define CPH_TCW_SESSIONS 24 /* at most 32: targets is a bit set */
#define CPH_TCW_CHANNELS 6
#define CPH_TCW_BATCH 40 /* events per POST /v1/events */

typedef struct cph_tcw_event {
  char *json; /* as posted */
  bool keyed;
  uint32_t targets; /* bit per session */
  bool acked;
  int64_t pos;
  uint8_t seen[CPH_TCW_SESSIONS]; /* turns completed (answered 200) that carried it */
} cph_tcw_event;

typedef struct cph_tcw {
  cph_test_cluster *c;
  cph_tcw_event *evs;
  int n_evs;
  int owner[CPH_TCW_SESSIONS]; /* the node that created each session */
  unsigned seed, seed0;        /* seed0: as given (seed_env reruns it) */
  int turns, staged;
} cph_tcw;

/* A world of n_evs events (none posted yet) on c; the seed is $seed_env or the time. */
cph_tcw *cph_tcw_new(cph_test_cluster *c, int n_evs, const char *seed_env);
/* Starts nodes 0..nodes-1 of c (its etcd, NATS and ports set up) with `extra` in their
 * policies, waits until every shard is owned and bound (fails the test after 30 s), and
 * returns cph_tcw_new's world with its sessions created; prints the seed and the time taken
 * since t0_ms. */
cph_tcw *cph_tcw_up(cph_test_cluster *c, int nodes, int shards, int ttl_s, const char *extra,
                    int n_evs, const char *seed_env, int64_t t0_ms);
/* Frees a world of cph_tcw_up and stops its cluster (everything, its temp dir included);
 * NULL: nothing. */
void cph_tcw_down(cph_tcw *w);
void cph_tcw_free(cph_tcw *w);

/* A random node that is up. */
int cph_tcw_live_node(cph_tcw *w);
/* Creates every session on its owner (following the 421s), waits until every node's session
 * table knows them all, and asserts that each node got some. */
void cph_tcw_create_sessions(cph_tcw *w);
/* Every node knows `count` sessions (the session table reached them all), within 10 s. */
void cph_tcw_wait_sessions_known(cph_tcw *w, int count);
/* The index of a session id "sNN", or -1. */
int cph_tcw_session_index(const char *id);

/* Leases and completes on node (-1: every live node in turn) until it answers 204, at most
 * max_turns turns per node (-1: no limit but a bound of 200); counts what each completed turn
 * carried into seen. Every completion must answer 200. Returns the turns completed. */
int cph_tcw_work(cph_tcw *w, int node, int max_turns);

/* Posts events [from, to) in batches of CPH_TCW_BATCH through random nodes; run names their
 * keys. all_keyed: every event has a key and a batch answered 503 is posted again (same keys)
 * for up to 30 s; otherwise every other event has one and every 7th batch's keyed events are
 * posted again elsewhere and must answer duplicate with the same pos. work_every > 0: every
 * work_every-th batch, cph_tcw_work on every node. kill_at >= 0: before the batch holding
 * that event, NATS server 0 (kill_node < 0) or node kill_node is killed -9. */
void cph_tcw_post_events(cph_tcw *w, int from, int to, const char *run, bool all_keyed,
                         int work_every, int kill_at, int kill_node);

/* Waits until each session holds, pending or staged on the node that serves it, every
 * acknowledged event of [from, to) routed to it less what completed turns consumed: the log's
 * messages were all applied (and forwarded). Fails after 30 s. No turn is worked meanwhile. */
void cph_tcw_wait_applied(cph_tcw *w, int from, int to);

/* Works until every acknowledged event of [from, to) reached its targets (60 s at most; what
 * is still missing at 30 s is reported with each node's log state, and what came later), then
 * checks the rule, failing the test with the first offence: exactly once where routed, never
 * elsewhere. lossy: sessions (a bit each) for which "at most once" is enough. Prints a line of
 * figures (posting_started: when posting began, for the figures). */
void cph_tcw_settle_and_check(cph_tcw *w, int from, int to, int64_t posting_started,
                              uint32_t lossy);

#endif
