/* The accounting rule of DESIGN §5 across a cluster (see the header). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cluster_world.h"

#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api.h"

cph_tcw *cph_tcw_new(cph_test_cluster *c, int n_evs, const char *seed_env) {
  cph_tcw *w = calloc(1, sizeof *w);
  assert_non_null(w);
  w->c = c;
  w->n_evs = n_evs;
  w->evs = calloc((size_t)(n_evs ? n_evs : 1), sizeof *w->evs);
  assert_non_null(w->evs);
  const char *v = seed_env ? getenv(seed_env) : NULL;
  w->seed = v && *v ? (unsigned)atoi(v) : (unsigned)time(NULL);
  w->seed0 = w->seed;
  return w;
}

cph_tcw *cph_tcw_up(cph_test_cluster *c, int nodes, int shards, int ttl_s, const char *extra,
                    int n_evs, const char *seed_env, int64_t t0_ms) {
  bool live[CPH_TC_MAX_NODES] = {false};
  for (int i = 0; i < nodes; i++) {
    cph_tc_start_node(c, i, shards, ttl_s, extra);
    live[i] = true;
  }
  if (!cph_tc_wait_settled(c, live, shards, 30000))
    fail_msg("the cluster did not settle (ownership and log) within 30 s (logs in %s)", c->dir);
  cph_tcw *w = cph_tcw_new(c, n_evs, seed_env);
  cph_tcw_create_sessions(w);
  printf("seed %u; cluster up and sessions known after %lld ms\n", w->seed,
         (long long)(cph_test_now_ms() - t0_ms));
  return w;
}

void cph_tcw_down(cph_tcw *w) {
  cph_test_cluster *c = w ? w->c : NULL;
  cph_tcw_free(w);
  cph_tc_free(c);
}

void cph_tcw_free(cph_tcw *w) {
  if (!w)
    return;
  for (int e = 0; e < w->n_evs; e++)
    free(w->evs[e].json);
  free(w->evs);
  free(w);
}

static int rnd(cph_tcw *w, int n) { return (int)(rand_r(&w->seed) % (unsigned)n); }

int cph_tcw_live_node(cph_tcw *w) {
  for (;;) {
    int n = rnd(w, w->c->n_nodes);
    if (w->c->up[n])
      return n;
  }
}

/* Creates session i on its owner (following the 421); returns the owner. */
static int create_session(cph_tcw *w, int i) {
  char body[256];
  snprintf(body, sizeof body,
           "{\"id\":\"s%02d\",\"class\":\"interactive\",\"subscribe\":[\"c%d\"]}", i,
           i % CPH_TCW_CHANNELS);
  for (int n = 0; n < w->c->n_nodes; n++) {
    cph_test_response r = cph_test_api(w->c->port[n], "POST", "/v1/sessions", NULL, body);
    int st = r.status;
    cph_test_response_free(&r);
    if (st == 200)
      return n;
    assert_int_equal(st, 421);
  }
  fail_msg("no node created session s%02d", i);
  return -1;
}

void cph_tcw_wait_sessions_known(cph_tcw *w, int count) {
  for (int t = 0; t < 10000; t += 100) {
    int ok = 0;
    for (int n = 0; n < w->c->n_nodes; n++) {
      json_t *v = w->c->up[n] ? cph_tc_view(w->c, n) : NULL;
      json_t *log = json_object_get(v, "log");
      ok += !w->c->up[n] || json_integer_value(json_object_get(log, "sessions_known")) == count;
      json_decref(v);
    }
    if (ok == w->c->n_nodes)
      return;
    cph_tc_sleep_ms(100);
  }
  fail_msg("the session table did not reach every node within 10 s");
}

void cph_tcw_create_sessions(cph_tcw *w) {
  for (int i = 0; i < CPH_TCW_SESSIONS; i++)
    w->owner[i] = create_session(w, i);
  cph_tcw_wait_sessions_known(w, CPH_TCW_SESSIONS);
  int per_node[CPH_TC_MAX_NODES] = {0};
  for (int i = 0; i < CPH_TCW_SESSIONS; i++)
    per_node[w->owner[i]]++;
  for (int n = 0; n < w->c->n_nodes; n++)
    assert_true(per_node[n] > 0); /* sessions on every node, so forwards cross nodes */
}

int cph_tcw_session_index(const char *id) {
  int i = -1;
  if (!id || sscanf(id, "s%d", &i) != 1 || i < 0 || i >= CPH_TCW_SESSIONS)
    return -1;
  return i;
}

