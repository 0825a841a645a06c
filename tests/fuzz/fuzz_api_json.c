/* libFuzzer target: the request body of every API route that takes one, end to end through
 * the server's own code.
 *
 * What runs is cephalond minus its socket: the real routing table, authentication, body
 * decoding (JSON, or msgpack through server/mpjson.c), the :max-string-bytes walk, the route
 * handler's field validation into a cph_op, the engine applying the op in a pass over a real
 * LMDB environment (a temp dir), the op's `done` building the answer, and the answer's
 * encoding; maintenance jobs a body queued are then run as cephalond's maintenance workers
 * run them (run_maintenance). Only server/main.c is left out (it owns the listening socket
 * and the event loop); the five functions of server/server.c that need its loop are below
 * (so that archive member is never linked). Input format: tests/fuzz/fuzz_api.h.
 *
 * The seam: a libevent request built without a connection. event2/http_struct.h (a public,
 * if deprecated, libevent header) lets the harness set the method, URI, headers and body
 * that libevent's parser would have; cph_http_dispatch() takes it from there exactly as it
 * takes a request from the network. libevent frees a request that has no connection when
 * it is answered (evhttp_send_reply), as for a client that went away. The link option
 * --wrap=evhttp_send_reply (CMakeLists.txt) lets the harness see each answer before
 * libevent frees it.
 *
 * Checked per input, beyond ASan/UBSan/LSan: exactly one answer; its status is one the API
 * documents for a bad or good request (never 500: malformed input must end in a 4xx);
 * its body is well-formed JSON (or msgpack when asked for) and an error answer has the
 * {"error": {"code", "message", "field"}} shape; no request is left alive afterwards.
 *
 * State: one engine serves many inputs (that is what finds bugs in how ops interact), on a
 * virtual clock that advances 10 ms per input, and is rebuilt from an empty directory every
 * FUZZ_API_RESET inputs (env, default 2000) so it stays small. A crash found this way is
 * normally reproduced by running the saved input alone; set FUZZ_API_RESET=1 to give every
 * input a fresh engine. */
#define _XOPEN_SOURCE 700
#include <event2/buffer.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/http_struct.h>
#include <event2/keyvalq_struct.h>
#include <ftw.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cephalon/cephalon.h"
#include "common/clock.h"
#include "common/log.h"
#include "fuzz_api.h"
#include "server/http.h"
#include "server/longpoll.h"
#include "server/mpjson.h"
#include "server/routes.h"
#include "server/server.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Limits the fuzzer can cross (run.sh gives it -max_len=20000), with :max-string-bytes
 * above the fixed buffers the handlers format strings into (4096 bytes), so what overflows
 * them at the default limit (65536) overflows them here too; budgets and credits so large
 * they never stop a turn; short leases so leased turns do not pile up. */
static const char FUZZ_POLICY[] =
    "{:server {:max-body-bytes 16384 :max-events-per-request 8 :max-string-bytes 6000\n"
    "          :max-long-polls-per-client 2 :max-wait-ms 1000 :map-size-mb 256\n"
    "          :log-level :error}\n"
    " :store {:sync :none}\n"
    " :leases {:ttl-seconds 2 :max-attempts 3}\n"
    " :sessions {:max-queue 32 :max-batch 4}\n"
    " :scheduler {:concurrency 8\n"
    "             :lanes {:interactive {:turns 100000000 :tool-calls 100000000}\n"
    "                     :operational {:turns 100000000 :tool-calls 100000000}\n"
    "                     :maintenance {:turns 100000000 :tool-calls 100000000}}\n"
    "             :credits {:refill-per-second 1000000 :max 1000000}}}\n";

#define CLOCK_STEP_NS (10 * CPH_NS_PER_MS)
#define MAX_PASSES 64

/* Path parameters by FUZZ_API_PARAM(flags). */
static const char *const session_params[8] = {
    "s1", "s2", "janitor", "ghost", "s1", "a%2Fb", "%FF%FE",
    /* 130 bytes: longer than a session id may be */
    ("x123456789012345678901234567890123456789012345678901234567890123456789012345678901234567"
     "8901234567890123456789012345678901234567890")};
