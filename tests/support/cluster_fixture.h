/* Cluster mode's test bench (DESIGN §14): a real etcd (Debian etcd-server), a real NATS
 * JetStream cluster (Debian nats-server, one to three servers routed to each other) and real
 * cephalond nodes with :cluster, all on 127.0.0.1 and free ports, in one temp dir. Every
 * process it starts is killed at exit if a test aborts. A missing etcd or nats-server fails
 * the test and says what to install. */
#ifndef CEPHALON_TESTS_CLUSTER_FIXTURE_H
#define CEPHALON_TESTS_CLUSTER_FIXTURE_H

#include <jansson.h>
#include <stdbool.h>
#include <sys/types.h>

#include "daemon.h"

#define CPH_TC_MAX_NODES 5
#define CPH_TC_MAX_NATS 3

typedef struct cph_test_cluster {
  char *dir;
  pid_t etcd;
  int etcd_port;
  int n_nats;
  pid_t nats[CPH_TC_MAX_NATS]; /* 0 once killed */
  int nats_port[CPH_TC_MAX_NATS], nats_cport[CPH_TC_MAX_NATS];
  int n_nodes;
  cph_test_daemon d[CPH_TC_MAX_NODES];
  int port[CPH_TC_MAX_NODES];
  bool up[CPH_TC_MAX_NODES];
  char url[CPH_TC_MAX_NODES][64];
  const char *cluster_extra; /* more members of each node's :cluster map (NULL: none) */
} cph_test_cluster;

/* A free TCP port on 127.0.0.1. */
int cph_tc_free_port(void);
/* Fails the test unless `command` is on PATH, with `install` as the advice. */
void cph_tc_require(const char *command, const char *install);
void cph_tc_sleep_ms(int ms);

/* A fresh bench in a temp dir (nothing started). */
cph_test_cluster *cph_tc_new(void);
/* Starts etcd and waits until it is healthy. */
void cph_tc_start_etcd(cph_test_cluster *c);
/* Starts n (1..3) nats-server with JetStream, routed into one cluster, and waits until each
 * accepts connections. */
void cph_tc_start_nats(cph_test_cluster *c, int n);
/* SIGKILLs NATS server i and reaps it. */
void cph_tc_kill_nats(cph_test_cluster *c, int i);
/* Picks the ports of n nodes (call once, before starting any). */
void cph_tc_ports(cph_test_cluster *c, int n);
/* Starts node i ("n<i>") with :shards, :lease-ttl-seconds and, when the bench has NATS
 * servers, :nats listing all of them and :replicas = their count; `extra` is more policy
 * text inside the top map (may be ""). */
void cph_tc_start_node(cph_test_cluster *c, int i, int shards, int ttl_s, const char *extra);
/* Kills node i (-9) and reaps it. keep: its data dir stays, returned (malloc'd) for
 * cph_tc_start_node_on; else NULL (the dir is removed). */
char *cph_tc_kill_node(cph_test_cluster *c, int i, bool keep);
/* Stops node i with SIGTERM, waits for it to exit (30 s at most, then -9) and removes its data
 * dir: its exit status (128 + the signal when a signal ended it, -1 when it had to be
 * killed). */
int cph_tc_stop_node(cph_test_cluster *c, int i);
/* Starts node i (as cph_tc_start_node) on the data dir cph_tc_kill_node kept, and takes it:
 * it is removed when the node stops. */
void cph_tc_start_node_on(cph_test_cluster *c, int i, int shards, int ttl_s, const char *extra,
                          char *data_dir);
/* Kills node i (-9) and starts it again at once on the same data dir, port and policy
 * (arguments as cph_tc_start_node's). */
void cph_tc_kill_restart_node(cph_test_cluster *c, int i, int shards, int ttl_s,
                              const char *extra);
/* GET /v1/cluster on node i (JSON, new reference) or NULL. */
json_t *cph_tc_view(cph_test_cluster *c, int i);
/* The shard of a session or channel id, as DESIGN §14 says: the first 8 bytes of its SHA-256,
 * big-endian, mod the shard count. */
int cph_tc_shard_of(const char *id, int shards);
/* log.<group>.<name> of node i's GET /v1/cluster (e.g. "parks", "retries"); the test fails
 * when the node does not answer it with an integer. */
long long cph_tc_log_counter(cph_test_cluster *c, int i, const char *group, const char *name);
/* The node whose URL is url, or -1. */
int cph_tc_node_of_url(const cph_test_cluster *c, const char *url);
/* POST path body on node n, following a 421 to the owner it names (and waiting out a 503),
 * 50 tries at most; returns the node that answered 200 (the test fails otherwise). */
int cph_tc_post_on_owner(cph_test_cluster *c, int n, const char *path, const char *body);
/* GET path likewise: the node that answered 200, its JSON (new reference) into *out. */
int cph_tc_get_on_owner(cph_test_cluster *c, int n, const char *path, json_t **out);
/* GET path of a list likewise (cph_tc_get_on_owner): the JSON (new reference) into *out and
 * its array under `key` (borrowed from it) into *items; more than max items fails the test
 * ("<path> lists N <key> on n<i>, more than it ever had"). Returns the node that answered. */
int cph_tc_list_on_owner(cph_test_cluster *c, int n, const char *path, const char *key,
                         size_t max, json_t **out, json_t **items);