/* Leases and completes on node n (see cph_tcw_work). */
static int work_node(cph_tcw *w, int n, int max_turns) {
  int done = 0;
  for (int k = 0; k < (max_turns < 0 ? 200 : max_turns); k++) {
    cph_test_response r = cph_test_api(w->c->port[n], "POST", "/v1/turns/lease", NULL,
                                       "{\"worker\":\"w\",\"wait_ms\":0}");
    if (r.status == 204) {
      cph_test_response_free(&r);
      break;
    }
    assert_int_equal(r.status, 200);
    json_t *j = cph_test_json(&r);
    cph_test_response_free(&r);
    json_t *turn = json_object_get(j, "turn");
    int s = cph_tcw_session_index(json_string_value(json_object_get(turn, "session")));
    assert_true(s >= 0);
    char path[96], body[160];
    cph_test_completion(turn, path, sizeof path, body, sizeof body);
    r = cph_test_api(w->c->port[n], "POST", path, NULL, body);
    if (r.status != 200)
      fail_msg("completing %s on n%d: %d %s", path, n, r.status, r.body ? r.body : "");
    cph_test_response_free(&r);
    /* Counted once the completion answered 200: that turn consumed what it carried. */
    size_t i;
    json_t *st;
    json_array_foreach(json_object_get(turn, "staged"), i, st) {
      const char *text = json_string_value(json_object_get(st, "body"));
      int e = -1;
      if (!text || sscanf(text, "event %d", &e) != 1 || e < 0 || e >= w->n_evs)
        fail_msg("session s%02d got a staged entry that is no event of this test: %s", s,
                 text ? text : "(null)");
      json_t *count = json_object_get(st, "count");
      assert_true(!count || json_integer_value(count) == 1);
      if (w->evs[e].seen[s] < 255)
        w->evs[e].seen[s]++;
      w->staged++;
    }
    json_decref(j);
    w->turns++;
    done++;
  }
  return done;
}

int cph_tcw_work(cph_tcw *w, int node, int max_turns) {
  int done = 0;
  for (int n = 0; n < w->c->n_nodes; n++)
    if (w->c->up[n] && (node < 0 || n == node))
      done += work_node(w, n, max_turns);
  return done;
}

/* Event e's JSON and its targets: a channel's subscribers, a named session, or a channel's
 * subscribers plus mentions. keyed: it carries a key (a retry of it is a duplicate). */
static void make_event(cph_tcw *w, int e, const char *run, bool keyed, char *out, size_t size) {
  cph_tcw_event *x = &w->evs[e];
  char key[64] = "";
  if (keyed)
    snprintf(key, sizeof key, ",\"key\":\"%s-%d\"", run, e);
  int kind = rnd(w, 100), ch = rnd(w, CPH_TCW_CHANNELS);
  if (kind < 55) {
    snprintf(out, size,
             "{\"channel\":\"c%d\",\"sender\":\"u%d\",\"body\":\"event %d for channel c%d\"%s}", ch,
             e % 7, e, ch, key);
    for (int s = 0; s < CPH_TCW_SESSIONS; s++)
      if (s % CPH_TCW_CHANNELS == ch)
        x->targets |= 1u << s;
  } else if (kind < 80) {
    int s = rnd(w, CPH_TCW_SESSIONS);
    if (rnd(w, 2))
      snprintf(out, size,
               "{\"session\":\"s%02d\",\"sender\":\"u%d\",\"body\":\"event %d for s%02d\"%s}", s,
               e % 7, e, s, key);
    else
      snprintf(out, size,
               "{\"channel\":\"c%d\",\"session\":\"s%02d\",\"sender\":\"u%d\","
               "\"body\":\"event %d for s%02d in c%d\"%s}",
               ch, s, e % 7, e, s, ch, key);
    x->targets |= 1u << s;
  } else {
    int a = rnd(w, CPH_TCW_SESSIONS), b = rnd(w, CPH_TCW_SESSIONS);
    snprintf(out, size,
             "{\"channel\":\"c%d\",\"sender\":\"u%d\",\"body\":\"event %d: s%02d and s%02d, "
             "see c%d\",\"mentions\":[\"s%02d\",\"s%02d\"]%s}",
             ch, e % 7, e, a, b, ch, a, b, key);
    for (int s = 0; s < CPH_TCW_SESSIONS; s++)
      if (s % CPH_TCW_CHANNELS == ch)
        x->targets |= 1u << s;
    x->targets |= 1u << a | 1u << b;
  }
}

/* Posts the keyed events of [start, end) again, as they were, through a random node: each
 * answers duplicate with its original's pos. */
