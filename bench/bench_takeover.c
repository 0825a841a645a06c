/* cephalon-bench cluster-fill: builds, on a running cluster, one shard holding N sessions and M
 * unconsumed events, for bench/cluster-takeover.sh to time its takeover (issue #20: "takeover
 * time for a shard with 10k sessions and 1M events").
 *
 * The shard is the one of the first probe session ("tk-probe-<k>") that the victim node
 * creates (it owns it); the other sessions are ids "tk-<n>" whose shard (DESIGN §14: the first
 * 8 bytes of SHA-256, big-endian, mod :shards) is that one, created on the victim. The events
 * go through the real path: POST /v1/events with 1,000 events a request, C clients spread over
 * the other nodes (the victim is busy applying them all), each event naming one of the
 * shard's sessions in turn (so it is logged on the shard's subject and applied by the victim
 * to that session alone), with distinct bodies (no folding). Nothing consumes them. It ends
 * when every event was answered `accepted` and the victim applied them all (its log.applied
 * stood still at >= M for a second).
 *
 *   cephalon-bench cluster-fill --nodes P,P,P --victim P [--sessions N] [--events M]
 *                               [--clients C] */
#include <inttypes.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "net.h"

#define FILL_PER_REQUEST 1000

typedef struct fill {
  int ports[16];
  int n_ports;
  int victim;
  uint64_t sessions, events, clients;
  char **ids; /* the shard's sessions */
  uint64_t next_request; /* under mu */
  uint64_t accepted, failed;
  pthread_mutex_t mu;
} fill;

static uint64_t shard_of(const char *id, uint64_t shards) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(id, strlen(id), md, &len, EVP_sha256(), NULL);
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v = v << 8 | md[i];
  return v % shards;
}

/* A number after `"name":` in s, or -1. */
static int64_t json_num(const char *s, const char *name) {
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\":", name);
  const char *p = s ? strstr(s, pat) : NULL;
  if (!p)
    return -1;
  p += strlen(pat);
  while (*p == ' ')
    p++;
  return strtoll(p, NULL, 10);
}

static int create_session(cph_bench_conn *c, const char *id, int *status) {
  char body[256];
  snprintf(body, sizeof body, "{\"id\":\"%s\",\"class\":\"interactive\"}", id);
  cph_bench_resp r;
  if (cph_bench_http(c, "POST", "/v1/sessions", body, strlen(body), &r))
    return -1;
  *status = r.status;
  return 0;
}

static void *fill_client(void *arg) {
  void **a = arg;
  fill *f = a[0];
  int id = (int)(intptr_t)a[1];
  cph_bench_conn c = CPH_BENCH_CONN_INIT;
  uint64_t rng = UINT64_C(0x7A6E0000) + (uint64_t)id;
  size_t cap = FILL_PER_REQUEST * 256 + 64;
  char *req = malloc(cap);
  int others[16], n_others = 0;
  for (int k = 0; k < f->n_ports; k++)
    if (f->ports[k] != f->victim || f->n_ports == 1)
      others[n_others++] = f->ports[k];
  if (!req || cph_bench_conn_open(&c, others[id % n_others])) {
    pthread_mutex_lock(&f->mu);
    f->failed++;
    pthread_mutex_unlock(&f->mu);
    free(req);
    return NULL;
  }
  uint64_t requests = (f->events + FILL_PER_REQUEST - 1) / FILL_PER_REQUEST;
  for (;;) {
    pthread_mutex_lock(&f->mu);
    uint64_t q = f->next_request++;
    pthread_mutex_unlock(&f->mu);
    if (q >= requests)
      break;
    uint64_t first = q * FILL_PER_REQUEST;
    uint64_t n = f->events - first < FILL_PER_REQUEST ? f->events - first : FILL_PER_REQUEST;
    size_t at = (size_t)snprintf(req, cap, "{\"events\":[");
    for (uint64_t i = 0; i < n; i++) {
      uint64_t e = first + i;
      char body[65];
      cph_bench_body(body, 64, e, &rng);
      at += (size_t)snprintf(req + at, cap - at,
                             "%s{\"session\":\"%s\",\"sender\":\"u\",\"body\":\"%s\"}",
                             i ? "," : "", f->ids[e % f->sessions], body);
    }
    at += (size_t)snprintf(req + at, cap - at, "]}");
    cph_bench_resp r;
    int rc = cph_bench_http(&c, "POST", "/v1/events", req, at, &r);
    uint64_t ok = 0;
    if (!rc && r.status == 200)
      for (const char *p = r.body; (p = strstr(p, "\"status\":\"accepted\"")) != NULL; p++)
        ok++;
    pthread_mutex_lock(&f->mu);
    f->accepted += ok;
    if (ok != n) {
      f->failed++;
      fprintf(stderr, "cephalon-bench cluster-fill: POST /v1/events -> %d (%" PRIu64
                      " of %" PRIu64 " accepted) %.200s\n",
              rc ? -1 : r.status, ok, n, rc ? "" : r.body);
    }
    pthread_mutex_unlock(&f->mu);
    if (ok != n)
      break;
  }
  cph_bench_conn_free(&c);
  free(req);
  return NULL;
}

