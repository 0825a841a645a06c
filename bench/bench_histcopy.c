/* cephalon-bench history-copies: what a cluster node's loop pays to apply a copy of another
 * node's reply or event into its copy of a channel's history (server/clusterflow.h 14., 15.;
 * core/ingest.c history_copy) — not a DESIGN §12 row.
 *
 * An engine in process (the public API, :sync :none) stores --history N events in one channel
 * (64-byte bodies), then applies copies (cph_event_in.history_only) to it, --batch B to an
 * ingest operation, three ways:
 *   new    each a new event (its own key, a body no entry has): stored — the check that the
 *          channel does not hold it already reads the channel's newest entries in full;
 *   held   each the same event (sender, time, body) as an entry 200 back, under a new key: not
 *          stored again — the check finds it there;
 *   again  the `new` copies once more, same keys: answered by the idempotency key.
 * Prints the engine's wall time per copy for each (the loop's cost: ingest runs on it). */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cephalon/cephalon.h"
#include "cephalon/providers.h"
#include "proc.h"

#define CHANNEL "team"
#define HELD_BACK 200 /* how far back the `held` copies' originals are */
#define KEY_BYTES 32

typedef struct slot {
  cph_op op;
  bool busy, failed;
  size_t stored, duplicate; /* of its events, by result */
} slot;

static void on_done(cph_op *op, void *ctx) {
  slot *s = ctx;
  s->busy = false;
  if (op->rc != CPH_OK) {
    s->failed = true;
    fprintf(stderr, "cephalon-bench history-copies: operation failed: %s\n", op->err.msg);
  }
  for (size_t i = 0; op->u.ingest.results && i < op->u.ingest.n_events; i++) {
    s->stored += op->u.ingest.results[i].status == CPH_EV_STORED ||
                 op->u.ingest.results[i].status == CPH_EV_QUEUED;
    s->duplicate += op->u.ingest.results[i].status == CPH_EV_DUPLICATE;
  }
  cph_op_clear_results(op);
}

/* Ingests evs[0..n) in operations of `batch`, one at a time (each its own pass, as a node
 * applies a batch of log messages); adds up the results in *s. 0 or -1. */
static int apply(cph_engine *e, cph_event_in *evs, size_t n, size_t batch, slot *s) {
  for (size_t done = 0; done < n; done += batch) {
    memset(&s->op, 0, sizeof s->op);
    s->op.kind = CPH_OP_INGEST;
    s->op.done = on_done;
    s->op.ctx = s;
    s->op.u.ingest.events = evs + done;
    s->op.u.ingest.n_events = n - done < batch ? n - done : batch;
    s->busy = true;
    if (cph_engine_submit(e, &s->op) != CPH_OK)
      return -1;
    for (int guard = 0; s->busy && guard < 100; guard++)
      if (cph_engine_run_pass(e) != CPH_OK)
        return -1;
    if (s->busy || s->failed)
      return -1;
  }
  return 0;
}

static void usage(FILE *f) {
  fprintf(f, "usage: cephalon-bench history-copies [--history N] [--copies K] [--batch B]\n"
             "  --history N  events in the channel first (default 1000)\n"
             "  --copies K   copies applied each way (default 5000)\n"
             "  --batch B    copies to an ingest operation (default 64)\n");
}