static void post_again(cph_tcw *w, int start, int end, char *body) {
  size_t len = (size_t)sprintf(body, "{\"events\":[");
  int n = 0;
  for (int e = start; e < end; e++)
    if (w->evs[e].keyed)
      len += (size_t)sprintf(body + len, "%s%s", n++ ? "," : "", w->evs[e].json);
  sprintf(body + len, "]}");
  if (!n)
    return;
  cph_test_response r =
      cph_test_api(w->c->port[cph_tcw_live_node(w)], "POST", "/v1/events", NULL, body);
  assert_int_equal(r.status, 200);
  json_t *j = cph_test_json(&r);
  cph_test_response_free(&r);
  json_t *results = json_object_get(j, "results");
  assert_int_equal(json_array_size(results), n);
  int i = 0;
  for (int e = start; e < end; e++) {
    if (!w->evs[e].keyed)
      continue;
    json_t *res = json_array_get(results, (size_t)i++);
    assert_string_equal(json_string_value(json_object_get(res, "status")), "duplicate");
    assert_int_equal(json_integer_value(json_object_get(res, "pos")), w->evs[e].pos);
  }
  json_decref(j);
}

void cph_tcw_post_events(cph_tcw *w, int from, int to, const char *run, bool all_keyed,
                         int work_every, int kill_at, int kill_node) {
  assert_true(from >= 0 && to <= w->n_evs);
  char *body = malloc(CPH_TCW_BATCH * 400 + 64);
  assert_non_null(body);
  int batch_no = 0;
  for (int start = from; start < to; start += CPH_TCW_BATCH, batch_no++) {
    int end = start + CPH_TCW_BATCH < to ? start + CPH_TCW_BATCH : to;
    if (kill_at >= start && kill_at < end && kill_node < 0) {
      cph_tc_kill_nats(w->c, 0);
      printf("killed nats-server 0 (-9) before event %d\n", start);
    } else if (kill_at >= start && kill_at < end) {
      cph_test_daemon_signal_wait(&w->c->d[kill_node], SIGKILL);
      cph_test_daemon_stop(&w->c->d[kill_node]);
      w->c->up[kill_node] = false;
      printf("killed node n%d (-9) before event %d\n", kill_node, start);
    }
    size_t len = (size_t)sprintf(body, "{\"events\":[");
    for (int e = start; e < end; e++) {
      if (e > start)
        body[len++] = ',';
      w->evs[e].keyed = all_keyed || e % 2 == 0;
      make_event(w, e, run, w->evs[e].keyed, body + len, 400);
      w->evs[e].json = strdup(body + len);
      len += strlen(body + len);
    }
    sprintf(body + len, "]}");
    int64_t t0 = cph_test_now_ms();
    json_t *j = NULL;
    int retried = 0;
    for (;;) {
      int node = cph_tcw_live_node(w);
      cph_test_response r = cph_test_api(w->c->port[node], "POST", "/v1/events", NULL, body);
      if (r.status == 200) {
        j = cph_test_json(&r);
        cph_test_response_free(&r);
        break;
      }
      if (r.status != 503 || !all_keyed || cph_test_now_ms() - t0 > 30000)
        fail_msg("POST /v1/events on n%d: %d %s", node, r.status, r.body ? r.body : "");
      cph_test_response_free(&r);
      retried++;
      cph_tc_sleep_ms(200);
    }
    json_t *results = json_object_get(j, "results");
    assert_int_equal(json_array_size(results), end - start);
    for (int e = start; e < end; e++) {
      json_t *res = json_array_get(results, (size_t)(e - start));
      const char *status = json_string_value(json_object_get(res, "status"));
      /* duplicate only after a retried request: its first attempt was logged */
      if (strcmp(status, "accepted") != 0 && !(retried && strcmp(status, "duplicate") == 0))
        fail_msg("event %d: status %s", e, status);
      w->evs[e].acked = true;
      w->evs[e].pos = json_integer_value(json_object_get(res, "pos"));
      assert_true(w->evs[e].pos > 0);
    }
    json_decref(j);
    if (!all_keyed && batch_no % 7 == 3) /* the keyed ones again, elsewhere: stored once */
      post_again(w, start, end, body);
    if (work_every > 0 && batch_no % work_every == work_every - 1)
      cph_tcw_work(w, -1, -1);
  }
  free(body);
}

/* Waits until each session holds, pending or staged on the node that serves it, every
 * acknowledged event of [from, to) routed to it less what completed turns consumed: the log's
 * messages were all applied (and forwarded). Fails after 30 s. */
