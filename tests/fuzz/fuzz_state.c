/* libFuzzer target: a session's state and its items as another node hands them over
 * (CPH_OP_SESSION_STATE; core/handover.c; server/clusterflow.h 11. and 13.). They come from the
 * cluster log, written by another build or damaged on the way, so every byte is untrusted.
 *
 * At start an engine ("x", cluster mode: consumed events and reply origins reported) runs a
 * session through turns on its direct channel and a subscribed one — replies, memories, a
 * failed turn, seals, a kept context — and keeps the genuine blobs it exported: the last
 * state, a turn record item, a seal item, a memory item (whose name carries its origin) and a
 * kept turn context item.
 * Each input edits one of them (or stands as a blob of its own) and a second engine ("y")
 * imports it into its session "a":
 *   byte 0   what: 0 the state, 1 the turn item, 2 the seal item, 3 the input itself as a
 *            state, 4 the input itself as an item, 5 the state with the four items, 6 the
 *            memory item, 7 the memory item with the edits made to its name instead, 8 the
 *            kept turn context item (the context explorer's; states carry none since), 9 a
 *            channel memories item of "c" (CPH_OP_CHANNEL_MEMORIES; clusterflow.h 16.), 10 the
 *            input itself as a channel memories item;
 *   byte 1   bit 0: cut the blob short by bytes 2-3 (big-endian, modulo its length);
 *   then     edits, 3 bytes each: a big-endian offset (modulo the blob's length) and a byte
 *            XORed into the blob there.
 * Checks beyond the sanitizers: the op answers; a state answers CPH_OK or CPH_EINVAL (a blob
 * that is not one, or a malformed part), an item alone always CPH_OK (a bad one is counted in
 * items_refused, never fatal), a channel memories item too (a bad one counted in refused); the
 * genuine blobs unedited are taken, and their items are not refused. The engine "y" starts afresh every RESET_EVERY inputs. */
#define _XOPEN_SOURCE 700 /* nftw */
#include <ftw.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/cephalon.h"
#include "common/clock.h"
#include "common/log.h"

#define RESET_EVERY 2000
#define TURNS 12
#define MAX_PASSES 64

static const char POLICY[] =
    "{:store {:sync :none}\n"
    " :server {:map-size-mb 256 :log-level :error}\n"
    " :scheduler {:lanes {:interactive {:turns 100000 :tool-calls 100000 :tokens 100000000}}}}";

typedef struct node {
  char dir[256];
  cph_clock clock;
  cph_engine *e;
} node;

static node X, Y;
static uint8_t *state_blob, *turn_item, *seal_item, *memory_item, *kept_item, *chan_item;
static size_t state_len, turn_len, seal_len, memory_len, kept_len, chan_len;
static char *memory_name; /* 'm' and the origin in hex */
static unsigned long inputs;