int cph_bench_cluster_fill(int argc, char **argv) {
  fill f = {.sessions = 10000, .events = 1000000, .clients = 8, .victim = 0};
  pthread_mutex_init(&f.mu, NULL);
  uint64_t victim = 0;
  for (int i = 1; i < argc;) {
    if (strcmp(argv[i], "--nodes") == 0 && i + 1 < argc) {
      char *list = argv[i + 1], *end;
      while (*list && f.n_ports < 16) {
        long p = strtol(list, &end, 10);
        if (end == list || p <= 0 || p > 65535)
          break;
        f.ports[f.n_ports++] = (int)p;
        list = *end == ',' ? end + 1 : end;
      }
      i += 2;
      continue;
    }
    int r;
    if ((r = cph_bench_opt_u64(argc, argv, &i, "--victim", 1, 65535, &victim)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--sessions", 1, 1000000, &f.sessions)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--events", 1, 100000000, &f.events)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--clients", 1, 64, &f.clients))) {
      if (r < 0)
        return 2;
      continue;
    }
    fprintf(stderr, "usage: cephalon-bench cluster-fill --nodes P,P,P --victim P [--sessions N] "
                    "[--events M] [--clients C]\n");
    return strcmp(argv[i], "--help") == 0 ? 0 : 2;
  }
  if (!f.n_ports || !victim) {
    fprintf(stderr, "cephalon-bench cluster-fill: --nodes and --victim are required\n");
    return 2;
  }
  f.victim = (int)victim;
  int status = 1;
  cph_bench_conn c = CPH_BENCH_CONN_INIT;
  cph_bench_resp r;
  if (cph_bench_conn_open(&c, f.victim) ||
      cph_bench_http(&c, "GET", "/v1/cluster", NULL, 0, &r) || r.status != 200) {
    fprintf(stderr, "cephalon-bench cluster-fill: GET /v1/cluster on %d failed\n", f.victim);
    goto out;
  }
  int64_t shards = json_num(r.body, "shards");
  if (shards <= 0) {
    fprintf(stderr, "cephalon-bench cluster-fill: no shard count in %.200s\n", r.body);
    goto out;
  }
  /* The shard: that of the first probe session the victim owns (it answers 200, others 421). */
  char probe[64];
  int64_t shard = -1;
  for (int k = 0; k < 1000 && shard < 0; k++) {
    int st = 0;
    snprintf(probe, sizeof probe, "tk-probe-%d", k);
    if (create_session(&c, probe, &st))
      goto out;
    if (st == 200 || st == 409)
      shard = (int64_t)shard_of(probe, (uint64_t)shards);
  }
  if (shard < 0) {
    fprintf(stderr, "cephalon-bench cluster-fill: node %d created no probe session\n", f.victim);
    goto out;
  }
  f.ids = calloc(f.sessions, sizeof *f.ids);
  if (!f.ids)
    goto out;
  f.ids[0] = strdup(probe);
  uint64_t have = 1;
  int64_t t0 = cph_bench_now_ns();
  for (uint64_t n = 0; have < f.sessions && f.ids[have - 1]; n++) {
    char id[64];
    snprintf(id, sizeof id, "tk-%" PRIu64, n);
    if (shard_of(id, (uint64_t)shards) == (uint64_t)shard)
      f.ids[have++] = strdup(id);
  }
  for (uint64_t i = 1; i < have; i++) {
    int st = 0;
    if (!f.ids[i] || create_session(&c, f.ids[i], &st) || (st != 200 && st != 409)) {
      fprintf(stderr, "cephalon-bench cluster-fill: creating %s on %d -> %d\n",
              f.ids[i] ? f.ids[i] : "?", f.victim, st);
      goto out;
    }
  }
  double created_s = (double)(cph_bench_now_ns() - t0) / 1e9;
  /* Every node must know the sessions (its session table) before an event names them. */
  for (int tries = 0;; tries++) {
    int known = 0;
    for (int k = 0; k < f.n_ports; k++) {
      cph_bench_conn q = CPH_BENCH_CONN_INIT;
      cph_bench_resp a;
      if (!cph_bench_conn_open(&q, f.ports[k]) &&
          !cph_bench_http(&q, "GET", "/v1/cluster", NULL, 0, &a) && a.status == 200 &&
          json_num(a.body, "sessions_known") >= (int64_t)f.sessions)
        known++;
      cph_bench_conn_free(&q);
    }
    if (known == f.n_ports)
      break;
    if (tries == 600) {
      fprintf(stderr, "cephalon-bench cluster-fill: the session table did not reach every node\n");
      goto out;
    }
    usleep(100000);
  }
  int64_t applied0 = -1;
  if (!cph_bench_http(&c, "GET", "/v1/cluster", NULL, 0, &r) && r.status == 200)
    applied0 = json_num(r.body, "applied");
  t0 = cph_bench_now_ns();
  pthread_t th[64];
  void *args[64][2];
  for (uint64_t i = 0; i < f.clients; i++) {
    args[i][0] = &f;
    args[i][1] = (void *)(intptr_t)i;
    pthread_create(&th[i], NULL, fill_client, args[i]);
  }
  for (uint64_t i = 0; i < f.clients; i++)
    pthread_join(th[i], NULL);
  double posted_s = (double)(cph_bench_now_ns() - t0) / 1e9;
  if (f.failed || f.accepted != f.events) {
    fprintf(stderr, "cephalon-bench cluster-fill: %" PRIu64 " of %" PRIu64 " events accepted\n",
            f.accepted, f.events);
    goto out;
  }
  /* Until the victim applied them all (its count stands still at or above M for a second). */
  int64_t last = -1, applied = -1;
  for (int tries = 0; tries < 1200; tries++) {
    if (cph_bench_http(&c, "GET", "/v1/cluster", NULL, 0, &r) || r.status != 200)
      goto out;
    applied = json_num(r.body, "applied") - applied0;
    if (applied >= (int64_t)f.events && applied == last)
      break;
    last = applied;
    usleep(1000000);
  }
  double applied_s = (double)(cph_bench_now_ns() - t0) / 1e9;
  if (applied < (int64_t)f.events) {
    fprintf(stderr, "cephalon-bench cluster-fill: the victim applied %" PRId64 " of %" PRIu64
                    " events\n",
            applied, f.events);
    goto out;
  }
  printf("cluster-fill shard=%" PRId64 " sessions=%" PRIu64 " events=%" PRIu64
         " create_s=%.1f post_s=%.1f posted_events_per_s=%.0f applied_s=%.1f\n",
         shard, have, f.events, created_s, posted_s, (double)f.events / posted_s, applied_s);
  status = 0;
out:
  for (uint64_t i = 0; f.ids && i < f.sessions; i++)
    free(f.ids[i]);
  free(f.ids);
  cph_bench_conn_free(&c);
  pthread_mutex_destroy(&f.mu);
  return status;
}
