/* kill -9 at random moments (DESIGN §4 durability, §7 gc_commit, §11): the real cephalond on a
 * loopback port and a data dir that outlives it. In each iteration child processes drive
 * traffic and append every ACKNOWLEDGED result to a file as it is acknowledged; the daemon is
 * killed with SIGKILL at a random moment (seeded PRNG: the seed is printed, CPH_TEST_SEED
 * reproduces a run), restarted on the same dir, and checked:
 *
 *   ingest     every acknowledged event is there with its body (GET /v1/events/{id}); an
 *              idempotency key retried after the crash finds its event, never a second copy;
 *   complete   every acknowledged completion's reply is in GET /v1/replies with its sources;
 *              no inbox message is the source of two replies; nothing consumed is handed out
 *              again; after draining, every acknowledged event was consumed exactly once;
 *   cycle      clients run post -> lease -> complete under :sync :always, where a lease is
 *              written without a flush of its own (issue 17): every acknowledged event and
 *              completion is there, no lease survives the restart, and the input of the
 *              leases in flight is staged again (the section's comment has the list);
 *   gc_commit  no compaction group is half applied: a committed group has its summary and
 *              none of its sources can be found any more, a source that cannot be found
 *              belongs to a committed group, no source is in two committed groups (one plan
 *              per iteration overlaps three others, so commit gates abort groups too); every
 *              acknowledged job is there; and once maintenance runs on, every plan ends and
 *              every group ends committed or aborted.
 *
 * 20 + 20 + 5 + 10 iterations; CPH_CRASH_ITERATIONS scales them (e.g. 0.2 for a quick look). */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/daemon.h"
#include "tests/support/hclient.h"
#include "tests/support/testutil.h"

/* Budgets that never hold work back, small turns (many of them), no dedupe (every event is a
 * message), no automatic compaction plans (the test chooses every group), fsync per commit. */
static const char *POLICY =
    "{:scheduler {:concurrency 16\n"
    "             :lanes {:interactive {:turns 1000000 :tool-calls 1000000}\n"
    "                     :maintenance {:turns 1000000 :tool-calls 1000000}}}\n"
    " :leases {:ttl-seconds 5}\n"
    " :sessions {:max-batch 4}\n"
    " :dedupe {:min-length 1000000}\n"
    " :gc {:min-age-hours 1000}\n"
    " :store {:sync :always}}\n";

enum { INGEST_ITERATIONS = 20, COMPLETE_ITERATIONS = 20, GC_ITERATIONS = 10 };
/* Six disjoint groups of three, and a seventh that takes one source from each of three of them:
 * whichever of two overlapping groups commits first wins, the other aborts at its gate. */
enum { GC_GROUPS = 6, GC_GROUP_SIZE = 3, GC_MEMORIES = GC_GROUPS * GC_GROUP_SIZE, GC_PLANS = 7 };

static uint64_t g_seed;
static cph_hc_rng g_rng;

static int iterations(int n) {
  const char *s = getenv("CPH_CRASH_ITERATIONS");
  double f = s && *s ? atof(s) : 1.0;
  int k = (int)(n * f + 0.5);
  return k < 1 ? 1 : k;
}

/* ---------------------------------------------------------------- growable tables */

/* Per id (dense, from 1): a value, 0 when unset. */
typedef struct idmap {
  int64_t *v;
  size_t cap;
} idmap;

static void idmap_set(idmap *m, int64_t id, int64_t value) {
  assert_true(id > 0 && id < 100000000);
  if ((size_t)id >= m->cap) {
    size_t cap = m->cap ? m->cap : 1024;
    while (cap <= (size_t)id)
      cap *= 2;
    m->v = realloc(m->v, cap * sizeof *m->v);
    memset(m->v + m->cap, 0, (cap - m->cap) * sizeof *m->v);
    m->cap = cap;
  }
  m->v[id] = value;
}

static int64_t idmap_get(const idmap *m, int64_t id) {
  return id > 0 && (size_t)id < m->cap ? m->v[id] : 0;
}

static void idmap_free(idmap *m) {
  free(m->v);
  m->v = NULL;
  m->cap = 0;
}

/* ---------------------------------------------------------------- the daemon and children */

typedef struct crash_run {
  char *policy;
  char *dir;
  cph_test_daemon d;
  pid_t kids[8];
  int n_kids;
  char *ack[8]; /* each child's acknowledgement file */
} crash_run;

/* The run of the current test; the teardown cleans up after a failure too. */
static crash_run g_run;

static crash_run *run_start(const char *tag) {
  crash_run *r = &g_run;
  memset(r, 0, sizeof *r);
  r->policy = cph_test_write_tmpfile(".edn", POLICY);
  r->dir = cph_test_tmpdir(tag);
  if (cph_test_daemon_start(&r->d, r->policy, r->dir, NULL) != 0)
    fail_msg("cephalond did not start");
  return r;
}

static void run_restart(crash_run *r) {
  cph_test_daemon_stop(&r->d); /* pid 0 after the kill: frees the paths, keeps the dir */
  if (cph_test_daemon_start(&r->d, r->policy, r->dir, NULL) != 0)
    fail_msg("seed %llu: cephalond did not come back after kill -9", (unsigned long long)g_seed);
}

/* Whatever is left: drivers, the daemon, files. */
static void run_release(crash_run *r) {
  for (int i = 0; i < r->n_kids; i++) {
    if (r->kids[i] > 0) {
      kill(r->kids[i], SIGKILL);
      waitpid(r->kids[i], NULL, 0);
    }
    if (r->ack[i])
      unlink(r->ack[i]);
    free(r->ack[i]);
  }
  r->n_kids = 0;
  if (r->dir) {
    cph_test_rmtree(r->dir);
    free(r->dir);
  }
  if (r->policy) {
    unlink(r->policy);
    free(r->policy);
  }
  r->dir = r->policy = NULL;
}

static void run_end(crash_run *r) {
  int rc = cph_test_daemon_stop(&r->d);
  run_release(r);
  assert_int_equal(rc, 0); /* a clean exit after all the crashes */
}

static int teardown(void **state) {
  (void)state;
  if (g_run.d.log_path)
    cph_test_daemon_stop(&g_run.d);
  run_release(&g_run);
  return 0;
}

/* Forks a driver child: fn(port, ack_path, arg) runs in it and the child exits. */
static void spawn(crash_run *r, void (*fn)(int port, const char *ack, uint64_t arg), uint64_t arg) {
  assert_true(r->n_kids < 8);
  int i = r->n_kids++;
  char *ack;
  if (asprintf(&ack, "%s.ack%d", r->dir, i) < 0)
    abort();
  unlink(ack);
  r->ack[i] = ack;
  fflush(NULL);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    fn(r->d.port, ack, arg);
    _exit(0);
  }
  r->kids[i] = pid;
}

/* kill -9 the daemon, then reap the children (they stop on their first failed request). */
static void crash(crash_run *r) {
  assert_int_equal(cph_test_daemon_signal_wait(&r->d, SIGKILL), 128 + SIGKILL);
  int64_t deadline = cph_hc_now_ms() + 15000;
  for (int i = 0; i < r->n_kids; i++) {
    int status;
    while (waitpid(r->kids[i], &status, WNOHANG) == 0) {
      if (cph_hc_now_ms() > deadline) {
        kill(r->kids[i], SIGKILL);
        waitpid(r->kids[i], &status, 0);
        r->kids[i] = 0;
        fail_msg("a driver did not stop after the daemon died");
      }
      cph_hc_sleep_ms(5);
    }
    r->kids[i] = 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
      fail_msg("a driver exited with status %d", status);
  }
}

/* The children's acknowledgement lines of this iteration (one string, NUL-separated lines
 * are not needed: callers walk it with strtok_r); removes the files. */
static char *collect_acks(crash_run *r) {
  char *all = strdup("");
  for (int i = 0; i < r->n_kids; i++) {
    char *text = cph_test_read_file(r->ack[i], NULL);
    if (text) {
      char *joined;
      if (asprintf(&joined, "%s%s", all, text) < 0)
        abort();
      free(all);
      all = joined;
      free(text);
    }
    unlink(r->ack[i]);
    free(r->ack[i]);
    r->ack[i] = NULL;
  }
  r->n_kids = 0;
  return all;
}