/* The sum over the nodes up of GET /v1/cluster log.rebuild.<name> (asserted present). */
long long cph_tc_rebuild_sum(cph_test_cluster *c, const char *name);
/* The sum over the nodes up but `except` (-1: none) of metric `name`, an unlabelled counter
 * or gauge of GET /metrics. */
long long cph_tc_metric_sum(cph_test_cluster *c, const char *name, int except);
/* The integer in environment variable `name`, or def when it is unset or empty (test sizes). */
int cph_tc_env_int(const char *name, int def);
/* Waits until every node in live[] sees n_live nodes, all shards held, spread even, and —
 * with NATS — its log ready with every owned shard bound. */
bool cph_tc_wait_settled(cph_test_cluster *c, const bool *live, int shards, int timeout_ms);
/* The nodes up now serve and have bound all `shards` shards within 30 s, else the test fails
 * naming `what`. */
void cph_tc_settle(cph_test_cluster *c, int shards, const char *what);
/* Every node up knows `count` sessions (the session table reached it) within 10 s, else the
 * test fails. */
void cph_tc_wait_known(cph_test_cluster *c, int count);
/* Starts etcd, one NATS server and `nodes` nodes (shards, ttl_s, extra as cph_tc_start_node),
 * waits until they serve every shard, creates the n interactive sessions id(i, ctx), the i-th
 * posted through node i % nodes and made by its owner (owner[i]: that node), and waits until
 * every node knows them. */
void cph_tc_up_with_sessions(cph_test_cluster *c, int nodes, int shards, int ttl_s,
                             const char *extra, int n, const char *(*id)(int i, void *ctx),
                             void *ctx, int *owner);
/* A new bench (cph_tc_new) up with sessions t00.. t<n - 1> (cph_tc_up_with_sessions with
 * cph_tc_session_t): the bench of a test's setup. */
cph_test_cluster *cph_tc_up_t(int nodes, int shards, int ttl_s, const char *extra, int n,
                              int *owner);
/* How many of the sessions owner[0..n) node victim owns; the test fails unless some and not
 * all (a kill of victim must move some sessions and leave others). */
int cph_tc_moved(const int *owner, int n, int victim);
/* Sessions named t00, t01, ... (an `id` for cph_tc_up_with_sessions; a static buffer). */
const char *cph_tc_session_t(int s, void *ctx);
/* Posts question `round` ("question <round> for t<s>", key "q<round>-<s>") to each of
 * sessions t00.. t<sessions - 1> in one request through node via (asserted 200). */
void cph_tc_ask(cph_test_cluster *c, int via, int sessions, int round);
/* Leases on node n (worker "w") until each session t<s> of t00..t<sessions - 1> it owns
 * (owner[s] == n) is done: answer(ctx, n, turn, s) gets each turn leased (the lease answer's
 * "turn" object; a session not owned by n, or one done already, fails the test) and completes
 * or fails it, returning true when its session is done for this round. `what` names the round
 * in the failure after 30 s. */
void cph_tc_lease_each(cph_test_cluster *c, int n, const int *owner, int sessions,
                       bool (*answer)(void *ctx, int n, json_t *turn, int s), void *ctx,
                       const char *what);
/* One lease on node n (worker "w", waiting up to 5 s), which must answer 200 with a turn of
 * session: the lease answer (json_decref it; its "turn" object is the turn). `what` names the
 * lease in a failure. */
json_t *cph_tc_lease_of(cph_test_cluster *c, int n, const char *session, const char *what);
/* Completes turn (a lease answer's "turn" object, leased on node n) with reply, for 10
 * tokens; fails the test unless the answer is 200. */
void cph_tc_complete(cph_test_cluster *c, int n, json_t *turn, const char *reply);
/* The same, reporting the turn's cost as tokens and tool_calls. */
/* The completion's answer, whatever it is (cph_test_response_free it). */
cph_test_response cph_tc_complete_try(cph_test_cluster *c, int n, json_t *turn, const char *reply,
                                      int tokens, int tool_calls);
void cph_tc_complete_cost(cph_test_cluster *c, int n, json_t *turn, const char *reply,
                          int tokens, int tool_calls);
/* One round: question `round` posted to t00.. t<sessions - 1> through node round % nodes
 * (cph_tc_ask), then on each of nodes 0..nodes - 1 every session it owns leased and answered
 * (cph_tc_lease_each with answer and ctx; "round <round>" in a failure). */
void cph_tc_ask_and_answer(cph_test_cluster *c, int nodes, int round, const int *owner,
                           int sessions, bool (*answer)(void *ctx, int n, json_t *turn, int s),
                           void *ctx);
/* Node victim, killed -9 with its data kept (dir: cph_tc_kill_node's), comes back on it (its
 * shards move back: settled, then check(ctx, "after the shards moved back")) and is killed -9
 * again (they move away again: settled, then check(ctx, "after the shards moved away
 * again")). Returns how many of the sessions owner[0..sessions) places on victim after the
 * first check (check keeps owner[] up to date); the test fails when none. */
int cph_tc_back_and_away(cph_test_cluster *c, int victim, int shards, int ttl_s,
                         const char *extra, char *dir, const int *owner, int sessions,
                         void (*check)(void *ctx, const char *when), void *ctx);
/* Stops everything and removes the temp dir. */
void cph_tc_free(cph_test_cluster *c);

#endif