static void fuzz_fail(const char *what, int rc, const char *msg) {
  fprintf(stderr, "fuzz_state: %s (rc %d: %s)\n", what, rc, msg ? msg : "");
  abort();
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

static void op_done(cph_op *op, void *ctx) {
  (void)op;
  *(bool *)ctx = true;
}

/* Applies op on n's engine: its rc (the op answered, or the harness aborts). */
static int run_op(node *n, cph_op *op) {
  bool done = false;
  op->done = op_done;
  op->ctx = &done;
  int rc = cph_engine_submit(n->e, op);
  if (rc != CPH_OK)
    fuzz_fail("submitting an op", rc, NULL);
  for (int i = 0; i < MAX_PASSES && !done; i++)
    cph_engine_run_pass(n->e);
  if (!done)
    fuzz_fail("an op was never answered", 0, NULL);
  return op->rc;
}

static void node_up(node *n, const char *name) {
  const char *tmp = getenv("TMPDIR");
  snprintf(n->dir, sizeof n->dir, "%s/cph-fuzz-state-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(n->dir))
    fuzz_fail("mkdtemp", 0, n->dir);
  cph_err err = {0};
  cph_policy *p = NULL;
  if (cph_policy_load_text("fuzz-policy", POLICY, sizeof POLICY - 1, &p, &err))
    fuzz_fail("the policy", 0, err.msg);
  cph_clock_init_virtual(&n->clock, 1000 * CPH_NS_PER_S);
  cph_engine_options eo = {.data_dir = n->dir, .clock = &n->clock};
  if (cph_engine_open(p, &eo, &n->e, &err) != CPH_OK)
    fuzz_fail("the engine", 0, err.msg);
  cph_engine_report_consumed(n->e, true);
  if (cph_engine_reply_origins(n->e, name) != CPH_OK)
    fuzz_fail("reply origins", 0, name);
  cph_op op = {.kind = CPH_OP_SESSION_CREATE};
  char *subscribe[] = {(char *)"c"};
  op.u.session.in.id = (char *)"a";
  op.u.session.in.lane = CPH_LANE_INTERACTIVE;
  op.u.session.in.subscribe.items = subscribe;
  op.u.session.in.subscribe.count = 1;
  int rc = run_op(n, &op);
  if (rc != CPH_OK)
    fuzz_fail("creating session a", rc, op.err.msg);
  cph_op_clear_results(&op);
}

static void node_down(node *n) {
  if (!n->e)
    return;
  cph_engine_run_pass(n->e);
  cph_engine_close(n->e);
  n->e = NULL;
  nftw(n->dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Copies the first item of items whose name begins with kind into *out (and its name into
 * *name, when given). */
static void keep_item(const cph_state_items *items, char kind, uint8_t **out, size_t *len,
                      char **name) {
  for (size_t i = 0; i < items->n; i++)
    if (items->v[i].name[0] == kind) {
      free(*out);
      *out = malloc(items->v[i].len);
      if (!*out)
        abort();
      memcpy(*out, items->v[i].data, items->v[i].len);
      *len = items->v[i].len;
      if (name) {
        free(*name);
        if (!(*name = strdup(items->v[i].name)))
          abort();
      }
      return;
    }
}

static void keep_state(uint8_t **state, size_t *len) {
  if (!*state)
    return;
  free(state_blob);
  state_blob = *state;
  state_len = *len;
  *state = NULL;
}

/* One turn of "a" on X: a message (to its direct channel, or to "c"), leased, then completed
 * with a reply and a memory, or failed. */
static void x_turn(int i, bool fail) {
  char body[64], reply[64], memory[64];
  snprintf(body, sizeof body, "question %d about the build", i);
  cph_event_in ev = {.sender = (char *)(i % 2 ? "ann" : "bob"), .body = body};
  if (i % 3)
    ev.channel = (char *)"c";
  else
    ev.session = (char *)"a";
  cph_op in = {.kind = CPH_OP_INGEST};
  in.u.ingest.events = &ev;
  in.u.ingest.n_events = 1;
  run_op(&X, &in);
  cph_op_clear_results(&in);
  cph_op lease = {.kind = CPH_OP_LEASE};
  lease.u.lease.worker = (char *)"w";
  lease.u.lease.deadline_ns = cph_clock_now(&X.clock) + CPH_NS_PER_S;
  int rc = run_op(&X, &lease);
  if (rc != CPH_OK)
    fuzz_fail("a lease on x", rc, lease.err.msg);
  cph_op done = {.kind = fail ? CPH_OP_FAIL : CPH_OP_COMPLETE};
  done.u.turn.turn_id = lease.u.lease.turn.id;
  memcpy(done.u.turn.lease, lease.u.lease.turn.lease, sizeof done.u.turn.lease);
  snprintf(reply, sizeof reply, "answer %d", i);
  snprintf(memory, sizeof memory, "remember %d", i);
  cph_memory_in m = {.text = memory};
  if (fail) {
    done.u.turn.error = (char *)"timed out";
  } else {
    done.u.turn.reply_body = reply;
    done.u.turn.memories = &m;
    done.u.turn.n_memories = 1;
    done.u.turn.tokens = 10;
  }
  rc = run_op(&X, &done);
  if (rc != CPH_OK)
    fuzz_fail("a completion on x", rc, done.err.msg);
  done.u.turn.reply_body = NULL;
  done.u.turn.error = NULL;
  done.u.turn.memories = NULL;
  done.u.turn.n_memories = 0;
  if (!fail) {
    keep_state(&done.u.turn.state, &done.u.turn.state_len);
    keep_item(&done.u.turn.items, 't', &turn_item, &turn_len, NULL);
    keep_item(&done.u.turn.items, 'm', &memory_item, &memory_len, &memory_name);
    keep_item(&done.u.turn.items, 'k', &kept_item, &kept_len, NULL);
  }
  cph_op_clear_results(&done);
  cph_op_clear_results(&lease);
  if (fail)
    cph_clock_advance(&X.clock, 120 * CPH_NS_PER_S); /* past the retry's backoff */
}

/* Notes to "c" applied on X as the log's `in` events: their memories as one channel item. */
static void x_channel_item(void) {
  enum { NOTES = 6 };
  char bodies[NOTES][64], keys[NOTES][16];
  cph_event_in evs[NOTES];
  for (int i = 0; i < NOTES; i++) {
    snprintf(bodies[i], sizeof bodies[i], "note %d on the channel", i);
    snprintf(keys[i], sizeof keys[i], "k%d", i);
    evs[i] = (cph_event_in){.channel = (char *)"c", .sender = (char *)"ann", .body = bodies[i],
                            .key = keys[i], .ts_ms = 1000 + i, .only_session = true,
                            .memory_item = true};
  }
  cph_op in = {.kind = CPH_OP_INGEST};
  in.u.ingest.events = evs;
  in.u.ingest.n_events = NOTES;
  int rc = run_op(&X, &in);
  if (rc != CPH_OK)
    fuzz_fail("channel notes on x", rc, in.err.msg);
  const uint8_t *parts[NOTES];
  size_t lens[NOTES], n = 0;
  for (int i = 0; i < NOTES; i++)
    if (in.u.ingest.results[i].memory_part) {
      parts[n] = in.u.ingest.results[i].memory_part;
      lens[n++] = in.u.ingest.results[i].memory_part_len;
    }
  if (n != NOTES || cph_channel_memories_item(parts, lens, n, &chan_item, &chan_len) != CPH_OK)
    fuzz_fail("x made no channel memories item", (int)n, NULL);
  cph_op_clear_results(&in);
}

static void x_seal(int i) {
  char trigger[32];
  snprintf(trigger, sizeof trigger, "seal %d", i);
  cph_op op = {.kind = CPH_OP_CONTEXT_SEAL};
  op.u.context.session = (char *)"a";
  op.u.context.trigger = trigger;
  int rc = run_op(&X, &op);
  if (rc != CPH_OK)
    fuzz_fail("a seal on x", rc, op.err.msg);
  keep_state(&op.u.context.state, &op.u.context.state_len);
  keep_item(&op.u.context.items, 's', &seal_item, &seal_len, NULL);
  cph_op_clear_results(&op);
}

static void at_exit(void) {
  node_down(&Y);
  free(state_blob);
  free(turn_item);
  free(seal_item);
  free(memory_item);
  free(memory_name);
  free(kept_item);
  free(chan_item);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  cph_log_set_level(CPH_LOG_ERROR);
  node_up(&X, "x");
  for (int i = 0; i < TURNS; i++) {
    if (i == TURNS / 2)
      x_seal(0);
    x_turn(i, i == 4);
  }
  x_seal(1);
  x_channel_item();
  node_down(&X);
  if (!state_blob || !turn_item || !seal_item || !memory_item || !kept_item)
    fuzz_fail("x exported no state or items", 0, NULL);
  node_up(&Y, "y");
  atexit(at_exit);
  return 0;
}

/* The blob an input names, edited by it, into *out (malloc'd). */
static size_t edited(const uint8_t *base, size_t len, const uint8_t *data, size_t size,
                     uint8_t **out) {
  *out = malloc(len ? len : 1);
  if (!*out)
    abort();
  memcpy(*out, base, len);
  if (size >= 4 && (data[1] & 1))
    len -= ((size_t)data[2] << 8 | data[3]) % (len + 1);
  for (size_t at = 4; len && at + 3 <= size; at += 3)
    (*out)[((size_t)data[at] << 8 | data[at + 1]) % len] ^= data[at + 2];
  return len;
}

/* An input that edits nothing and cuts nothing. */
static bool pristine_input(const uint8_t *data, size_t size) {
  return size < 5 && !(size >= 2 && (data[1] & 1));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  if (++inputs % RESET_EVERY == 0) {
    node_down(&Y);
    node_up(&Y, "y");
  }
  unsigned what = data[0] % 11;
  if (what >= 9) { /* a channel's memories */
    uint8_t *item = NULL;
    cph_state_item it = {(char *)"c", (uint8_t *)data + 1, size - 1};
    if (what == 9) {
      it.len = edited(chan_item, chan_len, data, size, &item);
      it.data = item;
    }
    cph_op op = {.kind = CPH_OP_CHANNEL_MEMORIES};
    op.u.channel.channel = (char *)"c";
    op.u.channel.items = &it;
    op.u.channel.n_items = 1;
    int rc = run_op(&Y, &op);
    if (rc != CPH_OK)
      fuzz_fail("a channel memories item did not answer OK", rc, op.err.msg);
    if (what == 9 && pristine_input(data, size) && op.u.channel.refused)
      fuzz_fail("a genuine channel memories item was refused", 0, op.err.msg);
    cph_op_clear_results(&op);
    free(item);
    return 0;
  }
  bool pristine = pristine_input(data, size);
  uint8_t *blob = NULL, *extra[2] = {NULL, NULL}, *name = NULL;
  size_t len = 0;
  cph_state_item items[4] = {{0}};
  size_t n_items = 0;
  cph_op op = {.kind = CPH_OP_SESSION_STATE};
  op.u.state.session = (char *)"a";
  if (what == 0 || what == 5) {
    len = edited(state_blob, state_len, data, size, &blob);
    op.u.state.data = blob;
    op.u.state.len = len;
  } else if (what == 3) {
    op.u.state.data = data + 1;
    op.u.state.len = size - 1;
  }
  if (what == 1 || what == 2) {
    items[0].name = (char *)(what == 1 ? "t" : "s");
    items[0].len = edited(what == 1 ? turn_item : seal_item, what == 1 ? turn_len : seal_len,
                          data, size, &extra[0]);
    items[0].data = extra[0];
    n_items = 1;
  } else if (what == 4) {
    items[0].name = (char *)"raw";
    items[0].data = (uint8_t *)data + 1;
    items[0].len = size - 1;
    n_items = 1;
  } else if (what == 5) { /* the genuine items beside an edited state */
    items[0] = (cph_state_item){(char *)"t", turn_item, turn_len};
    items[1] = (cph_state_item){(char *)"s", seal_item, seal_len};
    items[2] = (cph_state_item){memory_name, memory_item, memory_len};
    items[3] = (cph_state_item){(char *)"k", kept_item, kept_len};
    n_items = 4;
  } else if (what == 6) {
    items[0].name = memory_name;
    items[0].len = edited(memory_item, memory_len, data, size, &extra[0]);
    items[0].data = extra[0];
    n_items = 1;
  } else if (what == 8) {
    items[0].name = (char *)"k";
    items[0].len = edited(kept_item, kept_len, data, size, &extra[0]);
    items[0].data = extra[0];
    n_items = 1;
  } else if (what == 7) { /* the name edited: a NUL it gains ends it */
    size_t nl = edited((const uint8_t *)memory_name, strlen(memory_name) + 1, data, size, &name);
    if (nl)
      name[nl - 1] = '\0';
    items[0] = (cph_state_item){nl ? (char *)name : (char *)"m", memory_item, memory_len};
    n_items = 1;
  }
  op.u.state.items = items;
  op.u.state.n_items = n_items;
  int rc = run_op(&Y, &op);
  bool has_state = op.u.state.data != NULL;
  if (has_state && rc != CPH_OK && rc != CPH_EINVAL)
    fuzz_fail("a state answered neither OK nor EINVAL", rc, op.err.msg);
  if (!has_state && rc != CPH_OK)
    fuzz_fail("items alone did not answer OK", rc, op.err.msg);
  if (pristine && (what <= 2 || what >= 6) && rc != CPH_OK)
    fuzz_fail("a genuine state or item was refused", rc, op.err.msg);
  if ((pristine || what == 5) && what != 3 && what != 4 && op.u.state.items_refused)
    fuzz_fail("a genuine item was refused", (int)op.u.state.items_refused, op.err.msg);
  cph_op_clear_results(&op);
  free(blob);
  free(name);
  free(extra[0]);
  free(extra[1]);
  return 0;
}