static void fail_with_log(crash_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail_with_log(crash_run *r, const char *fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  char *log = cph_test_daemon_log(&r->d);
  fprintf(stderr, "--- cephalond log after the restart ---\n%s\n", log);
  free(log);
  fail_msg("seed %llu: %s", (unsigned long long)g_seed, msg);
}

/* ---------------------------------------------------------------- shared checks */

static json_t *get_ok(crash_run *r, const char *path) {
  int st;
  json_t *j = cph_hc_call(r->d.port, NULL, &st, "GET", path, NULL);
  if (st != 200)
    fail_with_log(r, "GET %s: status %d", path, st);
  return j;
}

static void expect_event(crash_run *r, int64_t id, const char *body) {
  char path[64];
  snprintf(path, sizeof path, "/v1/events/%lld", (long long)id);
  int st;
  json_t *j = cph_hc_call(r->d.port, NULL, &st, "GET", path, NULL);
  if (st != 200 || strcmp(cph_hc_str(j, "body"), body) != 0)
    fail_with_log(r, "acknowledged event %lld ('%s') after kill -9: status %d, body '%s'",
                  (long long)id, body, st, cph_hc_str(j, "body"));
  json_decref(j);
}

/* Every reply so far, oldest first (new reference): [{"id","body","source_inbox_ids"}...]. */
static json_t *all_replies(crash_run *r) {
  json_t *out = json_array();
  int64_t after = 0;
  for (int page = 0; page < 10000; page++) {
    char path[64];
    snprintf(path, sizeof path, "/v1/replies?after=%lld", (long long)after);
    json_t *j = get_ok(r, path);
    json_t *replies = json_object_get(j, "replies");
    json_array_extend(out, replies);
    int64_t next = cph_hc_int(j, "next");
    size_t k = json_array_size(replies);
    json_decref(j);
    if (!k || next <= after)
      break;
    after = next;
  }
  return out;
}

/* ================================================================ ingest */

/* A writer: batches of 1-5 events with idempotency keys; "P key" before sending, then
 * "E id body" for each acknowledged event. */
static void ingest_writer(int port, const char *ack, uint64_t arg) {
  cph_hc_rng rng = {arg};
  int iter = (int)(arg >> 40), w = (int)((arg >> 32) & 0xff);
  for (int n = 0; n < 100000;) {
    int batch = (int)cph_hc_rand_range(&rng, 1, 5);
    char json[4096];
    size_t used = (size_t)snprintf(json, sizeof json, "{\"events\":[");
    for (int i = 0; i < batch; i++) {
      char body[64];
      snprintf(body, sizeof body, "i%dw%dn%d", iter, w, n + i);
      cph_hc_append_line(ack, "P %s", body);
      used += (size_t)snprintf(json + used, sizeof json - used,
                               "%s{\"channel\":\"c%d\",\"sender\":\"w%d\",\"body\":\"%s\","
                               "\"key\":\"k-%s\"}",
                               i ? "," : "", (int)cph_hc_rand_range(&rng, 0, 3), w, body, body);
    }
    snprintf(json + used, sizeof json - used, "]}");
    int st;
    json_t *j = cph_hc_call(port, NULL, &st, "POST", "/v1/events", "%s", json);
    if (st == -1) { /* the daemon is gone */
      json_decref(j);
      return;
    }
    if (st != 200) {
      cph_hc_append_line(ack, "X %d", st);
      json_decref(j);
      return;
    }
    json_t *results = json_object_get(j, "results");
    for (int i = 0; i < batch; i++) {
      json_t *res = json_array_get(results, (size_t)i);
      cph_hc_append_line(ack, "E %lld i%dw%dn%d %s", (long long)cph_hc_int(res, "id"), iter, w,
                         n + i, cph_hc_str(res, "status"));
    }
    json_decref(j);
    n += batch;
  }
}

typedef struct acked_event {
  int64_t id;
  char body[48];
} acked_event;

static void test_kill_9_during_ingest_loses_no_acknowledged_event(void **state) {
  (void)state;
  crash_run *r = run_start("crash-ingest");
  int st;
  for (int i = 0; i < 4; i++) {
    json_decref(cph_hc_call(r->d.port, NULL, &st, "POST", "/v1/sessions",
                            "{\"id\":\"s%d\",\"class\":\"interactive\",\"subscribe\":[\"c%d\"]}", i, i));
    assert_int_equal(st, 200);
  }
  size_t cap = 4096, n_all = 0, retried = 0, retried_new = 0;
  acked_event *all = malloc(cap * sizeof *all);
  int n_iter = iterations(INGEST_ITERATIONS);
  for (int it = 0; it < n_iter; it++) {
    for (int w = 0; w < 3; w++)
      spawn(r, ingest_writer, ((uint64_t)it << 40) | ((uint64_t)w << 32) | (cph_hc_rand(&g_rng) & 0xffffffffu));
    int delay = (int)cph_hc_rand_range(&g_rng, 20, 400);
    cph_hc_sleep_ms(delay);
    crash(r);
    char *acks = collect_acks(r);
    run_restart(r);

    /* parse: E lines are acknowledged; P lines without an E were in flight */
    size_t first = n_all;
    size_t n_pending = 0, cap_pending = 256;
    char **pending = malloc(cap_pending * sizeof *pending);
    char *save = NULL;
    for (char *line = strtok_r(acks, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
      if (line[0] == 'X')
        fail_with_log(r, "ingest answered %s", line + 2);
      if (line[0] == 'P') {
        if (n_pending == cap_pending)
          pending = realloc(pending, (cap_pending *= 2) * sizeof *pending);
        pending[n_pending++] = line + 2;
      } else if (line[0] == 'E') {
        if (n_all == cap)
          all = realloc(all, (cap *= 2) * sizeof *all);
        acked_event *a = &all[n_all++];
        char status[16] = "";
        if (sscanf(line, "E %lld %47s %15s", (long long *)&a->id, a->body, status) != 3)
          fail_msg("bad ack line '%s'", line);
        if (strcmp(status, "queued") != 0)
          fail_with_log(r, "event %s answered %s", a->body, status);
        for (size_t p = n_pending; p-- > 0;) /* acknowledged: no longer in flight */
          if (pending[p] && strcmp(pending[p], a->body) == 0) {
            pending[p] = NULL;
            break;
          }
      }
    }
    /* every acknowledged event of this iteration is there */
    for (size_t i = first; i < n_all; i++)
      expect_event(r, all[i].id, all[i].body);
    /* an event in flight at the crash is retried with its key: it lands exactly once */
    for (size_t p = 0; p < n_pending; p++) {
      if (!pending[p])
        continue;
      char body[64];
      snprintf(body, sizeof body, "%s", pending[p]);
      json_t *j = cph_hc_call(r->d.port, NULL, &st, "POST", "/v1/events",
                              "{\"events\":[{\"channel\":\"c0\",\"sender\":\"retry\",\"body\":\"%s\","
                              "\"key\":\"k-%s\"}]}",
                              body, body);
      if (st != 200)
        fail_with_log(r, "retrying %s: status %d", body, st);
      json_t *res = json_array_get(json_object_get(j, "results"), 0);
      int64_t id = cph_hc_int(res, "id");
      const char *status = cph_hc_str(res, "status");
      if (strcmp(status, "duplicate") != 0 && strcmp(status, "queued") != 0)
        fail_with_log(r, "retrying %s answered %s", body, status);
      retried++;
      retried_new += strcmp(status, "queued") == 0;
      expect_event(r, id, body);
      /* and a second retry is a duplicate of the same id */
      json_t *again = cph_hc_call(r->d.port, NULL, &st, "POST", "/v1/events",
                                  "{\"events\":[{\"channel\":\"c0\",\"sender\":\"retry\",\"body\":\"%s\","
                                  "\"key\":\"k-%s\"}]}",
                                  body, body);
      json_t *res2 = json_array_get(json_object_get(again, "results"), 0);
      if (strcmp(cph_hc_str(res2, "status"), "duplicate") != 0 || cph_hc_int(res2, "id") != id)
        fail_with_log(r, "second retry of %s: %s id %lld, want duplicate of %lld", body,
                      cph_hc_str(res2, "status"), (long long)cph_hc_int(res2, "id"), (long long)id);
      json_decref(again);
      json_decref(j);
    }
    size_t in_flight = 0;
    for (size_t p = 0; p < n_pending; p++)
      in_flight += pending[p] != NULL;
    print_message("ingest %2d: kill after %3d ms, %4zu events acknowledged, %zu in flight\n", it,
                  delay, n_all - first, in_flight);
    free(pending);
    free(acks);
  }
  /* at the end, everything acknowledged in every iteration is still there, ids never reused */
  idmap seen = {0};
  for (size_t i = 0; i < n_all; i++) {
    if (idmap_get(&seen, all[i].id))
      fail_msg("event id %lld was acknowledged twice", (long long)all[i].id);
    idmap_set(&seen, all[i].id, 1);
    expect_event(r, all[i].id, all[i].body);
  }
  print_message("ingest: %zu acknowledged events over %d kills, all present; %zu in-flight "
                "retried (%zu had not landed)\n",
                n_all, n_iter, retried, retried_new);
  assert_true(n_all > 0);
  idmap_free(&seen);
  free(all);
  run_end(r);
}

/* ================================================================ complete */

enum { COMPLETE_SESSIONS = 6 };

/* The producer: events to random channels; "E id body" per acknowledged event. */
static void complete_producer(int port, const char *ack, uint64_t arg) {
  cph_hc_rng rng = {arg};
  for (int n = 0; n < 100000;) {
    int batch = (int)cph_hc_rand_range(&rng, 1, 3);
    char json[2048];
    size_t used = (size_t)snprintf(json, sizeof json, "{\"events\":[");
    for (int i = 0; i < batch; i++)
      used += (size_t)snprintf(json + used, sizeof json - used,
                               "%s{\"channel\":\"c%d\",\"sender\":\"p\",\"body\":\"m%d-%d\"}",
                               i ? "," : "", (int)cph_hc_rand_range(&rng, 0, COMPLETE_SESSIONS - 1),
                               (int)(arg & 0xff), n + i);
    snprintf(json + used, sizeof json - used, "]}");
    int st;
    json_t *j = cph_hc_call(port, NULL, &st, "POST", "/v1/events", "%s", json);
    if (st != 200) {
      if (st != -1)
        cph_hc_append_line(ack, "X ingest %d", st);
      json_decref(j);
      return;
    }
    json_t *results = json_object_get(j, "results");
    for (int i = 0; i < batch; i++)
      cph_hc_append_line(ack, "E %lld m%d-%d",
                         (long long)cph_hc_int(json_array_get(results, (size_t)i), "id"),
                         (int)(arg & 0xff), n + i);
    json_decref(j);
    n += batch;
    cph_hc_sleep_ms((int)cph_hc_rand_range(&rng, 1, 8));
  }
}

/* A worker: "L turn inbox:event ..." after each lease, "C turn reply inbox,..." after each
 * acknowledged completion. */
static void complete_worker(int port, const char *ack, uint64_t arg) {
  (void)arg;
  for (int n = 0; n < 100000; n++) {
    int st;
    json_t *j = cph_hc_call(port, NULL, &st, "POST", "/v1/turns/lease",
                            "{\"worker\":\"cw\",\"wait_ms\":200}");
    if (st == 204) {
      json_decref(j);
      continue;
    }
    if (st != 200) {
      if (st != -1)
        cph_hc_append_line(ack, "X lease %d", st);
      json_decref(j);
      return;
    }
    json_t *turn = json_object_get(j, "turn");
    int64_t id = cph_hc_int(turn, "id");
    json_t *staged = json_object_get(turn, "staged");
    char line[2048], inbox[1024];
    size_t lu = (size_t)snprintf(line, sizeof line, "L %lld", (long long)id);
    size_t iu = 0;
    inbox[0] = '\0';
    for (size_t i = 0; i < json_array_size(staged); i++) {
      json_t *m = json_array_get(staged, i);
      lu += (size_t)snprintf(line + lu, sizeof line - lu, " %lld:%lld", (long long)cph_hc_int(m, "id"),
                             (long long)cph_hc_int(m, "event_id"));
      iu += (size_t)snprintf(inbox + iu, sizeof inbox - iu, "%s%lld", i ? "," : "",
                             (long long)cph_hc_int(m, "id"));
    }
    cph_hc_append_line(ack, "%s", line);
    char path[96];
    snprintf(path, sizeof path, "/v1/turns/%lld/complete", (long long)id);
    json_t *c = cph_hc_call(port, NULL, &st, "POST", path,
                            "{\"lease\":\"%s\",\"cost\":{\"tokens\":2,\"tool_calls\":0},"
                            "\"reply\":{\"body\":\"rep-%lld\"}}",
                            cph_hc_str(turn, "lease"), (long long)id);
    if (st == 200 && !json_is_true(json_object_get(c, "already")))
      cph_hc_append_line(ack, "C %lld rep-%lld %s", (long long)id, (long long)id, inbox);
    else if (st != -1)
      cph_hc_append_line(ack, "X complete %d", st);
    json_decref(c);
    json_decref(j);
    if (st == -1)
      return;
  }
}

typedef struct complete_state {
  idmap inbox_event;   /* inbox id -> event id (from leases and drains) */
  idmap event_body_at; /* event id -> index into bodies */
  char (*bodies)[32];
  int64_t *acked_events;
  size_t n_events, cap_events;
  char (*acked_replies)[32]; /* reply bodies of acknowledged completions */
  char **acked_sources;      /* their inbox ids, "1,2,3" */
  size_t n_replies, cap_replies;
} complete_state;

/* An acknowledged event's line "E <id> <body>": kept as cs's next event; its id. */
static int64_t note_acked_event(complete_state *cs, const char *line) {
  if (cs->n_events == cs->cap_events) {
    cs->cap_events = cs->cap_events ? cs->cap_events * 2 : 1024;
    cs->acked_events = realloc(cs->acked_events, cs->cap_events * sizeof *cs->acked_events);
    cs->bodies = realloc(cs->bodies, cs->cap_events * sizeof *cs->bodies);
  }
  long long id;
  char body[32];
  if (sscanf(line, "E %lld %31s", &id, body) != 2)
    fail_msg("bad ack line '%s'", line);
  cs->acked_events[cs->n_events] = id;
  memcpy(cs->bodies[cs->n_events], body, sizeof body);
  cs->n_events++;
  return id;
}

static void note_inbox(crash_run *r, complete_state *cs, int64_t inbox, int64_t event) {
  int64_t was = idmap_get(&cs->inbox_event, inbox);
  if (was && was != event)
    fail_with_log(r, "inbox message %lld carried event %lld, then event %lld", (long long)inbox,
                  (long long)was, (long long)event);
  idmap_set(&cs->inbox_event, inbox, event);
}

/* The sources of a reply as "1,2,3" (ascending). */
static void sources_text(const json_t *reply, char *out, size_t size) {
  json_t *src = json_object_get(reply, "source_inbox_ids");
  size_t n = json_array_size(src), used = 0;
  int64_t ids[256];
  for (size_t i = 0; i < n && i < 256; i++)
    ids[i] = json_integer_value(json_array_get(src, i));
  for (size_t i = 1; i < n && i < 256; i++) /* insertion sort: a handful of ids */
    for (size_t k = i; k > 0 && ids[k - 1] > ids[k]; k--) {
      int64_t t = ids[k];
      ids[k] = ids[k - 1];
      ids[k - 1] = t;
    }
  out[0] = '\0';
  for (size_t i = 0; i < n && i < 256; i++)
    used += (size_t)snprintf(out + used, size - used, "%s%lld", i ? "," : "", (long long)ids[i]);
}

static void sort_csv(const char *in, char *out, size_t size) {
  json_t *fake = json_object(), *arr = json_array();
  char *copy = strdup(in), *save = NULL;
  for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save))
    json_array_append_new(arr, json_integer(atoll(t)));
  json_object_set_new(fake, "source_inbox_ids", arr);
  sources_text(fake, out, size);
  json_decref(fake);
  free(copy);
}