static const char *const turn_params[8] = {NULL /* the live turn */, "1", "2", "0", "-1",
                                           "18446744073709551616", "abc", "3"};

/* ================================================================ what server.c provides */

void cph_srv_schedule_pass(cph_srv *s) { s->pass_scheduled = true; }
void cph_srv_wake_replies_later(cph_srv *s) { s->replies_scheduled = true; }
void cph_srv_request_closed(cph_srv *s) {
  if (s->open_reqs > 0)
    s->open_reqs--;
}
void cph_srv_reply_flushed(cph_srv *s) {
  if (s->unflushed > 0)
    s->unflushed--;
}
int cph_srv_reload(cph_srv *s, cph_err *err) {
  (void)s;
  return cph_err_set(err, CPH_EIO, "policy reload is not part of the fuzzed surface");
}
/* the harness never stops (the cluster flow, linked in, calls it when its log settles) */
void cph_srv_maybe_finish_stop(cph_srv *s) { (void)s; }

/* ================================================================ answers */

static struct {
  int count; /* answers to the current request */
  int status;
  char *body; /* NUL-terminated copy */
  size_t len;
} answer;

void __real_evhttp_send_reply(struct evhttp_request *req, int code, const char *reason,
                              struct evbuffer *databuf);
void __wrap_evhttp_send_reply(struct evhttp_request *req, int code, const char *reason,
                              struct evbuffer *databuf);

/* Sees the answer, then lets libevent send it (which frees a connection-less request). */
void __wrap_evhttp_send_reply(struct evhttp_request *req, int code, const char *reason,
                              struct evbuffer *databuf) {
  answer.count++;
  answer.status = code;
  free(answer.body);
  answer.len = databuf ? evbuffer_get_length(databuf) : 0;
  answer.body = malloc(answer.len + 1);
  if (answer.body) {
    if (answer.len)
      evbuffer_copyout(databuf, answer.body, answer.len);
    answer.body[answer.len] = '\0';
  }
  __real_evhttp_send_reply(req, code, reason, databuf);
}

/* ================================================================ the engine */

static struct {
  bool up;
  char dir[512];
  cph_srv srv; /* srv.clock is the engine's clock too, as in main.c */
  unsigned long reset_every;
  bool verbose;
  unsigned long runs; /* inputs since the engine was opened */
  unsigned long seq;  /* makes the harness's own event bodies unique (no dedupe) */
  bool live;          /* a turn the harness leased, whose lease replaces FUZZ_API_LEASE_MARK */
  uint64_t live_id;
  char live_lease[33];
} H;