int cph_bench_history_copies(int argc, char **argv) {
  uint64_t history = 1000, copies = 5000, batch = 64;
  for (int i = 1; i < argc;) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      usage(stdout);
      return 0;
    }
    int r;
    if ((r = cph_bench_opt_u64(argc, argv, &i, "--history", HELD_BACK + 1, 1000000, &history)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--copies", 1, 1000000, &copies)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--batch", 1, 1000, &batch))) {
      if (r < 0)
        return 2;
      continue;
    }
    fprintf(stderr, "cephalon-bench history-copies: bad option \"%s\"\n", argv[i]);
    usage(stderr);
    return 2;
  }
  char policy_text[2048];
  if (cph_bench_policy(policy_text, sizeof policy_text, "none", 64, 10, 1, NULL))
    return 1;
  int status = 1;
  cph_policy *policy = NULL;
  cph_engine *e = NULL;
  cph_err err = {0};
  char *dir = cph_bench_tmpdir("histcopy");
  size_t n = (size_t)(history > copies ? history : copies);
  cph_event_in *evs = calloc(n, sizeof *evs);
  char *bodies = malloc(n * 65), *keys = malloc(n * KEY_BYTES);
  int64_t *ts = malloc(n * sizeof *ts);
  slot s = {0};
  if (!dir || !evs || !bodies || !keys || !ts)
    goto out;
  if (cph_policy_load_text("bench-policy", policy_text, strlen(policy_text), &policy, &err)) {
    fprintf(stderr, "cephalon-bench history-copies: %s\n", err.msg);
    goto out;
  }
  cph_engine_options eo = {.data_dir = dir, .clock = NULL, .providers = cph_providers_network()};
  int orc = cph_engine_open(policy, &eo, &e, &err); /* takes the policy, also on failure */
  policy = NULL;
  if (orc) {
    fprintf(stderr, "cephalon-bench history-copies: %s\n", err.msg);
    goto out;
  }
  /* The channel's history: `history` events, each with its own time. */
  uint64_t rng = 0x48495354;
  int64_t t0_ms = 1700000000000;
  for (size_t i = 0; i < history; i++) {
    cph_bench_body(bodies + i * 65, 64, i, &rng);
    ts[i] = t0_ms + (int64_t)i;
    evs[i] = (cph_event_in){.channel = CHANNEL, .sender = "alice", .body = bodies + i * 65,
                            .ts_ms = ts[i]};
  }
  if (apply(e, evs, (size_t)history, 1000, &s))
    goto out;

  /* new: copies of events the channel does not hold */
  for (size_t i = 0; i < copies; i++) {
    char *body = bodies + i * 65;
    cph_bench_body(body, 64, history + i, &rng);
    snprintf(keys + i * KEY_BYTES, KEY_BYTES, "h:new-%zu", i);
    evs[i] = (cph_event_in){.channel = CHANNEL, .sender = "bob", .body = body,
                            .key = keys + i * KEY_BYTES, .kind = "reply",
                            .ts_ms = t0_ms + (int64_t)(history + i), .history_only = true};
  }
  slot fresh = {0}, again = {0}, held = {0};
  int64_t a = cph_bench_now_ns();
  if (apply(e, evs, (size_t)copies, (size_t)batch, &fresh))
    goto out;
  int64_t b = cph_bench_now_ns();
  /* again: the same copies, same keys */
  if (apply(e, evs, (size_t)copies, (size_t)batch, &again))
    goto out;
  int64_t c = cph_bench_now_ns();
  /* held: an entry HELD_BACK back, under a new key each time (its body and time as stored) */
  for (size_t i = 0; i < copies; i++) {
    size_t back = (size_t)(history + copies - HELD_BACK) + i % 8; /* among the newest */
    size_t j = back - (size_t)history; /* one of the `new` copies, stored above */
    snprintf(keys + i * KEY_BYTES, KEY_BYTES, "h:held-%zu", i);
    evs[i].key = keys + i * KEY_BYTES;
    evs[i].body = bodies + j * 65;
    evs[i].ts_ms = t0_ms + (int64_t)back;
  }
  int64_t d = cph_bench_now_ns();
  if (apply(e, evs, (size_t)copies, (size_t)batch, &held))
    goto out;
  int64_t f = cph_bench_now_ns();
  if (fresh.stored != copies || again.duplicate != copies || held.duplicate != copies) {
    fprintf(stderr,
            "cephalon-bench history-copies: expected %" PRIu64 " stored, then as many "
            "duplicates twice; got %zu stored, %zu and %zu duplicates\n",
            copies, fresh.stored, again.duplicate, held.duplicate);
    goto out;
  }
  double k = (double)copies * 1000.0;
  printf("history-copies history=%" PRIu64 " copies=%" PRIu64 " batch=%" PRIu64
         " new_us=%.2f held_us=%.2f again_us=%.2f\n",
         history, copies, batch, (double)(b - a) / k, (double)(f - d) / k, (double)(c - b) / k);
  status = 0;
out:
  if (e)
    cph_engine_close(e);
  if (policy)
    cph_policy_free(policy);
  if (dir)
    cph_bench_tmpdir_remove(dir);
  free(evs);
  free(bodies);
  free(keys);
  free(ts);
  return status;
}