/* Drains every turn left (well-behaved worker); returns how many; their messages go to the
 * inbox map. Fails if one of them was already consumed by a reply. */
static size_t drain(crash_run *r, complete_state *cs, const idmap *in_reply) {
  size_t turns = 0;
  for (int idle = 0, guard = 0; idle < 2 && guard < 5000; guard++) {
    int st;
    json_t *j = cph_hc_call(r->d.port, NULL, &st, "POST", "/v1/turns/lease",
                            "{\"worker\":\"drain\",\"wait_ms\":300}");
    if (st == 204) {
      idle++;
      json_decref(j);
      continue;
    }
    if (st != 200)
      fail_with_log(r, "drain lease: status %d", st);
    idle = 0;
    json_t *turn = json_object_get(j, "turn");
    json_t *staged = json_object_get(turn, "staged");
    for (size_t i = 0; i < json_array_size(staged); i++) {
      json_t *m = json_array_get(staged, i);
      int64_t inbox = cph_hc_int(m, "id");
      if (idmap_get(in_reply, inbox))
        fail_with_log(r, "inbox message %lld was consumed (reply %lld) and handed out again",
                      (long long)inbox, (long long)idmap_get(in_reply, inbox));
      note_inbox(r, cs, inbox, cph_hc_int(m, "event_id"));
    }
    char path[96];
    snprintf(path, sizeof path, "/v1/turns/%lld/complete", (long long)cph_hc_int(turn, "id"));
    json_decref(cph_hc_call(r->d.port, NULL, &st, "POST", path,
                            "{\"lease\":\"%s\",\"cost\":{\"tokens\":1,\"tool_calls\":0},"
                            "\"reply\":{\"body\":\"drain-%lld\"}}",
                            cph_hc_str(turn, "lease"), (long long)cph_hc_int(turn, "id")));
    if (st != 200)
      fail_with_log(r, "drain complete: status %d", st);
    json_decref(j);
    turns++;
  }
  return turns;
}

/* inbox id -> reply id for every reply; fails on an inbox message in two replies. */
static void replies_by_inbox(crash_run *r, const json_t *replies, idmap *out) {
  for (size_t i = 0; i < json_array_size(replies); i++) {
    json_t *rep = json_array_get(replies, i);
    json_t *src = json_object_get(rep, "source_inbox_ids");
    for (size_t k = 0; k < json_array_size(src); k++) {
      int64_t inbox = json_integer_value(json_array_get(src, k));
      if (idmap_get(out, inbox))
        fail_with_log(r, "inbox message %lld is the source of replies %lld and %lld",
                      (long long)inbox, (long long)idmap_get(out, inbox),
                      (long long)cph_hc_int(rep, "id"));
      idmap_set(out, inbox, cph_hc_int(rep, "id"));
    }
  }
}