static void fuzz_fail(const char *what) {
  fprintf(stderr, "fuzz_api_json: %s\nstatus %d, %d answer(s), body: %s\n", what,
          answer.status, answer.count, answer.body ? answer.body : "(none)");
  abort();
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static void run_passes(void) {
  for (int i = 0; i < MAX_PASSES && (H.srv.pass_scheduled || cph_engine_pass_wanted(H.srv.engine));
       i++) {
    H.srv.pass_scheduled = false;
    cph_engine_run_pass(H.srv.engine);
  }
}

static void op_done(cph_op *op, void *ctx) {
  (void)op;
  *(bool *)ctx = true;
}

/* Applies an op of the harness's own (setup, the live turn, maintenance); returns its rc.
 * *taken (may be NULL) says whether the engine accepted it (and so owns what it hands over). */
static int run_op_taken(cph_op *op, bool *taken) {
  bool done = false;
  op->done = op_done;
  op->ctx = &done;
  int rc = cph_engine_submit(H.srv.engine, op);
  if (taken)
    *taken = rc == CPH_OK;
  if (rc != CPH_OK)
    return rc;
  run_passes();
  if (!done)
    fuzz_fail("an op of the harness was never answered");
  return op->rc;
}

static int run_op(cph_op *op) { return run_op_taken(op, NULL); }

static void create_session(const char *id, cph_lane lane, const char *channel) {
  cph_op op = {.kind = CPH_OP_SESSION_CREATE};
  char *subscribe[] = {(char *)channel};
  op.u.session.in.id = (char *)id;
  op.u.session.in.lane = lane;
  op.u.session.in.subscribe.items = subscribe;
  op.u.session.in.subscribe.count = 1;
  if (run_op(&op) != CPH_OK) {
    fprintf(stderr, "fuzz_api_json: creating session %s: %s\n", id, op.err.msg);
    abort();
  }
  cph_op_clear_results(&op);
}

static void engine_down(void) {
  if (!H.up)
    return;
  cph_longpolls_stop(H.srv.lp);
  run_passes();
  cph_http_release_all(&H.srv);
  cph_longpolls_free(H.srv.lp);
  cph_engine_close(H.srv.engine);
  event_base_free(H.srv.base);
  nftw(H.dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
  memset(&H.srv, 0, sizeof H.srv);
  H.up = false;
  H.live = false;
}

static void engine_up(void) {
  /* $TMPDIR (make fuzz points it into build-fuzz/): a crash leaves its directory behind. */
  const char *tmp = getenv("TMPDIR");
  snprintf(H.dir, sizeof H.dir, "%s/cph-fuzz-api-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(H.dir)) {
    perror("fuzz_api_json: mkdtemp");
    abort();
  }
  cph_err err = {0};
  cph_policy *p = NULL;
  if (cph_policy_load_text("fuzz-policy", FUZZ_POLICY, sizeof FUZZ_POLICY - 1, &p, &err)) {
    fprintf(stderr, "fuzz_api_json: %s\n", err.msg);
    abort();
  }
  memset(&H.srv, 0, sizeof H.srv);
  cph_clock_init_virtual(&H.srv.clock, CPH_NS_PER_S);
  H.srv.listen_loopback = true;
  H.srv.policy_path = "fuzz-policy";
  cph_engine_options eo = {.data_dir = H.dir, .clock = &H.srv.clock};
  if (cph_engine_open(p, &eo, &H.srv.engine, &err) != CPH_OK) {
    fprintf(stderr, "fuzz_api_json: engine: %s\n", err.msg);
    abort();
  }
  H.srv.base = event_base_new();
  H.srv.lp = H.srv.base ? cph_longpolls_new(H.srv.base) : NULL;
  if (!H.srv.lp)
    abort();
  cph_log_set_level(CPH_LOG_ERROR);
  H.up = true;
  H.runs = 0;
  create_session("s1", CPH_LANE_INTERACTIVE, "general");
  create_session("s2", CPH_LANE_OPERATIONAL, "ops");
}

static void at_exit(void) {
  engine_down();
  free(answer.body);
}

/* Leases a turn for the live parameter: stages an event for s1 and leases at once. Leaves
 * H.live false when no turn could be had (then the route gets turn id 1). */
static void ensure_live_turn(void) {
  if (H.live)
    return;
  char body[48];
  snprintf(body, sizeof body, "live turn input %lu", ++H.seq);
  cph_event_in ev = {.channel = "general", .sender = "fuzz-harness", .body = body};
  cph_op ingest = {.kind = CPH_OP_INGEST};
  ingest.u.ingest.events = &ev;
  ingest.u.ingest.n_events = 1;
  run_op(&ingest);
  cph_op_clear_results(&ingest);
  cph_op lease = {.kind = CPH_OP_LEASE};
  lease.u.lease.worker = "fuzz-harness";
  lease.u.lease.deadline_ns = cph_clock_now(&H.srv.clock); /* now or never */
  if (run_op(&lease) == CPH_OK) {
    H.live = true;
    H.live_id = lease.u.lease.turn.id;
    memcpy(H.live_lease, lease.u.lease.turn.lease, sizeof H.live_lease);
  }
  cph_op_clear_results(&lease);
}

/* Runs up to n queued maintenance jobs the way cephalond's maintenance workers do
 * (server/maint_workers.c), but synchronously: lease an internal turn, execute its job with
 * the policy in force, complete the turn with the results. Jobs posted (or enqueued by a
 * completion) with fuzzed args are thereby carried out, not just queued. */
static void run_maintenance(int n) {
  for (int i = 0; i < n; i++) {
    cph_op lease = {.kind = CPH_OP_LEASE};
    lease.u.lease.worker = "fuzz-maint";
    lease.u.lease.internal = true;
    lease.u.lease.deadline_ns = cph_clock_now(&H.srv.clock); /* now or never */
    if (run_op(&lease) != CPH_OK) {
      cph_op_clear_results(&lease);
      return;
    }
    cph_op complete = {.kind = CPH_OP_COMPLETE};
    complete.u.turn.turn_id = lease.u.lease.turn.id;
    memcpy(complete.u.turn.lease, lease.u.lease.turn.lease, sizeof complete.u.turn.lease);
    cph_job_work *work = lease.u.lease.turn.job;
    lease.u.lease.turn.job = NULL;
    cph_op_clear_results(&lease);
    const char *kind = work ? cph_job_kind_name(work->kind) : "no job";
    if (work)
      cph_job_execute(cph_engine_policy(H.srv.engine), work);
    complete.u.turn.job = work; /* the engine frees it once it took the op */
    bool taken;
    int rc = run_op_taken(&complete, &taken);
    if (H.verbose)
      fprintf(stderr, "  maintenance turn %llu (%s): %s\n",
              (unsigned long long)complete.u.turn.turn_id,
              kind, rc ? complete.err.msg : "done");
    if (!taken)
      cph_job_work_free(work);
    cph_op_clear_results(&complete);
  }
}

/* ================================================================ checking an answer */

static bool status_documented(int status) {
  switch (status) {
  case 200: case 202: case 204: /* done */
  case 400: case 404: case 409: case 413: case 429: /* the client's fault (DESIGN §9) */
  case 503: case 507: /* busy, storage full: the server's state, not a bug */
    return true;
  default:
    return false;
  }
}

static void check_answer(bool msgpack_out) {
  if (answer.count != 1)
    fuzz_fail(answer.count ? "more than one answer to one request" : "no answer");
  if (!status_documented(answer.status))
    fuzz_fail("an undocumented status (a request body must never cause a 500)");
  if (answer.status == 204) {
    if (answer.len)
      fuzz_fail("a 204 with a body");
    return;
  }
  json_t *v;
  if (msgpack_out) {
    char err[256];
    v = cph_mpjson_read(answer.body, answer.len, err, sizeof err);
    if (!v)
      fuzz_fail(err);
  } else {
    json_error_t je;
    v = json_loadb(answer.body, answer.len, JSON_REJECT_DUPLICATES, &je);
    if (!v)
      fuzz_fail("the answer is not JSON");
  }
  if (!json_is_object(v))
    fuzz_fail("the answer is not an object");
  if (answer.status >= 400) {
    json_t *e = json_object_get(v, "error");
    json_t *field = json_object_get(e, "field");
    if (!json_is_object(e) || !json_is_string(json_object_get(e, "code")) ||
        !json_is_string(json_object_get(e, "message")) ||
        !(json_is_string(field) || json_is_null(field)))
      fuzz_fail("an error answer without {\"error\": {code, message, field}}");
  }
  json_decref(v);
}

/* ================================================================ one input */

/* A connection-less request as libevent's parser would have left it. */
static struct evhttp_request *make_request(const fuzz_api_route *route, const char *path,
                                           unsigned flags, const uint8_t *body, size_t len) {
  struct evhttp_request *ev = evhttp_request_new(NULL, NULL);
  if (!ev)
    return NULL;
  ev->kind = EVHTTP_REQUEST;
  ev->type = route->method;
  ev->uri = strdup(path);
  ev->uri_elems = evhttp_uri_parse(path);
  struct evkeyvalq *h = evhttp_request_get_input_headers(ev);
  evhttp_add_header(h, "Host", "fuzz");
  evhttp_add_header(h, "Content-Type",
                    flags & FUZZ_API_MSGPACK_IN ? "application/msgpack" : "application/json");
  if (flags & FUZZ_API_MSGPACK_OUT)
    evhttp_add_header(h, "Accept", "application/msgpack");
  if (!ev->uri || !ev->uri_elems || evbuffer_add(evhttp_request_get_input_buffer(ev), body, len)) {
    evhttp_request_free(ev);
    return NULL;
  }
  return ev;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2)
    return 0;
  if (!H.up) {
    const char *every = getenv("FUZZ_API_RESET");
    H.reset_every = every && atol(every) > 0 ? (unsigned long)atol(every) : 2000;
    H.verbose = getenv("FUZZ_API_VERBOSE") != NULL;
    engine_up();
    atexit(at_exit);
  } else if (H.runs >= H.reset_every) {
    engine_down();
    engine_up();
  }
  H.runs++;
  cph_clock_advance(&H.srv.clock, CLOCK_STEP_NS);

  const fuzz_api_route *route = &fuzz_api_routes[data[0] % FUZZ_API_ROUTES];
  unsigned flags = data[1];
  unsigned choice = FUZZ_API_PARAM(flags);
  bool live_request = false;
  char path[256], idbuf[24];
  const char *param = "";
  if (route->param == FUZZ_PARAM_SESSION) {
    param = session_params[choice];
  } else if (route->param == FUZZ_PARAM_TURN) {
    param = turn_params[choice];
    if (!param) {
      ensure_live_turn();
      snprintf(idbuf, sizeof idbuf, "%llu", H.live ? (unsigned long long)H.live_id : 1ull);
      param = idbuf;
      live_request = H.live;
    }
  }
  snprintf(path, sizeof path, route->path, param);

  /* The body, with the live lease in place of its marker. */
  size_t len = size - 2;
  uint8_t *body = malloc(len ? len : 1);
  if (!body)
    return 0;
  memcpy(body, data + 2, len);
  const size_t mark = sizeof FUZZ_API_LEASE_MARK - 1;
  for (size_t i = 0; H.live && len >= mark && i <= len - mark; i++)
    if (memcmp(body + i, FUZZ_API_LEASE_MARK, mark) == 0) {
      memcpy(body + i, H.live_lease, mark);
      i += mark - 1;
    }

  struct evhttp_request *ev = make_request(route, path, flags, body, len);
  free(body);
  if (!ev)
    return 0;
  answer.count = 0;
  answer.status = 0;
  cph_http_dispatch(ev, &H.srv);
  run_passes();
  if (H.srv.lp->leases) {
    /* A lease long-poll: let its wait run out on the engine's clock, as in the daemon. */
    int64_t wait_ms = cph_engine_policy(H.srv.engine)->server.max_wait_ms;
    cph_clock_advance(&H.srv.clock, (wait_ms + 1) * CPH_NS_PER_MS);
    cph_srv_schedule_pass(&H.srv);
    run_passes();
    cph_longpolls_stop(H.srv.lp); /* whatever still waits is withdrawn (204) */
  }
  if (H.srv.reqs || H.srv.open_reqs)
    fuzz_fail("a request is still alive after it was answered");
  check_answer(flags & FUZZ_API_MSGPACK_OUT);
  if (H.verbose) /* FUZZ_API_VERBOSE=1: what each input did (for seeds and debugging) */
    fprintf(stderr, "%s %s -> %d %.300s\n", route->name, path, answer.status,
            flags & FUZZ_API_MSGPACK_OUT ? "(msgpack)" : answer.body);

  if (strcmp(route->name, "job") == 0 || strcmp(route->name, "complete") == 0)
    run_maintenance(4);

  /* The live turn ends when the route ended it, or when the engine no longer knows its lease. */
  if (live_request && (answer.status == 404 || answer.status == 409 ||
                       (answer.status == 200 && strcmp(route->name, "heartbeat") != 0)))
    H.live = false; /* a heartbeat keeps it; complete, fail and requeue end it */
  return 0;
}