void cph_tcw_wait_applied(cph_tcw *w, int from, int to) {
  int want[CPH_TCW_SESSIONS] = {0};
  for (int e = from; e < to; e++)
    for (int s = 0; s < CPH_TCW_SESSIONS; s++)
      want[s] += w->evs[e].acked && (w->evs[e].targets >> s & 1) && !w->evs[e].seen[s];
  int64_t t0 = cph_test_now_ms();
  int s = 0, have = -1;
  while (s < CPH_TCW_SESSIONS) {
    char path[64];
    snprintf(path, sizeof path, "/v1/sessions/s%02d", s);
    have = -1;
    for (int n = 0; n < w->c->n_nodes && have < 0; n++) {
      if (!w->c->up[n])
        continue;
      cph_test_response r = cph_test_api(w->c->port[n], "GET", path, NULL, NULL);
      json_t *j = r.status == 200 ? cph_test_json(&r) : NULL;
      if (j)
        have = (int)(json_integer_value(json_object_get(j, "pending")) +
                     json_integer_value(json_object_get(j, "staged")));
      json_decref(j);
      cph_test_response_free(&r);
    }
    if (have == want[s]) {
      s++;
      continue;
    }
    if (have > want[s])
      fail_msg("s%02d holds %d entries, more than the %d events routed to it", s, have, want[s]);
    if (cph_test_now_ms() - t0 > 30000)
      fail_msg("s%02d holds %d of its %d events after 30 s", s, have, want[s]);
    cph_tc_sleep_ms(50);
  }
  printf("every event applied %lld ms after the last was acknowledged\n",
         (long long)(cph_test_now_ms() - t0));
}

void cph_tcw_settle_and_check(cph_tcw *w, int from, int to, int64_t posting_started,
                              uint32_t lossy) {
  int64_t t0 = cph_test_now_ms();
  int missing = 0, lost = 0, late_from = 0;
  for (;;) {
    cph_tcw_work(w, -1, -1);
    missing = lost = 0;
    for (int e = from; e < to; e++)
      for (int s = 0; s < CPH_TCW_SESSIONS; s++)
        if (w->evs[e].acked && (w->evs[e].targets >> s & 1) && !w->evs[e].seen[s]) {
          if (lossy >> s & 1)
            lost++;
          else
            missing++;
        }
    /* 30 s, or 60 when something is still coming: then each node's log state is printed once
     * (a loaded machine — the sanitized suite beside other builds — once left a batch message
     * undelivered at 30 s after a NATS server's kill), and what came late is said below */
    int64_t waited = cph_test_now_ms() - t0;
    if (!missing || waited > 60000)
      break;
    if (waited > 30000 && !late_from) {
      late_from = missing;
      for (int n = 0; n < w->c->n_nodes; n++) {
        json_t *v = w->c->up[n] ? cph_tc_view(w->c, n) : NULL;
        char *log = v ? json_dumps(json_object_get(v, "log"), JSON_COMPACT) : NULL;
        if (log)
          printf("%d deliveries missing after 30 s; n%d's log: %s\n", missing, n, log);
        free(log);
        json_decref(v);
      }
    }
    cph_tc_sleep_ms(100);
  }
  if (late_from)
    printf("%d of %d deliveries missing at 30 s came later\n", late_from - missing, late_from);
  if (lost) { /* they may still come: a moment more for the lossy ones */
    cph_tc_sleep_ms(1000);
    cph_tcw_work(w, -1, -1);
    lost = 0;
    for (int e = from; e < to; e++)
      for (int s = 0; s < CPH_TCW_SESSIONS; s++)
        lost += w->evs[e].acked && (w->evs[e].targets >> s & 1) && !w->evs[e].seen[s];
  }
  int twice = 0, stray = 0, expected = 0;
  char first[256] = "";
  for (int e = from; e < to; e++)
    for (int s = 0; s < CPH_TCW_SESSIONS; s++) {
      bool routed = w->evs[e].acked && (w->evs[e].targets >> s & 1);
      int seen = w->evs[e].seen[s];
      expected += routed;
      if (routed && seen > 1)
        twice++;
      if (!routed && seen)
        stray++;
      if (!first[0] &&
          ((routed && seen > 1) || (routed && !seen && !(lossy >> s & 1)) || (!routed && seen)))
        snprintf(first, sizeof first, "event %d (pos %lld) at s%02d (owner n%d): seen %d, %s", e,
                 (long long)w->evs[e].pos, s, w->owner[s], seen,
                 routed ? "routed there" : "not routed there");
    }
  printf("%d events posted in %lld ms, all delivered %lld ms later; %d deliveries expected; "
         "%d turns carried %d staged entries; missing %d, twice %d, stray %d, lost with a dead "
         "node %d\n",
         to - from, (long long)(t0 - posting_started), (long long)(cph_test_now_ms() - t0),
         expected, w->turns, w->staged, missing, twice, stray, lost);
  if (missing || twice || stray)
    fail_msg("accounting broken (seed %u): missing %d, twice %d, stray %d; first: %s", w->seed0,
             missing, twice, stray, first);
}