static void test_kill_9_during_completions_loses_no_acknowledged_completion(void **state) {
  (void)state;
  crash_run *r = run_start("crash-complete");
  int st;
  for (int i = 0; i < COMPLETE_SESSIONS; i++) {
    json_decref(cph_hc_call(r->d.port, NULL, &st, "POST", "/v1/sessions",
                            "{\"id\":\"s%d\",\"class\":\"interactive\",\"subscribe\":[\"c%d\"]}", i, i));
    assert_int_equal(st, 200);
  }
  complete_state cs = {0};
  int n_iter = iterations(COMPLETE_ITERATIONS);
  size_t total_completions = 0, total_drained = 0;
  for (int it = 0; it < n_iter; it++) {
    spawn(r, complete_producer, (cph_hc_rand(&g_rng) << 8) | (uint64_t)(it & 0xff));
    for (int w = 0; w < 3; w++)
      spawn(r, complete_worker, (uint64_t)w);
    int delay = (int)cph_hc_rand_range(&g_rng, 40, 500);
    cph_hc_sleep_ms(delay);
    crash(r);
    char *acks = collect_acks(r);
    run_restart(r);

    size_t first_event = cs.n_events, first_reply = cs.n_replies;
    char *save = NULL;
    for (char *line = strtok_r(acks, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
      if (line[0] == 'X') {
        fail_with_log(r, "a driver saw %s", line + 2);
      } else if (line[0] == 'E') {
        int64_t id = note_acked_event(&cs, line);
        idmap_set(&cs.event_body_at, id, (int64_t)cs.n_events);
      } else if (line[0] == 'L') {
        char *save2 = NULL;
        strtok_r(line, " ", &save2); /* "L" */
        strtok_r(NULL, " ", &save2); /* turn id */
        for (char *p = strtok_r(NULL, " ", &save2); p; p = strtok_r(NULL, " ", &save2)) {
          long long inbox, event;
          if (sscanf(p, "%lld:%lld", &inbox, &event) == 2)
            note_inbox(r, &cs, inbox, event);
        }
      } else if (line[0] == 'C') {
        if (cs.n_replies == cs.cap_replies) {
          cs.cap_replies = cs.cap_replies ? cs.cap_replies * 2 : 1024;
          cs.acked_replies = realloc(cs.acked_replies, cs.cap_replies * sizeof *cs.acked_replies);
          cs.acked_sources = realloc(cs.acked_sources, cs.cap_replies * sizeof *cs.acked_sources);
        }
        long long turn;
        char body[32], src[1024] = "";
        if (sscanf(line, "C %lld %31s %1023s", &turn, body, src) < 2)
          fail_msg("bad ack line '%s'", line);
        memcpy(cs.acked_replies[cs.n_replies], body, sizeof body);
        char sorted[1024];
        sort_csv(src, sorted, sizeof sorted);
        cs.acked_sources[cs.n_replies] = strdup(sorted);
        cs.n_replies++;
      }
    }
    free(acks);

    /* 1. acknowledged events are there */
    for (size_t i = first_event; i < cs.n_events; i++)
      expect_event(r, cs.acked_events[i], cs.bodies[i]);
    /* 2. acknowledged completions: their replies, with their sources; no message in two */
    json_t *replies = all_replies(r);
    idmap by_inbox = {0};
    replies_by_inbox(r, replies, &by_inbox);
    for (size_t i = first_reply; i < cs.n_replies; i++) {
      bool found = false;
      for (size_t k = 0; k < json_array_size(replies) && !found; k++) {
        json_t *rep = json_array_get(replies, k);
        if (strcmp(cph_hc_str(rep, "body"), cs.acked_replies[i]) != 0)
          continue;
        found = true;
        char got[1024];
        sources_text(rep, got, sizeof got);
        if (strcmp(got, cs.acked_sources[i]) != 0)
          fail_with_log(r, "reply %s: sources [%s], the completion carried [%s]",
                        cs.acked_replies[i], got, cs.acked_sources[i]);
      }
      if (!found)
        fail_with_log(r, "acknowledged completion %s has no reply after kill -9",
                      cs.acked_replies[i]);
    }
    json_decref(replies);
    /* 3. nothing consumed is handed out again; the rest is drained */
    size_t drained = drain(r, &cs, &by_inbox);
    idmap_free(&by_inbox);
    /* 4. every acknowledged event so far was consumed exactly once */
    replies = all_replies(r);
    replies_by_inbox(r, replies, &by_inbox);
    idmap consumed = {0};
    for (size_t i = 0; i < by_inbox.cap; i++) {
      if (!by_inbox.v[i])
        continue;
      int64_t ev = idmap_get(&cs.inbox_event, (int64_t)i);
      if (!ev)
        fail_with_log(r, "reply %lld names inbox message %zu, which no worker ever leased",
                      (long long)by_inbox.v[i], i);
      idmap_set(&consumed, ev, idmap_get(&consumed, ev) + 1);
    }
    for (size_t i = 0; i < cs.n_events; i++)
      if (idmap_get(&consumed, cs.acked_events[i]) != 1)
        fail_with_log(r, "acknowledged event %lld (%s) was consumed %lld times",
                      (long long)cs.acked_events[i], cs.bodies[i],
                      (long long)idmap_get(&consumed, cs.acked_events[i]));
    idmap_free(&consumed);
    idmap_free(&by_inbox);
    json_decref(replies);
    print_message("complete %2d: kill after %3d ms, %4zu events and %3zu completions "
                  "acknowledged, %3zu turns drained after the restart\n",
                  it, delay, cs.n_events - first_event, cs.n_replies - first_reply, drained);
    total_completions += cs.n_replies - first_reply;
    total_drained += drained;
  }
  print_message("complete: %zu events, %zu acknowledged completions over %d kills, all present "
                "and consumed once (%zu turns drained)\n",
                cs.n_events, total_completions, n_iter, total_drained);
  assert_true(total_completions > 0);
  for (size_t i = 0; i < cs.n_replies; i++)
    free(cs.acked_sources[i]);
  free(cs.acked_sources);
  free(cs.acked_replies);
  free(cs.acked_events);
  free(cs.bodies);
  idmap_free(&cs.inbox_event);
  idmap_free(&cs.event_body_at);
  run_end(r);
}

/* ================================================================ turn cycles */

/* Issue 17 item 3: under :sync :always a lease is written without a flush of its own, and
 * answers wait for their pass's flush while the next pass is built. Clients each run the
 * bench's cycle — post one event, lease, complete with a reply — and log what was
 * acknowledged: "E id body" (post), "L turn lease inbox:event ..." (lease), "C turn reply
 * inbox,..." (completion). Each seed gets a fresh data dir, a kill -9 at a seeded moment, a
 * restart on the same dir, and these checks:
 *   - no lease survives as active: no cycle session is running, the interactive lane runs
 *     nothing; a lease acknowledged but not completed answers 409 ("expired") to its
 *     completion — or `already`, when the completion landed but its answer was lost;
 *   - every acknowledged POST: the event is stored with its body, and accounted: a source of
 *     exactly one reply once the sessions are drained;
 *   - every acknowledged completion: its reply is there with its sources, and completing it
 *     again answers `already` (the turn is stored completed with that lease);
 *   - the input of every lease that came back expired is staged again: the drain hands those
 *     inbox messages out again.
 * CPH_CRASH_ITERATIONS scales the seeds like the other tests. */
enum { CYCLE_SEEDS = 5, CYCLE_CLIENTS = 4 };

static void cycle_client(int port, const char *ack, uint64_t arg) {
  cph_hc_rng rng = {arg | 1};
  int me = (int)(arg & 0xff);
  for (int n = 0; n < 100000; n++) {
    int st;
    json_t *j = cph_hc_call(port, NULL, &st, "POST", "/v1/events",
                            "{\"events\":[{\"channel\":\"k%d\",\"sender\":\"u\",\"body\":\"c%d-%d\"}]}",
                            me, me, n);
    if (st != 200) {
      if (st != -1)
        cph_hc_append_line(ack, "X ingest %d", st);
      json_decref(j);
      return;
    }
    cph_hc_append_line(ack, "E %lld c%d-%d",
                       (long long)cph_hc_int(json_array_get(json_object_get(j, "results"), 0), "id"),
                       me, n);
    json_decref(j);
    j = cph_hc_call(port, NULL, &st, "POST", "/v1/turns/lease",
                    "{\"worker\":\"cy%d\",\"wait_ms\":%d}", me, (int)cph_hc_rand_range(&rng, 50, 300));
    if (st == 204) {
      json_decref(j);
      continue;
    }
    if (st != 200) {
      if (st != -1)
        cph_hc_append_line(ack, "X lease %d", st);
      json_decref(j);
      return;
    }
    json_t *turn = json_object_get(j, "turn");
    int64_t id = cph_hc_int(turn, "id");
    const char *lease = cph_hc_str(turn, "lease");
    json_t *staged = json_object_get(turn, "staged");
    char line[2048], inbox[1024];
    size_t lu = (size_t)snprintf(line, sizeof line, "L %lld %s", (long long)id, lease);
    size_t iu = 0;
    inbox[0] = '\0';
    for (size_t i = 0; i < json_array_size(staged); i++) {
      json_t *m = json_array_get(staged, i);
      lu += (size_t)snprintf(line + lu, sizeof line - lu, " %lld:%lld", (long long)cph_hc_int(m, "id"),
                             (long long)cph_hc_int(m, "event_id"));
      iu += (size_t)snprintf(inbox + iu, sizeof inbox - iu, "%s%lld", i ? "," : "",
                             (long long)cph_hc_int(m, "id"));
    }
    cph_hc_append_line(ack, "%s", line);
    cph_hc_sleep_ms((int)cph_hc_rand_range(&rng, 0, 20)); /* the model's turn: a kill lands here */
    char path[96];
    snprintf(path, sizeof path, "/v1/turns/%lld/complete", (long long)id);
    json_t *c = cph_hc_call(port, NULL, &st, "POST", path,
                            "{\"lease\":\"%s\",\"cost\":{\"tokens\":2,\"tool_calls\":0},"
                            "\"reply\":{\"body\":\"rep-%lld\"}}",
                            lease, (long long)id);
    if (st == 200 && !json_is_true(json_object_get(c, "already")))
      cph_hc_append_line(ack, "C %lld rep-%lld %s", (long long)id, (long long)id, inbox);
    else if (st != -1)
      cph_hc_append_line(ack, "X complete %d", st);
    json_decref(c);
    json_decref(j);
    if (st == -1)
      return;
  }
}

typedef struct cycle_lease {
  int64_t turn;
  char lease[40];
  int64_t inbox[8];
  int n_inbox;
  bool completed; /* its completion was acknowledged */
} cycle_lease;

/* The state of a session the scheduler must not show after a restart. */
static void expect_nothing_running(crash_run *r) {
  json_t *j = get_ok(r, "/v1/sessions?state=running");
  json_t *list = json_object_get(j, "sessions");
  for (size_t i = 0; i < json_array_size(list); i++) {
    const char *id = cph_hc_str(json_array_get(list, i), "id");
    if (strncmp(id, "cy", 2) == 0)
      fail_with_log(r, "session %s is running right after the restart: a lease survived", id);
  }
  json_decref(j);
  j = get_ok(r, "/v1/lanes");
  json_t *lanes = json_object_get(j, "lanes");
  for (size_t i = 0; i < json_array_size(lanes); i++) {
    json_t *l = json_array_get(lanes, i);
    if (strcmp(cph_hc_str(l, "name"), "interactive") == 0 && cph_hc_int(l, "running") != 0)
      fail_with_log(r, "the interactive lane runs %lld turns right after the restart",
                    (long long)cph_hc_int(l, "running"));
  }
  json_decref(j);
}

static void test_kill_9_mid_cycle_keeps_what_was_acknowledged_and_expires_leases(void **state) {
  (void)state;
  int n_seeds = iterations(CYCLE_SEEDS);
  size_t total_events = 0, total_completions = 0, total_expired = 0;
  for (int it = 0; it < n_seeds; it++) {
    uint64_t seed = cph_hc_rand(&g_rng);
    cph_hc_rng rng = {seed | 1};
    int delay = (int)cph_hc_rand_range(&rng, 100, 600);
    print_message("cycle %d: seed %llu, kill after %d ms\n", it, (unsigned long long)seed, delay);
    crash_run *r = run_start("crash-cycle");
    int st;
    for (int i = 0; i < CYCLE_CLIENTS; i++) {
      json_decref(cph_hc_call(r->d.port, NULL, &st, "POST", "/v1/sessions",
                              "{\"id\":\"cy%d\",\"class\":\"interactive\",\"subscribe\":[\"k%d\"]}", i, i));
      assert_int_equal(st, 200);
    }
    for (int i = 0; i < CYCLE_CLIENTS; i++)
      spawn(r, cycle_client, (cph_hc_rand(&rng) << 8) | (uint64_t)i);
    cph_hc_sleep_ms(delay);
    crash(r);
    char *acks = collect_acks(r);
    run_restart(r);
    /* before anything else touches it: no lease is active */
    expect_nothing_running(r);

    complete_state cs = {0};
    cycle_lease *leases = calloc(4096, sizeof *leases);
    size_t n_leases = 0;
    char *save = NULL;
    for (char *line = strtok_r(acks, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
      if (line[0] == 'X') {
        fail_with_log(r, "a client saw %s", line + 2);
      } else if (line[0] == 'E') {
        note_acked_event(&cs, line);
      } else if (line[0] == 'L' && n_leases < 4096) {
        cycle_lease *l = &leases[n_leases++];
        char *save2 = NULL;
        strtok_r(line, " ", &save2); /* "L" */
        l->turn = atoll(strtok_r(NULL, " ", &save2));
        snprintf(l->lease, sizeof l->lease, "%s", strtok_r(NULL, " ", &save2));
        for (char *p = strtok_r(NULL, " ", &save2); p; p = strtok_r(NULL, " ", &save2)) {
          long long inbox, event;
          if (sscanf(p, "%lld:%lld", &inbox, &event) == 2) {
            note_inbox(r, &cs, inbox, event);
            if (l->n_inbox < 8)
              l->inbox[l->n_inbox++] = inbox;
          }
        }
      } else if (line[0] == 'C') {
        if (cs.n_replies == cs.cap_replies) {
          cs.cap_replies = cs.cap_replies ? cs.cap_replies * 2 : 1024;
          cs.acked_replies = realloc(cs.acked_replies, cs.cap_replies * sizeof *cs.acked_replies);
          cs.acked_sources = realloc(cs.acked_sources, cs.cap_replies * sizeof *cs.acked_sources);
        }
        long long turn;
        char body[32], src[1024] = "";
        if (sscanf(line, "C %lld %31s %1023s", &turn, body, src) < 2)
          fail_msg("bad ack line '%s'", line);
        memcpy(cs.acked_replies[cs.n_replies], body, sizeof body);
        char sorted[1024];
        sort_csv(src, sorted, sizeof sorted);
        cs.acked_sources[cs.n_replies] = strdup(sorted);
        cs.n_replies++;
        for (size_t k = n_leases; k-- > 0;)
          if (leases[k].turn == turn) {
            leases[k].completed = true;
            break;
          }
      }
    }
    free(acks);

    /* every acknowledged event is stored */
    for (size_t i = 0; i < cs.n_events; i++)
      expect_event(r, cs.acked_events[i], cs.bodies[i]);
    /* every acknowledged completion: its reply with its sources */
    json_t *replies = all_replies(r);
    for (size_t i = 0; i < cs.n_replies; i++) {
      bool found = false;
      for (size_t k = 0; k < json_array_size(replies) && !found; k++) {
        json_t *rep = json_array_get(replies, k);
        if (strcmp(cph_hc_str(rep, "body"), cs.acked_replies[i]) != 0)
          continue;
        found = true;
        char got[1024];
        sources_text(rep, got, sizeof got);
        if (strcmp(got, cs.acked_sources[i]) != 0)
          fail_with_log(r, "reply %s: sources [%s], the completion carried [%s]",
                        cs.acked_replies[i], got, cs.acked_sources[i]);
      }
      if (!found)
        fail_with_log(r, "acknowledged completion %s has no reply after kill -9",
                      cs.acked_replies[i]);
    }
    /* the turns: a completed one is stored completed; a lease in flight has ended */
    idmap expired_inbox = {0}; /* inbox id -> the expired turn that held it */
    size_t expired = 0;
    for (size_t i = 0; i < n_leases; i++) {
      cycle_lease *l = &leases[i];
      char path[96];
      snprintf(path, sizeof path, "/v1/turns/%lld/complete", (long long)l->turn);
      json_t *c = cph_hc_call(r->d.port, NULL, &st, "POST", path,
                              "{\"lease\":\"%s\",\"cost\":{\"tokens\":1,\"tool_calls\":0},"
                              "\"reply\":{\"body\":\"late-%lld\"}}",
                              l->lease, (long long)l->turn);
      bool already = st == 200 && json_is_true(json_object_get(c, "already"));
      if (l->completed && !already)
        fail_with_log(r, "turn %lld: its completion was acknowledged, completing it again "
                         "answered %d%s instead of `already`",
                      (long long)l->turn, st, st == 200 ? " (a fresh completion)" : "");
      if (!l->completed && !already) {
        const char *msg = cph_hc_str(json_object_get(c, "error"), "message");
        if (st != 409 || !strstr(msg, "expired"))
          fail_with_log(r, "turn %lld leased before the crash: completing it after the restart "
                           "answered %d '%s', want 409 expired (no lease survives a restart)",
                        (long long)l->turn, st, msg);
        expired++;
        for (int k = 0; k < l->n_inbox; k++)
          idmap_set(&expired_inbox, l->inbox[k], l->turn);
      } /* else: its completion landed, the answer was lost in the crash: acknowledged nothing */
      json_decref(c);
    }
    /* drain: nothing consumed comes back; what the expired leases held does */
    idmap by_inbox = {0};
    replies_by_inbox(r, replies, &by_inbox);
    json_decref(replies);
    size_t drained = drain(r, &cs, &by_inbox);
    idmap_free(&by_inbox);
    replies = all_replies(r);
    replies_by_inbox(r, replies, &by_inbox);
    /* the input of every expired lease was staged again: a drain turn consumed it */
    for (size_t k = 0; k < json_array_size(replies); k++) {
      json_t *rep = json_array_get(replies, k);
      json_t *src = json_object_get(rep, "source_inbox_ids");
      for (size_t i = 0; i < json_array_size(src); i++) {
        int64_t inbox = json_integer_value(json_array_get(src, i));
        if (idmap_get(&expired_inbox, inbox) && strncmp(cph_hc_str(rep, "body"), "drain-", 6) != 0)
          fail_with_log(r, "inbox message %lld of expired turn %lld was consumed by '%s', not "
                           "by a turn after the restart",
                        (long long)inbox, (long long)idmap_get(&expired_inbox, inbox),
                        cph_hc_str(rep, "body"));
      }
    }
    json_decref(replies);
    /* every acknowledged event consumed exactly once, over the replies before and after */
    idmap consumed = {0};
    for (size_t i = 0; i < by_inbox.cap; i++) {
      if (!by_inbox.v[i])
        continue;
      int64_t ev = idmap_get(&cs.inbox_event, (int64_t)i);
      if (!ev)
        fail_with_log(r, "reply %lld names inbox message %zu, which no lease ever handed out",
                      (long long)by_inbox.v[i], i);
      idmap_set(&consumed, ev, idmap_get(&consumed, ev) + 1);
    }
    for (size_t i = 0; i < cs.n_events; i++)
      if (idmap_get(&consumed, cs.acked_events[i]) != 1)
        fail_with_log(r, "acknowledged event %lld (%s) was consumed %lld times",
                      (long long)cs.acked_events[i], cs.bodies[i],
                      (long long)idmap_get(&consumed, cs.acked_events[i]));
    print_message("cycle %d: %zu events, %zu completions acknowledged, %zu leases expired by "
                  "the restart, %zu turns drained\n",
                  it, cs.n_events, cs.n_replies, expired, drained);
    total_events += cs.n_events;
    total_completions += cs.n_replies;
    total_expired += expired;
    idmap_free(&consumed);
    idmap_free(&by_inbox);
    idmap_free(&expired_inbox);
    for (size_t i = 0; i < cs.n_replies; i++)
      free(cs.acked_sources[i]);
    free(cs.acked_sources);
    free(cs.acked_replies);
    free(cs.acked_events);
    free(cs.bodies);
    idmap_free(&cs.inbox_event);
    idmap_free(&cs.event_body_at);
    free(leases);
    run_end(r);
  }
  print_message("cycle: %zu events, %zu completions acknowledged over %d kills, all there; %zu "
                "leases expired by the restarts, their input staged again\n",
                total_events, total_completions, n_seeds, total_expired);
  assert_true(total_events > 0);
}

/* ================================================================ gc_commit */

static const char *WORDS[] = {"amber",  "basalt", "cobalt", "dune",   "ember",  "fjord",
                              "garnet", "harbor", "indigo", "jasper", "kelp",   "lagoon",
                              "marble", "nectar", "onyx",   "pollen", "quartz", "russet",
                              "saffron", "tundra", "umber",  "velvet", "willow", "zephyr"};

typedef struct gc_mem {
  char text[160];
  int64_t id;
} gc_mem;

/* Searches session g for text; the memories found (new reference). */
static json_t *search(crash_run *r, const char *text) {
  char path[512], q[320];
  size_t o = 0;
  for (const char *p = text; *p && o + 4 < sizeof q; p++) {
    if (*p == ' ' || *p == ':' || *p == '#' || *p == '+' || *p == '&')
      o += (size_t)snprintf(q + o, sizeof q - o, "%%%02X", (unsigned char)*p);
    else
      q[o++] = *p;
  }
  q[o] = '\0';
  snprintf(path, sizeof path, "/v1/memories/search?session=g&k=100&q=%s", q);
  json_t *j = get_ok(r, path);
  json_t *mems = json_incref(json_object_get(j, "memories"));
  json_decref(j);
  return mems;
}

static bool hits_have(const json_t *hits, int64_t id, const char *kind) {
  for (size_t i = 0; i < json_array_size(hits); i++) {
    json_t *h = json_array_get(hits, i);
    if (cph_hc_int(h, "id") == id && (!kind || strcmp(cph_hc_str(h, "kind"), kind) == 0))
      return true;
  }
  return false;
}

/* The child: the gc_plan jobs ("J job_id" each), then ingest traffic until the crash. */
static void gc_driver(int port, const char *ack, uint64_t arg) {
  (void)arg;
  const char *plans = getenv("CPH_CRASH_GC_PLANS"); /* "a,b,c;d,e,f;..." from the parent */
  char *copy = strdup(plans ? plans : ""), *save = NULL;
  for (char *g = strtok_r(copy, ";", &save); g; g = strtok_r(NULL, ";", &save)) {
    int st;
    json_t *j = cph_hc_call(port, NULL, &st, "POST", "/v1/maintenance/jobs",
                            "{\"job\":\"gc_plan\",\"args\":{\"sources\":[%s]}}", g);
    if (st == 202)
      cph_hc_append_line(ack, "J %lld %s", (long long)cph_hc_int(j, "job_id"), g);
    else if (st != -1)
      cph_hc_append_line(ack, "X gc_plan %d", st);
    json_decref(j);
    if (st != 202)
      break;
  }
  free(copy);
  for (int n = 0; n < 100000; n++) {
    int st;
    json_decref(cph_hc_call(port, NULL, &st, "POST", "/v1/events",
                            "{\"events\":[{\"channel\":\"noise\",\"sender\":\"n\",\"body\":\"noise %d\"}]}", n));
    if (st != 200)
      break;
    cph_hc_sleep_ms(3);
  }
}

typedef struct gc_group {
  int64_t id;
  char state[16];
  int64_t summary_id;
  int64_t sources[GC_GROUP_SIZE];
  size_t n_sources;
} gc_group;

/* This iteration's groups (those whose sources are all among mems), by id. */
static size_t groups_of(crash_run *r, const gc_mem *mems, size_t n_mems, gc_group *out,
                        size_t max) {
  json_t *j = get_ok(r, "/v1/gc/groups?limit=1000");
  json_t *groups = json_object_get(j, "groups");
  size_t n = 0;
  for (size_t i = 0; i < json_array_size(groups) && n < max; i++) {
    json_t *g = json_array_get(groups, i);
    json_t *src = json_object_get(g, "source_ids");
    bool ours = json_array_size(src) == GC_GROUP_SIZE;
    for (size_t k = 0; ours && k < json_array_size(src); k++) {
      int64_t id = json_integer_value(json_array_get(src, k));
      bool found = false;
      for (size_t m = 0; m < n_mems && !found; m++)
        found = mems[m].id == id;
      ours = found;
    }
    if (!ours)
      continue;
    gc_group *o = &out[n++];
    o->id = cph_hc_int(g, "group_id");
    snprintf(o->state, sizeof o->state, "%s", cph_hc_str(g, "state"));
    o->summary_id = cph_hc_int(g, "summary_id");
    o->n_sources = json_array_size(src);
    for (size_t k = 0; k < o->n_sources; k++)
      o->sources[k] = json_integer_value(json_array_get(src, k));
  }
  json_decref(j);
  return n;
}

static const char *text_of(const gc_mem *mems, size_t n, int64_t id) {
  for (size_t i = 0; i < n; i++)
    if (mems[i].id == id)
      return mems[i].text;
  return NULL;
}

/* Checks every group against what search shows; a group that commits while we look is looked
 * at again. want_summary_ms > 0: a committed group's summary must turn up within that long
 * (its embedding runs after the commit). Returns how many groups were committed. */
static size_t check_groups(crash_run *r, const gc_mem *mems, size_t n_mems, int want_summary_ms) {
  for (int attempt = 0; attempt < 50; attempt++) {
    gc_group before[GC_GROUPS * 2], after[GC_GROUPS * 2];
    size_t n = groups_of(r, mems, n_mems, before, GC_GROUPS * 2);
    size_t committed = 0;
    for (size_t g = 0; g < n; g++) {
      bool is_committed = strcmp(before[g].state, "committed") == 0;
      committed += is_committed;
      if (is_committed && !before[g].summary_id)
        fail_with_log(r, "group %lld is committed without a summary_id", (long long)before[g].id);
      if (!is_committed && before[g].summary_id)
        fail_with_log(r, "group %lld is %s with summary_id %lld", (long long)before[g].id,
                      before[g].state, (long long)before[g].summary_id);
      if (is_committed) { /* the group's own page says the same */
        char path[64];
        snprintf(path, sizeof path, "/v1/gc/groups/%lld", (long long)before[g].id);
        json_t *one = get_ok(r, path);
        if (strcmp(cph_hc_str(one, "state"), "committed") != 0 ||
            cph_hc_int(one, "summary_id") != before[g].summary_id)
          fail_with_log(r, "GET %s: state %s summary_id %lld, the list said committed with %lld",
                        path, cph_hc_str(one, "state"), (long long)cph_hc_int(one, "summary_id"),
                        (long long)before[g].summary_id);
        json_decref(one);
      }
      for (size_t k = 0; k < before[g].n_sources; k++) {
        const char *text = text_of(mems, n_mems, before[g].sources[k]);
        json_t *hits = search(r, text);
        bool source_found = hits_have(hits, before[g].sources[k], "raw");
        json_decref(hits);
        if (is_committed && source_found)
          fail_with_log(r, "group %lld is committed but its source %lld is still found",
                        (long long)before[g].id, (long long)before[g].sources[k]);
        if (!is_committed && !source_found) {
          /* gone: only a committed group (this one just now, or another that shares the
           * source) may have deleted it */
          gc_group now[GC_GROUPS * 2];
          size_t m = groups_of(r, mems, n_mems, now, GC_GROUPS * 2);
          bool accounted = false;
          for (size_t x = 0; x < m; x++)
            for (size_t y = 0; y < now[x].n_sources; y++)
              accounted |= now[x].sources[y] == before[g].sources[k] &&
                           strcmp(now[x].state, "committed") == 0;
          if (!accounted)
            fail_with_log(r, "group %lld is %s but its source %lld cannot be found, and no "
                          "committed group holds it (deleted without a summary)",
                          (long long)before[g].id, before[g].state,
                          (long long)before[g].sources[k]);
        }
      }
      if (is_committed && want_summary_ms > 0) {
        bool found = false;
        int64_t deadline = cph_hc_now_ms() + want_summary_ms;
        const char *text = text_of(mems, n_mems, before[g].sources[0]);
        while (!found && cph_hc_now_ms() < deadline) {
          json_t *hits = search(r, text);
          found = hits_have(hits, before[g].summary_id, "summary");
          json_decref(hits);
          if (!found)
            cph_hc_sleep_ms(50);
        }
        if (!found)
          fail_with_log(r, "group %lld is committed but its summary %lld is never found",
                        (long long)before[g].id, (long long)before[g].summary_id);
      }
    }
    /* a source is in at most one committed group */
    for (size_t g = 0; g < n; g++)
      for (size_t h = g + 1; h < n; h++)
        for (size_t a = 0; a < before[g].n_sources; a++)
          for (size_t b = 0; b < before[h].n_sources; b++)
            if (before[g].sources[a] == before[h].sources[b] &&
                strcmp(before[g].state, "committed") == 0 &&
                strcmp(before[h].state, "committed") == 0)
              fail_with_log(r, "memory %lld was compacted by groups %lld and %lld",
                            (long long)before[g].sources[a], (long long)before[g].id,
                            (long long)before[h].id);
    /* a stable picture: nobody committed while we looked */
    size_t n2 = groups_of(r, mems, n_mems, after, GC_GROUPS * 2);
    bool stable = n2 == n;
    for (size_t g = 0; stable && g < n; g++)
      stable = after[g].id == before[g].id &&
               (strcmp(after[g].state, "committed") == 0) == (strcmp(before[g].state, "committed") == 0);
    if (stable)
      return committed;
  }
  fail_with_log(r, "the gc groups never held still long enough to check");
  return 0;
}

/* Pauses (or resumes) the janitor, whose turns run the maintenance jobs; a pause waits for a
 * running job turn to end. */
static void janitor_pause(crash_run *r, bool pause) {
  int st;
  json_decref(cph_hc_call(r->d.port, NULL, &st, "PUT", "/v1/sessions/janitor",
                          "{\"paused\":%s}", pause ? "true" : "false"));
  if (st != 200)
    fail_with_log(r, "%s the janitor: status %d", pause ? "pausing" : "resuming", st);
  for (int64_t deadline = cph_hc_now_ms() + 10000; pause && cph_hc_now_ms() < deadline;) {
    json_t *j = get_ok(r, "/v1/sessions/janitor");
    bool running = strcmp(cph_hc_str(j, "state"), "running") == 0;
    json_decref(j);
    if (!running)
      return;
    cph_hc_sleep_ms(5);
  }
}

static void test_kill_9_during_gc_commit_leaves_no_group_half_applied(void **state) {
  (void)state;
  crash_run *r = run_start("crash-gc");
  int st;
  json_decref(cph_hc_call(r->d.port, NULL, &st, "POST", "/v1/sessions",
                          "{\"id\":\"g\",\"class\":\"interactive\",\"subscribe\":[\"gch\"]}"));
  assert_int_equal(st, 200);
  int n_iter = iterations(GC_ITERATIONS);
  size_t at_crash[4] = {0}; /* groups found planned/summarized/committed/aborted after the kill */
  for (int it = 0; it < n_iter; it++) {
    /* mint 18 memories through a completion */
    json_decref(cph_hc_call(r->d.port, NULL, &st, "POST", "/v1/events",
                            "{\"events\":[{\"channel\":\"gch\",\"sender\":\"u\",\"body\":\"mint %d\"}]}", it));
    assert_int_equal(st, 200);
    json_t *j = cph_hc_call(r->d.port, NULL, &st, "POST", "/v1/turns/lease",
                            "{\"worker\":\"minter\",\"wait_ms\":5000}");
    assert_int_equal(st, 200);
    json_t *turn = json_object_get(j, "turn");
    gc_mem mems[GC_MEMORIES];
    char body[8192];
    size_t used = (size_t)snprintf(body, sizeof body,
                                   "{\"lease\":\"%s\",\"cost\":{\"tokens\":1,\"tool_calls\":0},\"memories\":[",
                                   cph_hc_str(turn, "lease"));
    for (int m = 0; m < GC_MEMORIES; m++) {
      snprintf(mems[m].text, sizeof mems[m].text, "crash %d fact %d: %s %s %s and %s", it, m,
               WORDS[cph_hc_rand_range(&g_rng, 0, 23)], WORDS[cph_hc_rand_range(&g_rng, 0, 23)],
               WORDS[cph_hc_rand_range(&g_rng, 0, 23)], WORDS[cph_hc_rand_range(&g_rng, 0, 23)]);
      mems[m].id = 0;
      used += (size_t)snprintf(body + used, sizeof body - used, "%s{\"text\":\"%s\"}", m ? "," : "",
                               mems[m].text);
    }
    snprintf(body + used, sizeof body - used, "]}");
    char path[96];
    snprintf(path, sizeof path, "/v1/turns/%lld/complete", (long long)cph_hc_int(turn, "id"));
    json_decref(cph_hc_call(r->d.port, NULL, &st, "POST", path, "%s", body));
    assert_int_equal(st, 200);
    json_decref(j);
    /* wait until each is searchable (at once: queued embeddings match lexically); that gives
     * its id */
    int64_t deadline = cph_hc_now_ms() + 60000;
    for (int m = 0; m < GC_MEMORIES; m++) {
      while (!mems[m].id) {
        json_t *hits = search(r, mems[m].text);
        for (size_t h = 0; h < json_array_size(hits); h++)
          if (strcmp(cph_hc_str(json_array_get(hits, h), "text"), mems[m].text) == 0)
            mems[m].id = cph_hc_int(json_array_get(hits, h), "id");
        json_decref(hits);
        if (!mems[m].id) {
          if (cph_hc_now_ms() > deadline)
            fail_with_log(r, "memory '%s' was never embedded", mems[m].text);
          cph_hc_sleep_ms(20);
        }
      }
    }
    /* the groups: a random partition of the 18 into threes */
    int order[GC_MEMORIES];
    for (int m = 0; m < GC_MEMORIES; m++)
      order[m] = m;
    for (int m = GC_MEMORIES - 1; m > 0; m--) {
      int k = (int)cph_hc_rand_range(&g_rng, 0, m), t = order[m];
      order[m] = order[k];
      order[k] = t;
    }
    char plans[512];
    size_t pu = 0;
    int overlap_at = (int)cph_hc_rand_range(&g_rng, 0, GC_GROUPS);
    for (int g = 0, p = 0; p < GC_PLANS; p++) {
      if (p == overlap_at) /* one source each from the groups 0, 1 and 2 */
        pu += (size_t)snprintf(plans + pu, sizeof plans - pu, "%s%lld,%lld,%lld", p ? ";" : "",
                               (long long)mems[order[0]].id, (long long)mems[order[4]].id,
                               (long long)mems[order[8]].id);
      else {
        pu += (size_t)snprintf(plans + pu, sizeof plans - pu, "%s%lld,%lld,%lld", p ? ";" : "",
                               (long long)mems[order[3 * g]].id,
                               (long long)mems[order[3 * g + 1]].id,
                               (long long)mems[order[3 * g + 2]].id);
        g++;
      }
    }
    setenv("CPH_CRASH_GC_PLANS", plans, 1);
    spawn(r, gc_driver, 0);
    /* kill while commits are under way: once a first group is summarised (its gc_commit is
     * queued), after a random few milliseconds more */
    int64_t t0 = cph_hc_now_ms();
    for (bool ready = false; !ready && cph_hc_now_ms() - t0 < 10000;) {
      gc_group gs[GC_GROUPS * 2];
      size_t n = groups_of(r, mems, GC_MEMORIES, gs, GC_GROUPS * 2);
      for (size_t g = 0; g < n; g++)
        ready |= strcmp(gs[g].state, "planned") != 0;
      if (!ready)
        cph_hc_sleep_ms(2);
    }
    int delay = (int)cph_hc_rand_range(&g_rng, 0, 50);
    cph_hc_sleep_ms(delay);
    crash(r);
    char *acks = collect_acks(r);
    unsetenv("CPH_CRASH_GC_PLANS");
    run_restart(r);

    /* the picture right after the restart */
    gc_group gs[GC_GROUPS * 2];
    size_t n = groups_of(r, mems, GC_MEMORIES, gs, GC_GROUPS * 2);
    size_t counts[4] = {0};
    for (size_t g = 0; g < n; g++) {
      static const char *const states[] = {"planned", "summarized", "committed", "aborted"};
      for (int s = 0; s < 4; s++)
        if (strcmp(gs[g].state, states[s]) == 0)
          counts[s]++;
    }
    for (int s = 0; s < 4; s++)
      at_crash[s] += counts[s];
    /* hold maintenance still while the picture is checked (a job turn that started before
     * the pause may still finish: the check then looks again) */
    janitor_pause(r, true);
    size_t committed = check_groups(r, mems, GC_MEMORIES, 0);
    janitor_pause(r, false);
    /* every acknowledged job is there */
    json_t *jobs = get_ok(r, "/v1/maintenance/jobs?limit=1000");
    size_t acked_jobs = 0;
    long long job_ids[GC_PLANS];
    char job_sources[GC_PLANS][96];
    char *save = NULL;
    for (char *line = strtok_r(acks, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
      if (line[0] == 'X')
        fail_with_log(r, "the driver saw %s", line + 2);
      long long job;
      char src[96];
      if (line[0] != 'J' || sscanf(line, "J %lld %95s", &job, src) != 2 || acked_jobs == GC_PLANS)
        continue;
      job_ids[acked_jobs] = job;
      sort_csv(src, job_sources[acked_jobs], sizeof job_sources[acked_jobs]);
      acked_jobs++;
      bool found = false;
      json_t *list = json_object_get(jobs, "jobs");
      for (size_t k = 0; k < json_array_size(list) && !found; k++)
        found = cph_hc_int(json_array_get(list, k), "id") == job;
      if (!found)
        fail_with_log(r, "acknowledged gc_plan job %lld is gone after kill -9", job);
    }
    json_decref(jobs);
    free(acks);
    /* maintenance runs on: every acknowledged plan ends (done; or failed, when another group
     * compacted one of its sources first) and every group of this iteration ends committed or
     * aborted */
    char job_state[GC_PLANS][16], job_error[GC_PLANS][160];
    deadline = cph_hc_now_ms() + 60000;
    for (bool settled = false; !settled;) {
      /* The jobs first, then the groups: a plan and the group it makes commit together, so a
       * plan seen done has its group in the later read. (Read the other way round, a plan run
       * again after the restart could finish between the two reads: seen done, its group not
       * yet seen — which this test once reported as a plan that made no group.) */
      json_t *now = get_ok(r, "/v1/maintenance/jobs?limit=1000");
      json_t *list = json_object_get(now, "jobs");
      settled = true;
      for (size_t a = 0; a < acked_jobs; a++) {
        job_state[a][0] = '\0';
        for (size_t k = 0; k < json_array_size(list); k++) {
          json_t *jb = json_array_get(list, k);
          if (cph_hc_int(jb, "id") != job_ids[a])
            continue;
          snprintf(job_state[a], sizeof job_state[a], "%s", cph_hc_str(jb, "state"));
          snprintf(job_error[a], sizeof job_error[a], "%s", cph_hc_str(jb, "error"));
        }
        settled &= strcmp(job_state[a], "done") == 0 || strcmp(job_state[a], "failed") == 0;
      }
      n = groups_of(r, mems, GC_MEMORIES, gs, GC_GROUPS * 2);
      for (size_t g = 0; g < n; g++)
        settled &= strcmp(gs[g].state, "committed") == 0 || strcmp(gs[g].state, "aborted") == 0;
      if (!settled && cph_hc_now_ms() > deadline) {
        char *dump = json_dumps(list, JSON_COMPACT);
        fprintf(stderr, "jobs: %s\n", dump);
        free(dump);
        fail_with_log(r, "gc groups or jobs did not settle after the restart (%zu groups, %zu "
                      "jobs acknowledged)", n, acked_jobs);
      }
      json_decref(now);
      if (!settled)
        cph_hc_sleep_ms(50);
    }
    /* a plan that ran made its group; one that failed lost a source to a committed group */
    for (size_t a = 0; a < acked_jobs; a++) {
      bool made = false, lost_to_committed = false;
      for (size_t g = 0; g < n; g++) {
        char raw_got[96], got[96];
        snprintf(raw_got, sizeof raw_got, "%lld,%lld,%lld", (long long)gs[g].sources[0],
                 (long long)gs[g].sources[1], (long long)gs[g].sources[2]);
        sort_csv(raw_got, got, sizeof got);
        bool same = strcmp(got, job_sources[a]) == 0;
        made |= same;
        if (same || strcmp(gs[g].state, "committed") != 0)
          continue;
        for (size_t x = 0; x < gs[g].n_sources; x++) {
          char id[24];
          snprintf(id, sizeof id, "%lld", (long long)gs[g].sources[x]);
          char padded[128], needle[28];
          snprintf(padded, sizeof padded, ",%.96s,", job_sources[a]);
          snprintf(needle, sizeof needle, ",%s,", id);
          lost_to_committed |= strstr(padded, needle) != NULL;
        }
      }
      if (strcmp(job_state[a], "done") == 0 && !made)
        fail_with_log(r, "acknowledged gc_plan job %lld (%s) is done but made no group",
                      job_ids[a], job_sources[a]);
      if (strcmp(job_state[a], "failed") == 0 &&
          (!lost_to_committed || !strstr(job_error[a], "deleted")))
        fail_with_log(r, "acknowledged gc_plan job %lld (%s) failed: %s", job_ids[a],
                      job_sources[a], job_error[a]);
    }
    size_t final_committed = check_groups(r, mems, GC_MEMORIES, 20000);
    print_message("gc %2d: kill %2d ms after the first summary; after the restart %zu planned, "
                  "%zu summarized, %zu committed (%zu checked), %zu aborted; %zu of %zu jobs "
                  "acknowledged; %zu committed in the end\n",
                  it, delay, counts[0], counts[1], counts[2], committed, counts[3], acked_jobs,
                  (size_t)GC_PLANS, final_committed);
  }
  print_message("gc: over %d kills, groups found after the restart: %zu planned, %zu summarized, "
                "%zu committed, %zu aborted; none half applied\n",
                n_iter, at_crash[0], at_crash[1], at_crash[2], at_crash[3]);
  run_end(r);
}

/* Found by the overlapping plans above: a gc_plan whose explicit sources are unknown (or were
 * compacted already) ends failed with the reason — it used to stay "running" for ever and run
 * again at every restart. */
static void test_gc_plan_of_missing_memories_fails_once_and_stays_failed(void **state) {
  (void)state;
  crash_run *r = run_start("crash-badplan");
  int st;
  json_t *j = cph_hc_call(r->d.port, NULL, &st, "POST", "/v1/maintenance/jobs",
                          "{\"job\":\"gc_plan\",\"args\":{\"sources\":[999,1000]}}");
  assert_int_equal(st, 202);
  int64_t job = cph_hc_int(j, "job_id");
  json_decref(j);
  char state_seen[16] = "";
  for (int64_t deadline = cph_hc_now_ms() + 20000; cph_hc_now_ms() < deadline;) {
    json_t *list = get_ok(r, "/v1/maintenance/jobs?limit=1000");
    json_t *jobs = json_object_get(list, "jobs");
    for (size_t k = 0; k < json_array_size(jobs); k++) {
      json_t *jb = json_array_get(jobs, k);
      if (cph_hc_int(jb, "id") != job)
        continue;
      snprintf(state_seen, sizeof state_seen, "%s", cph_hc_str(jb, "state"));
      if (strcmp(state_seen, "failed") == 0 && !strstr(cph_hc_str(jb, "error"), "999"))
        fail_msg("the failed plan's error does not name the memory: %s", cph_hc_str(jb, "error"));
    }
    json_decref(list);
    if (strcmp(state_seen, "failed") == 0)
      break;
    cph_hc_sleep_ms(20);
  }
  if (strcmp(state_seen, "failed") != 0)
    fail_msg("gc_plan of unknown memories: state '%s', want failed", state_seen);
  /* a restart leaves it failed, with its one attempt */
  assert_int_equal(cph_test_daemon_signal_wait(&r->d, SIGTERM), 0);
  run_restart(r);
  cph_hc_sleep_ms(300);
  json_t *list = get_ok(r, "/v1/maintenance/jobs?limit=1000");
  json_t *jobs = json_object_get(list, "jobs");
  for (size_t k = 0; k < json_array_size(jobs); k++) {
    json_t *jb = json_array_get(jobs, k);
    if (cph_hc_int(jb, "id") == job) {
      assert_string_equal(cph_hc_str(jb, "state"), "failed");
      assert_int_equal(cph_hc_int(jb, "attempts"), 1);
    }
  }
  json_decref(list);
  run_end(r);
}

int main(void) {
  const char *s = getenv("CPH_TEST_SEED");
  g_seed = s && *s ? strtoull(s, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 20);
  g_rng.s = g_seed;
  printf("test_crash seed %llu (CPH_TEST_SEED=%llu reproduces it)\n", (unsigned long long)g_seed,
         (unsigned long long)g_seed);
  fflush(stdout);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(test_kill_9_during_ingest_loses_no_acknowledged_event, teardown),
      cmocka_unit_test_teardown(test_kill_9_during_completions_loses_no_acknowledged_completion,
                                teardown),
      cmocka_unit_test_teardown(test_kill_9_mid_cycle_keeps_what_was_acknowledged_and_expires_leases,
                                teardown),
      cmocka_unit_test_teardown(test_kill_9_during_gc_commit_leaves_no_group_half_applied,
                                teardown),
      cmocka_unit_test_teardown(test_gc_plan_of_missing_memories_fails_once_and_stays_failed,
                                teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
