/* Cluster mode: events through the replicated log — accept, apply, forward (clusterflow.h). */
#include "clusterflow.h"

#include <event2/event.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cluster.h"
#include "clusterlog.h"
#include "clustertable.h"
#include "common/arena.h"
#include "common/clock.h"
#include "common/hmap.h"
#include "common/log.h"
#include "emit.h"
#include "evjson.h"
#include "reply.h"
#include "server.h"
#include "statezip.h"

#define INGEST_DEADLINE_MS 10000
#define FWD_DEADLINE_MS 10000
#define SESSION_DEADLINE_MS 30000
#define RETRY_MS 100
#define APPLY_BATCH 512
/* A rebuild's events per engine operation (8.): each operation is one LMDB commit (an fsync
 * with :sync :always), and a replay of a big shard is bound by their count, not by the work per
 * event (measured: 512 a commit replayed ~10k events/s here). */
#define REBUILD_BATCH 8192
/* Most events of delivered messages in the engine at once (the rest wait here, in order): the
 * engine applies up to 512 operations a pass, and with batch messages (1,000 events each) a
 * pass of those held the loop for tens of seconds while a node applied a backlog. */
#define APPLY_IN_ENGINE 8192
/* Events of one request for one shard go into one log message ({"batch": [...]}, 1.) up to
 * this many payload bytes or events; the forwards of such a message to one session go into
 * one message too (3.). Well under NATS's 1 MiB payload limit, also for the forwards, which
 * add the session's id and engine key (~330 bytes at most) to each event. */
#define LOG_BATCH_BYTES (256 * 1024)
#define LOG_BATCH_EVENTS 1000
#define FORWARD_ROOM 1024 /* what a forward adds to its event, and more (the 330 above) */
#define SWEEP_MS 1000
#define SWEEP_PAGE 500
#define SWEEP_DELAY_MS 3000 /* after the log is ready: the watch has delivered the table */
#define CHANNEL_MAX 256     /* as the engine's (core/ingest.c) */
#define KEY_MAX 256
#define DONE_DEADLINE_MS 10000 /* a done mark, as an ingest: then the completion answers 503 */
#define DONE_CHUNK_BYTES 65536 /* a done mark's payload stays around this size */
#define MARK_MS 1000           /* watermarks: looked at (and published if changed) this often */
#define MARK_DEADLINE_MS 5000
#define RETAIN_AT_ONCE 256 /* a rebuild's inbox retains in the engine at a time */
/* 13., 14.: a copy of a reply or an item the log did not take within its deadline is sent
 * again (the same subject, message id and data) RESEND_FIRST_MS later, then after twice the
 * previous wait up to RESEND_MAX_MS, until the log takes it (resend_wait_ms; a park mark, 6.,
 * waits the same, on the watermark tick). The first wait is short because
 * most outages are a JetStream leader election or one NATS server restarting (a few seconds,
 * and the first attempt already spent 10 s); the doubling and the cap keep a long outage to
 * one publish per waiting message every 30 s — cheap when NATS is down (refused at once),
 * bounded when it answers — and a message is sent at most ~30 s after the log is back. A
 * resend is one publish (RESEND_WAIT_MS, the longest clusterlog.c waits for an answer): no
 * 100 ms loop as a first attempt's (RETRY_MS), which would spin every waiting message.
 * RESEND_CAP_BYTES bounds what waits (struct, subject, id and data: ~0.5 KB a copy or a turn
 * record's item in test_cluster_copyretry, more for long replies and packed kept contexts): a
 * small part of a node's memory, yet at an estimated ~1-2 MB of copies and items a second (100
 * completions a second; not measured) half a minute to a minute of a full outage; beyond it a
 * copy or an item is dropped, loudly (resend_later). RESEND_BATCH bounds the resends one timer
 * callback starts. */
#define RESEND_FIRST_MS 1000
#define RESEND_MAX_MS 30000
#define RESEND_WAIT_MS 3000
#define RESEND_CAP_BYTES ((size_t)64 << 20)
#define RESEND_BATCH 1024
/* A stop (cph_cflow_stop_begin) sends what waits at once, then this often until the log takes
 * it or the stop's deadline passes: the stop is short, a back-off would outlast it. */
#define STOP_RESEND_MS 200

typedef enum pub_kind {
  PUB_INGEST,
  PUB_FWD,
  PUB_SESSION,
  PUB_DONE,
  PUB_MARK,
  PUB_STATE,
  PUB_ITEM,
  PUB_HIST
} pub_kind;
typedef enum ev_status { EV_ACCEPTED, EV_DUPLICATE, EV_REJECTED } ev_status;

typedef struct ingest_req ingest_req;
typedef struct applying applying;
typedef struct done_req done_req;
typedef struct record_req record_req;

/* A node of a seqheap (the sequence heaps below). */
typedef struct seqnode {
  uint64_t seq;
  size_t pos;
} seqnode;

/* One message on its way into the log, retried with the same id until its deadline. */
typedef struct pub {
  char key[24]; /* ref in decimal: its key in cph_cflow.pubs */
  uint64_t ref;
  pub_kind kind;
  char *subject, *msgid, *data;
  size_t len;
  bool kv_delete;
  int sends;
  bool in_map;
  bool too_large; /* larger than the log takes (cph_clog_max_payload): never sent again */
  int64_t deadline_ns, retry_at_ns;
  struct pub *next_retry;
  ingest_req *ir; /* PUB_INGEST: the request and its events' indices in it */
  size_t *index;
  size_t n_index;
  applying *ap;   /* PUB_FWD: the applied message it forwards */
  size_t copies;  /* PUB_FWD: how many history copies (15.) it carries */
  done_req *dr;   /* PUB_DONE, PUB_STATE: the completion (or delete) it records */
  record_req *rr; /* PUB_SESSION: the request waiting for this record, or NULL */
  uint32_t shard; /* PUB_DONE, PUB_MARK, PUB_STATE: the shard (fenced: 10.); PUB_MARK: the
                     watermark */
  uint64_t mark;
  struct pub *next_done; /* PUB_DONE, PUB_STATE: the shard's queue (one in flight at a time) */
  /* PUB_STATE (11.): data is the epoch and the raw state until the packer hands the packed
   * value back (packing: the shard's queue waits at it); raw_len counts the raw value. */
  bool packing;
  size_t raw_len;
  cph_statezip_job zjob;
  struct pub *next_packing; /* PUB_ITEM being packed: the next one (f->packing_head, FIFO) */
  /* PUB_HIST, PUB_ITEM (14., 13.): once the log did not take one in time it is resending
   * (counted in cph_cflow's *_pending and *_pending_bytes until taken or given up), and waits
   * in f->resend (due: the time of its next attempt, mono ns) between its attempts. rounds:
   * the resends started; backoff_ms: the wait before the next one. */
  bool resending, in_resend;
  seqnode due;
  int rounds;
  int64_t backoff_ms;
  bool test_unacked; /* CPH_TEST_FAIL_HIST_COPIES / _ITEMS: stored, answered as lost */
  /* PUB_ITEM: the epoch of the shard it was made under (a resend goes only while this node
   * serves the shard under it); key_held: counted in f->item_keys; forgotten: its session was
   * deleted here (never sent again). */
  uint64_t epoch;
  bool key_held, forgotten;
  bool chan_item; /* PUB_ITEM of a channel's memories (16.): counted apart */
} pub;

typedef struct ev_result {
  ev_status status;
  uint64_t pos;
  const char *reason, *field;
} ev_result;

/* A POST /v1/events waiting for the log. */
struct ingest_req {
  cph_req *r;
  size_t n;
  ev_result *res;
  size_t outstanding, failed;
  char why[256];
  ingest_req *prev, *next;
};

/* A delivered message being applied; lives until acknowledged or released. */
struct applying {
  cph_clog_msg *m;
  struct cph_arena_chunk *arena; /* evs, their strings and mentions (decode_payload) */
  json_t *doc;                   /* when jansson decoded it (NULL: the fast path did) */
  cph_event_in *evs;    /* its events (one, or a batch's) */
  size_t n_evs;
  const char *batch_id; /* a batch's message id (in doc); NULL: a single event */
  size_t outstanding;   /* forwards not yet acknowledged */
  bool failed;
};

/* A session create, change or delete waiting for its record in the log (4.): its answer goes
 * once the log took the record, 503 when it did not within DONE_DEADLINE_MS or the node stops
 * first — so a session answered 200 is known to the node that serves it next. */
struct record_req {
  cph_req *r;     /* NULL once answered at shutdown (its pub still points here) */
  json_t *answer; /* its 200 answer */
  bool deleted;
  char *session;
  record_req *prev, *next; /* cph_cflow.records: the waiting ones, for shutdown */
};

/* What a done_req logs (6.): what consumed input (a completion, a delete, a refusal), or a
 * seal's or edit's state alone (made_buf set), or a park or unpark mark. */
typedef enum mark_kind { MARK_DONE, MARK_PARK, MARK_UNPARK } mark_kind;

/* The done marks of one completion (or session delete) on their way into the log (6.); or the
 * park or unpark mark of a turn parked or requeued here. */
struct done_req {
  mark_kind kind;
  cph_req *r;     /* the completion waiting for them; NULL for a delete (nobody waits) */
  /* a seal's or a context edit's request: what was made ("seal N was made") and what the
   * next owner would lack, for its 503 (its answer waits for its session's state, no marks);
   * "" for a completion or a delete */
  char made_buf[64], lacks_buf[64];
  json_t *answer; /* its 200 answer */
  char *session;
  uint32_t shard;
  size_t outstanding, failed;
  char why[256];
  done_req *prev, *next; /* the waiting completions, for shutdown */
  /* MARK_PARK, MARK_UNPARK: the turn's note (a copy), so a mark the log did not take is sent
   * again (park_resend_later); backoff_ms: the wait before this attempt's successor, 0 on the
   * first attempt. */
  cph_park_note note;
  int64_t backoff_ms;
};

/* A park or unpark mark the log did not take, waiting for its next attempt (6.;
 * park_resend_later). */
typedef struct park_resend {
  mark_kind kind;
  cph_park_note note;
  int64_t due_ns, backoff_ms;
  struct park_resend *next;
} park_resend;

/* ---------------------------------------------------------------- sequence heaps
 *
 * A min-heap of log positions whose nodes know their place, so the owner of a node removes it
 * in O(log n) without a search; the minimum is O(1). The watermark (7.) is the minimum of two
 * of them per shard; the resends (13., 14.) are one ordered by time (seqnode above). */
typedef struct seqheap {
  seqnode **v;
  size_t n, cap;
} seqheap;

static void seqheap_swap(seqheap *h, size_t a, size_t b) {
  seqnode *x = h->v[a];
  h->v[a] = h->v[b];
  h->v[b] = x;
  h->v[a]->pos = a;
  h->v[b]->pos = b;
}

static void seqheap_up(seqheap *h, size_t i) {
  while (i > 0 && h->v[(i - 1) / 2]->seq > h->v[i]->seq) {
    seqheap_swap(h, i, (i - 1) / 2);
    i = (i - 1) / 2;
  }
}

static void seqheap_down(seqheap *h, size_t i) {
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < h->n && h->v[l]->seq < h->v[m]->seq)
      m = l;
    if (r < h->n && h->v[r]->seq < h->v[m]->seq)
      m = r;
    if (m == i)
      return;
    seqheap_swap(h, i, m);
    i = m;
  }
}

static bool seqheap_push(seqheap *h, seqnode *x) {
  if (h->n == h->cap) {
    size_t cap = h->cap ? 2 * h->cap : 64;
    seqnode **v = realloc(h->v, cap * sizeof *v);
    if (!v)
      return false;
    h->v = v;
    h->cap = cap;
  }
  x->pos = h->n;
  h->v[h->n++] = x;
  seqheap_up(h, x->pos);
  return true;
}

static void seqheap_remove(seqheap *h, seqnode *x) {
  size_t i = x->pos;
  if (i >= h->n || h->v[i] != x)
    return;
  if (i != --h->n) {
    h->v[i] = h->v[h->n];
    h->v[i]->pos = i;
    seqheap_down(h, i);
    seqheap_up(h, i);
  }
}

static uint64_t seqheap_min(const seqheap *h) { return h->n ? h->v[0]->seq : UINT64_MAX; }

/* An event applied here that reached its session and is not consumed yet (7.): keyed by its
 * engine key in cph_cflow.pending, in its shard's heap by log position. */
typedef struct pending_ev {
  seqnode node;
  char *key;
  uint32_t shard;
} pending_ev;

/* A message of a served shard delivered here and not acknowledged: in flight, or released
 * while the shard is still served (it comes back). Keyed by its position in decimal. */
typedef struct held_msg {
  seqnode node;
  char key[24];
} held_msg;

typedef struct rebuild rebuild;

/* What this node keeps of a shard it serves, for the watermark (7.) and the rebuild (8.). */
typedef struct shard_track {
  bool live;            /* rebuilt and served: its messages are applied and tracked */
  seqheap pending;      /* its pending_ev */
  seqheap held;         /* its held_msg */
  cph_hmap held_by_seq; /* position -> held_msg */
  uint64_t last_seen;   /* the newest position delivered or replayed */
  uint64_t mark_put;    /* the last watermark the log took (0: none yet) */
  bool mark_sending;
  /* The fences (10.): what this node's next watermark put and done mark of the shard expect
   * as the last sequence of their subjects; fenced once the log refused one (another node
   * took the shard over), until this node takes the shard again. */
  uint64_t mark_rev, done_last;
  bool fenced, mark_fenced;
  /* The sequence of this node's epoch on ceph.s.done.<shard> when it last took the shard: the
   * epoch its state puts carry (11.). */
  uint64_t epoch;
  pub *checking; /* the done mark refused, while the fence check runs (ref check_ref) */
  uint64_t check_ref;
  pub *done_head, *done_tail; /* done marks waiting for the one in flight */
  bool done_sending;
  rebuild *rb; /* the rebuild under way, or NULL */
  /* Trimming (12.): the watermark last handed to the log to purge below (0: none since this
   * node took the shard), and when. */
  uint64_t trimmed;
  int64_t trim_at_ns;
} shard_track;

/* Messages applied as one engine operation: events[i] is an event of items[i], whose events are
 * contiguous (a message's events all go into one batch). */
typedef struct apply_batch {
  cph_op op;
  struct cph_cflow *f;
  applying **items;
  cph_event_in *events;
  size_t n, cap;
  struct apply_batch *next; /* the blocked list (the engine was busy) */
} apply_batch;

/* A request waiting for its min_pos (9.). */
typedef struct pos_req {
  struct pos_req *next;
  cph_req *r;
  uint64_t ref, pos;
  void (*resume)(cph_req *r);
} pos_req;

struct cph_cflow {
  cph_srv *s;
  int32_t prep_shingle_words; /* the dedupe settings delivered events are prepared under */
  int64_t prep_min_length;
  cph_clog *log; /* NULL after quiesce */
  char node[101];
  uint64_t boot, minted, next_ref;
  cph_hmap pubs;
  pub *retry_head;
  struct event *ev_retry;  /* RETRY_MS: retries and blocked batches */
  struct event *ev_submit; /* zero delay: submit the forming batch */
  struct event *ev_sweep;  /* SWEEP_MS: the record sweep (sweep_records) */
  char sweep_after[160];   /* the sweep's cursor: the last session id it looked at */
  int64_t ready_since_ns;  /* when the log was first seen ready (0: not yet) */
  apply_batch *forming;
  apply_batch *blocked_head, *blocked_tail; /* not in the engine yet: its queue was full, or
                                               APPLY_IN_ENGINE events of ours were in it */
  size_t in_engine; /* events of apply batches in the engine */
  ingest_req *reqs;
  cph_ctable *table; /* the session table (clustertable.h) */
  uint64_t applied, forwarded, apply_failures;
  bool quiesced;
  bool started; /* the log was started (libnats is open) */
  uint32_t shards;
  shard_track *tracks; /* per shard */
  cph_hmap pending;    /* engine key -> pending_ev, over every shard */
  done_req *dones;     /* completions waiting for their done marks */
  record_req *records; /* session creates, changes and deletes waiting for their records */
  pos_req *waits;      /* requests waiting for their min_pos */
  uint64_t pos_waits, pos_timeouts;
  uint64_t minted_marks;
  struct event *ev_mark; /* MARK_MS: the watermarks */
  int64_t trim_ns;       /* :log-trim-seconds: a shard's log is trimmed at most this often (0:
                            never, 12.) */
  /* 11.: session -> state_rev_entry, the revision of its key in CEPH_STATE this node last read
   * or wrote (absent: none, a put creates the key). Entries of sessions of shards no longer served
   * stay until the shard is taken again (its replay reads them anew). */
  cph_hmap state_revs;
  uint64_t states_put, state_bytes, state_raw_bytes, state_failures, states_loaded,
      state_load_bytes, state_load_raw_bytes;
  /* 13.: items put, their bytes, those the log did not take; loaded by rebuilds, and refused
   * by the engine there. */
  uint64_t items_put, item_bytes, item_failures, items_loaded, items_refused;
  /* 16.: channel memories items made here; memories a rebuild stored from them, and those this
   * node held already. */
  uint64_t channel_items, channel_item_bytes, channel_items_loaded, channel_memories_loaded,
      channel_memories_held;
  uint64_t direct_items_left; /* 16.: direct memories items a rebuild left to its delivery */
  uint32_t chan_reads; /* channels_ask's reads so far: each one's token */
  /* 14.: copies of replies sent to other shards, those the log did not take; copies applied
   * here (stored in a channel's history), and those this node held already. */
  uint64_t hist_sent, hist_failures, hist_stored, hist_held;
  /* 13., 14.: the copies and items the log did not take in time, sent again (resend_later):
   * those waiting for their next attempt, by its time; resends started; those given up
   * (dropped: lost, logged); waiting now (pending) and their bytes (every resending pub's,
   * bounded by RESEND_CAP_BYTES together). */
  seqheap resend;
  struct event *ev_resend; /* at the first one's time */
  uint64_t hist_retries, hist_dropped, item_retries, item_dropped;
  size_t hist_pending, item_pending, hist_pending_bytes, item_pending_bytes;
  /* 13.: item key (its subject) -> item_key, while a put of it made here is alive: the newest
   * one's ref, so an older put is never sent again over a newer value (item_skip). */
  cph_hmap item_keys;
  /* Fault injection for tests only (test_cluster_copyretry): CPH_TEST_FAIL_HIST_COPIES and
   * CPH_TEST_FAIL_ITEMS, "N[,M]", in the environment at start make each copy's (item's) first N
   * attempts fail unsent, as if the log had not answered in time, and its next M be stored but
   * answered as lost. Unset (0) in any real use. */
  int test_hist_drop, test_hist_unacked, test_item_drop, test_item_unacked;
  /* RESEND_CAP_BYTES, or CPH_TEST_RESEND_CAP_BYTES from the environment at start (tests only:
   * test_cluster_copyretry's drop at the cap) */
  size_t resend_cap;
  int64_t state_pack_ns; /* the time packing took, over every state packed */
  cph_statezip_packer *packer; /* packs the states beside the loop (statezip.h) */
  pub *packing_head, *packing_tail; /* the items on the packer (13.), in submission order */
  /* Counters of GET /metrics and GET /v1/cluster (log.rebuild). */
  uint64_t rebuilds, rebuild_events, done_marks, done_mark_failures, marks_put;
  /* 6.: park and unpark marks the log took, those it did not; 8.: turns rebuilds parked here
   * again as another node parked them. */
  uint64_t park_marks, unpark_marks, park_mark_failures, parks_rebuilt;
  /* park marks not taken, waiting to be sent again (oldest first), how many, resends made,
   * and those given up because the turn or the shard left this node meanwhile */
  park_resend *park_resends;
  size_t park_pending;
  uint64_t park_retries, park_resends_dropped;
  int test_park_drop; /* CPH_TEST_FAIL_PARK_MARKS: the first N park mark parts fail unsent */
  int test_unpark_drop; /* CPH_TEST_FAIL_UNPARK_MARKS: the same for unpark marks */
  int test_state_drop;  /* CPH_TEST_FAIL_STATES: the first N session states fail unsent
                         * (test_cluster_stateretry); 0 in any real use */
  /* What a stop waits for (cph_cflow_stop_begin; mirrored in cph_srv.log_unsettled): copies
   * and items made here that the log has not taken and that are not given up (in flight,
   * packing, retrying or waiting to be sent again), and park marks no request waits for (an
   * expiry's) in flight; with park_pending, nobody else would see them lost. */
  size_t loose, parks_loose;
  bool stopping; /* cph_cflow_stop_begin was called */
  double last_rebuild_s, last_read_s;
  uint64_t last_rebuild_events, last_rebuild_messages;
  int64_t last_rebuild_shard; /* -1: none yet */
};

static void on_session_entry(void *ctx, const char *session, const char *value, size_t vlen) {
  cph_cflow *f = ctx;
  if (!cph_ctable_record(f->table, session, value, vlen))
    cph_warn("cluster log: session record of \"%s\" not taken (malformed or out of memory)",
             session);
}

/* ================================================================ publishing */

static void pub_free(pub *p) {
  free(p->index);
  free(p->subject);
  free(p->msgid);
  free(p->data);
  free(p);
}

static void arm_retry(cph_cflow *f) {
  if (!evtimer_pending(f->ev_retry, NULL)) {
    struct timeval tv = {0, RETRY_MS * 1000};
    evtimer_add(f->ev_retry, &tv);
  }
}

static void pub_outcome(cph_cflow *f, pub *p, bool ok, uint64_t seq, bool dup, const char *why);

#define FENCED_WHY "another node took the shard over: the log refuses this node's writes to it"

/* What this node knows of a session's key in CEPH_STATE (cph_cflow.state_revs keys it by its
 * own copy of the session id). */
typedef struct state_rev_entry {
  uint64_t rev;
  char session[];
} state_rev_entry;

/* The revision of session's key in CEPH_STATE as this node knows it (0: none). */
static uint64_t state_rev(cph_cflow *f, const char *session) {
  const state_rev_entry *e = cph_hmap_get(&f->state_revs, session);
  return e ? e->rev : 0;
}

/* Remembers rev (0: forgets the key). False when out of memory (then a put expects what it
 * expected before: refused, then checked — never wrong, only slower). */
static bool state_rev_set(cph_cflow *f, const char *session, uint64_t rev) {
  state_rev_entry *have = cph_hmap_get(&f->state_revs, session);
  if (!rev) {
    free(cph_hmap_del(&f->state_revs, session));
    return true;
  }
  if (have) {
    have->rev = rev;
    return true;
  }
  size_t n = strlen(session);
  state_rev_entry *e = malloc(sizeof *e + n + 1);
  if (!e)
    return false;
  memcpy(e->session, session, n + 1);
  e->rev = rev;
  if (cph_hmap_put(&f->state_revs, e->session, e) != CPH_OK) {
    free(e);
    return false;
  }
  return true;
}

/* Sends p again after RETRY_MS (a JetStream leader election takes a moment: resending at once
 * would only spin). */
static void pub_retry_later(cph_cflow *f, pub *p) {
  p->retry_at_ns = cph_mono_ns() + RETRY_MS * 1000000LL;
  p->next_retry = f->retry_head;
  f->retry_head = p;
  arm_retry(f);
}

/* Sends p (again); a refusal now (not connected, too much in flight) is retried later. */
static void pub_send(cph_cflow *f, pub *p) {
  int rc = CPH_EBUSY;
  if (f->log && !p->in_map && cph_hmap_put(&f->pubs, p->key, p) == CPH_OK) {
    p->in_map = true;
    /* no answer later than the deadline: the request is answered on time */
    int64_t left_ms = (p->deadline_ns - cph_mono_ns()) / 1000000;
    shard_track *tr = p->kind == PUB_DONE || p->kind == PUB_MARK || p->kind == PUB_STATE
                          ? &f->tracks[p->shard]
                          : NULL;
    if (tr && tr->fenced) {
      cph_hmap_del(&f->pubs, p->key);
      p->in_map = false;
      pub_outcome(f, p, false, 0, false, FENCED_WHY);
      return;
    }
    uint64_t expect = !tr                     ? CPH_CLOG_NO_EXPECT
                      : p->kind == PUB_DONE   ? tr->done_last
                      : p->kind == PUB_STATE ? state_rev(f, p->dr->session)
                                              : tr->mark_rev;
    rc = cph_clog_publish(f->log, p->subject, p->msgid, p->data, p->len, p->kv_delete, left_ms,
                          p->ref, expect);
    if (rc == CPH_OK) {
      p->sends++;
      return;
    }
    cph_hmap_del(&f->pubs, p->key);
    p->in_map = false;
  }
  if (rc == CPH_ELIMIT) { /* never taken: failed now, not tried again (resend_given_up too) */
    char why[160];
    snprintf(why, sizeof why,
             "%zu bytes, more than the %" PRId64 " the cluster log takes (NATS max_payload)",
             p->len, cph_clog_max_payload(f->log));
    p->too_large = true;
    pub_outcome(f, p, false, 0, false, why);
    return;
  }
  if (p->rounds || cph_mono_ns() >= p->deadline_ns) { /* a resend is one publish (resend_later) */
    pub_outcome(f, p, false, 0, false,
                rc == CPH_EBUSY ? "not connected to NATS, or too many publishes in flight"
                                : "out of memory");
    return;
  }
  pub_retry_later(f, p);
}

static pub *pub_new(cph_cflow *f, pub_kind kind, const char *subject, const char *msgid, char *data,
                    size_t len, int64_t deadline_ms) {
  pub *p = calloc(1, sizeof *p);
  if (!p) {
    free(data);
    return NULL;
  }
  p->ref = ++f->next_ref;
  snprintf(p->key, sizeof p->key, "%" PRIu64, p->ref);
  p->kind = kind;
  p->subject = strdup(subject);
  p->msgid = msgid ? strdup(msgid) : NULL;
  p->data = data;
  p->len = len;
  p->deadline_ns = cph_mono_ns() + deadline_ms * 1000000LL;
  if (!p->subject || (msgid && !p->msgid) || !data) {
    pub_free(p);
    return NULL;
  }
  return p;
}

static void on_published(void *ctx, uint64_t ref, int rc, uint64_t seq, bool dup, const char *why) {
  cph_cflow *f = ctx;
  char key[24];
  snprintf(key, sizeof key, "%" PRIu64, ref);
  pub *p = cph_hmap_del(&f->pubs, key);
  if (!p)
    return;
  p->in_map = false;
  if (rc == CPH_OK && p->test_unacked) { /* stored; answered as lost (a test's fault) */
    p->test_unacked = false;
    pub_outcome(f, p, false, 0, false,
                "stored, but its answer dropped (CPH_TEST_FAIL_HIST_COPIES / _ITEMS)");
    return;
  }
  if (rc == CPH_OK) {
    pub_outcome(f, p, true, seq, dup, NULL);
    return;
  }
  if (rc == CPH_ECONFLICT && p->kind == PUB_MARK) {
    /* Its revision unknown (a put stored without an acknowledgement) or another owner's: no
     * more watermarks of the shard from this node until it takes the shard again. */
    cph_warn("cluster log: the log refused the watermark of shard %" PRIu32 " (written by "
             "another node, or a put of this node's was not acknowledged): none is put until "
             "this node takes the shard again",
             p->shard);
    f->tracks[p->shard].mark_fenced = true;
    pub_outcome(f, p, false, 0, false, why);
    return;
  }
  if (rc == CPH_ECONFLICT && p->kind == PUB_DONE && cph_mono_ns() < p->deadline_ns && f->log &&
      !f->tracks[p->shard].fenced) {
    /* Deposed, or a mark of this node's was stored without an acknowledgement: the last
     * message of the subject tells (on_pos). The mark stays in flight meanwhile. */
    shard_track *tr = &f->tracks[p->shard];
    char prefix[160];
    snprintf(prefix, sizeof prefix, "d.%s.%" PRIx64 ".", f->node, f->boot);
    tr->check_ref = ++f->next_ref;
    int64_t left_ms = (p->deadline_ns - cph_mono_ns()) / 1000000;
    if (cph_clog_check_fence(f->log, p->shard, prefix, left_ms, tr->check_ref) == CPH_OK) {
      tr->checking = p;
      return;
    }
  }
  if (rc == CPH_ECONFLICT && p->kind == PUB_STATE && cph_mono_ns() < p->deadline_ns && f->log &&
      !f->tracks[p->shard].fenced) {
    /* Another write to the key since this node read or wrote it: a deposed owner's late put
     * (written over: its epoch is older) or the next owner's (fenced). The key tells (on_pos). */
    shard_track *tr = &f->tracks[p->shard];
    tr->check_ref = ++f->next_ref;
    int64_t left_ms = (p->deadline_ns - cph_mono_ns()) / 1000000;
    if (cph_clog_check_state(f->log, p->subject, tr->epoch, left_ms, tr->check_ref) == CPH_OK) {
      tr->checking = p;
      return;
    }
  }
  if (rc == CPH_ECONFLICT && p->kind == PUB_STATE) {
    pub_outcome(f, p, false, 0, false,
                f->tracks[p->shard].fenced ? FENCED_WHY : "the log refused the state (unchecked)");
    return;
  }
  if (rc == CPH_ECONFLICT && p->kind == PUB_DONE) { /* fenced, or no time left to check */
    pub_outcome(f, p, false, 0, false,
                f->tracks[p->shard].fenced ? FENCED_WHY : "the log refused the mark (unchecked)");
    return;
  }
  cph_debug("cluster log: publish to %s failed (%s); retrying", p->subject, why ? why : "?");
  if (p->rounds || cph_mono_ns() >= p->deadline_ns) {
    pub_outcome(f, p, false, 0, false, why);
    return;
  }
  pub_retry_later(f, p); /* the same message id: stored once however often it is sent */
}

/* ================================================================ tracking (7.)
 *
 * The watermark of a served shard is the lowest of: the positions of its pending events
 * (applied here, reached their session, not consumed), the positions of its held messages
 * (delivered, not acknowledged — a message in flight may still reach a session, and one
 * released comes back), and the newest position seen + 1. Below it every message of the shard
 * either reached no session or reached one that consumed it, so a rebuild may start there. */

static void pending_free(pending_ev *e) {
  free(e->key);
  free(e);
}

/* Event `key`, at position seq of shard, reached its session here and is not consumed. Out of
 * memory: not tracked, so the watermark may pass it — logged, as it weakens a later rebuild. */
static void pending_add(cph_cflow *f, const char *key, uint64_t seq, uint32_t shard) {
  shard_track *tr = &f->tracks[shard];
  pending_ev *e = cph_hmap_get(&f->pending, key);
  if (e) { /* the same key logged twice (a repeat after the log's window): the older counts */
    if (seq < e->node.seq && e->shard == shard) {
      seqheap_remove(&tr->pending, &e->node);
      e->node.seq = seq;
      seqheap_push(&tr->pending, &e->node); /* cannot fail: it was in the heap */
    }
    return;
  }
  e = calloc(1, sizeof *e);
  if (e && (e->key = strdup(key)) && cph_hmap_put(&f->pending, e->key, e) == CPH_OK) {
    e->node.seq = seq;
    e->shard = shard;
    if (seqheap_push(&tr->pending, &e->node))
      return;
    cph_hmap_del(&f->pending, e->key);
  }
  if (e)
    pending_free(e);
  cph_error("cluster log: out of memory tracking event %s of shard %" PRIu32
            " (a rebuild of the shard may miss it)",
            key, shard);
}

/* The events named by keys were consumed here (a completion, a delete). */
static void pending_consumed(cph_cflow *f, const cph_strv *keys) {
  for (size_t i = 0; i < keys->count; i++) {
    pending_ev *e = keys->items[i] ? cph_hmap_del(&f->pending, keys->items[i]) : NULL;
    if (!e)
      continue;
    seqheap_remove(&f->tracks[e->shard].pending, &e->node);
    pending_free(e);
  }
}

/* Message seq of a live shard was delivered: held until acknowledged. */
static void held_add(shard_track *tr, uint64_t seq) {
  if (seq > tr->last_seen)
    tr->last_seen = seq;
  char key[24];
  snprintf(key, sizeof key, "%" PRIu64, seq);
  if (cph_hmap_get(&tr->held_by_seq, key))
    return; /* delivered again while held */
  held_msg *h = calloc(1, sizeof *h);
  if (h) {
    memcpy(h->key, key, sizeof key);
    h->node.seq = seq;
    if (cph_hmap_put(&tr->held_by_seq, h->key, h) == CPH_OK) {
      if (seqheap_push(&tr->held, &h->node))
        return;
      cph_hmap_del(&tr->held_by_seq, h->key);
    }
    free(h);
  }
  cph_error("cluster log: out of memory tracking message %" PRIu64 " (the shard's watermark may "
            "pass it)",
            seq);
}

/* Message seq was acknowledged: no longer held. */
static void held_done(shard_track *tr, uint64_t seq) {
  char key[24];
  snprintf(key, sizeof key, "%" PRIu64, seq);
  held_msg *h = cph_hmap_del(&tr->held_by_seq, key);
  if (h) {
    seqheap_remove(&tr->held, &h->node);
    free(h);
  }
}

/* The shard is no longer served here (or is being rebuilt again): what was tracked for it goes.
 * A rebuild under way is left to finish its engine operation, then dropped. */
static void drop_shard(cph_cflow *f, uint32_t shard) {
  shard_track *tr = &f->tracks[shard];
  for (size_t i = 0; i < tr->pending.n; i++) {
    pending_ev *e = (pending_ev *)tr->pending.v[i];
    cph_hmap_del(&f->pending, e->key);
    pending_free(e);
  }
  for (size_t i = 0; i < tr->held.n; i++)
    free(tr->held.v[i]);
  tr->pending.n = tr->held.n = 0;
  cph_hmap_free(&tr->held_by_seq);
  tr->live = false;
  tr->last_seen = 0;
}

static uint64_t shard_watermark(const shard_track *tr) {
  uint64_t w = tr->last_seen + 1;
  uint64_t p = seqheap_min(&tr->pending), h = seqheap_min(&tr->held);
  return p < w && p < h ? p : h < w ? h : w;
}

static bool served(cph_cflow *f, uint32_t shard) {
  char node[8], url[8];
  return cph_cluster_route(f->s->cluster, shard, node, sizeof node, url, sizeof url) ==
         CPH_CLUSTER_SERVED;
}

/* 12.: once the log holds a watermark of a live shard this node put, the shard's messages below
 * it go — at most every :log-trim-seconds per shard, and only when the watermark moved since the
 * last trim. Why it is safe: the put expected the revision of this node's previous put (10.), so
 * the log took it while no other node had taken the shard; a node taking the shard later reads
 * that key (or a later value: the previous owner's next puts, or its own rewrite of it) as the
 * start of its replay, never a lower one but for a redelivered message's (lower is only a longer
 * replay, of messages that were not needed). A purge that runs late, after the shard moved, purges
 * below a watermark that was true when it was put: what is below it reached no session or was
 * consumed, and stays so. The log's trim thread bounds the purge further by the shard consumer's
 * ack floor (a message whose forwards may be missing is delivered again) and keeps the done
 * subject's last message (the fence). */
static void trim_maybe(cph_cflow *f, uint32_t shard) {
  shard_track *tr = &f->tracks[shard];
  if (!f->trim_ns || !f->log || !tr->live || tr->fenced || tr->mark_fenced ||
      tr->mark_put <= tr->trimmed || tr->mark_put <= 1)
    return;
  int64_t now = cph_mono_ns();
  if (tr->trimmed && now - tr->trim_at_ns < f->trim_ns)
    return;
  if (cph_clog_trim(f->log, shard, tr->mark_put, tr->done_last) == CPH_OK) {
    tr->trimmed = tr->mark_put;
    tr->trim_at_ns = now;
  }
}

/* Every MARK_MS: each live shard's watermark goes to the log when it changed (one put in flight
 * per shard); a shard no longer served is dropped. Only the owner puts: a node that lost the
 * shard stops here, before the next owner can have read it (it rebuilds after the previous
 * owner's lease expired, and this node stops serving before that). A put that comes late all
 * the same is refused by the log: it expects the revision this node wrote last (10.). */
static void park_resends_due(cph_cflow *f);

static void on_mark(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  cph_cflow *f = arg;
  if (f->quiesced || !f->log)
    return;
  struct timeval tv = {MARK_MS / 1000, (MARK_MS % 1000) * 1000};
  evtimer_add(f->ev_mark, &tv);
  park_resends_due(f);
  for (uint32_t s = 0; s < f->shards; s++) {
    shard_track *tr = &f->tracks[s];
    if (!tr->live)
      continue;
    if (!served(f, s)) {
      drop_shard(f, s);
      continue;
    }
    trim_maybe(f, s); /* the watermark the log holds, when its purge was held back */
    uint64_t w = shard_watermark(tr);
    if (w == tr->mark_put || tr->mark_sending || tr->fenced || tr->mark_fenced)
      continue;
    char subject[64], value[24];
    cph_clog_mark_subject(subject, sizeof subject, s);
    int len = snprintf(value, sizeof value, "%" PRIu64, w);
    char *data = strdup(value);
    pub *p = data ? pub_new(f, PUB_MARK, subject, NULL, data, (size_t)len, MARK_DEADLINE_MS) : NULL;
    if (!p)
      continue; /* out of memory: the next tick */
    p->shard = s;
    p->mark = w;
    tr->mark_sending = true;
    pub_send(f, p);
  }
}

/* ================================================================ resends (13., 14.)
 *
 * A copy of a reply (PUB_HIST) or an item (PUB_ITEM) is not waited for by anyone, so nobody
 * would send it again: one the log does not take within its deadline is sent again here, with
 * the same subject, message id and data, after a back-off (RESEND_FIRST_MS doubling up to
 * RESEND_MAX_MS), until the log takes it. Why that is safe, and when one is given up, is in
 * clusterflow.h 13. and 14. */

static pub *resend_of(seqnode *n) { return (pub *)(void *)((char *)n - offsetof(pub, due)); }

/* The wait before the next attempt of a copy, an item or a park mark (6., 13., 14.) whose last
 * wait was prev_ms (0: none yet): RESEND_FIRST_MS, then twice the last, up to RESEND_MAX_MS. */
static int64_t resend_wait_ms(const cph_cflow *f, int64_t prev_ms) {
  if (f->stopping)
    return STOP_RESEND_MS;
  return !prev_ms ? RESEND_FIRST_MS : prev_ms * 2 > RESEND_MAX_MS ? RESEND_MAX_MS : prev_ms * 2;
}

/* After loose, parks_loose or park_pending changed: tells the server whether a stop must wait
 * for the log, and lets a stop that waited only for that end. */
static void unsettled_update(cph_cflow *f) {
  bool was = f->s->log_unsettled;
  f->s->log_unsettled = f->loose || f->parks_loose || f->park_pending;
  if (was && !f->s->log_unsettled && f->stopping)
    cph_srv_maybe_finish_stop(f->s);
}

/* p, a copy or an item (counted in loose from its making), ends: taken or given up. */
static void loose_end(cph_cflow *f, const pub *p) {
  if (p->kind != PUB_HIST && p->kind != PUB_ITEM)
    return;
  f->loose--;
  unsettled_update(f);
}

/* What p holds in memory, as the resends count it against RESEND_CAP_BYTES. */
static size_t pub_bytes(const pub *p) {
  return sizeof *p + p->len + strlen(p->subject) + 1 + (p->msgid ? strlen(p->msgid) + 1 : 0);
}

/* An item key's newest put made here (cph_cflow.item_keys). */
typedef struct item_key {
  uint64_t ref;  /* the newest put's */
  size_t alive;  /* puts of the key not ended yet (in flight, packing or resending) */
  char subject[];
} item_key;

/* p, an item's put just made, is its key's newest. Out of memory: untracked (never resent). */
static void item_key_hold(cph_cflow *f, pub *p) {
  item_key *k = cph_hmap_get(&f->item_keys, p->subject);
  if (!k) {
    size_t n = strlen(p->subject);
    if (!(k = malloc(sizeof *k + n + 1)))
      return;
    memcpy(k->subject, p->subject, n + 1);
    k->alive = 0;
    if (cph_hmap_put(&f->item_keys, k->subject, k) != CPH_OK) {
      free(k);
      return;
    }
  }
  k->ref = p->ref;
  k->alive++;
  p->key_held = true;
}

/* p, an item's put, ends (taken or given up). */
static void item_key_release(cph_cflow *f, pub *p) {
  if (!p->key_held)
    return;
  p->key_held = false;
  item_key *k = cph_hmap_get(&f->item_keys, p->subject);
  if (k && --k->alive == 0) {
    cph_hmap_del(&f->item_keys, k->subject);
    free(k);
  }
}

/* Why item p is not to be sent again, or NULL: its session was deleted here (its keys are
 * deleted), a newer put of its key was made here since (an older value must not land over it:
 * a kept context's slot, a memory put again tombstoned), or this node does not serve its shard
 * under the epoch it was made in any more (*lost: the next owner took the session's records
 * from its state, 11., and only those; its own puts of the key must not be written over). */
static const char *item_skip(cph_cflow *f, const pub *p, bool *lost) {
  *lost = false;
  if (p->forgotten)
    return "its session was deleted";
  const item_key *k = p->key_held ? cph_hmap_get(&f->item_keys, p->subject) : NULL;
  if (!k) {
    *lost = true;
    return "out of memory tracking its key";
  }
  if (k->ref != p->ref)
    return "a newer put of its key was made since";
  const shard_track *tr = &f->tracks[p->shard];
  if (!tr->live || tr->fenced || tr->epoch != p->epoch || !served(f, p->shard)) {
    *lost = true;
    return "this node no longer serves its shard (the next owner took the session's records "
           "from its state)";
  }
  return NULL;
}

/* p, resending, leaves the resends (taken, or given up): uncounted. */
static void resend_leave(cph_cflow *f, pub *p) {
  if (p->in_resend) {
    seqheap_remove(&f->resend, &p->due);
    p->in_resend = false;
  }
  if (!p->resending)
    return;
  p->resending = false;
  size_t b = pub_bytes(p);
  if (p->kind == PUB_HIST) {
    f->hist_pending--;
    f->hist_pending_bytes -= b;
  } else {
    f->item_pending--;
    f->item_pending_bytes -= b;
  }
}

static void count_dropped(cph_cflow *f, const pub *p) {
  if (p->kind == PUB_HIST)
    f->hist_dropped++;
  else
    f->item_dropped++;
}

/* Whether p is given up rather than sent again (an item item_skip names): logged, and counted
 * as dropped when that may lose it. */
static bool resend_given_up(cph_cflow *f, const pub *p) {
  bool lost = p->too_large;
  const char *skip = p->too_large        ? "the log never takes a message this large"
                     : p->kind == PUB_ITEM ? item_skip(f, p, &lost)
                                           : NULL;
  if (!skip)
    return false;
  if (lost) {
    count_dropped(f, p);
    cph_warn("cluster log: %s %s is not sent again: %s",
             p->kind == PUB_HIST ? "the copy of a reply" : "item",
             p->msgid ? p->msgid : p->subject, skip);
  } else {
    cph_debug("cluster log: item %s is not sent again: %s", p->subject, skip);
  }
  return true;
}

/* Arms the resend timer for the earliest resend. */
static void resend_arm(cph_cflow *f) {
  if (!f->resend.n || f->quiesced)
    return;
  int64_t wait_ns = (int64_t)seqheap_min(&f->resend) - cph_mono_ns();
  if (wait_ns < 0)
    wait_ns = 0;
  struct timeval tv = {(time_t)(wait_ns / 1000000000), (suseconds_t)(wait_ns % 1000000000 / 1000)};
  evtimer_add(f->ev_resend, &tv);
}

/* p, a copy or an item, was not taken (why) by this attempt: true when it waits for its next
 * attempt (p kept), false when it is given up (the caller frees it) — an item item_skip
 * names (logged; counted as dropped when that may lose it), or, logged and counted as dropped,
 * anything that would take the resends past their cap (f->resend_cap: RESEND_CAP_BYTES; what waits already keeps its
 * place: the oldest are the longest unseen), or out of memory. */
static bool resend_later(cph_cflow *f, pub *p, const char *why) {
  if (resend_given_up(f, p))
    return false;
  const char *what = p->kind == PUB_HIST ? "copy of a reply" : "item";
  if (!p->resending) {
    size_t b = pub_bytes(p);
    size_t held = f->hist_pending_bytes + f->item_pending_bytes;
    if (held + b > f->resend_cap) {
      count_dropped(f, p);
      cph_error("cluster log: the %s %s (%s) is DROPPED: the log has not taken %zu copies and "
                "items (%zu bytes) and no more wait to be sent again; %s",
                what, p->msgid ? p->msgid : p->subject, p->subject,
                f->hist_pending + f->item_pending, held,
                p->kind == PUB_HIST ? "the sessions of that shard do not see the reply in that "
                                      "channel"
                                    : "it moves with its session only while the session's "
                                      "state carries it");
      return false;
    }
    p->resending = true;
    p->backoff_ms = resend_wait_ms(f, 0);
    if (p->kind == PUB_HIST) {
      f->hist_pending++;
      f->hist_pending_bytes += b;
    } else {
      f->item_pending++;
      f->item_pending_bytes += b;
    }
  } else {
    p->backoff_ms = resend_wait_ms(f, p->backoff_ms);
    cph_debug("cluster log: the %s %s was not taken again (%s); sent again in %" PRId64 " ms",
              what, p->msgid ? p->msgid : p->subject, why ? why : "no answer", p->backoff_ms);
  }
  p->due.seq = (uint64_t)(cph_mono_ns() + p->backoff_ms * 1000000LL);
  if (!seqheap_push(&f->resend, &p->due)) {
    resend_leave(f, p);
    count_dropped(f, p);
    cph_error("cluster log: the %s %s is DROPPED: out of memory queueing it to be sent again",
              what, p->msgid ? p->msgid : p->subject);
    return false;
  }
  p->in_resend = true;
  resend_arm(f);
  return true;
}

/* Sends a copy (14.) or an item (13.): its first attempt, or a resend. The test hooks
 * (cph_cflow.test_*) fail it here. */
static void pub_attempt(cph_cflow *f, pub *p) {
  int drop = p->kind == PUB_HIST ? f->test_hist_drop : f->test_item_drop;
  int unacked = p->kind == PUB_HIST ? f->test_hist_unacked : f->test_item_unacked;
  if (p->rounds < drop) {
    pub_outcome(f, p, false, 0, false, "not sent (CPH_TEST_FAIL_HIST_COPIES / _ITEMS)");
    return;
  }
  p->test_unacked = p->rounds < drop + unacked;
  pub_send(f, p);
}

/* At the earliest resend's time: the resends due, oldest due first, RESEND_BATCH at most. */
static void on_resend(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  cph_cflow *f = arg;
  if (f->quiesced)
    return;
  int64_t now = cph_mono_ns();
  for (int n = 0; n < RESEND_BATCH && f->resend.n && seqheap_min(&f->resend) <= (uint64_t)now;
       n++) {
    pub *p = resend_of(f->resend.v[0]);
    seqheap_remove(&f->resend, &p->due);
    p->in_resend = false;
    if (resend_given_up(f, p)) {
      resend_leave(f, p);
      item_key_release(f, p);
      loose_end(f, p);
      pub_free(p);
      continue;
    }
    p->rounds++;
    if (p->kind == PUB_HIST)
      f->hist_retries++;
    else
      f->item_retries++;
    p->deadline_ns = now + RESEND_WAIT_MS * 1000000LL;
    pub_attempt(f, p); /* may fail at once: then due again after its next back-off */
  }
  resend_arm(f);
}

/* ================================================================ done marks (6.) */

/* *out, a deep copy of n. False out of memory (*out then holds what was copied: free it). */
static bool park_note_copy(cph_park_note *out, const cph_park_note *n) {
  *out = (cph_park_note){.turn_id = n->turn_id, .attempts = n->attempts};
  if (!(out->session = strdup(n->session)) || (n->error && !(out->error = strdup(n->error))))
    return false;
  if (!n->keys.count)
    return true;
  if (!(out->keys.items = calloc(n->keys.count, sizeof *out->keys.items)))
    return false;
  for (size_t i = 0; i < n->keys.count; i++, out->keys.count++)
    if (!(out->keys.items[i] = strdup(n->keys.items[i])))
      return false;
  return true;
}

static void done_req_free(done_req *dr) {
  json_decref(dr->answer);
  free(dr->session);
  cph_park_note_free(&dr->note);
  free(dr);
}

/* dr's request, answered: off the waiting list, and ended. */
static void done_unlink(cph_cflow *f, done_req *dr) {
  if (dr->prev)
    dr->prev->next = dr->next;
  else
    f->dones = dr->next;
  if (dr->next)
    dr->next->prev = dr->prev;
  cph_req_end(dr->r);
}

/* What a park or unpark mark not taken leaves a node that takes the session over. */
static const char *park_lost(const done_req *dr) {
  return dr->kind == MARK_PARK
             ? "delivers its input to a turn again"
             : "holds its input parked again (list GET /v1/turns?state=parked there, and "
               "requeue it there)";
}

/* Why an unpark mark waiting to be sent again is given up, or NULL: some of the input it
 * brought back is no longer in its session's live inbox here — consumed (the done mark
 * settles it), or taken by a turn that parked it again (that turn's park mark must stay the
 * last word on those keys: an unpark landing after it would deliver parked input), or the
 * session was deleted, or its inbox could not be read (given up, the safe side: the next owner
 * holds the input parked). */
static const char *unpark_resend_void(cph_cflow *f, const cph_park_note *note) {
  cph_strv live = {0};
  cph_err err = {0};
  int rc = cph_engine_inbox_keys(f->s->engine, note->session, &live, &err);
  if (rc == CPH_ENOTFOUND)
    return "its session was deleted";
  if (rc != CPH_OK)
    return "its session's inbox could not be read";
  cph_hmap in = CPH_HMAP_INIT;
  const char *why = NULL;
  for (size_t i = 0; !why && i < live.count; i++)
    if (live.items[i] && cph_hmap_put(&in, live.items[i], live.items[i]) != CPH_OK)
      why = "out of memory";
  for (size_t i = 0; !why && i < note->keys.count; i++)
    if (!cph_hmap_get(&in, note->keys.items[i]))
      why = "what it brought back was consumed, or parked again, here";
  cph_hmap_free(&in);
  cph_strv_free(&live);
  return why;
}

/* Why a park (or unpark) mark waiting to be sent again is given up, or NULL: this node no
 * longer serves the session's shard (its next owner rebuilt it from what the log held; a mark
 * now would be refused by the fence); a park mark's turn left this node's parked list
 * (requeued: its unpark mark follows the park marks taken; its session deleted: its delete's
 * mark names the keys); an unpark mark's input left the live inbox (unpark_resend_void). */
static const char *park_resend_void(cph_cflow *f, mark_kind kind, const cph_park_note *note) {
  uint32_t shard = cph_cluster_shard_of(note->session, cph_cluster_shards(f->s->cluster));
  if (f->quiesced || !served(f, shard) || f->tracks[shard].fenced)
    return "this node no longer serves the session's shard";
  if (kind == MARK_UNPARK)
    return unpark_resend_void(f, note);
  cph_turn_record rec = {0};
  cph_err err = {0};
  int rc = cph_engine_turn_record(f->s->engine, note->turn_id, &rec, &err);
  const char *why = rc == CPH_ENOTFOUND ? "the turn is gone (its session was deleted)"
                    : rc != CPH_OK      ? NULL /* unknown: sent again, harmless if parked */
                    : strcmp(rec.session, note->session) != 0 ? "the turn is gone"
                    : strcmp(rec.state, "parked") != 0        ? "the turn was requeued"
                                                              : NULL;
  cph_turn_record_free(&rec);
  return why;
}

/* dr, a park or unpark mark the log did not take: queued to be sent again (its note taken)
 * unless park_resend_void gives it up. True when queued. */
static bool park_resend_later(cph_cflow *f, done_req *dr) {
  if (park_resend_void(f, dr->kind, &dr->note))
    return false;
  park_resend *pr = calloc(1, sizeof *pr);
  if (!pr)
    return false;
  pr->kind = dr->kind;
  pr->note = dr->note;
  dr->note = (cph_park_note){0};
  pr->backoff_ms = resend_wait_ms(f, dr->backoff_ms);
  pr->due_ns = cph_mono_ns() + pr->backoff_ms * 1000000LL;
  park_resend **at = &f->park_resends; /* oldest first: they go again in this order */
  while (*at)
    at = &(*at)->next;
  *at = pr;
  f->park_pending++;
  unsettled_update(f);
  return true;
}

static bool park_publish(cph_cflow *f, cph_req *r, mark_kind kind, const cph_park_note *note,
                         json_t *answer, int64_t backoff_ms);

/* On the watermark tick: the park and unpark marks due to be sent again, oldest first (so a
 * turn's park mark goes before its unpark mark). */
static void park_resends_due(cph_cflow *f) {
  int64_t now = cph_mono_ns();
  for (park_resend **at = &f->park_resends; *at;) {
    park_resend *pr = *at;
    if (pr->due_ns > now) {
      at = &pr->next;
      continue;
    }
    *at = pr->next;
    f->park_pending--; /* unsettled_update below, once the resend (if any) counts */
    const char *mark = pr->kind == MARK_PARK ? "park" : "unpark";
    const char *why = park_resend_void(f, pr->kind, &pr->note);
    if (why) {
      f->park_resends_dropped++;
      cph_info("cluster log: the %s mark of turn %" PRIu64 " of session %s is not sent again: "
               "%s",
               mark, pr->note.turn_id, pr->note.session, why);
    } else {
      f->park_retries++;
      if (!park_publish(f, NULL, pr->kind, &pr->note, NULL, pr->backoff_ms)) {
        f->park_mark_failures++;
        cph_error("cluster log: out of memory sending the %s mark of turn %" PRIu64
                  " of session %s again (a node that takes the session over %s)",
                  mark, pr->note.turn_id, pr->note.session,
                  park_lost(&(done_req){.kind = pr->kind}));
      }
    }
    cph_park_note_free(&pr->note);
    free(pr);
  }
  unsettled_update(f);
}

static void park_answer(cph_cflow *f, done_req *dr) {
  const char *did = dr->kind == MARK_PARK ? "parked" : "requeued";
  const char *mark = dr->kind == MARK_PARK ? "park mark" : "unpark mark";
  if (dr->failed)
    f->park_mark_failures++;
  else if (dr->kind == MARK_PARK)
    f->park_marks++;
  else
    f->unpark_marks++;
  /* 6.: a park or unpark mark not taken goes again until the log takes it (or its turn, its
   * input or the shard leaves this node), so a node that takes the session over holds the
   * turn parked, or its input staged, too */
  bool again = dr->failed && park_resend_later(f, dr);
  if (!dr->r) {
    f->parks_loose--;
    unsettled_update(f);
    if (dr->failed)
      cph_warn("cluster log: the %s of a turn of session %s was not taken (%s); %s%s",
               mark, dr->session, dr->why,
               again ? "it is sent again until the log takes it" : "a node that takes the "
                                                                     "session over ",
               again ? "" : park_lost(dr));
    return;
  }
  if (dr->failed && again)
    cph_reply_error(dr->r, 503, "unavailable", NULL,
                    "the turn was %s on this node, but the cluster log (NATS JetStream) did not "
                    "take its %s within %d s (%s); the mark is sent again until the log takes "
                    "it: should this node die before that, the node that serves the session "
                    "next %s",
                    did, mark, DONE_DEADLINE_MS / 1000, dr->why, park_lost(dr));
  else if (dr->failed)
    cph_reply_error(dr->r, 503, "unavailable", NULL,
                    "the turn was %s on this node, but the cluster log (NATS JetStream) did not "
                    "take its %s within %d s (%s): should this node die before the session is "
                    "served elsewhere, the node that serves it next %s",
                    did, mark, DONE_DEADLINE_MS / 1000, dr->why, park_lost(dr));
  else if (!served(f, dr->shard))
    cph_reply_error(dr->r, 503, "unavailable", NULL,
                    "the turn was %s on this node, but its session's shard %" PRIu32 " moved to "
                    "another node before the cluster log took its %s: the new owner may be a "
                    "node that %s",
                    did, dr->shard, mark, park_lost(dr));
  else
    cph_reply_json(dr->r, 200, json_incref(dr->answer));
  done_unlink(f, dr);
}

static void done_answer(cph_cflow *f, done_req *dr) {
  bool edit = dr->made_buf[0] != '\0'; /* logs no mark: its put counts as a state put alone */
  if (dr->kind == MARK_DONE && dr->failed && !edit)
    f->done_mark_failures++;
  else if (dr->kind == MARK_DONE && !edit)
    f->done_marks++;
  if (dr->kind != MARK_DONE) {
    park_answer(f, dr);
  } else if (dr->r && dr->made_buf[0]) {
    cph_req *r = dr->r;
    if (dr->failed)
      cph_reply_error(r, 503, "unavailable", NULL,
                      "%s on this node, but the cluster log (NATS JetStream) did not take its "
                      "session's state within %d s (%s): should this node die before the "
                      "session is served elsewhere, the new owner lacks %s",
                      dr->made_buf, DONE_DEADLINE_MS / 1000, dr->why, dr->lacks_buf);
    else if (!served(f, dr->shard))
      cph_reply_error(r, 503, "unavailable", NULL,
                      "%s on this node, but its session's shard %" PRIu32 " moved to another "
                      "node before the cluster log took the session's state: the new owner "
                      "may lack %s",
                      dr->made_buf, dr->shard, dr->lacks_buf);
    else
      cph_reply_json(r, 200, json_incref(dr->answer));
    done_unlink(f, dr);
  } else if (dr->r) {
    cph_req *r = dr->r;
    if (dr->failed)
      cph_reply_error(r, 503, "unavailable", NULL,
                      "the turn was completed on this node, but the cluster log (NATS JetStream) "
                      "did not take the record of what it consumed within %d s (%s): should "
                      "this node die before the turn's session is served elsewhere, its input "
                      "may be delivered to a turn again",
                      DONE_DEADLINE_MS / 1000, dr->why);
    else if (!served(f, dr->shard))
      cph_reply_error(r, 503, "unavailable", NULL,
                      "the turn was completed on this node, but its session's shard %" PRIu32
                      " moved to another node before the cluster log took the record of what it "
                      "consumed: the new owner may deliver its input to a turn again",
                      dr->shard);
    else
      cph_reply_json(r, 200, json_incref(dr->answer));
    done_unlink(f, dr);
  } else if (dr->failed) {
    cph_warn("cluster log: a done mark of session %s (a delete, or an event it refused) was not "
             "taken (%s); a rebuild of its shard may deliver those events again",
             dr->session, dr->why);
  }
  done_req_free(dr);
}

/* Sends the shard's next done mark unless one is in flight: each expects the sequence of the
 * one before (10.), so they go one at a time. */
static void done_pump(cph_cflow *f, uint32_t shard) {
  shard_track *tr = &f->tracks[shard];
  while (!tr->done_sending && tr->done_head && !tr->done_head->packing) {
    pub *p = tr->done_head;
    tr->done_head = p->next_done;
    if (!tr->done_head)
      tr->done_tail = NULL;
    p->next_done = NULL;
    if (p->kind == PUB_DONE && p->dr->failed && p->dr->r) {
      /* Its completion's state did not reach the log (11.): the mark must not either, or a
       * rebuild would take the input as consumed and show no trace of the turn. The completion
       * answers 503; a retry (`already`) logs state and mark again. */
      done_req *dr = p->dr;
      pub_free(p);
      if (--dr->outstanding == 0)
        done_answer(f, dr);
      continue;
    }
    tr->done_sending = true;
    int *drop = p->kind == PUB_STATE          ? &f->test_state_drop
                : p->kind != PUB_DONE         ? NULL
                : p->dr->kind == MARK_PARK    ? &f->test_park_drop
                : p->dr->kind == MARK_UNPARK ? &f->test_unpark_drop
                                              : NULL;
    if (drop && *drop > 0) {
      --*drop; /* a test's fault (cph_cflow.test_park_drop, test_unpark_drop, test_state_drop) */
      pub_outcome(f, p, false, 0, false,
                  "not sent (CPH_TEST_FAIL_PARK_MARKS / _UNPARK_MARKS / CPH_TEST_FAIL_STATES)");
      return;
    }
    pub_send(f, p); /* may answer at once (then the next one is sent from there) */
    return;
  }
}

/* One done mark: {"session", "keys": [keys[from..to)]}. */
static char *done_payload(const char *session, const cph_strv *keys, size_t from, size_t to) {
  json_t *a = json_array();
  for (size_t i = from; a && i < to; i++)
    json_array_append_new(a, json_string(keys->items[i]));
  json_t *doc = a ? json_pack("{ssso}", "session", session, "keys", a) : NULL;
  char *data = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
  json_decref(doc);
  return data;
}

/* A packed state (or item) is back (on the loop): it replaces the raw one, under the same
 * epoch. */
static void state_packed(cph_cflow *f, pub *p) {
  cph_statezip_job *job = &p->zjob;
  if (p->kind == PUB_STATE) /* log.states.pack_us: the states' packing time */
    f->state_pack_ns += job->pack_ns;
  if (job->out) { /* else (out of memory) the raw value goes */
    memcpy(job->out, p->data, CPH_CLOG_EPOCH_BYTES);
    free(p->data);
    p->data = (char *)job->out;
    p->len = job->out_len;
    job->out = NULL;
  }
  p->packing = false;
}

static void on_state_packed(void *arg, cph_statezip_job *job) {
  cph_cflow *f = arg;
  pub *p = job->tag;
  state_packed(f, p);
  if (p->kind != PUB_ITEM) {
    done_pump(f, p->shard);
    return;
  }
  /* 13.: a big item goes once packed, on its own; the packer hands jobs back in order */
  pub **at = &f->packing_head, *prev = NULL;
  while (*at && *at != p)
    prev = *at, at = &(*at)->next_packing;
  if (*at)
    *at = p->next_packing;
  if (f->packing_tail == p)
    f->packing_tail = prev;
  pub_attempt(f, p);
}

/* Packs p's value (a state, 11., or a big item, 13.): on the packer's thread, or here when it
 * takes none. */
static void state_pack(cph_cflow *f, pub *p) {
  p->raw_len = p->len;
  p->zjob = (cph_statezip_job){.raw = (const uint8_t *)p->data + CPH_CLOG_EPOCH_BYTES,
                               .raw_len = p->len - CPH_CLOG_EPOCH_BYTES,
                               .headroom = CPH_CLOG_EPOCH_BYTES,
                               .tag = p};
  p->packing = true;
  if (cph_statezip_packer_submit(f->packer, &p->zjob))
    return;
  cph_statezip_job_run(&p->zjob, CPH_STATEZIP_LEVEL);
  state_packed(f, p);
}

/* A mark's payload for keys [from, to) (done_part, park_part). */
typedef char *(*mark_part_fn)(const void *ctx, size_t from, size_t to);

typedef struct done_part_of {
  const char *session;
  const cph_strv *keys;
} done_part_of;

static char *done_part(const void *ctx, size_t from, size_t to) {
  const done_part_of *d = ctx;
  return done_payload(d->session, d->keys, from, to);
}

/* Appends to *parts (*n of *cap) dr's marks of keys, in parts of about DONE_CHUNK_BYTES on
 * subject, each under a message id of its own of the done marks' form (a fence check knows it
 * as this node's; a resend is stored once); part(ctx, from, to) writes each one's payload.
 * False when out of memory (what was appended stays in *parts for marks_abandon). */
static bool marks_add(cph_cflow *f, done_req *dr, const char *subject, const cph_strv *keys,
                      mark_part_fn part, const void *ctx, pub ***parts, size_t *n, size_t *cap) {
  for (size_t from = 0; from < keys->count;) {
    size_t to = from, bytes = 0;
    while (to < keys->count && (to == from || bytes + strlen(keys->items[to]) < DONE_CHUNK_BYTES))
      bytes += strlen(keys->items[to++]) + 3;
    if (*n == *cap) {
      size_t grown_cap = *cap ? 2 * *cap : 4;
      pub **g = realloc(*parts, grown_cap * sizeof *g);
      if (!g)
        return false;
      *parts = g;
      *cap = grown_cap;
    }
    char msgid[160];
    snprintf(msgid, sizeof msgid, "d.%s.%" PRIx64 ".%" PRIu64, f->node, f->boot, ++f->minted_marks);
    char *data = part(ctx, from, to);
    pub *p =
        data ? pub_new(f, PUB_DONE, subject, msgid, data, strlen(data), DONE_DEADLINE_MS) : NULL;
    if (!p)
      return false;
    p->dr = dr;
    p->shard = dr->shard;
    (*parts)[(*n)++] = p;
    from = to;
  }
  return true;
}

/* Out of memory before dr's parts were queued: none was sent; answer and dr go. */
static void marks_abandon(done_req *dr, pub **parts, size_t n, json_t *answer) {
  for (size_t i = 0; i < n; i++)
    pub_free(parts[i]);
  free(parts);
  dr->answer = answer;
  done_req_free(dr);
}

/* Queues dr's parts (taking the array) on its shard's queue of done marks, in order, r (when
 * given) held until done_answer; then sends what the queue allows. */
static void marks_queue(cph_cflow *f, cph_req *r, done_req *dr, pub **parts, size_t n) {
  dr->outstanding = n + 1; /* + 1 until every part is queued (one may answer at once) */
  if (r) {
    r->held = true;
    dr->next = f->dones;
    if (f->dones)
      f->dones->prev = dr;
    f->dones = dr;
  }
  shard_track *tr = &f->tracks[dr->shard];
  for (size_t i = 0; i < n; i++) {
    parts[i]->shard = dr->shard;
    if (tr->done_tail)
      tr->done_tail->next_done = parts[i];
    else
      tr->done_head = parts[i];
    tr->done_tail = parts[i];
    if (parts[i]->kind == PUB_STATE) /* in the queue: freed only after the packer stopped */
      state_pack(f, parts[i]);
  }
  free(parts);
  done_pump(f, dr->shard);
  if (--dr->outstanding == 0)
    done_answer(f, dr);
}

/* Logs what a completion (r, answered with answer once the log took it), a session delete or
 * a refusal (r NULL) consumed: the engine keys of its events, in marks of about DONE_CHUNK_BYTES on
 * ceph.s.done.<shard of session>, each under a message id of its own (a resend is stored
 * once). The events leave the shard's pending set at once: they were consumed here. True when
 * r is taken (answered later); false when r must be answered now (out of memory: 500). */
static bool done_publish(cph_cflow *f, cph_req *r, const char *made, const char *lacks,
                         const char *session, const cph_strv *keys, const uint8_t *state,
                         size_t state_len, json_t *answer) {
  pending_consumed(f, keys);
  done_req *dr = calloc(1, sizeof *dr);
  if (!dr || !(dr->session = strdup(session))) {
    free(dr);
    json_decref(answer);
    return false;
  }
  dr->r = r;
  snprintf(dr->made_buf, sizeof dr->made_buf, "%s", made ? made : "");
  snprintf(dr->lacks_buf, sizeof dr->lacks_buf, "%s", lacks ? lacks : "");
  dr->answer = answer;
  dr->shard = cph_cluster_shard_of(session, cph_cluster_shards(f->s->cluster));
  char subject[64];
  cph_clog_done_subject(subject, sizeof subject, dr->shard);
  pub **parts = NULL;
  size_t n = 0, cap = 0;
  bool ok = true;
  if (state) { /* 11.: the session's state first; the marks go only once the log holds it */
    char ssubject[700], msgid[160];
    uint8_t *value = NULL;
    pub *p = NULL;
    if (cph_clog_state_subject(ssubject, sizeof ssubject, dr->shard, session) == CPH_OK &&
        (value = malloc(CPH_CLOG_EPOCH_BYTES + state_len))) {
      cph_clog_epoch_put(value, f->tracks[dr->shard].epoch);
      memcpy(value + CPH_CLOG_EPOCH_BYTES, state, state_len);
      snprintf(msgid, sizeof msgid, "st.%s.%" PRIx64 ".%" PRIu64, f->node, f->boot,
               ++f->minted_marks);
      p = pub_new(f, PUB_STATE, ssubject, msgid, (char *)value, CPH_CLOG_EPOCH_BYTES + state_len,
                  DONE_DEADLINE_MS);
    }
    if (p && (parts = malloc(4 * sizeof *parts))) {
      cap = 4;
      p->dr = dr;
      parts[n++] = p;
    } else {
      if (p)
        pub_free(p);
      ok = false;
    }
  }
  if (!ok || !marks_add(f, dr, subject, keys, done_part, &(done_part_of){session, keys}, &parts,
                        &n, &cap)) {
    marks_abandon(dr, parts, n, answer);
    return false;
  }
  marks_queue(f, r, dr, parts, n);
  return true;
}

/* One park or unpark mark (6.): {"session", "park" | "unpark": [keys[from..to)], "turn":
 * "<node>/<id>", "attempts", "error"} — "turn" groups the parts of one turn's mark (a rebuild
 * makes one turn of them, 8.); attempts and error are what the rebuilt turn shows. */
static char *park_payload(const cph_cflow *f, mark_kind kind, const cph_park_note *note,
                          size_t from, size_t to) {
  json_t *a = json_array();
  for (size_t i = from; a && i < to; i++)
    json_array_append_new(a, json_string(note->keys.items[i]));
  char turn[160];
  snprintf(turn, sizeof turn, "%s/%" PRIu64, f->node, note->turn_id);
  json_t *doc = a ? json_pack("{sssosssIss}", "session", note->session,
                              kind == MARK_PARK ? "park" : "unpark", a, "turn", turn, "attempts",
                              (json_int_t)note->attempts, "error",
                              note->error ? note->error : "")
                  : NULL;
  char *data = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
  json_decref(doc);
  return data;
}

typedef struct park_part_of {
  const cph_cflow *f;
  mark_kind kind;
  const cph_park_note *note;
} park_part_of;

static char *park_part(const void *ctx, size_t from, size_t to) {
  const park_part_of *p = ctx;
  return park_payload(p->f, p->kind, p->note, from, to);
}

/* Logs the park (or unpark) mark of a turn parked (requeued) here, in parts of about
 * DONE_CHUNK_BYTES, through the shard's queue of done marks (in order with its completions'
 * marks, fenced: 10.), each part under a message id of its own of the done marks' form (a
 * fence check knows it as this node's). The keys stay pending (7.): parked input is not
 * consumed. r, when given, is answered with answer (taken) once the log took every part, 503
 * when it did not (park_answer). False when out of memory (answer freed; r not answered). */
static bool park_publish(cph_cflow *f, cph_req *r, mark_kind kind, const cph_park_note *note,
                         json_t *answer, int64_t backoff_ms) {
  done_req *dr = calloc(1, sizeof *dr);
  if (!dr || !(dr->session = strdup(note->session)) || !park_note_copy(&dr->note, note)) {
    if (dr) {
      dr->answer = answer;
      done_req_free(dr);
    } else {
      json_decref(answer);
    }
    return false;
  }
  dr->backoff_ms = backoff_ms;
  dr->kind = kind;
  dr->r = r;
  dr->answer = answer;
  dr->shard = cph_cluster_shard_of(note->session, cph_cluster_shards(f->s->cluster));
  char subject[64];
  cph_clog_done_subject(subject, sizeof subject, dr->shard);
  pub **parts = NULL;
  size_t n = 0, cap = 0;
  if (!marks_add(f, dr, subject, &note->keys, park_part, &(park_part_of){f, kind, note}, &parts,
                 &n, &cap)) {
    marks_abandon(dr, parts, n, answer);
    return false;
  }
  if (!r) { /* an expiry's park, or a resend: nobody else waits for it (a stop does) */
    f->parks_loose++;
    unsettled_update(f);
  }
  marks_queue(f, r, dr, parts, n);
  return true;
}

void cph_cflow_parked(cph_cflow *f, cph_req *r, bool parked, const cph_park_note *note,
                      json_t *answer) {
  mark_kind kind = parked ? MARK_PARK : MARK_UNPARK;
  const char *did = parked ? "parked" : "requeued";
  if (!note->session || !note->keys.count) {
    if (r)
      cph_reply_json(r, 200, answer);
    else
      json_decref(answer);
  } else if (f->quiesced) {
    json_decref(answer);
    f->park_mark_failures++;
    if (r)
      cph_reply_error(r, 503, "unavailable", NULL,
                      "the turn was %s on this node, but cephalond is stopping before the "
                      "cluster log took its %s mark: the node that serves its session next %s",
                      did, parked ? "park" : "unpark",
                      park_lost(&(done_req){.kind = kind}));
  } else if (!park_publish(f, r, kind, note, answer, 0)) {
    f->park_mark_failures++;
    if (r)
      cph_reply_error(r, 500, "internal", NULL,
                      "the turn was %s on this node, but out of memory logging its %s mark", did,
                      parked ? "park" : "unpark");
    else
      cph_error("cluster log: out of memory logging the park mark of turn %" PRIu64
                " of session %s (a node that takes the session over delivers its input again)",
                note->turn_id, note->session);
  }
}

void cph_cflow_passed(cph_cflow *f) {
  if (!f || f->quiesced)
    return;
  cph_park_note *v = NULL;
  size_t n = 0;
  if (cph_engine_take_parks(f->s->engine, &v, &n) == CPH_OK) { /* else they stay for the next */
    for (size_t i = 0; i < n; i++) {
      cph_cflow_parked(f, NULL, true, &v[i], NULL);
      cph_park_note_free(&v[i]);
    }
    free(v);
  }
  /* the records and kept contexts of turns that ended with no request (13.) */
  cph_session_items *ended = NULL;
  if (cph_engine_take_ended_items(f->s->engine, &ended, &n) != CPH_OK)
    return; /* out of memory: they stay for the next pass */
  for (size_t i = 0; i < n; i++) {
    cph_cflow_items(f, ended[i].session, &ended[i].items);
    cph_session_items_free(&ended[i]);
  }
  free(ended);
}

void cph_cflow_completed(cph_cflow *f, cph_req *r, const char *session, const cph_strv *keys,
                         const uint8_t *state, size_t state_len, json_t *answer) {
  uint32_t shard = session ? cph_cluster_shard_of(session, cph_cluster_shards(f->s->cluster)) : 0;
  if (!session || (!keys->count && !state)) {
    cph_reply_json(r, 200, answer);
  } else if (state && !f->quiesced && !f->tracks[shard].live) {
    json_decref(answer);
    cph_reply_error(r, 503, "unavailable", NULL,
                    "the turn was completed on this node, but its session's shard %" PRIu32
                    " is not rebuilt here yet (or moved away), so the cluster log cannot take the "
                    "session's state now: retry the completion (it answers from the stored turn)",
                    shard);
  } else if (f->quiesced) {
    json_decref(answer);
    cph_reply_error(r, 503, "unavailable", NULL,
                    "the turn was completed on this node, but cephalond is stopping before the "
                    "cluster log took the record of what it consumed: the node that serves its "
                    "session next may deliver its input to a turn again");
  } else if (!done_publish(f, r, NULL, NULL, session, keys, state, state_len, answer)) {
    cph_reply_error(r, 500, "internal", NULL,
                    "the turn was completed on this node, but out of memory logging the record "
                    "of what it consumed");
  }
}

void cph_cflow_context_changed(cph_cflow *f, cph_req *r, const char *session, const char *made,
                               const char *lacks, const uint8_t *state, size_t state_len,
                               json_t *answer) {
  uint32_t shard = cph_cluster_shard_of(session, cph_cluster_shards(f->s->cluster));
  static const cph_strv none = {0};
  if (!state) {
    cph_reply_json(r, 200, answer); /* the state was not read (logged): nothing to wait for */
  } else if (f->quiesced || !f->tracks[shard].live) {
    json_decref(answer);
    cph_reply_error(r, 503, "unavailable", NULL,
                    "%s on this node, but %s, so the cluster log cannot take its session's "
                    "state now: the node that serves the session next may lack %s",
                    made, f->quiesced ? "cephalond is stopping"
                                      : "its shard is not rebuilt here yet (or moved away)",
                    lacks);
  } else if (!done_publish(f, r, made, lacks, session, &none, state, state_len, answer)) {
    cph_reply_error(r, 500, "internal", NULL,
                    "%s on this node, but out of memory logging its session's state", made);
  }
}

/* Items this big are packed (statezip.h) before they are put: a kept turn context or a seal
 * holds a conversation (~15-70 KB), which deflate folds as it folds a state; a turn record or a
 * memory (a few hundred bytes) is put as it is. */
#define ITEM_PACK_MIN 2048

/* The owner of a channel's keys in CEPH_STATE (16.): "#" and the channel, as its memories'
 * scope is named; no session id has it (sessions.c). */
#define CHANNEL_OWNER_PREFIX '#'

/* Puts items under owner's keys of shard key_shard ("<key_shard>.<owner in hex>.<name>"),
 * made while this node serves shard `shard` (what a resend checks, item_skip). */
static void items_put(cph_cflow *f, uint32_t key_shard, const char *owner, uint32_t shard,
                      const cph_state_items *items) {
  bool chan = owner[0] == CHANNEL_OWNER_PREFIX;
  for (size_t i = 0; i < items->n; i++) {
    const cph_state_item *it = &items->v[i];
    char subject[1200], msgid[160];
    uint8_t *value = NULL;
    pub *p = NULL;
    if (cph_clog_item_subject(subject, sizeof subject, key_shard, owner, it->name) == CPH_OK &&
        (value = malloc(CPH_CLOG_EPOCH_BYTES + it->len))) {
      cph_clog_epoch_put(value, f->tracks[shard].epoch);
      memcpy(value + CPH_CLOG_EPOCH_BYTES, it->data, it->len);
      snprintf(msgid, sizeof msgid, "it.%s.%" PRIx64 ".%" PRIu64, f->node, f->boot,
               ++f->minted_marks);
      p = pub_new(f, PUB_ITEM, subject, msgid, (char *)value, CPH_CLOG_EPOCH_BYTES + it->len,
                  DONE_DEADLINE_MS);
    } else {
      free(value);
    }
    if (!p) {
      f->item_dropped++;
      cph_error("cluster log: item %.40s of %s %s is DROPPED, not put (%s)", it->name,
                chan ? "channel" : "session", owner + chan,
                value ? "out of memory" : "its key is too long");
      continue;
    }
    p->shard = shard;
    p->epoch = f->tracks[shard].epoch;
    p->chan_item = chan;
    item_key_hold(f, p); /* the key's newest put: an older one waiting is not sent again */
    f->loose++;
    unsettled_update(f);
    if (it->len >= ITEM_PACK_MIN) /* a kept turn context, a seal: packed as a state is */
      state_pack(f, p);
    if (p->packing) { /* on the packer, which hands it back on the loop (on_state_packed) */
      p->next_packing = NULL;
      if (f->packing_tail)
        f->packing_tail->next_packing = p;
      else
        f->packing_head = p;
      f->packing_tail = p;
    } else {
      pub_attempt(f, p);
    }
  }
}

void cph_cflow_items(cph_cflow *f, const char *session, const cph_state_items *items) {
  uint32_t shard = cph_cluster_shard_of(session, cph_cluster_shards(f->s->cluster));
  if (f->quiesced || !f->tracks[shard].live)
    return; /* the next owner takes the session's records from its state */
  items_put(f, shard, session, shard, items);
}

static char *event_json(const char *channel, const char *sender, const char *body,
                        const char *session, const char *kind, const char *key, int64_t ts_ms,
                        char *const *mentions, size_t n_mentions, bool history, size_t *len);

/* The shards a copy into channel's history goes to (14., 15.): of each other node serving
 * subscribers or members of channel (a member reads the channel's history too: DESIGN §2),
 * the first of their shards by number (a shard whose owner is not
 * known gets a copy of its own) — a node stores a copy once in its copy of the channel, which
 * all its sessions read. Not to the owners of skip[0..n_skip): they get the event otherwise (a
 * forward, 15.), which puts it in their copy of the channel. Into out (room for f->shards);
 * returns how many, or SIZE_MAX when out of memory. */
static size_t copy_shards(cph_cflow *f, const char *channel, const uint32_t *skip, size_t n_skip,
                          uint32_t *out) {
  const char *const *subscribers = NULL, *const *members = NULL;
  size_t n_subs = cph_ctable_subscribers(f->table, channel, &subscribers);
  size_t n_members = cph_ctable_members(f->table, channel, &members);
  if (!n_subs && !n_members)
    return 0;
  bool *wanted = calloc(f->shards, sizeof *wanted);
  if (!wanted)
    return SIZE_MAX;
  for (size_t i = 0; i < n_subs + n_members; i++) {
    const cph_ctable_session *r =
        cph_ctable_get(f->table, i < n_subs ? subscribers[i] : members[i - n_subs]);
    if (r)
      wanted[r->shard] = true;
  }
  typedef char owner_name[101];
  /* owners[i]: the owner of out[i] ("" unknown) for i < n_out, then those of the skipped */
  owner_name *owners = NULL;
  size_t n_out = 0, n_owners = 0, cap = 0;
  for (size_t k = 0; k < n_skip + f->shards; k++) {
    bool skipped = k < n_skip;
    uint32_t shard = skipped ? skip[k] : (uint32_t)(k - n_skip);
    owner_name owner = "";
    char url[8];
    if ((!skipped && !wanted[shard]) ||
        cph_cluster_route(f->s->cluster, shard, owner, sizeof owner, url, sizeof url) ==
            CPH_CLUSTER_SERVED ||
        (skipped && !owner[0]))
      continue;
    bool seen = false;
    for (size_t i = 0; owner[0] && i < n_owners && !seen; i++)
      seen = strcmp(owners[i], owner) == 0;
    if (seen)
      continue;
    if (n_owners == cap) {
      cap = cap ? 2 * cap : 4;
      owner_name *grown = realloc(owners, cap * sizeof *owners);
      if (!grown) {
        free(owners);
        free(wanted);
        return SIZE_MAX;
      }
      owners = grown;
    }
    memcpy(owners[n_owners++], owner, sizeof owner);
    if (!skipped)
      out[n_out++] = shard;
  }
  free(owners);
  free(wanted);
  return n_out;
}

void cph_cflow_replied(cph_cflow *f, const char *session, const char *channel, const char *body,
                       int64_t ts_ms) {
  if (f->quiesced)
    return;
  /* The shards whose sessions read the channel: its subscribers'. Those served here read this
   * node's copy of the channel, which has the reply. (Not the channel's own shard: its owner's
   * copy of the history is read by its sessions alone, and a direct channel has no
   * subscribers — its session's replies move with its state, in their place.) */
  uint32_t *shards = malloc(f->shards * sizeof *shards);
  size_t n = shards ? copy_shards(f, channel, NULL, 0, shards) : SIZE_MAX;
  /* One engine key for every copy, so a node that owns two of the shards stores it once; the
   * message ids differ by shard (JetStream deduplicates ids across the whole stream). */
  char key[160];
  size_t len = 0;
  char *json = NULL;
  if (n && n != SIZE_MAX) {
    snprintf(key, sizeof key, "h.%s.%" PRIx64 ".%" PRIu64, f->node, f->boot, ++f->minted);
    json = event_json(channel, session, body, NULL, "reply", key, ts_ms, NULL, 0, true, &len);
  }
  if (n && !json) {
    f->hist_dropped += n == SIZE_MAX ? 1 : n; /* how many is not known: counted once */
    cph_error("cluster log: out of memory copying a reply of %s in %s to the other nodes: its "
              "copies are DROPPED",
              session, channel);
  }
  for (size_t i = 0; json && i < n; i++) {
    char subject[64], msgid[200];
    cph_clog_subject(subject, sizeof subject, shards[i], true);
    snprintf(msgid, sizeof msgid, "%s/%" PRIu32, key, shards[i]);
    char *data = malloc(len);
    pub *p = data ? pub_new(f, PUB_HIST, subject, msgid, memcpy(data, json, len), len,
                            DONE_DEADLINE_MS)
                  : NULL;
    if (!p) {
      f->hist_dropped++;
      cph_error("cluster log: out of memory copying a reply of %s in %s to shard %" PRIu32
                ": the copy is DROPPED", session, channel, shards[i]);
      continue;
    }
    p->shard = shards[i];
    f->loose++;
    unsettled_update(f);
    pub_attempt(f, p);
  }
  free(json);
  free(shards);
}

void cph_cflow_deleted(cph_cflow *f, const char *session, const cph_strv *keys) {
  if (!f->quiesced && keys->count &&
      !done_publish(f, NULL, NULL, NULL, session, keys, NULL, 0, NULL))
    cph_error("cluster log: out of memory logging the done mark of deleted session %s", session);
}

/* ================================================================ accepting (1.) */

static void ingest_answer(cph_cflow *f, ingest_req *ir) {
  cph_req *r = ir->r;
  if (ir->failed) {
    cph_reply_error(r, 503, "unavailable", NULL,
                    "the cluster log (NATS JetStream) did not acknowledge %zu of the %zu events "
                    "within %d s (%s); some may have been stored: retry them with the same keys "
                    "(a stored one answers duplicate)",
                    ir->failed, ir->n, INGEST_DEADLINE_MS / 1000, ir->why);
  } else {
    json_t *results = json_array();
    for (size_t i = 0; i < ir->n; i++) {
      ev_result *e = &ir->res[i];
      json_t *o = json_pack("{snsss[]}", "id", "status",
                            e->status == EV_ACCEPTED    ? "accepted"
                            : e->status == EV_DUPLICATE ? "duplicate"
                                                        : "rejected",
                            "sessions");
      if (e->status == EV_REJECTED) {
        json_object_set_new(o, "reason", json_string(e->reason));
        json_object_set_new(o, "field", json_string(e->field));
      } else {
        json_object_set_new(o, "pos", json_integer((json_int_t)e->pos));
      }
      json_array_append_new(results, o);
    }
    cph_reply_json(r, 200, json_pack("{so}", "results", results));
  }
  if (r->async) {
    if (ir->prev)
      ir->prev->next = ir->next;
    else
      f->reqs = ir->next;
    if (ir->next)
      ir->next->prev = ir->prev;
    cph_req_end(r);
  }
  free(ir->res);
  free(ir);
}

static void reject(ev_result *e, const char *field, const char *reason) {
  e->status = EV_REJECTED;
  e->field = field;
  e->reason = reason;
}

/* The checks of the engine's ingest (core/ingest.c), in its order; true when e was rejected.
 * A named session must be in the session table. */
static bool check_event(cph_cflow *f, const cph_event_in *in, ev_result *e) {
  if (!in->body)
    reject(e, "body", "body is required");
  else if (!in->sender || !*in->sender)
    reject(e, "sender", "sender is required");
  else if (in->session && !cph_ctable_get(f->table, in->session))
    reject(e, "session", "no such session");
  else if (!in->channel && !in->session)
    reject(e, "channel", "an event needs a channel or a session");
  else if (in->channel && (!*in->channel || strlen(in->channel) > CHANNEL_MAX))
    reject(e, "channel", "a channel name is 1 to 256 bytes");
  else if (!in->channel && strlen(in->session) + 7 > CHANNEL_MAX)
    reject(e, "channel", "a channel name is 1 to 256 bytes");
  else if (in->key && (!*in->key || strlen(in->key) > KEY_MAX))
    reject(e, "key", "an idempotency key is 1 to 256 bytes");
  else
    return false;
  return true;
}

/* The JSON of a logged event (1.) or of a forwarded copy (3.), written with cph_emit (no jansson
 * tree: two of them per event were a good part of a node's ingest); malloc'd, *len its length,
 * NULL when out of memory. NULL strings are left out, and so are mentions when none is set. */
static char *event_json(const char *channel, const char *sender, const char *body,
                        const char *session, const char *kind, const char *key, int64_t ts_ms,
                        char *const *mentions, size_t n_mentions, bool history, size_t *len) {
  size_t mentioned = 0;
  for (size_t i = 0; i < n_mentions; i++)
    mentioned += mentions[i] != NULL;
  cph_buf b = CPH_BUF_INIT;
  cph_emit w;
  cph_emit_init(&w, &b, false);
  cph_emit_object(&w, 4 + (channel != NULL) + (session != NULL) + (kind != NULL) +
                          (mentioned > 0) + history);
  cph_emit_key(&w, "sender");
  cph_emit_str(&w, sender);
  cph_emit_key(&w, "body");
  cph_emit_str(&w, body);
  cph_emit_key(&w, "key");
  cph_emit_str(&w, key);
  cph_emit_key(&w, "ts_ms");
  cph_emit_i64(&w, ts_ms);
  if (channel) {
    cph_emit_key(&w, "channel");
    cph_emit_str(&w, channel);
  }
  if (session) {
    cph_emit_key(&w, "session");
    cph_emit_str(&w, session);
  }
  if (kind) {
    cph_emit_key(&w, "kind");
    cph_emit_str(&w, kind);
  }
  if (mentioned) {
    cph_emit_key(&w, "mentions");
    cph_emit_array(&w, mentioned);
    for (size_t i = 0; i < n_mentions; i++)
      if (mentions[i])
        cph_emit_str(&w, mentions[i]);
    cph_emit_end(&w);
  }
  if (history) {
    cph_emit_key(&w, "history");
    cph_emit_bool(&w, true);
  }
  cph_emit_end(&w);
  *len = b.len;
  if (cph_buf_error(&b)) {
    cph_buf_free(&b);
    return NULL;
  }
  return cph_buf_steal(&b);
}

static json_t *strv_json(const cph_strv *v) {
  json_t *a = json_array();
  for (size_t i = 0; a && i < v->count; i++)
    if (v->items[i])
      json_array_append_new(a, json_string(v->items[i]));
  return a;
}

/* The events of one request bound for one shard, gathered into one log message (1.). */
typedef struct ingest_group {
  cph_buf buf;    /* {"id":<its message id>,"batch":[ + the events so far */
  char *first;    /* the first event's payload alone (a group of one is logged as it) */
  char first_id[320], id[320];
  size_t *index;  /* the events' indices in the request */
  size_t n;
} ingest_group;

/* The group's message, into a pub (NULL: out of memory); the group is emptied. One event goes
 * alone, as an event without a batch, under its own id; more go as {"batch": [...]} under an id
 * minted for the message (an event's own id, its engine key, stays inside). */
static pub *group_pub(cph_cflow *f, ingest_group *g, const char *subject) {
  pub *p;
  if (g->n == 1) {
    p = pub_new(f, PUB_INGEST, subject, g->first_id, g->first, strlen(g->first),
                INGEST_DEADLINE_MS);
    g->first = NULL;
    cph_buf_free(&g->buf);
  } else {
    cph_buf_puts(&g->buf, "]}");
    size_t len = g->buf.len;
    char *data = cph_buf_steal(&g->buf);
    p = data ? pub_new(f, PUB_INGEST, subject, g->id, data, len, INGEST_DEADLINE_MS) : NULL;
    free(g->first);
    g->first = NULL;
  }
  if (p) {
    p->index = g->index;
    p->n_index = g->n;
  } else {
    free(g->index);
  }
  g->index = NULL;
  g->n = 0;
  return p;
}

void cph_cflow_ingest(cph_req *r, cph_event_in *events, size_t n) {
  cph_cflow *f = r->srv->cflow;
  if (f->quiesced) {
    cph_reply_error(r, 503, "unavailable", NULL, "cephalond is shutting down");
    return;
  }
  ingest_req *ir = calloc(1, sizeof *ir);
  if (!ir || !(ir->res = calloc(n ? n : 1, sizeof *ir->res))) {
    free(ir);
    cph_reply_error(r, 500, "internal", NULL, "out of memory");
    return;
  }
  ir->r = r;
  ir->n = n;
  uint32_t shards = cph_cluster_shards(r->srv->cluster);
  /* An event whose message the log would refuse for its size is rejected, with room left for
   * the session's id and engine key its forwards add (3.): a forward the log refused would
   * keep its `in` message coming back. 0: not connected yet (its publish fails anyway). */
  int64_t max_len = f->log ? cph_clog_max_payload(f->log) : 0;
  max_len = max_len > FORWARD_ROOM ? max_len - FORWARD_ROOM : 0;
  /* At most one message per event; events without a key share their shard's (groups[shard]):
   * the log's message id of such a message is minted, and each event keeps its own id inside.
   * An event with a key goes alone under it, so the log answers `duplicate` for that event. */
  pub **pubs = calloc(n ? n : 1, sizeof *pubs);
  ingest_group *groups = calloc(shards, sizeof *groups);
  size_t n_pubs = 0;
  if (!pubs || !groups)
    goto nomem;
  for (size_t i = 0; i < n; i++) {
    cph_event_in *in = &events[i];
    if (check_event(f, in, &ir->res[i]))
      continue;
    char msgid[320];
    if (in->key)
      snprintf(msgid, sizeof msgid, "%s", in->key);
    else
      snprintf(msgid, sizeof msgid, "%s.%" PRIx64 ".%" PRIu64, f->node, f->boot, ++f->minted);
    size_t len;
    char *data = event_json(in->channel, in->sender, in->body, in->session, in->kind, msgid,
                            in->ts_ms ? in->ts_ms : cph_wall_ms(), in->mentions.items,
                            in->mentions.count, false, &len);
    if (!data)
      goto nomem;
    if (max_len && (int64_t)len > max_len) {
      free(data);
      reject(&ir->res[i], "body", "the event is larger than the cluster log takes (the NATS "
                                  "servers' max_payload, less room for its forwards)");
      continue;
    }
    uint32_t shard = cph_cluster_shard_of(in->session ? in->session : in->channel, shards);
    char subject[64];
    cph_clog_subject(subject, sizeof subject, shard, false);
    ir->outstanding++;
    if (in->key || len >= LOG_BATCH_BYTES) {
      pub *p = pub_new(f, PUB_INGEST, subject, msgid, data, len, INGEST_DEADLINE_MS);
      size_t *ix = malloc(sizeof *ix);
      if (!p || !ix) {
        free(ix);
        if (p)
          pub_free(p);
        goto nomem;
      }
      *ix = i;
      p->index = ix;
      p->n_index = 1;
      pubs[n_pubs++] = p;
      continue;
    }
    ingest_group *g = &groups[shard];
    if (g->n && (g->buf.len + len + 2 > LOG_BATCH_BYTES || g->n == LOG_BATCH_EVENTS)) {
      if (!(pubs[n_pubs++] = group_pub(f, g, subject)))
        goto nomem;
    }
    if (!g->index && !(g->index = calloc(LOG_BATCH_EVENTS, sizeof *g->index))) {
      free(data);
      goto nomem;
    }
    if (!g->n) {
      snprintf(g->id, sizeof g->id, "%s.%" PRIx64 ".b%" PRIu64, f->node, f->boot, ++f->minted);
      json_t *idj = json_string(g->id);
      char *ids = idj ? json_dumps(idj, JSON_ENCODE_ANY) : NULL;
      json_decref(idj);
      if (!ids) {
        free(data);
        goto nomem;
      }
      cph_buf_printf(&g->buf, "{\"id\":%s,\"batch\":[", ids);
      free(ids);
    } else {
      cph_buf_putc(&g->buf, ',');
    }
    cph_buf_append(&g->buf, data, len);
    if (!g->n) {
      g->first = data;
      snprintf(g->first_id, sizeof g->first_id, "%s", msgid);
    } else {
      free(data);
    }
    if (cph_buf_error(&g->buf))
      goto nomem;
    g->index[g->n++] = i;
  }
  for (uint32_t sh = 0; sh < shards; sh++) {
    if (!groups[sh].n)
      continue;
    char subject[64];
    cph_clog_subject(subject, sizeof subject, sh, false);
    if (!(pubs[n_pubs++] = group_pub(f, &groups[sh], subject)))
      goto nomem;
  }
  free(groups);
  groups = NULL;
  if (!ir->outstanding) {
    free(pubs);
    ingest_answer(f, ir);
    return;
  }
  r->async = true;
  ir->next = f->reqs;
  if (f->reqs)
    f->reqs->prev = ir;
  f->reqs = ir;
  ir->outstanding = n_pubs; /* now counted in messages */
  for (size_t i = 0; i < n_pubs; i++) {
    pubs[i]->ir = ir;
    pub_send(f, pubs[i]); /* may answer (a deadline of 0 never passes here) */
  }
  free(pubs);
  return;
nomem:
  for (size_t i = 0; i < n_pubs; i++)
    if (pubs[i])
      pub_free(pubs[i]);
  for (uint32_t sh = 0; groups && sh < shards; sh++) {
    cph_buf_free(&groups[sh].buf);
    free(groups[sh].first);
    free(groups[sh].index);
  }
  free(groups);
  free(pubs);
  free(ir->res);
  free(ir);
  cph_reply_error(r, 500, "internal", NULL, "out of memory");
}

/* ================================================================ applying (2.) and
 * forwarding (3.) */

static void applying_free(applying *ap) {
  json_decref(ap->doc);
  cph_arena_free(&ap->arena);
  free(ap);
}

/* A message is acknowledged only while its shard is served here: one applied after the shard
 * moved comes again to the next owner (which may have read the shard's past already); the copy
 * here is stale (README: a node keeps stale copies of the sessions it no longer serves). */
static void applying_finish(cph_cflow *f, applying *ap) {
  if (f->log && !f->quiesced && !ap->failed && served(f, ap->m->shard)) {
    if (f->tracks[ap->m->shard].live)
      held_done(&f->tracks[ap->m->shard], ap->m->seq);
    cph_clog_ack(f->log, ap->m);
  } else {
    cph_clog_release(f->log, ap->m); /* held while the shard is served: it comes back */
  }
  applying_free(ap);
}

static const char *jstr(json_t *doc, const char *key) {
  return json_string_value(json_object_get(doc, key));
}

/* Memory of an arena aligned for any object (cph_arena_alloc's is not: it is for strings). */
static void *arena_alloc(void *arena, size_t n) {
  const size_t a = _Alignof(max_align_t);
  char *p = cph_arena_alloc(arena, n + a - 1);
  return p ? (void *)(((uintptr_t)p + a - 1) & ~(uintptr_t)(a - 1)) : NULL;
}

/* What a logged event needs (1.): an id, a sender, a body, a channel or a session. The engine
 * applies it to its named session alone (2.). */
static bool event_ok(cph_event_in *ev) {
  ev->only_session = true; /* the others hear it through the log (forward) */
  /* 16.: its raw memory in its channel (or its session's direct channel) under its identity
   * cluster-wide, however often and wherever it is applied (as the `in` event, a forward, a
   * rebuild's delivery) */
  ev->memory_origin = !ev->history_only;
  return ev->key && ev->sender && ev->body && (ev->channel || ev->session);
}

/* Decodes an event of a message (d) with jansson into ev, whose strings then point into d and
 * whose mentions array comes from arena; false when it is not one of ours. */
static bool decode_event(json_t *d, cph_event_in *ev, struct cph_arena_chunk **arena) {
  memset(ev, 0, sizeof *ev);
  ev->channel = (char *)jstr(d, "channel");
  ev->sender = (char *)jstr(d, "sender");
  ev->body = (char *)jstr(d, "body");
  ev->session = (char *)jstr(d, "session");
  ev->kind = (char *)jstr(d, "kind");
  ev->key = (char *)jstr(d, "key");
  json_t *ts = json_object_get(d, "ts_ms");
  ev->ts_ms = json_is_integer(ts) ? json_integer_value(ts) : 0;
  ev->history_only = json_is_true(json_object_get(d, "history")); /* 14. */
  json_t *m = json_object_get(d, "mentions");
  size_t n = json_array_size(m);
  if (n) {
    ev->mentions.items = arena_alloc(arena, n * sizeof(char *));
    if (!ev->mentions.items)
      return false;
    for (size_t i = 0; i < n; i++)
      if (json_is_string(json_array_get(m, i)))
        ev->mentions.items[ev->mentions.count++] = (char *)json_string_value(json_array_get(m, i));
  }
  return event_ok(ev);
}

/* The fast path of decode_payload (evjson.h): false leaves the message to jansson. */
static bool decode_fast(const char *data, size_t len, struct cph_arena_chunk **arena,
                        cph_event_in **evs, size_t *n, const char **batch_id) {
  cph_evjson f = {arena_alloc, arena, data, data + len, SIZE_MAX};
  char *id = NULL;
  cph_evjson_ws(&f);
  static const char ID[] = "{\"id\":", BATCH[] = "\"batch\":[";
  if (f.end - f.p < (ptrdiff_t)sizeof ID - 1 || memcmp(f.p, ID, sizeof ID - 1) != 0 ||
      (f.p += sizeof ID - 1, !cph_evjson_str(&f, &id)) || !cph_evjson_lit(&f, ',')) {
    /* not {"id": ..., "batch": ...}: a single event, or a forwarded batch {"batch": [...]} */
    f.p = data;
    cph_evjson_ws(&f);
    if (f.end - f.p >= (ptrdiff_t)sizeof BATCH && f.p[0] == '{' &&
        memcmp(f.p + 1, BATCH, sizeof BATCH - 1) == 0) {
      f.p += sizeof BATCH;
    } else {
      *evs = arena_alloc(arena, sizeof **evs);
      if (!*evs || !cph_evjson_event(&f, *evs) || !event_ok(*evs))
        return false;
      cph_evjson_ws(&f);
      *n = 1;
      return f.p == f.end;
    }
  } else {
    cph_evjson_ws(&f);
    if (f.end - f.p < (ptrdiff_t)sizeof BATCH - 1 || memcmp(f.p, BATCH, sizeof BATCH - 1) != 0)
      return false;
    f.p += sizeof BATCH - 1;
  }
  size_t cap = 0;
  do {
    if (*n == cap) {
      cap = cap ? 2 * cap : 64;
      cph_event_in *grown = arena_alloc(arena, cap * sizeof *grown);
      if (!grown)
        return false;
      if (*n)
        memcpy(grown, *evs, *n * sizeof *grown);
      *evs = grown;
    }
    if (!cph_evjson_event(&f, &(*evs)[*n]) || !event_ok(&(*evs)[*n]))
      return false;
    (*n)++;
  } while (cph_evjson_lit(&f, ','));
  if (!cph_evjson_lit(&f, ']') || !cph_evjson_lit(&f, '}'))
    return false;
  cph_evjson_ws(&f);
  *batch_id = id;
  return f.p == f.end;
}

/* Decodes a log message: one event, or {"id": <message id>, "batch": [event, ...]} (1.), or a
 * forwarded batch {"batch": [event, ...]} (3.) — into *evs (*n of them; *batch_id NULL for a
 * single event), strings and arrays from *arena, or pointing into *doc when the fast path
 * (evjson.h) left it to jansson (the caller decrefs *doc). False when it is not one of ours. */
static bool decode_payload(const char *data, size_t len, struct cph_arena_chunk **arena,
                           json_t **doc, cph_event_in **evs, size_t *n, const char **batch_id) {
  *doc = NULL;
  *evs = NULL;
  *n = 0;
  *batch_id = NULL;
  if (decode_fast(data, len, arena, evs, n, batch_id))
    return true;
  *evs = NULL; /* what the fast path took of the arena stays there until it is freed */
  *n = 0;
  *batch_id = NULL;
  if (!(*doc = json_loadb(data, len, 0, NULL)))
    return false;
  json_t *batch = json_object_get(*doc, "batch");
  if (!batch) {
    *evs = arena_alloc(arena, sizeof **evs);
    *n = *evs ? 1 : 0;
    return *evs && decode_event(*doc, *evs, arena);
  }
  size_t k = json_array_size(batch);
  *batch_id = jstr(*doc, "id");
  if (!k || !(*evs = arena_alloc(arena, k * sizeof **evs)))
    return false;
  for (size_t i = 0; i < k; i++) {
    (*n)++;
    if (!decode_event(json_array_get(batch, i), &(*evs)[i], arena))
      return false;
  }
  return true;
}

/* A delivered message decoded on the thread that received it (clusterlog.h's decode hook):
 * what decode_payload gives, and its events' text hashes (cph_event_prepare) in the arena, so
 * the loop only applies them. */
typedef struct predecoded {
  bool ok; /* decode_payload's answer */
  struct cph_arena_chunk *arena;
  json_t *doc;
  cph_event_in *evs;
  size_t n;
  const char *batch_id;
} predecoded;

static void predecoded_free(void *d) {
  predecoded *p = d;
  json_decref(p->doc);
  cph_arena_free(&p->arena);
  free(p);
}

static void *predecode(void *ctx, const char *data, size_t len) {
  const cph_cflow *f = ctx;
  predecoded *p = calloc(1, sizeof *p);
  if (!p)
    return NULL;
  p->ok = decode_payload(data, len, &p->arena, &p->doc, &p->evs, &p->n, &p->batch_id);
  cph_event_hasher *h = p->ok && p->n ? cph_event_hasher_new() : NULL;
  cph_event_prep *preps = h ? arena_alloc(&p->arena, p->n * sizeof *preps) : NULL;
  for (size_t i = 0; preps && i < p->n; i++)
    if (!p->evs[i].history_only && /* 14.: no dedupe for those */
        cph_event_prepare(h, &p->evs[i], f->prep_shingle_words, f->prep_min_length,
                          &preps[i]) == CPH_OK)
      p->evs[i].prep = &preps[i];
  cph_event_hasher_free(h);
  return p;
}

typedef struct target {
  const char *id;
  uint32_t shard;
  bool mentioned;
} target;

/* A mention: a new target, or the subscriber it already is, now mentioned. */
static void add_mention(target *ts, size_t *n, const cph_ctable_session *r) {
  for (size_t i = 0; i < *n; i++)
    if (ts[i].id == r->id) {
      ts[i].mentioned = true;
      return;
    }
  ts[(*n)++] = (target){r->id, r->shard, true};
}

/* The hex SHA-256 of a message id (within 256 bytes), lowercase, NUL-terminated: how keys
 * name a message (copy_key; a channel memories item's key, 16.). */
static void msgid_sha256_hex(const char *msgid, char out[65]) {
  static const char HEX[] = "0123456789abcdef";
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(msgid, strlen(msgid), md, &len, EVP_sha256(), NULL);
  for (unsigned i = 0; i < 32; i++) {
    out[2 * i] = HEX[md[i] >> 4];
    out[2 * i + 1] = HEX[md[i] & 15];
  }
  out[64] = '\0';
}

/* The engine key of a copy (3., 15.): kind ('f' a forward, 'h' a history copy), ':', the time
 * its event was accepted (fixed at 1.) in 16 hex digits, then the hex SHA-256 of the copy's
 * message id — the same wherever and however often the event is applied. The time leads so
 * the node's idempotency keys grow at their end as events come in time order: with the hash
 * alone every applied copy looked up and inserted a key on a random page of that B-tree (a
 * dirty page per event; three-node ingest ~25% slower, bench/PROFILE.md). Builds before wrote
 * the hash alone; a copy re-made here of one a node applied under that form is still stored
 * once, by the log's message id (the same in both), within its deduplication window — as
 * long as the engine's key counts (:dedupe :key-window-seconds, the default of both). */
#define COPY_KEY_LEN 82
static void copy_key(char kind, const char *msgid, int64_t ts_ms, char out[COPY_KEY_LEN + 1]) {
  static const char HEX[] = "0123456789abcdef";
  out[0] = kind;
  out[1] = ':';
  uint64_t ts = (uint64_t)ts_ms;
  for (int i = 0; i < 16; i++)
    out[2 + i] = HEX[(ts >> (60 - 4 * i)) & 15];
  msgid_sha256_hex(msgid, out + 18);
}

/* The copy of ev forwarded to target t (3.): the event naming t as its session, under the engine
 * key of "<event id>/<t>" (copy_key 'f'). Malloc'd JSON; NULL when out of memory. */
static char *forward_copy(const cph_event_in *ev, const target *t) {
  char direct[300];
  const char *channel = ev->channel;
  if (!channel) {
    snprintf(direct, sizeof direct, "direct:%s", ev->session);
    channel = direct;
  }
  size_t idlen = strlen(ev->key) + 1 + strlen(t->id) + 1;
  char *id = malloc(idlen);
  if (!id)
    return NULL;
  snprintf(id, idlen, "%s/%s", ev->key, t->id);
  char key[COPY_KEY_LEN + 1];
  copy_key('f', id, ev->ts_ms, key);
  free(id);
  char *mention = (char *)t->id;
  size_t len;
  return event_json(channel, ev->sender, ev->body, t->id, ev->kind, key, ev->ts_ms, &mention,
                    t->mentioned, false, &len);
}

/* The sessions ev is forwarded to, into ts (room for its subscribers and mentions): the channel's
 * subscribers when it names no session, and the mentioned sessions but the named one. */
static size_t forward_targets(cph_cflow *f, const cph_event_in *ev, target **out) {
  const char *const *subscribers = NULL;
  size_t n_subscribers =
      !ev->session && ev->channel ? cph_ctable_subscribers(f->table, ev->channel, &subscribers) : 0;
  size_t cap = n_subscribers + ev->mentions.count;
  target *ts = calloc(cap ? cap : 1, sizeof *ts);
  size_t n = 0;
  *out = ts;
  if (!ts)
    return 0;
  for (size_t i = 0; i < n_subscribers; i++) { /* a channel lists each session once */
    const cph_ctable_session *r = cph_ctable_get(f->table, subscribers[i]);
    if (r)
      ts[n++] = (target){r->id, r->shard, false};
  }
  for (size_t i = 0; i < ev->mentions.count; i++) {
    const cph_ctable_session *r = cph_ctable_get(f->table, ev->mentions.items[i]);
    if (r && !(ev->session && strcmp(ev->session, r->id) == 0)) /* the named one has it */
      add_mention(ts, &n, r);
  }
  return n;
}

/* The copies of a batch's events for one session, on their way into one message. */
typedef struct fwd_group {
  cph_buf buf; /* {"batch":[ + the copies so far */
  const char *id;
  uint32_t shard;
} fwd_group;

static void forward_send(cph_cflow *f, applying *ap, const char *msgid, uint32_t shard, char *data,
                         size_t len, size_t copies) {
  char subject[64];
  cph_clog_subject(subject, sizeof subject, shard, true);
  pub *p = data ? pub_new(f, PUB_FWD, subject, msgid, data, len, FWD_DEADLINE_MS) : NULL;
  if (!p) {
    ap->failed = true;
    return;
  }
  ap->outstanding++;
  p->ap = ap;
  p->copies = copies;
  pub_send(f, p);
}

/* 15.: an `in` event that names a session, or any `in` event of a channel with members, and
 * was stored in its channel's history here — applied now (queued, or stored for nobody: a
 * channel's event on its owner, or one refused by a busy session), or a repeat of one applied
 * before (a redelivery: its copies go again under the same ids) — is copied into the other
 * nodes' copies of that channel that get no forward of it (a channel's event reaches its
 * subscribers' nodes as forwards; members are not forwarded to unless mentioned). Not a repeat
 * folded into a family (it stays out of the history, DESIGN §5), not a direct channel's, not a
 * copy itself. */
static bool history_wanted(cph_cflow *f, const cph_event_in *ev, const cph_event_result *res) {
  const char *const *members;
  return ev->channel && !ev->history_only &&
         (ev->session || cph_ctable_members(f->table, ev->channel, &members) > 0) &&
         (res->status == CPH_EV_QUEUED || res->status == CPH_EV_STORED ||
          res->status == CPH_EV_DUPLICATE);
}

/* The history copies of one applied message, by the shard they go to. */
typedef struct hist_copies {
  struct {
    uint32_t shard;
    cph_buf buf; /* the copies to it so far, comma-separated */
    size_t n;
  } *to;
  size_t n_to, cap_to;
  uint32_t *shards; /* copy_shards' scratch (f->shards) */
} hist_copies;

/* Adds ev's copies (15.) to hc: the event as the history holds it, no session, "history":
 * true, under the engine key of "<event id>/#" (copy_key 'h') — the same wherever and
 * however often the event is applied, so a node stores it once — for the nodes that get no
 * forward of it (fwd[0..n_fwd), its forwards: the forward is that node's entry, and a copy
 * applied before it would be a second one, which exact deduplication does not see). False
 * when out of memory. */
static bool history_copies_add(cph_cflow *f, hist_copies *hc, const cph_event_in *ev,
                               const target *fwd, size_t n_fwd) {
  if (!hc->shards && !(hc->shards = malloc(2 * (size_t)f->shards * sizeof *hc->shards)))
    return false;
  uint32_t *skip = hc->shards + f->shards; /* the forwards' shards, each once */
  size_t n_skip = 0;
  for (size_t i = 0; i < n_fwd; i++) {
    size_t j = 0;
    while (j < n_skip && skip[j] != fwd[i].shard)
      j++;
    if (j == n_skip)
      skip[n_skip++] = fwd[i].shard;
  }
  size_t n = copy_shards(f, ev->channel, skip, n_skip, hc->shards);
  if (n == SIZE_MAX)
    return false;
  if (!n)
    return true;
  size_t idlen = strlen(ev->key) + 3;
  char *id = malloc(idlen), key[COPY_KEY_LEN + 1];
  if (!id)
    return false;
  snprintf(id, idlen, "%s/#", ev->key);
  copy_key('h', id, ev->ts_ms, key);
  free(id);
  size_t len;
  char *json = event_json(ev->channel, ev->sender, ev->body, NULL, ev->kind, key, ev->ts_ms, NULL,
                          0, true, &len);
  if (!json)
    return false;
  for (size_t i = 0; i < n; i++) {
    size_t t = 0;
    while (t < hc->n_to && hc->to[t].shard != hc->shards[i])
      t++;
    if (t == hc->n_to) {
      if (hc->n_to == hc->cap_to) {
        size_t cap = hc->cap_to ? 2 * hc->cap_to : 4;
        void *grown = realloc(hc->to, cap * sizeof *hc->to);
        if (!grown) {
          free(json);
          return false;
        }
        hc->to = grown;
        hc->cap_to = cap;
      }
      memset(&hc->to[t], 0, sizeof hc->to[t]);
      hc->to[t].shard = hc->shards[i];
      hc->n_to++;
    }
    if (hc->to[t].n++)
      cph_buf_putc(&hc->to[t].buf, ',');
    cph_buf_append(&hc->to[t].buf, json, len);
  }
  free(json);
  return true;
}

/* Sends hc's copies (unless ap failed) as forwards of ap — its acknowledgement waits for them,
 * so a message acknowledged had its copies taken — and frees hc. A single event's copy goes
 * alone under "<event id>/#<shard>"; a batch's go together under "<batch id>/#<shard>" ('#' is
 * in no session id, so no forward's id is one of these). */
static void history_copies_send(cph_cflow *f, applying *ap, hist_copies *hc) {
  for (size_t t = 0; t < hc->n_to; t++) {
    cph_buf *b = &hc->to[t].buf;
    char *data = NULL;
    size_t len = 0;
    if (!ap->failed && !cph_buf_error(b)) {
      if (ap->batch_id) {
        cph_buf frame = {0};
        cph_buf_puts(&frame, "{\"batch\":[");
        cph_buf_append(&frame, b->data, b->len);
        cph_buf_puts(&frame, "]}");
        len = frame.len;
        data = cph_buf_error(&frame) ? NULL : cph_buf_steal(&frame);
        cph_buf_free(&frame);
      } else {
        len = b->len;
        data = cph_buf_steal(b);
      }
    }
    const char *base = ap->batch_id ? ap->batch_id : ap->evs[0].key;
    size_t idlen = strlen(base) + 16;
    char *msgid = data ? malloc(idlen) : NULL;
    if (msgid) {
      snprintf(msgid, idlen, "%s/#%" PRIu32, base, hc->to[t].shard);
      forward_send(f, ap, msgid, hc->to[t].shard, data, len, hc->to[t].n);
    } else {
      free(data);
      ap->failed = true;
    }
    free(msgid);
    cph_buf_free(b);
  }
  free(hc->to);
  free(hc->shards);
}

/* Publishes the forwards of an applied `in` message; it is acknowledged when they all were
 * (applying_finish). Every session an event is routed to other than its named session gets it
 * as a forward through the log, wherever it lives, this node included: the engine applied the
 * `in` event with only_session, so it reached no one else. So the log's deduplication of the
 * forward's message id is what makes each delivery happen once, also when the message is
 * applied again (a redelivery, or the shard's next owner after a death). A single event's copy
 * to S goes alone under "<event id>/<S>"; a batch's copies to S go together, in order, under
 * "<batch id>/<S>" — each (event, S) is in one such message only, so it too is stored once.
 * (Should the session table change between two applications, S gets what the first one sent.) */
static void forward(cph_cflow *f, applying *ap, const cph_event_result *res) {
  cph_hmap groups = CPH_HMAP_INIT;
  fwd_group **list = NULL;
  size_t n_list = 0, cap_list = 0;
  hist_copies hc = {0};
  ap->outstanding = 1; /* until every forward is sent */
  for (size_t e = 0; e < ap->n_evs && !ap->failed; e++) {
    const cph_event_in *ev = &ap->evs[e];
    target *ts;
    size_t n = forward_targets(f, ev, &ts);
    if (!ts || (res && history_wanted(f, ev, &res[e]) && !history_copies_add(f, &hc, ev, ts, n))) {
      free(ts);
      ap->failed = true;
      break;
    }
    for (size_t i = 0; i < n; i++) {
      char *copy = forward_copy(ev, &ts[i]);
      if (!copy) {
        ap->failed = true;
        break;
      }
      if (!ap->batch_id) {
        size_t idlen = strlen(ev->key) + 1 + strlen(ts[i].id) + 1;
        char *msgid = malloc(idlen);
        if (msgid) {
          snprintf(msgid, idlen, "%s/%s", ev->key, ts[i].id);
          forward_send(f, ap, msgid, ts[i].shard, copy, strlen(copy), 0);
        } else {
          free(copy);
          ap->failed = true;
        }
        free(msgid);
        continue;
      }
      fwd_group *g = cph_hmap_get(&groups, ts[i].id);
      if (!g) {
        if (n_list == cap_list) {
          size_t cap = cap_list ? 2 * cap_list : 8;
          fwd_group **l = realloc(list, cap * sizeof *l);
          if (!l) {
            free(copy);
            ap->failed = true;
            break;
          }
          list = l;
          cap_list = cap;
        }
        g = calloc(1, sizeof *g);
        if (!g || cph_hmap_put(&groups, ts[i].id, g) != CPH_OK) {
          free(g);
          free(copy);
          ap->failed = true;
          break;
        }
        g->id = ts[i].id; /* the table's string: the table does not change during this call */
        g->shard = ts[i].shard;
        list[n_list++] = g;
        cph_buf_puts(&g->buf, "{\"batch\":[");
      } else {
        cph_buf_putc(&g->buf, ',');
      }
      cph_buf_puts(&g->buf, copy);
      free(copy);
    }
    free(ts);
  }
  for (size_t i = 0; i < n_list; i++) {
    fwd_group *g = list[i];
    cph_buf_puts(&g->buf, "]}");
    size_t len = g->buf.len;
    char *data = ap->failed || cph_buf_error(&g->buf) ? NULL : cph_buf_steal(&g->buf);
    size_t idlen = strlen(ap->batch_id) + 1 + strlen(g->id) + 1;
    char *msgid = data ? malloc(idlen) : NULL;
    if (msgid) {
      snprintf(msgid, idlen, "%s/%s", ap->batch_id, g->id);
      forward_send(f, ap, msgid, g->shard, data, len, 0);
    } else {
      free(data);
      ap->failed = true;
    }
    free(msgid);
    cph_buf_free(&g->buf);
    free(g);
  }
  free(list);
  cph_hmap_free(&groups);
  history_copies_send(f, ap, &hc);
  if (--ap->outstanding == 0)
    applying_finish(f, ap);
}

static void record_free(record_req *rr) {
  json_decref(rr->answer);
  free(rr->session);
  free(rr);
}

/* rr's request (when it still waits): 200 once the log took its session's record, else 503;
 * then rr is freed. */
static void record_answer(cph_cflow *f, record_req *rr, bool ok, const char *why) {
  if (rr->r) {
    if (rr->prev)
      rr->prev->next = rr->next;
    else
      f->records = rr->next;
    if (rr->next)
      rr->next->prev = rr->prev;
    if (ok)
      cph_reply_json(rr->r, 200, json_incref(rr->answer));
    else if (rr->deleted)
      cph_reply_error(rr->r, 503, "unavailable", NULL,
                      "session '%s' was deleted on this node, but the cluster log (NATS "
                      "JetStream) did not take the deletion of its record within %d s (%s): "
                      "other nodes may still know the session, and a node that serves its shard "
                      "next may serve it again (delete it again there)",
                      rr->session, DONE_DEADLINE_MS / 1000, why ? why : "no answer");
    else
      cph_reply_error(rr->r, 503, "unavailable", NULL,
                      "session '%s' was written on this node, but the cluster log (NATS "
                      "JetStream) did not take its record within %d s (%s): should this node die "
                      "before the log takes it, the node that serves the session next lacks "
                      "the change; PUT /v1/sessions/%s with the same fields writes it again",
                      rr->session, DONE_DEADLINE_MS / 1000, why ? why : "no answer",
                      rr->session);
    cph_req_end(rr->r);
  }
  record_free(rr);
}

static void pub_outcome(cph_cflow *f, pub *p, bool ok, uint64_t seq, bool dup, const char *why) {
  switch (p->kind) {
  case PUB_INGEST: {
    ingest_req *ir = p->ir;
    for (size_t i = 0; ok && i < p->n_index; i++) {
      ev_result *e = &ir->res[p->index[i]];
      /* A duplicate on a resend is our own earlier send: accepted. */
      e->status = dup && p->sends == 1 ? EV_DUPLICATE : EV_ACCEPTED;
      e->pos = seq;
    }
    if (!ok) {
      ir->failed += p->n_index;
      snprintf(ir->why, sizeof ir->why, "%s", why ? why : "no answer");
    }
    if (--ir->outstanding == 0)
      ingest_answer(f, ir);
    break;
  }
  case PUB_FWD:
    if (ok) {
      f->forwarded++;
      f->hist_sent += p->copies; /* 15. */
    } else {
      cph_warn("cluster log: forward %s not acknowledged (%s); the event comes again", p->msgid,
               why ? why : "no answer");
      p->ap->failed = true;
    }
    if (--p->ap->outstanding == 0)
      applying_finish(f, p->ap);
    break;
  case PUB_SESSION:
    if (!ok)
      cph_error("cluster log: the record of a session (%s) was not taken by the log: %s; "
                "other nodes do not see its change",
                p->subject, why ? why : "no answer");
    if (p->rr)
      record_answer(f, p->rr, ok, why);
    break;
  case PUB_DONE: {
    done_req *dr = p->dr;
    shard_track *tr = &f->tracks[p->shard];
    tr->done_sending = false;
    if (ok && seq > tr->done_last)
      tr->done_last = seq;
    if (!ok) {
      dr->failed++;
      snprintf(dr->why, sizeof dr->why, "%s", why ? why : "no answer");
    }
    if (--dr->outstanding == 0)
      done_answer(f, dr);
    done_pump(f, p->shard);
    break;
  }
  case PUB_STATE: {
    done_req *dr = p->dr;
    f->tracks[p->shard].done_sending = false;
    if (ok) /* a duplicate is our own resend: the first one's revision is seq */
      state_rev_set(f, dr->session, seq);
    if (ok) {
      f->states_put++;
      f->state_bytes += p->len;
      f->state_raw_bytes += p->raw_len;
    } else {
      f->state_failures++;
      dr->failed++;
      snprintf(dr->why, sizeof dr->why, "the session's state: %s", why ? why : "no answer");
    }
    if (--dr->outstanding == 0)
      done_answer(f, dr);
    done_pump(f, p->shard);
    break;
  }
  case PUB_ITEM:
    if (ok && p->chan_item) {
      f->channel_items++;
      f->channel_item_bytes += p->len;
    } else if (ok) {
      f->items_put++;
      f->item_bytes += p->len;
    }
    if (ok) {
      if (p->resending)
        cph_info("cluster log: item %s taken after %d resends", p->subject, p->rounds);
      break;
    }
    if (!p->resending) {
      f->item_failures++;
      cph_warn("cluster log: an item of a session's state (%s) was not taken: %s; it is sent "
               "again, from %d s on, until the log takes it",
               p->subject, why ? why : "no answer", RESEND_FIRST_MS / 1000);
    }
    if (resend_later(f, p, why))
      return; /* p waits for its next attempt */
    break;
  case PUB_HIST:
    if (ok) {
      f->hist_sent++;
      if (p->resending)
        cph_info("cluster log: the copy %s of a reply taken after %d resends", p->msgid,
                 p->rounds);
      break;
    }
    if (!p->resending) {
      f->hist_failures++;
      cph_warn("cluster log: the copy %s of a reply for the channel histories of shard %" PRIu32
               " was not taken (%s); it is sent again, from %d s on, until the log takes it",
               p->msgid, p->shard, why ? why : "no answer", RESEND_FIRST_MS / 1000);
    }
    if (resend_later(f, p, why))
      return; /* p waits for its next attempt */
    break;
  case PUB_MARK: {
    shard_track *tr = &f->tracks[p->shard];
    tr->mark_sending = false;
    if (ok) {
      if (seq > tr->mark_rev)
        tr->mark_rev = seq;
      tr->mark_put = p->mark;
      f->marks_put++;
      trim_maybe(f, p->shard);
    } else {
      cph_warn("cluster log: the watermark of shard %" PRIu32 " was not taken (%s); put again "
               "within a second",
               p->shard, why ? why : "no answer");
    }
    break;
  }
  }
  resend_leave(f, p);
  item_key_release(f, p);
  loose_end(f, p);
  pub_free(p);
}

/* The most bytes of memory parts one channel memories item carries before the next item of
 * the same message and channel begins: well under the log's message limit (1 MiB). */
#define CHANNEL_ITEM_BYTES (512 * 1024)

/* The group of an event's memory part (16.): its channel, whose items go under the channel's
 * key; or, for an event to a session alone, CPH_DIRECT_MEMORIES, whose items go under its
 * session's shard — one item for a message's direct events of one shard, however many
 * sessions they name (an item per session and message made the takeover bench's fill of 1M
 * such events 224 s against 27-32 s). */
static const char *part_group(const cph_event_in *ev) {
  return ev->channel ? ev->channel : CPH_DIRECT_MEMORIES;
}

/* Whether event i of a message gave a memory part that goes to the log (16.). */
static bool has_part(const cph_event_in *evs, const cph_event_result *res, size_t i) {
  return res[i].memory_part && (evs[i].channel || evs[i].session);
}

/* A direct memories item's name: 'd', the time in 16 hex digits, then the message id's hash
 * (64 hex digits), then a piece's suffix. */
#define DIRECT_ITEM_HASH_AT 17
#define DIRECT_ITEM_NAME_MIN (DIRECT_ITEM_HASH_AT + 64)

/* 16. The raw memories the events of message ap (evs[0..n), their results) minted, as one
 * memories item per channel — more when they would not fit one — put under the channel's key
 * "<shard of the channel>.<'#' channel in hex>.c<SHA-256 of the message id>[n<k>]", and those
 * of its events to a session alone likewise per shard of their sessions, under "<shard>.<'#'
 * CPH_DIRECT_MEMORIES in hex>.d<the first event's time, 16 hex digits><SHA-256 of the message
 * id>[n<k in 6 digits>]" (the time leads: a shard's direct items sort in the order they were
 * made, and a takeover imports them in steps of DIRECT_IMPORT_ITEMS in that order). The same
 * message applied again, here or by the shard's next owner, puts the same keys. Not waited
 * for, as items are not (13.). */
static void channel_memories_put(cph_cflow *f, applying *ap, const cph_event_in *evs,
                                 cph_event_result *res, size_t n) {
  const char *msgid = ap->batch_id ? ap->batch_id : n ? evs[0].key : NULL;
  if (!msgid || f->quiesced || !f->tracks[ap->m->shard].live)
    return;
  uint32_t shards = cph_cluster_shards(f->s->cluster);
  char hash[65];
  msgid_sha256_hex(msgid, hash);
  const uint8_t **parts = malloc(n * sizeof *parts);
  size_t *lens = malloc(n * sizeof *lens);
  uint32_t *key_shard = malloc(n * sizeof *key_shard); /* each part's key's, worked out once */
  for (size_t i = 0; key_shard && i < n; i++)
    if (has_part(evs, res, i))
      key_shard[i] = cph_cluster_shard_of(evs[i].channel ? evs[i].channel : evs[i].session,
                                          shards);
  for (size_t i = 0; i < n; i++) {
    if (!has_part(evs, res, i))
      continue;
    const char *group = part_group(&evs[i]);
    bool direct = !evs[i].channel;
    char owner[302];
    snprintf(owner, sizeof owner, "%c%s", CHANNEL_OWNER_PREFIX, group);
    size_t k = 0, bytes = 0, piece = 0;
    /* every part of this group and key shard in the message, from here on, in order */
    for (size_t j = i; parts && lens && key_shard && j <= n; j++) {
      bool mine = j < n && has_part(evs, res, j) && key_shard[j] == key_shard[i] &&
                  strcmp(part_group(&evs[j]), group) == 0;
      if (k && (j == n || (mine && bytes + res[j].memory_part_len > CHANNEL_ITEM_BYTES))) {
        char name[128];
        int at = direct ? snprintf(name, sizeof name, "d%016" PRIx64 "%s",
                                   (uint64_t)evs[i].ts_ms, hash)
                        : snprintf(name, sizeof name, "c%s", hash);
        if (piece) /* a direct item's pieces padded, so that they sort in order too */
          snprintf(name + at, sizeof name - (size_t)at, direct ? "n%06zu" : "n%zu", piece);
        cph_state_item it = {name, NULL, 0};
        if (cph_channel_memories_item(parts, lens, k, &it.data, &it.len) == CPH_OK) {
          cph_state_items one = {&it, 1};
          items_put(f, key_shard[i], owner, ap->m->shard, &one);
        } else if (direct) {
          f->item_dropped++;
          cph_error("cluster log: a memories item of the direct channels of shard %" PRIu32
                    " of message %s is DROPPED (out of memory)", key_shard[i], msgid);
        } else {
          f->item_dropped++;
          cph_error("cluster log: a memories item of channel %s of message %s is DROPPED (out "
                    "of memory)", group, msgid);
        }
        free(it.data);
        piece++;
        k = bytes = 0;
      }
      if (mine) {
        parts[k] = res[j].memory_part;
        lens[k++] = res[j].memory_part_len;
        bytes += res[j].memory_part_len;
      }
    }
    if (!parts || !lens || !key_shard) {
      f->item_dropped++;
      cph_error("cluster log: the memories item of %s of message %s is DROPPED (out of memory)",
                direct ? "its direct events" : group, msgid);
    }
    for (size_t j = i; j < n; j++) /* taken into this group's items: not another's */
      if (has_part(evs, res, j) && (!key_shard || key_shard[j] == key_shard[i]) &&
          strcmp(part_group(&evs[j]), group) == 0) {
        free(res[j].memory_part);
        res[j].memory_part = NULL;
      }
  }
  free(parts);
  free(lens);
  free(key_shard);
}

static void batch_free(apply_batch *b) {
  free(b->items);
  free(b->events);
  free(b);
}

static void pump_batches(cph_cflow *f);

static void apply_done(cph_op *op, void *ctx) {
  apply_batch *b = ctx;
  cph_cflow *f = b->f;
  f->in_engine -= b->n;
  bool ok = op->rc == CPH_OK && !f->quiesced;
  if (op->rc != CPH_OK && !f->quiesced) {
    f->apply_failures++;
    cph_warn("cluster log: applying %zu messages failed (%s); they come again", b->n,
             op->err.msg[0] ? op->err.msg : cph_strerror(op->rc));
  }
  size_t first = 0; /* the index of the message's first event */
  for (size_t i = 0; i < b->n; i++) {
    applying *ap = b->items[i];
    if (i == 0 || b->items[i - 1] != ap)
      first = i;
    bool last = i + 1 == b->n || b->items[i + 1] != ap; /* the message's last event */
    if (!ok) {
      ap->failed = true;
      if (last)
        applying_finish(f, ap);
      continue;
    }
    f->applied++;
    cph_event_in *ev = &b->events[i];
    cph_event_result *res = op->u.ingest.results ? &op->u.ingest.results[i] : NULL;
    if (res && ev->history_only) /* 14. */
      res->status == CPH_EV_STORED ? f->hist_stored++ : f->hist_held++;
    if (res && res->status == CPH_EV_REJECTED && res->reason &&
        strcmp(res->reason, "session_busy") != 0)
      cph_warn("cluster log: an event of message %" PRIu64 " of shard %" PRIu32
               " rejected by the engine: %s",
               ap->m->seq, ap->m->shard, res->reason);
    /* Reached its session here: pending until a turn consumes it (7.), tracked before the
     * message is acknowledged. A duplicate was tracked when it first landed. */
    if (res && (res->status == CPH_EV_QUEUED || res->status == CPH_EV_AGGREGATED) &&
        res->sessions.count && f->tracks[ap->m->shard].live)
      pending_add(f, ev->key, ap->m->seq, ap->m->shard);
    /* Refused by its session (while_running :reject): it did not reach it, so a rebuild must
     * not deliver it either — a done mark says so (not waited for). */
    if (res && res->busy.count && ev->session) {
      cph_strv one = {&ev->key, 1};
      if (!done_publish(f, NULL, NULL, NULL, ev->session, &one, NULL, 0, NULL))
        cph_error("cluster log: out of memory logging that session %s refused event %s",
                  ev->session, ev->key);
    }
    if (!last)
      continue;
    if (!ap->m->fwd && op->u.ingest.results)
      channel_memories_put(f, ap, &b->events[first], &op->u.ingest.results[first], i + 1 - first);
    if (ap->m->fwd)
      applying_finish(f, ap);
    else
      forward(f, ap, op->u.ingest.results ? &op->u.ingest.results[first] : NULL);
  }
  cph_op_clear_results(op);
  batch_free(b);
  if (!f->quiesced)
    pump_batches(f);
}

/* The batch's engine operation: one ingest of its events, answered to apply_done. */
static void batch_op_init(apply_batch *b) {
  memset(&b->op, 0, sizeof b->op);
  b->op.kind = CPH_OP_INGEST;
  b->op.done = apply_done;
  b->op.ctx = b;
  b->op.u.ingest.events = b->events;
  b->op.u.ingest.n_events = b->n;
}

/* Hands the waiting batches to the engine, in order, while fewer than APPLY_IN_ENGINE of their
 * events are in it (one batch at least); a full engine queue is tried again on the next retry
 * tick. */
static void pump_batches(cph_cflow *f) {
  bool submitted = false;
  if (f->quiesced) /* stopping: the waiting batches are released by cph_cflow_free */
    return;
  while (f->blocked_head &&
         (!f->in_engine || f->in_engine + f->blocked_head->n <= APPLY_IN_ENGINE)) {
    apply_batch *b = f->blocked_head;
    batch_op_init(b);
    if (cph_engine_submit(f->s->engine, &b->op) != CPH_OK) {
      arm_retry(f);
      break;
    }
    f->blocked_head = b->next;
    if (!f->blocked_head)
      f->blocked_tail = NULL;
    f->in_engine += b->n;
    submitted = true;
  }
  if (submitted)
    cph_srv_schedule_pass(f->s);
}

static void batch_submit(cph_cflow *f, apply_batch *b) {
  b->next = NULL;
  if (f->blocked_tail)
    f->blocked_tail->next = b;
  else
    f->blocked_head = b;
  f->blocked_tail = b;
  pump_batches(f);
}

static void submit_forming(cph_cflow *f) {
  apply_batch *b = f->forming;
  f->forming = NULL;
  if (!b)
    return;
  if (!b->n) { /* nothing went in (out of memory) */
    batch_free(b);
    return;
  }
  batch_submit(f, b);
}

static void on_submit(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  cph_cflow *f = arg;
  if (!f->quiesced) /* stopping: the forming batch is released by cph_cflow_free */
    submit_forming(f);
}

/* ---------------------------------------------------------------- adopting a shard's sessions
 *
 * A node that starts serving a shard (it took the shard over, came back, or restarted) first
 * creates, from the session table, the sessions of that shard its engine does not have: their
 * unconsumed input is rebuilt from the log right after (8.), the rest of the state they had on
 * their previous owner (history, credits, context) does not move. The creation is queued before
 * the rebuild's first batch, so the engine applies it first. */

typedef struct adopt_op {
  cph_op op;
  json_t *def; /* the strings of op.u.session.in point into it */
  char *id;
} adopt_op;

static void strv_from(json_t *a, cph_strv *out) {
  size_t n = json_array_size(a);
  out->items = n ? calloc(n, sizeof(char *)) : NULL;
  out->count = 0;
  for (size_t i = 0; out->items && i < n; i++)
    if (json_is_string(json_array_get(a, i)))
      out->items[out->count++] = (char *)json_string_value(json_array_get(a, i));
}

static void adopt_free(adopt_op *a) {
  free(a->op.u.session.in.subscribe.items);
  free(a->op.u.session.in.member.items);
  free(a->op.u.session.in.tools.items);
  json_decref(a->def);
  free(a->id);
  free(a);
}

static void adopt_done(cph_op *op, void *ctx) {
  adopt_op *a = ctx;
  if (op->rc == CPH_OK)
    cph_info("cluster log: adopted session %s from the session table (its unconsumed input is "
             "rebuilt from the log, its state loaded from %s when it has one)",
             a->id, CPH_CLOG_STATES);
  else if (op->rc != CPH_EEXISTS)
    cph_warn("cluster log: adopting session %s failed: %s", a->id,
             op->err.msg[0] ? op->err.msg : cph_strerror(op->rc));
  cph_op_clear_results(op);
  adopt_free(a);
}

/* Queues the creation of one session from its definition; false when the engine refused. */
static bool adopt_one(cph_cflow *f, const cph_ctable_session *r) {
  adopt_op *a = calloc(1, sizeof *a);
  if (!a || !(a->id = strdup(r->id))) {
    free(a);
    return false;
  }
  a->def = json_incref(r->def);
  cph_session_info *in = &a->op.u.session.in;
  in->id = a->id;
  if (cph_lane_parse(json_string_value(json_object_get(r->def, "class")), &in->lane) != CPH_OK)
    in->lane = CPH_LANE_INTERACTIVE;
  strv_from(json_object_get(r->def, "subscribe"), &in->subscribe);
  strv_from(json_object_get(r->def, "member"), &in->member);
  strv_from(json_object_get(r->def, "tools"), &in->tools);
  in->autonomy_interval_s =
      (uint32_t)json_integer_value(json_object_get(r->def, "autonomy_interval_s"));
  in->report_interval_s =
      (uint32_t)json_integer_value(json_object_get(r->def, "report_interval_s"));
  in->context_window_tokens =
      (uint32_t)json_integer_value(json_object_get(r->def, "context_window_tokens"));
  in->system = (char *)json_string_value(json_object_get(r->def, "system"));
  in->tenant = (char *)json_string_value(json_object_get(r->def, "tenant"));
  const char *wr = json_string_value(json_object_get(r->def, "while_running"));
  in->while_running_class = !wr || cph_policy_while_running_parse(wr, &in->while_running) != CPH_OK;
  a->op.u.session.set = CPH_SET_WHILE_RUNNING;
  if (json_is_true(json_object_get(r->def, "paused"))) {
    in->state = CPH_STATE_PAUSED;
    a->op.u.session.set |= CPH_SET_PAUSED;
  }
  a->op.kind = CPH_OP_SESSION_CREATE;
  a->op.done = adopt_done;
  a->op.ctx = a;
  if (cph_engine_submit(f->s->engine, &a->op) != CPH_OK) {
    adopt_free(a);
    return false;
  }
  return true;
}

/* Adopts the sessions of shard that this engine lacks; false when one could not be queued
 * (try again with the next message). */
static bool adopt_shard(cph_cflow *f, uint32_t shard) {
  bool ok = true, queued = false;
  for (const cph_ctable_session *r = cph_ctable_shard_first(f->table, shard); r;
       r = r->shard_next) {
    if (!r->def)
      continue;
    cph_session_info have = {0};
    cph_err err = {0};
    int rc = cph_engine_get_session(f->s->engine, r->id, &have, &err);
    if (rc == CPH_OK)
      cph_session_info_free(&have);
    else if (rc == CPH_ENOTFOUND && adopt_one(f, r))
      queued = true;
    else if (rc == CPH_ENOTFOUND)
      ok = false;
  }
  if (queued)
    cph_srv_schedule_pass(f->s);
  return ok;
}

/* ---------------------------------------------------------------- rebuilding a shard (8.)
 *
 * The log hands over a shard's past (cph_clog_replay) before binding the shard's consumer.
 * From it: the keys its done marks name, and those its park marks hold parked (6.); then, in log
 * order, every in or fwd message naming a session (the only ones that reached one: 2., 3.) whose
 * key no done mark names, applied to that session alone, one engine operation at a time (so in
 * order), after the shard's sessions were adopted: first each parked turn's events as one
 * operation that parks them again, then the others in batches of REBUILD_BATCH. What reached its session is tracked as pending; a message
 * the engine already had (this node applied it before: a restart, or the shard came back) is
 * pending only if its event is still in the session's live inbox (cph_engine_inbox_keys): it
 * may have been consumed here without its mark reaching the log. Then the shard is live and
 * the log binds its consumer. */

typedef struct rb_event {
  cph_event_in ev; /* strings in the rebuild's arena or docs */
  uint64_t seq;
  bool unparked; /* its newest mark is an unpark (6.): requeued on another node */
} rb_event;

/* The keys a session keeps (CPH_OP_INBOX_RETAIN): those of the rebuild's events naming it. */
typedef struct rb_keep {
  cph_op op;
  struct rebuild *rb;
  char *session;
  const char **keys; /* strings in the events' docs */
  size_t n, cap;
  /* of keys: those of turns parked elsewhere (8.), and those requeued elsewhere (6.) */
  const char **parked, **unparked;
  size_t n_parked, n_unparked;
} rb_keep;

/* A turn another node parked (its park marks, 6.) whose events the replay holds: they are
 * applied to its session and parked again there in one engine operation (8.). */
typedef struct rb_park {
  char *session, *turn, *error; /* from its marks: "turn" groups a turn's parts */
  uint32_t attempts;
  rb_event *evs; /* its events, in log order, until laid out into the rebuild's */
  size_t n, cap;
  size_t first; /* once laid out: its events are rebuild.evs[first .. first + n) */
  const char **keys; /* once laid out: their keys (in the events' docs), for the operation */
} rb_park;

struct rebuild {
  cph_op op; /* the batch in the engine, events[next - op_n .. next) */
  rb_park **parks; /* the parked turns, their events first in evs (in this order) */
  size_t n_parks, next_park;
  size_t parks_end; /* evs[0 .. parks_end): the parked turns' events */
  rb_park *op_park; /* the batch in the engine parks this one (NULL: none) */
  struct cph_arena_chunk *arena; /* the events' strings (decode_payload) */
  json_t *docs;                  /* the messages jansson decoded (an array), or NULL */
  cph_cflow *f;
  cph_clog_replay *rp;
  rb_event *evs;
  cph_event_in *ins; /* the events of evs, in order, for the operations */
  size_t n, next, op_n;
  size_t next_state; /* rp->states[..next_state) queued (11.) */
  size_t next_item;  /* rp->items[..next_item) queued (13.), once sorted by session */
  bool items_sorted;
  rb_keep **keeps;                      /* one per session of the shard, after the batches */
  size_t n_keeps, next_keep, retaining; /* keeps[next_keep..) not queued; retaining in the engine */
  bool adopted, states_queued, in_engine, waiting, stale;
  /* 16.: the memories items of the channels of the shard's sessions, read (cph_clog_read_items)
   * and queued before the states, so a channel's older memories are stored before the state's
   * newer ones (a turn lists a scope's memories by id, newest first). */
  bool chans_asked, chans_done;
  bool own_chans_queued; /* the shard's own channels' items (they come with its keys) */
  uint32_t chan_ops;     /* channel imports queued and not done: the states wait for them (an
                          * import goes in steps, which what is queued after it may pass) */
  uint32_t chan_token; /* the read in flight (its ref's low 32 bits) */
  int64_t chan_asked_ns; /* when: an answer that never comes is asked again after a while */
  int chan_tries;
  cph_clog_replay *chan_rp; /* the answer, its items sorted by owner */
  size_t chan_next;         /* chan_rp->items[..chan_next) queued */
  cph_hmap dups;    /* engine key of a duplicate -> its rb_event */
  /* 16.: the hex SHA-256 of each replayed `in` message whose events to a session alone all
   * go to their sessions again (none consumed): its direct memories items are not imported,
   * the delivery mints those memories (keys in the arena) */
  cph_hmap direct_redelivered;
  cph_hmap checks;  /* sessions with duplicates (keys owned by evs' docs) -> themselves */
  uint64_t reached; /* events that reached their session */
  int64_t t0_ns;
};

static void rb_park_free(rb_park *g) {
  if (!g)
    return;
  free(g->session);
  free(g->turn);
  free(g->error);
  free(g->evs);
  free(g->keys);
  free(g);
}

static void rebuild_free(rebuild *rb) {
  for (size_t i = 0; i < rb->n_parks; i++)
    rb_park_free(rb->parks[i]);
  free(rb->parks);
  for (size_t i = 0; i < rb->n_keeps; i++) {
    free(rb->keeps[i]->keys);
    free(rb->keeps[i]->parked);
    free(rb->keeps[i]->unparked);
    free(rb->keeps[i]->session);
    free(rb->keeps[i]);
  }
  free(rb->keeps);
  cph_arena_free(&rb->arena);
  json_decref(rb->docs);
  free(rb->evs);
  free(rb->ins);
  cph_hmap_free(&rb->dups);
  cph_hmap_free(&rb->checks);
  cph_hmap_free(&rb->direct_redelivered);
  cph_clog_replay_free(rb->rp);
  cph_clog_replay_free(rb->chan_rp);
  free(rb);
}

/* The park group of (session, turn) in rb, made when new. NULL out of memory. */
static rb_park *park_group(rebuild *rb, const char *session, const char *turn, json_t *doc) {
  for (size_t i = 0; i < rb->n_parks; i++)
    if (strcmp(rb->parks[i]->session, session) == 0 && strcmp(rb->parks[i]->turn, turn) == 0)
      return rb->parks[i];
  rb_park **v = realloc(rb->parks, (rb->n_parks + 1) * sizeof *v);
  if (!v)
    return NULL;
  rb->parks = v;
  rb_park *g = calloc(1, sizeof *g);
  const char *error = json_string_value(json_object_get(doc, "error"));
  json_int_t attempts = json_integer_value(json_object_get(doc, "attempts"));
  if (!g || !(g->session = strdup(session)) || !(g->turn = strdup(turn)) ||
      !(g->error = strdup(error ? error : ""))) {
    rb_park_free(g);
    return NULL;
  }
  g->attempts = attempts > 0 && attempts <= UINT32_MAX ? (uint32_t)attempts : 1;
  rb->parks[rb->n_parks++] = g;
  return g;
}

/* rp's marks, in log order (6.): the keys done marks name into done; the keys a park mark names
 * and no later unpark or done mark does into parked (key -> the rb_park of its turn, made in
 * rb->parks); the keys whose newest mark is an unpark into unparked. Keys are owned by the marks'
 * documents, kept in docs. A malformed mark is logged and skipped. False out of memory. */
static bool rebuild_marks(rebuild *rb, cph_hmap *done, cph_hmap *parked, cph_hmap *unparked,
                          json_t *docs) {
  const cph_clog_replay *rp = rb->rp;
  for (size_t i = rp->n_events; i < rp->n_entries; i++) {
    const cph_clog_entry *e = &rp->entries[i];
    json_t *doc = json_loadb(e->data, e->len, 0, NULL);
    json_t *keys = json_object_get(doc, "keys"), *park = json_object_get(doc, "park"),
           *unpark = json_object_get(doc, "unpark");
    if (!keys && !park && !unpark && json_object_get(doc, "epoch")) { /* a fence (10.) */
      json_decref(doc);
      continue;
    }
    const char *session = json_string_value(json_object_get(doc, "session"));
    const char *turn = json_string_value(json_object_get(doc, "turn"));
    json_t *list = keys ? keys : park ? park : unpark;
    if (!json_is_array(list) || (!keys && (!session || !turn))) {
      cph_warn("cluster log: mark %" PRIu64 " of shard %" PRIu32
               " is malformed (no \"keys\", \"park\" or \"unpark\" array, or a park mark "
               "without its session and turn); skipped",
               e->seq, rp->shard);
      json_decref(doc);
      continue;
    }
    if (json_array_append_new(docs, doc) != 0)
      return false;
    rb_park *g = park ? park_group(rb, session, turn, doc) : NULL;
    if (park && !g)
      return false;
    size_t k;
    json_t *key;
    json_array_foreach(list, k, key) {
      const char *v = json_string_value(key);
      if (!v)
        continue;
      int rc = CPH_OK;
      if (keys) { /* consumed: never parked again, whatever came before */
        rc = cph_hmap_put(done, v, doc);
        cph_hmap_del(parked, v);
        cph_hmap_del(unparked, v);
      } else if (park && !cph_hmap_get(done, v)) {
        rc = cph_hmap_put(parked, v, g);
        cph_hmap_del(unparked, v);
      } else if (unpark && !cph_hmap_get(done, v)) {
        cph_hmap_del(parked, v);
        rc = cph_hmap_put(unparked, v, doc);
      }
      if (rc != CPH_OK)
        return false;
    }
  }
  return true;
}

static int park_by_first(const void *a, const void *b) {
  uint64_t x = (*(rb_park *const *)a)->evs[0].seq, y = (*(rb_park *const *)b)->evs[0].seq;
  return x < y ? -1 : x > y;
}

/* Lays the parked turns' events out at the head of rb->evs (each turn's together, the turns by
 * their first event), before the other events, and drops the turns none of whose events the
 * replay holds. False out of memory. */
static bool rebuild_park_layout(rebuild *rb) {
  size_t kept = 0, total = 0;
  for (size_t i = 0; i < rb->n_parks; i++) {
    rb_park *g = rb->parks[i];
    if (!g->n) {
      rb_park_free(g);
      continue;
    }
    rb->parks[kept++] = g;
    total += g->n;
  }
  rb->n_parks = kept;
  if (!total)
    return true;
  qsort(rb->parks, rb->n_parks, sizeof *rb->parks, park_by_first);
  rb_event *v = malloc((total + rb->n) * sizeof *v);
  if (!v)
    return false;
  size_t at = 0;
  for (size_t i = 0; i < rb->n_parks; i++) {
    rb_park *g = rb->parks[i];
    if (!(g->keys = malloc(g->n * sizeof *g->keys))) {
      free(v);
      return false;
    }
    g->first = at;
    for (size_t k = 0; k < g->n; k++) {
      g->keys[k] = g->evs[k].ev.key;
      v[at++] = g->evs[k];
    }
    free(g->evs);
    g->evs = NULL;
  }
  memcpy(v + at, rb->evs, rb->n * sizeof *v);
  free(rb->evs);
  rb->evs = v;
  rb->n += total;
  rb->parks_end = total;
  return true;
}

/* Notes that message msgid's events to a session alone all go to their sessions again (16.).
 * False out of memory. */
static bool direct_redelivered(rebuild *rb, const char *msgid) {
  char *hash = cph_arena_alloc(&rb->arena, 65);
  if (!hash)
    return false;
  msgid_sha256_hex(msgid, hash);
  return cph_hmap_put(&rb->direct_redelivered, hash, hash) == CPH_OK;
}

/* The events to apply again, from rp's in and fwd messages (see above); a batch's events one by
 * one, in order — those of a turn parked elsewhere (parked: rebuild_marks) set aside with it, to
 * go first (rebuild_park_layout). */
static bool rebuild_events(cph_cflow *f, rebuild *rb, const cph_hmap *done,
                           const cph_hmap *parked, const cph_hmap *unparked) {
  const cph_clog_replay *rp = rb->rp;
  size_t cap = rp->n_events ? rp->n_events : 1;
  rb->evs = calloc(cap, sizeof *rb->evs);
  if (!rb->evs)
    return false;
  for (size_t i = 0; i < rp->n_events; i++) {
    const cph_clog_entry *e = &rp->entries[i];
    json_t *doc = NULL;
    cph_event_in *evs = NULL;
    size_t n = 0;
    const char *batch_id = NULL;
    const predecoded *pd = e->decoded; /* by the replay thread: lives as long as rp */
    bool ok = pd ? (evs = pd->evs, n = pd->n, pd->ok)
                 : decode_payload(e->data, e->len, &rb->arena, &doc, &evs, &n, &batch_id);
    if (!ok)
      cph_warn("cluster log: message %" PRIu64 " of shard %" PRIu32
               " is not an event; skipped by the rebuild",
               e->seq, rp->shard);
    if (ok && doc && ((!rb->docs && !(rb->docs = json_array())) ||
                      json_array_append(rb->docs, doc) != 0)) {
      json_decref(doc);
      return false;
    }
    json_decref(doc); /* rb->docs holds it while its events are used */
    size_t direct = 0, direct_consumed = 0; /* its events to a session alone (16.) */
    for (size_t k = 0; ok && k < n; k++) {
      cph_event_in *ev = &evs[k];
      bool alone = !ev->history_only && !ev->channel && ev->session;
      direct += alone;
      /* a history copy (14.) is applied again as well: the node applies it once (its key, or the
       * same event in the channel) */
      if (!ev->history_only && (!ev->session || cph_hmap_get(done, ev->key) ||
                                !cph_ctable_get(f->table, ev->session))) {
        direct_consumed += alone && cph_hmap_get(done, ev->key); /* else: deleted since */
        continue;
      }
      rb_park *g = ev->history_only || !ev->key ? NULL : cph_hmap_get(parked, ev->key);
      if (g && strcmp(g->session, ev->session) == 0) { /* parked elsewhere: goes with its turn */
        if (g->n == g->cap) {
          size_t c = g->cap ? 2 * g->cap : 8;
          rb_event *v = realloc(g->evs, c * sizeof *v);
          if (!v)
            return false;
          g->evs = v;
          g->cap = c;
        }
        g->evs[g->n] = (rb_event){*ev, e->seq, false};
        g->n++;
        continue;
      }
      if (rb->n == cap) {
        size_t c = 2 * cap;
        rb_event *v = realloc(rb->evs, c * sizeof *v);
        if (!v)
          return false;
        rb->evs = v;
        cap = c;
      }
      rb_event *x = &rb->evs[rb->n++];
      x->ev = *ev;
      x->seq = e->seq;
      x->unparked = ev->key && !ev->history_only && cph_hmap_get(unparked, ev->key);
    }
    const char *msgid = pd ? pd->batch_id : batch_id;
    if (!msgid && n)
      msgid = evs[0].key;
    if (ok && direct && !direct_consumed && msgid && !direct_redelivered(rb, msgid))
      return false;
  }
  if (!rebuild_park_layout(rb))
    return false;
  rb->ins = calloc(rb->n ? rb->n : 1, sizeof *rb->ins);
  if (!rb->ins)
    return false;
  for (size_t i = 0; i < rb->n; i++)
    rb->ins[i] = rb->evs[i].ev;
  return true;
}

static void rebuild_step(cph_cflow *f, rebuild *rb);

/* A batch of the rebuild was applied: what reached its session is pending; duplicates are
 * looked at once all batches are in. */
static void rebuild_done(cph_op *op, void *ctx) {
  rebuild *rb = ctx;
  cph_cflow *f = rb->f;
  rb->in_engine = false;
  if (rb->stale || f->quiesced) {
    if (f->tracks[rb->rp->shard].rb == rb)
      f->tracks[rb->rp->shard].rb = NULL;
    cph_op_clear_results(op);
    rebuild_free(rb);
    return;
  }
  uint32_t shard = rb->rp->shard;
  size_t first = rb->next - rb->op_n;
  if (op->rc != CPH_OK) {
    cph_warn("cluster log: rebuilding shard %" PRIu32 ": applying %zu events failed (%s); "
             "tried again",
             shard, rb->op_n, op->err.msg[0] ? op->err.msg : cph_strerror(op->rc));
    cph_op_clear_results(op);
    rb->next = first;
    if (rb->op_park)
      rb->next_park--;
    rb->waiting = true;
    arm_retry(f);
    return;
  }
  /* A turn parked elsewhere: what its session holds parked (now, or parked by this node before
   * a restart) is not consumed — pending, so the watermark stays below it (7.). */
  cph_hmap held = CPH_HMAP_INIT;
  for (size_t i = 0; i < op->u.ingest.park_held.count; i++)
    if (cph_hmap_put(&held, op->u.ingest.park_held.items[i], op->u.ingest.park_held.items[i]) !=
        CPH_OK)
      cph_error("cluster log: out of memory rebuilding shard %" PRIu32, shard);
  if (op->u.ingest.park_turn)
    f->parks_rebuilt++;
  for (size_t i = 0; op->u.ingest.results && i < rb->op_n; i++) {
    const cph_event_result *res = &op->u.ingest.results[i];
    rb_event *x = &rb->evs[first + i];
    bool reached =
        (res->status == CPH_EV_QUEUED || res->status == CPH_EV_AGGREGATED) && res->sessions.count;
    if (reached || (x->ev.key && cph_hmap_get(&held, x->ev.key))) {
      pending_add(f, x->ev.key, x->seq, shard);
      rb->reached += reached;
    } else if (res->status == CPH_EV_DUPLICATE && x->ev.session) {
      if (cph_hmap_put(&rb->dups, x->ev.key, x) != CPH_OK ||
          cph_hmap_put(&rb->checks, x->ev.session, x->ev.session) != CPH_OK)
        cph_error("cluster log: out of memory rebuilding shard %" PRIu32, shard);
    }
  }
  cph_hmap_free(&held);
  cph_op_clear_results(op);
  rebuild_step(f, rb);
}

/* The events of the duplicates that are still in their session's live inbox are pending. */
static void rebuild_check_dups(cph_cflow *f, rebuild *rb) {
  for (size_t i = 0; i < rb->checks.cap; i++) {
    const char *session = rb->checks.slots[i].key;
    if (!session)
      continue;
    cph_strv keys = {0};
    cph_err err = {0};
    if (cph_engine_inbox_keys(f->s->engine, session, &keys, &err) != CPH_OK) {
      cph_warn("cluster log: rebuilding shard %" PRIu32 ": the inbox of %s: %s", rb->rp->shard,
               session, err.msg);
      continue;
    }
    for (size_t k = 0; k < keys.count; k++) {
      rb_event *x = cph_hmap_get(&rb->dups, keys.items[k]);
      if (x)
        pending_add(f, x->ev.key, x->seq, rb->rp->shard);
    }
    cph_strv_free(&keys);
  }
}

static void rebuild_retained(cph_op *op, void *ctx) {
  rb_keep *k = ctx;
  rebuild *rb = k->rb;
  cph_cflow *f = rb->f;
  if (op->rc == CPH_OK && op->u.retain.dropped)
    cph_info("cluster log: session %s dropped %" PRIu32 " entries consumed on another node "
             "while this one did not serve it",
             k->session, op->u.retain.dropped);
  if (op->rc == CPH_OK && (op->u.retain.parked_dropped || op->u.retain.parked_requeued))
    cph_info("cluster log: session %s: of its turns parked here before, %" PRIu32 " requeued "
             "(requeued on another node meanwhile) and %" PRIu32 " no longer parked (consumed "
             "on another node meanwhile)",
             k->session, op->u.retain.parked_requeued, op->u.retain.parked_dropped);
  /* A turn parked here with no mark that says so (parked before park marks, or its mark was
   * lost) stays parked: its input is not consumed (7.). */
  for (size_t i = 0; op->rc == CPH_OK && !rb->stale && !f->quiesced &&
                     i < op->u.retain.held.count;
       i++) {
    const rb_event *x = cph_hmap_get(&rb->dups, op->u.retain.held.items[i]);
    if (x)
      pending_add(f, x->ev.key, x->seq, rb->rp->shard);
  }
  if (op->rc != CPH_OK && op->rc != CPH_ENOTFOUND)
    cph_warn("cluster log: retaining the inbox of %s: %s", k->session,
             op->err.msg[0] ? op->err.msg : cph_strerror(op->rc));
  cph_op_clear_results(op);
  if (--rb->retaining)
    return;
  rb->in_engine = false;
  if (rb->stale || f->quiesced) {
    if (f->tracks[rb->rp->shard].rb == rb)
      f->tracks[rb->rp->shard].rb = NULL;
    rebuild_free(rb);
    return;
  }
  rebuild_step(f, rb);
}

/* After the batches: every session of the shard keeps, of what its inbox held before the
 * rebuild, only the entries of events the replay found unconsumed — a node that served the
 * shard before (it came back) holds stale entries that another node's turns consumed since
 * (their done marks, or below the watermark). One CPH_OP_INBOX_RETAIN per session, at most
 * RETAIN_AT_ONCE in the engine at a time; true once every one was queued. Out of memory:
 * nothing is retained (stale entries may then be delivered again), logged. */
static bool rebuild_retain(cph_cflow *f, rebuild *rb) {
  if (!rb->keeps) {
    size_t n = 0;
    for (const cph_ctable_session *r = cph_ctable_shard_first(f->table, rb->rp->shard); r;
         r = r->shard_next)
      n++;
    rb->keeps = calloc(n ? n : 1, sizeof *rb->keeps);
    cph_hmap by = CPH_HMAP_INIT;
    bool ok = rb->keeps != NULL;
    for (const cph_ctable_session *r = cph_ctable_shard_first(f->table, rb->rp->shard); ok && r;
         r = r->shard_next) {
      rb_keep *k = calloc(1, sizeof *k);
      ok = k && (k->session = strdup(r->id)) && cph_hmap_put(&by, k->session, k) == CPH_OK;
      if (k && !ok) {
        free(k->session);
        free(k);
      } else if (k) {
        k->rb = rb;
        rb->keeps[rb->n_keeps++] = k;
      }
    }
    for (size_t i = 0; ok && i < rb->n; i++) {
      rb_keep *k = rb->evs[i].ev.session ? cph_hmap_get(&by, rb->evs[i].ev.session) : NULL;
      if (!k) /* a history copy (14.) names no session */
        continue;
      if (k->n == k->cap) {
        size_t cap = k->cap ? 2 * k->cap : 16;
        const char **keys = realloc(k->keys, cap * sizeof *keys);
        if (!keys) {
          ok = false;
          break;
        }
        k->keys = keys;
        k->cap = cap;
      }
      k->keys[k->n++] = rb->evs[i].ev.key;
    }
    /* of them, those of turns parked elsewhere and those requeued elsewhere (few: sized as
     * the session's keys when there is one) */
    for (size_t i = 0; ok && i < rb->n; i++) {
      bool in_park = i < rb->parks_end;
      rb_keep *k = (in_park || rb->evs[i].unparked) && rb->evs[i].ev.session
                       ? cph_hmap_get(&by, rb->evs[i].ev.session)
                       : NULL;
      if (!k)
        continue;
      const char ***list = in_park ? &k->parked : &k->unparked;
      size_t *count = in_park ? &k->n_parked : &k->n_unparked;
      if (!*list && !(*list = malloc(k->n * sizeof **list))) {
        ok = false;
        break;
      }
      (*list)[(*count)++] = rb->evs[i].ev.key;
    }
    cph_hmap_free(&by);
    if (!ok) { /* out of memory: stale entries are not dropped (at worst delivered again) */
      cph_error("cluster log: out of memory rebuilding shard %" PRIu32
                "; stale entries of its sessions are kept",
                rb->rp->shard);
      rb->next_keep = rb->n_keeps; /* none queued: given up */
      return true;
    }
  }
  while (rb->next_keep < rb->n_keeps && rb->retaining < RETAIN_AT_ONCE) {
    rb_keep *k = rb->keeps[rb->next_keep];
    memset(&k->op, 0, sizeof k->op);
    k->op.kind = CPH_OP_INBOX_RETAIN;
    k->op.done = rebuild_retained;
    k->op.ctx = k;
    k->op.u.retain.session = k->session;
    k->op.u.retain.keep = k->keys;
    k->op.u.retain.n_keep = k->n;
    k->op.u.retain.parked = k->parked;
    k->op.u.retain.n_parked = k->n_parked;
    k->op.u.retain.unparked = k->unparked;
    k->op.u.retain.n_unparked = k->n_unparked;
    if (cph_engine_submit(f->s->engine, &k->op) != CPH_OK)
      break;
    rb->next_keep++;
    rb->retaining++;
  }
  if (rb->retaining)
    cph_srv_schedule_pass(f->s);
  return rb->next_keep == rb->n_keeps;
}

/* ---- the sessions' states (11.) and items (13.) ---- */

/* One session's state and items, copied for their operation (it may outlive the rebuild). */
typedef struct state_op {
  cph_op op;
  cph_cflow *f;
  char *session;
  uint8_t *data; /* NULL: items only */
  cph_state_item *items;
  size_t n_items;
  uint32_t shard; /* a channel's: the rebuild whose states wait for it (rb_of) */
  uint64_t gen;
} state_op;

static void state_op_free(state_op *so) {
  for (size_t i = 0; i < so->n_items; i++) {
    free(so->items[i].name);
    free(so->items[i].data);
  }
  free(so->items);
  free(so->session);
  free(so->data);
  free(so);
}

static void state_done(cph_op *op, void *ctx) {
  state_op *so = ctx;
  if (op->kind == CPH_OP_CHANNEL_MEMORIES) { /* 16. */
    cph_cflow *f = so->f;
    f->items_refused += op->u.channel.refused;
    f->channel_memories_loaded += op->u.channel.added;
    f->channel_memories_held += op->u.channel.held;
    if (op->rc != CPH_OK)
      cph_warn("cluster log: the memories of channel %s from the log were not taken: %s",
               so->session + 1, op->err.msg[0] ? op->err.msg : cph_strerror(op->rc));
    rebuild *rb = so->shard < cph_cluster_shards(f->s->cluster) ? f->tracks[so->shard].rb : NULL;
    if (rb && rb->rp->gen != so->gen)
      rb = NULL; /* the rebuild it was queued for ended */
    cph_op_clear_results(op);
    state_op_free(so);
    if (rb && rb->chan_ops && --rb->chan_ops == 0 && rb->waiting)
      rebuild_step(f, rb); /* its states were waiting for the channels' imports */
    return;
  }
  so->f->items_refused += op->u.state.items_refused;
  if (op->rc != CPH_OK)
    cph_warn("cluster log: the %s of session %s from the log %s not taken: %s",
             so->data ? (so->n_items ? "state and items" : "state") : "items", so->session,
             so->data && !so->n_items ? "was" : "were",
             op->err.msg[0] ? op->err.msg : cph_strerror(op->rc));
  cph_op_clear_results(op);
  state_op_free(so);
}

/* Items by owner, then name: a shard's direct memories items (16.) in the order they were
 * made (their names begin with the time). */
static int item_by_session(const void *a, const void *b) {
  const cph_clog_item *x = a, *y = b;
  int c = strcmp(x->session, y->session);
  return c ? c : strcmp(x->name, y->name);
}

/* The first item of session in rp (sorted by session): its index, or n_items. */
static size_t items_of(const cph_clog_replay *rp, const char *session) {
  size_t lo = 0, hi = rp->n_items;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (strcmp(rp->items[mid].session, session) < 0)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* Copies the items of session in rp (from index `from` on, at most max of them) into so: *to
 * is where they end. False out of memory. */
static bool copy_items(const cph_clog_replay *rp, size_t from, const char *session, size_t max,
                       state_op *so, size_t *to) {
  *to = from;
  while (*to < rp->n_items && *to - from < max && strcmp(rp->items[*to].session, session) == 0)
    (*to)++;
  if (*to == from)
    return true;
  if (!(so->items = calloc(*to - from, sizeof *so->items)))
    return false;
  for (size_t i = from; i < *to; i++) {
    const cph_clog_item *it = &rp->items[i];
    if (it->len < CPH_CLOG_EPOCH_BYTES)
      continue; /* taken already (items_taken), or not a value this build put */
    cph_state_item *c = &so->items[so->n_items];
    size_t len = it->len - CPH_CLOG_EPOCH_BYTES;
    if (!(c->name = strdup(it->name)) || !(c->data = malloc(len ? len : 1))) {
      free(c->name);
      return false;
    }
    memcpy(c->data, it->data + CPH_CLOG_EPOCH_BYTES, len);
    c->len = len;
    so->n_items++;
  }
  return true;
}

/* The items rp->items[from..to) went to the engine: never queued again. */
static void items_taken(cph_cflow *f, cph_clog_replay *rp, size_t from, size_t to) {
  for (size_t i = from; i < to; i++)
    if (rp->items[i].len >= CPH_CLOG_EPOCH_BYTES) {
      rp->items[i].len = 0;
      if (rp->items[i].session[0] == CHANNEL_OWNER_PREFIX) /* 16. */
        f->channel_items_loaded++;
      else
        f->items_loaded++;
    }
}

/* The most direct memories items (16.; up to CHANNEL_ITEM_BYTES each) one import takes. */
#define DIRECT_IMPORT_ITEMS 16

/* 16. Of the direct memories items rp->items[from..to): those of a message the rebuild
 * delivers again whole (rb->direct_redelivered) are left to the delivery — which mints their
 * memories, after the states, as the events are the newest — and marked taken. Importing them
 * too stored each memory and then linked it to its delivery: the takeover bench (1M pending
 * events to a session alone) took 67-69 s against 41-55 s before these items. */
static void direct_items_left(cph_cflow *f, rebuild *rb, cph_clog_replay *rp, size_t from,
                              size_t to) {
  char hash[65];
  for (size_t i = from; rb->direct_redelivered.len && i < to; i++) {
    const char *name = rp->items[i].name;
    if (rp->items[i].len < CPH_CLOG_EPOCH_BYTES || name[0] != 'd' ||
        strlen(name) < DIRECT_ITEM_NAME_MIN)
      continue;
    memcpy(hash, name + DIRECT_ITEM_HASH_AT, 64);
    hash[64] = '\0';
    if (cph_hmap_get(&rb->direct_redelivered, hash)) {
      rp->items[i].len = 0;
      f->direct_items_left++;
    }
  }
}

/* Submits so (its session's state, items or both), or frees it. False when the engine is busy
 * or out of memory. */
static bool state_submit(cph_cflow *f, state_op *so) {
  so->f = f;
  so->op.done = state_done;
  so->op.ctx = so;
  if (so->session[0] == CHANNEL_OWNER_PREFIX) { /* a channel's memories (16.) */
    so->op.kind = CPH_OP_CHANNEL_MEMORIES;
    so->op.u.channel.channel = so->session + 1;
    so->op.u.channel.items = so->items;
    so->op.u.channel.n_items = so->n_items;
  } else {
    so->op.kind = CPH_OP_SESSION_STATE;
    so->op.u.state.session = so->session;
    so->op.u.state.data = so->data;
    so->op.u.state.items = so->items;
    so->op.u.state.n_items = so->n_items;
  }
  if (cph_engine_submit(f->s->engine, &so->op) == CPH_OK)
    return true;
  state_op_free(so);
  return false;
}

/* Queues, from rp->items[*next..) (sorted by owner), one operation per owner with items:
 * CPH_OP_CHANNEL_MEMORIES for a channel's ("#", 16.; counted in rb->chan_ops until done), and
 * — unless channels_only, which stops at the first session's — CPH_OP_SESSION_STATE with
 * items only for a session the table knows (its state put failed, or its key was lost; the
 * items of a session deleted since are being forgotten). *next moves past what was queued;
 * *queued set when something was. False when the engine is busy or out of memory (the rest
 * on the next try). */
static bool owner_items_submit(cph_cflow *f, rebuild *rb, cph_clog_replay *rp, size_t *next,
                               bool channels_only, bool *queued) {
  for (size_t j; *next < rp->n_items; *next = j) {
    const char *owner = rp->items[*next].session;
    bool chan = owner[0] == CHANNEL_OWNER_PREFIX;
    if (channels_only && !chan)
      break;
    /* a shard's direct memories (16.) in steps of DIRECT_IMPORT_ITEMS items, oldest first:
     * one operation would hold all of them decoded at once (a million, in the takeover bench) */
    size_t max = chan && strcmp(owner + 1, CPH_DIRECT_MEMORIES) == 0 ? DIRECT_IMPORT_ITEMS
                                                                      : SIZE_MAX;
    for (j = *next + 1;
         j < rp->n_items && j - *next < max && strcmp(rp->items[j].session, owner) == 0; j++)
      ;
    const cph_ctable_session *known = chan ? NULL : cph_ctable_get(f->table, owner);
    if (!chan && (!known || !known->def))
      continue; /* deleted since: its items are being forgotten */
    if (max != SIZE_MAX)
      direct_items_left(f, rb, rp, *next, j);
    state_op *so = calloc(1, sizeof *so);
    size_t to = j;
    if (!so || !(so->session = strdup(owner)) || !copy_items(rp, *next, owner, max, so, &to)) {
      if (so)
        state_op_free(so);
      return false;
    }
    if (!so->n_items) { /* all went with its state */
      state_op_free(so);
      continue;
    }
    so->shard = rb->rp->shard;
    so->gen = rb->rp->gen;
    if (!state_submit(f, so))
      return false;
    rb->chan_ops += chan;
    items_taken(f, rp, *next, to);
    *queued = true;
  }
  return true;
}

/* Queues one CPH_OP_SESSION_STATE per state of the replay whose session the table places on
 * the shard, with the session's items (13.: the engine stores them first, so the records keep
 * the order they were made in) — after the adoptions: the engine applies operations in order,
 * so each session exists by then, and before the replayed events. Then one with items only per
 * session with items and no state (its state put failed, or its key was lost). Values are
 * copied: an operation may outlive the rebuild. What is queued is not queued again
 * (rb->next_state, rb->next_item, items taken). False when the engine is busy (the rest on the
 * next try). */
static bool states_import(cph_cflow *f, rebuild *rb) {
  cph_clog_replay *rp = rb->rp;
  /* the shard's channels' memories went before (own_chans_import, 16.) */
  bool queued = false, ok = true;
  for (; ok && rb->next_state < rp->n_states; rb->next_state++) {
    const cph_clog_state *st = &rp->states[rb->next_state];
    const cph_ctable_session *known = cph_ctable_get(f->table, st->session);
    if (!known || !known->def)
      continue; /* not a session of the table (deleted since): nothing to give it to */
    if (!st->data || st->len < CPH_CLOG_EPOCH_BYTES)
      continue; /* deleted: nothing to take (its items, if any, go below) */
    size_t from = items_of(rp, st->session);
    state_op *so = calloc(1, sizeof *so);
    size_t len = st->len - CPH_CLOG_EPOCH_BYTES, to = from;
    if (!so || !(so->session = strdup(st->session)) || !(so->data = malloc(len ? len : 1)) ||
        !copy_items(rp, from, st->session, SIZE_MAX, so, &to)) {
      if (so)
        state_op_free(so);
      ok = false;
      break;
    }
    memcpy(so->data, st->data + CPH_CLOG_EPOCH_BYTES, len);
    so->op.u.state.len = len;
    if (!state_submit(f, so)) {
      ok = false;
      break;
    }
    items_taken(f, rp, from, to);
    queued = true;
    f->states_loaded++;
    f->state_load_bytes += st->stored_len;
    f->state_load_raw_bytes += st->len;
  }
  if (ok)
    ok = owner_items_submit(f, rb, rp, &rb->next_item, false, &queued);
  if (queued)
    cph_srv_schedule_pass(f->s);
  return ok;
}

/* 16. Queues the memories of the shard's own channels (their items came with its keys: "#"
 * sorts before every session id), one operation per channel. False when the engine is busy
 * (the rest on the next try). */
static bool own_chans_import(cph_cflow *f, rebuild *rb) {
  cph_clog_replay *rp = rb->rp;
  if (!rb->items_sorted && rp->n_items > 1)
    qsort(rp->items, rp->n_items, sizeof *rp->items, item_by_session);
  rb->items_sorted = true;
  bool queued = false, ok = owner_items_submit(f, rb, rp, &rb->next_item, true, &queued);
  if (queued)
    cph_srv_schedule_pass(f->s);
  return ok;
}

/* How long a rebuild waits for channels_ask's answer before it asks again. */
#define CHAN_READ_WAIT_NS (60 * (int64_t)1000000000)

/* 16. Asks for the memories items of the channels of the shard's sessions (their
 * subscriptions and the channels they are members of; their direct channels have none), but
 * those whose items came with the shard itself ("#" owners of rp). None: done at once. False
 * when the log is not ready or memory ran out (asked again on the next try). */
static bool channels_ask(cph_cflow *f, rebuild *rb) {
  if (!rb->items_sorted && rb->rp->n_items > 1)
    qsort(rb->rp->items, rb->rp->n_items, sizeof *rb->rp->items, item_by_session);
  rb->items_sorted = true;
  cph_hmap seen = CPH_HMAP_INIT;
  char **owners = NULL;
  size_t n = 0, cap = 0;
  bool ok = true;
  for (const cph_ctable_session *x = cph_ctable_shard_first(f->table, rb->rp->shard); ok && x;
       x = x->shard_next) {
    size_t total = x->n_subs + x->n_members;
    for (size_t i = 0; ok && i < total; i++) {
      const char *chan = i < x->n_subs ? x->subs[i] : x->members[i - x->n_subs];
      char *owner = malloc(strlen(chan) + 2);
      if (!owner) {
        ok = false;
        break;
      }
      owner[0] = CHANNEL_OWNER_PREFIX;
      strcpy(owner + 1, chan);
      size_t at = items_of(rb->rp, owner); /* rp's items are sorted by owner by now */
      bool with_shard = at < rb->rp->n_items && strcmp(rb->rp->items[at].session, owner) == 0;
      if (with_shard || cph_hmap_get(&seen, owner)) {
        free(owner);
        continue;
      }
      char **g = n == cap ? realloc(owners, (cap = cap ? 2 * cap : 16) * sizeof *g) : owners;
      if (!g || cph_hmap_put(&seen, owner, owner) != CPH_OK) {
        free(owner);
        if (g)
          owners = g;
        ok = false;
        break;
      }
      owners = g;
      owners[n++] = owner;
    }
  }
  if (ok && n)
    rb->chan_token = ++f->chan_reads;
  int rc = ok && n ? cph_clog_read_items(f->log, (const char *const *)owners, n,
                                         (uint64_t)rb->rp->shard << 32 | rb->chan_token)
                   : CPH_OK;
  for (size_t i = 0; i < n; i++)
    free(owners[i]);
  free(owners);
  cph_hmap_free(&seen);
  if (!ok || rc != CPH_OK)
    return false;
  rb->chans_asked = true;
  rb->chans_done = n == 0;
  rb->chan_asked_ns = cph_mono_ns();
  return true;
}

/* 16. Queues the channels' memories of the read's answer (rb->chan_rp), one operation per
 * channel, before the states. False when the engine is busy (the rest on the next try). */
static bool chan_items_submit(cph_cflow *f, rebuild *rb) {
  bool queued = false;
  bool ok = owner_items_submit(f, rb, rb->chan_rp, &rb->chan_next, true, &queued);
  if (queued)
    cph_srv_schedule_pass(f->s);
  if (!ok)
    return false;
  cph_clog_replay_free(rb->chan_rp);
  rb->chan_rp = NULL;
  rb->chans_done = true;
  return true;
}

/* The answer of channels_ask's read: queued, then the rebuild goes on. A read that failed is
 * asked again, twice; then the rebuild goes on without it (logged: the sessions have the
 * newest memories their states carried; the next takeover reads the items again). */
static void on_items(void *ctx, uint64_t ref, cph_clog_replay *rp, const char *why) {
  cph_cflow *f = ctx;
  uint32_t shard = (uint32_t)(ref >> 32);
  rebuild *rb = shard < cph_cluster_shards(f->s->cluster) ? f->tracks[shard].rb : NULL;
  if (!rb || rb->chans_done || rb->chan_token != (uint32_t)ref || rb->chan_rp) {
    cph_clog_replay_free(rp);
    return; /* of a rebuild that ended, or an earlier read */
  }
  if (!rp) {
    if (++rb->chan_tries < 3) {
      cph_warn("cluster log: rebuilding shard %" PRIu32 ": reading its channels' memories: %s; "
               "read again",
               shard, why ? why : "failed");
      rb->chans_asked = false;
    } else {
      cph_error("cluster log: rebuilding shard %" PRIu32 ": its channels' memories are not "
                "loaded (%s): its sessions have the newest their states carried",
                shard, why ? why : "failed");
      rb->chans_done = true;
    }
    rebuild_step(f, rb);
    return;
  }
  if (rp->n_items > 1)
    qsort(rp->items, rp->n_items, sizeof *rp->items, item_by_session);
  rb->chan_rp = rp;
  rb->chan_next = 0;
  rebuild_step(f, rb);
}

/* Takes the rebuild as far as it goes now: adopt, the states, the next batch, or the end. */
static void rebuild_step(cph_cflow *f, rebuild *rb) {
  uint32_t shard = rb->rp->shard;
  shard_track *tr = &f->tracks[shard];
  rb->waiting = false;
  if (!served(f, shard)) { /* lost meanwhile: the log drops the shard's replay too */
    tr->rb = NULL;
    rebuild_free(rb);
    return;
  }
  if (!rb->adopted) {
    if (!adopt_shard(f, shard)) {
      rb->waiting = true; /* the engine is busy: again on the next retry tick */
      arm_retry(f);
      return;
    }
    rb->adopted = true;
  }
  if (!rb->chans_done) {
    if (!rb->chans_asked && !channels_ask(f, rb)) {
      rb->waiting = true; /* not ready, or out of memory: again on the next retry tick */
      arm_retry(f);
      return;
    }
    if (rb->chan_rp && !chan_items_submit(f, rb)) {
      rb->waiting = true; /* the engine is busy */
      arm_retry(f);
      return;
    }
    if (!rb->chans_done && cph_mono_ns() - rb->chan_asked_ns > CHAN_READ_WAIT_NS) {
      cph_warn("cluster log: rebuilding shard %" PRIu32 ": no answer to reading its channels' "
               "memories in %d s; read again",
               shard, (int)(CHAN_READ_WAIT_NS / 1000000000));
      rb->chans_asked = false; /* the late answer, should it come, is of another token */
      rb->waiting = true;
      arm_retry(f);
      return;
    }
    if (!rb->chans_done) {
      rb->waiting = true; /* the read's answer calls rebuild_step (on_items) */
      return;
    }
  }
  if (!rb->own_chans_queued) {
    if (!own_chans_import(f, rb)) {
      rb->waiting = true; /* the engine is busy: again on the next retry tick */
      arm_retry(f);
      return;
    }
    rb->own_chans_queued = true;
  }
  if (rb->chan_ops) {
    rb->waiting = true; /* the last import's done calls rebuild_step (state_done) */
    return;
  }
  if (!rb->states_queued) {
    if (!states_import(f, rb)) {
      rb->waiting = true; /* the engine is busy: again on the next retry tick */
      arm_retry(f);
      return;
    }
    rb->states_queued = true;
  }
  if (rb->next < rb->n) {
    /* A turn parked elsewhere goes whole, in one operation that parks it again (no lease can
     * take its entries in between); the other events in batches after them. */
    rb_park *g = rb->next_park < rb->n_parks ? rb->parks[rb->next_park] : NULL;
    size_t k = g                                ? g->n
               : rb->n - rb->next < REBUILD_BATCH ? rb->n - rb->next
                                                  : REBUILD_BATCH;
    memset(&rb->op, 0, sizeof rb->op);
    rb->op.kind = CPH_OP_INGEST;
    rb->op.done = rebuild_done;
    rb->op.ctx = rb;
    rb->op.u.ingest.events = rb->ins + rb->next;
    rb->op.u.ingest.n_events = k;
    if (g) {
      rb->op.u.ingest.park_session = g->session;
      rb->op.u.ingest.park_keys = g->keys;
      rb->op.u.ingest.n_park_keys = g->n;
      rb->op.u.ingest.park_attempts = g->attempts;
      rb->op.u.ingest.park_error = g->error;
    }
    if (cph_engine_submit(f->s->engine, &rb->op) != CPH_OK) {
      rb->waiting = true;
      arm_retry(f);
      return;
    }
    rb->op_park = g;
    if (g)
      rb->next_park++;
    rb->op_n = k;
    rb->next += k;
    rb->in_engine = true;
    cph_srv_schedule_pass(f->s);
    return;
  }
  if (!rebuild_retain(f, rb) || rb->retaining) {
    if (rb->retaining) {
      rb->in_engine = true; /* rebuild_retained steps on once they are all answered */
    } else {
      rb->waiting = true; /* the engine's queue is full: on the next retry tick */
      arm_retry(f);
    }
    return;
  }
  rebuild_check_dups(f, rb);
  tr->live = true;
  tr->last_seen = rb->rp->to;
  tr->mark_put = 0; /* put this node's watermark at the next tick */
  tr->trimmed = 0;  /* and trim below it once the log holds it (12.) */
  tr->rb = NULL;
  double took = (double)(cph_mono_ns() - rb->t0_ns) / 1e9 + (double)rb->rp->read_ns / 1e9;
  f->rebuilds++;
  f->rebuild_events += rb->reached;
  f->last_rebuild_s = took;
  f->last_read_s = (double)rb->rp->read_ns / 1e9;
  f->last_rebuild_events = rb->reached;
  f->last_rebuild_messages = rb->rp->n_entries;
  f->last_rebuild_shard = shard;
  cph_info("cluster log: shard %" PRIu32 " rebuilt in %.3f s (reading %.3f s): positions %" PRIu64
           "..%" PRIu64 ", %zu messages, %zu done marks and %zu session states read, %" PRIu64
           " events delivered again, %zu turns parked elsewhere among them, %zu pending",
           shard, took, f->last_read_s, rb->rp->from, rb->rp->to, rb->rp->n_events,
           rb->rp->n_entries - rb->rp->n_events, rb->rp->n_states, rb->reached, rb->n_parks,
           tr->pending.n);
  cph_clog_rebuilt(f->log, shard, rb->rp->gen);
  rebuild_free(rb);
}

/* ================================================================ min_pos (9.) */

/* A fence check's outcome (10.): the refused mark p is sent again expecting seq (this node
 * wrote last), or the shard is fenced here (another node did) and p fails. */
static void fence_checked(cph_cflow *f, shard_track *tr, int rc, uint64_t seq) {
  pub *p = tr->checking;
  tr->checking = NULL;
  if (rc == CPH_OK && p->kind == PUB_STATE) {
    cph_info("cluster log: the state of session %s was written by an earlier owner of shard "
             "%" PRIu32 " after this node took it; writing over it",
             p->dr->session, p->shard);
    if (!state_rev_set(f, p->dr->session, seq)) {
      pub_outcome(f, p, false, 0, false, "out of memory");
      return;
    }
    pub_send(f, p);
    return;
  }
  if (rc == CPH_OK) {
    cph_info("cluster log: a done mark of shard %" PRIu32 " was stored unacknowledged; "
             "continuing after it",
             p->shard);
    if (seq > tr->done_last)
      tr->done_last = seq;
    pub_send(f, p);
    return;
  }
  if (rc == CPH_ECONFLICT && !tr->fenced) {
    cph_error("cluster log: the log refused a write to %s: another node took shard %" PRIu32
              " over; this node writes nothing more of it until it takes it again",
              p->subject, p->shard);
    tr->fenced = true;
  }
  pub_outcome(f, p, false, 0, false,
              rc == CPH_ECONFLICT ? FENCED_WHY
              : p->kind == PUB_STATE
                  ? "the log refused the session's state and its key could not be read"
                  : "the log refused the mark and its last one could not be read");
}

static void on_pos(void *ctx, uint64_t ref, int rc, uint64_t seq, const char *why) {
  cph_cflow *f = ctx;
  for (uint32_t s = 0; s < f->shards; s++)
    if (f->tracks[s].checking && f->tracks[s].check_ref == ref) {
      fence_checked(f, &f->tracks[s], rc, seq);
      return;
    }
  pos_req **pp = &f->waits;
  while (*pp && (*pp)->ref != ref)
    pp = &(*pp)->next;
  pos_req *w = *pp;
  if (!w)
    return;
  *pp = w->next;
  cph_req *r = w->r;
  if (rc == CPH_OK) {
    w->resume(r);
  } else {
    f->pos_timeouts++;
    cph_reply_error(r, 504, "timeout", "min_pos", "%s; retry, or read without min_pos",
                    why ? why : "the log position was not applied here in time");
    cph_req_end(r);
  }
  free(w);
}

void cph_cflow_wait_pos(cph_cflow *f, cph_req *r, uint64_t pos, int64_t shard,
                        void (*resume)(cph_req *r)) {
  pos_req *w = f->quiesced ? NULL : calloc(1, sizeof *w);
  /* A lease (shard -1) can only come from a shard that holds sessions: the others' consumers
   * need no checking (a poll round asks the log about each shard it checks). */
  uint8_t *only = w && shard < 0 ? calloc((f->shards + 7) / 8, 1) : NULL;
  for (uint32_t s = 0; only && s < f->shards; s++)
    if (cph_ctable_shard_first(f->table, s))
      only[s >> 3] |= (uint8_t)(1u << (s & 7));
  int rc = w ? cph_clog_wait_pos(f->log, pos, shard, only, CPH_MIN_POS_WAIT_MS, ++f->next_ref)
             : CPH_EBUSY;
  free(only);
  if (rc != CPH_OK) {
    free(w);
    cph_reply_error(r, 503, "unavailable", "min_pos",
                    "the cluster log is not reachable from this node: min_pos cannot be checked");
    return;
  }
  w->r = r;
  w->ref = f->next_ref;
  w->pos = pos;
  w->resume = resume;
  w->next = f->waits;
  f->waits = w;
  f->pos_waits++;
  r->async = true;
}

static void on_replayed(void *ctx, cph_clog_replay *rp) {
  cph_cflow *f = ctx;
  uint32_t shard = rp->shard;
  if (f->quiesced || shard >= f->shards || !served(f, shard)) {
    cph_clog_replay_free(rp); /* the log drops the shard's replay when it is not served */
    return;
  }
  shard_track *tr = &f->tracks[shard];
  if (tr->rb) { /* an older rebuild of the shard (it was lost and taken again) */
    if (tr->rb->in_engine)
      tr->rb->stale = true; /* freed when its operation is done */
    else
      rebuild_free(tr->rb);
    tr->rb = NULL;
  }
  drop_shard(f, shard);
  tr->mark_rev = rp->mark_rev; /* the fences this node just took (10.) */
  tr->done_last = rp->done_last;
  tr->epoch = rp->done_last; /* its epoch's sequence: what its state puts carry (11.) */
  for (size_t i = 0; i < rp->n_states; i++) /* what its state puts expect (11.) */
    if (!state_rev_set(f, rp->states[i].session, rp->states[i].rev))
      cph_warn("cluster log: out of memory noting the state revision of session %s (its next "
               "put is refused once, then checked)",
               rp->states[i].session);
  tr->fenced = tr->mark_fenced = false;
  rebuild *rb = calloc(1, sizeof *rb);
  cph_hmap done = CPH_HMAP_INIT, parked = CPH_HMAP_INIT, unparked = CPH_HMAP_INIT;
  json_t *docs = json_array();
  bool ok = rb && docs;
  if (ok) {
    rb->f = f;
    rb->rp = rp;
    rb->t0_ns = cph_mono_ns();
    ok = rebuild_marks(rb, &done, &parked, &unparked, docs) &&
         rebuild_events(f, rb, &done, &parked, &unparked);
  }
  cph_hmap_free(&done);
  cph_hmap_free(&parked);
  cph_hmap_free(&unparked);
  json_decref(docs);
  if (!ok) {
    cph_error("cluster log: out of memory rebuilding shard %" PRIu32 "; read again", shard);
    uint64_t gen = rp->gen;
    if (rb)
      rebuild_free(rb); /* frees rp */
    else
      cph_clog_replay_free(rp);
    cph_clog_rebuild_failed(f->log, shard, gen);
    return;
  }
  tr->rb = rb;
  rebuild_step(f, rb);
}

static void on_message(void *ctx, cph_clog_msg *m) {
  cph_cflow *f = ctx;
  shard_track *tr = &f->tracks[m->shard];
  if (!served(f, m->shard)) {
    if (tr->live)
      drop_shard(f, m->shard);
    cph_clog_release(f->log, m); /* no longer ours: the next owner gets it */
    return;
  }
  if (!tr->live) { /* of a binding from before the shard was lost: it comes again */
    cph_clog_release(f->log, m);
    return;
  }
  held_add(tr, m->seq);
  applying *ap = calloc(1, sizeof *ap);
  if (!ap) {
    cph_clog_release(f->log, m);
    return;
  }
  ap->m = m;
  predecoded *pd = m->decoded;
  bool decoded;
  if (pd) { /* decoded and prepared off the loop: taken over */
    m->decoded = NULL;
    decoded = pd->ok;
    ap->arena = pd->arena;
    ap->doc = pd->doc;
    ap->evs = pd->evs;
    ap->n_evs = pd->n;
    ap->batch_id = pd->batch_id;
    free(pd);
  } else {
    decoded = decode_payload(m->data, m->len, &ap->arena, &ap->doc, &ap->evs, &ap->n_evs,
                             &ap->batch_id);
  }
  if (!decoded) {
    cph_error("cluster log: message %" PRIu64 " of shard %" PRIu32
              " is not an event; acknowledged and skipped",
              m->seq, m->shard);
    applying_finish(f, ap);
    return;
  }
  if (!f->forming && !(f->forming = calloc(1, sizeof *f->forming))) {
    ap->failed = true;
    applying_finish(f, ap);
    return;
  }
  apply_batch *b = f->forming;
  b->f = f;
  if (b->n + ap->n_evs > b->cap) {
    size_t cap = b->cap ? b->cap : APPLY_BATCH;
    while (cap < b->n + ap->n_evs)
      cap *= 2;
    applying **items = realloc(b->items, cap * sizeof *items);
    if (items)
      b->items = items;
    cph_event_in *events = items ? realloc(b->events, cap * sizeof *events) : NULL;
    if (events)
      b->events = events;
    if (!items || !events) {
      ap->failed = true;
      applying_finish(f, ap);
      return;
    }
    b->cap = cap;
  }
  for (size_t i = 0; i < ap->n_evs; i++) {
    b->items[b->n] = ap;
    b->events[b->n] = ap->evs[i];
    /* 16.: the raw memory an `in` event mints goes to the log: under its channel's key, or
     * (an event to a session alone, its direct channel) its session's shard's */
    b->events[b->n].memory_item = !m->fwd && !ap->evs[i].history_only;
    b->n++;
  }
  if (b->n >= APPLY_BATCH)
    submit_forming(f);
  else if (!evtimer_pending(f->ev_submit, NULL)) {
    struct timeval zero = {0, 0};
    evtimer_add(f->ev_submit, &zero);
  }
}

static void on_retry(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  cph_cflow *f = arg;
  if (f->quiesced)
    return;
  pump_batches(f);
  bool rebuilds_waiting = false;
  for (uint32_t sh = 0; sh < f->shards; sh++) {
    rebuild *rb = f->tracks[sh].rb;
    if (rb && rb->waiting)
      rebuild_step(f, rb);
    rebuilds_waiting |= f->tracks[sh].rb && f->tracks[sh].rb->waiting;
  }
  int64_t now = cph_mono_ns();
  pub *due = NULL, **pp = &f->retry_head;
  while (*pp) {
    pub *p = *pp;
    if (p->retry_at_ns <= now) {
      *pp = p->next_retry;
      p->next_retry = due;
      due = p;
    } else {
      pp = &p->next_retry;
    }
  }
  while (due) {
    pub *p = due;
    due = p->next_retry;
    pub_send(f, p);
  }
  if (f->retry_head || (f->blocked_head && !f->in_engine) || rebuilds_waiting)
    arm_retry(f);
}

/* ================================================================ sessions (4.) */

/* The definition a new owner creates the session from (adopt below): what POST /v1/sessions
 * takes, nothing of its state. */
static json_t *session_def(const cph_session_info *in) {
  return json_pack(
      "{sssosososIsIsIsosososo}", "class", cph_lane_name(in->lane), "subscribe",
      strv_json(&in->subscribe), "member", strv_json(&in->member), "tools", strv_json(&in->tools),
      "autonomy_interval_s", (json_int_t)in->autonomy_interval_s, "report_interval_s",
      (json_int_t)in->report_interval_s, "context_window_tokens",
      (json_int_t)in->context_window_tokens, "system",
      in->system ? json_string(in->system) : json_null(), "tenant",
      in->tenant ? json_string(in->tenant) : json_null(), "while_running",
      in->while_running_class ? json_null()
                              : json_string(cph_policy_while_running_name(in->while_running)),
      "paused", json_boolean(in->state == CPH_STATE_PAUSED));
}

/* Session was deleted here: its item puts still alive (in flight, waiting for a retry or their
 * packing, or resending) are never sent again (item_skip). O(those puts), on a delete only. */
static void items_forget(cph_cflow *f, uint32_t shard, const char *session) {
  char prefix[700];
  if (cph_clog_state_subject(prefix, sizeof prefix - 1, shard, session) != CPH_OK)
    return;
  strcat(prefix, "."); /* an item's subject: the state's, then ".<name>" */
  size_t n = strlen(prefix);
  for (size_t i = 0; i < f->pubs.cap; i++) {
    pub *p = f->pubs.slots[i].key ? f->pubs.slots[i].value : NULL;
    if (p && p->kind == PUB_ITEM && strncmp(p->subject, prefix, n) == 0)
      p->forgotten = true;
  }
  for (pub *p = f->retry_head; p; p = p->next_retry)
    if (p->kind == PUB_ITEM && strncmp(p->subject, prefix, n) == 0)
      p->forgotten = true;
  for (pub *p = f->packing_head; p; p = p->next_packing)
    if (strncmp(p->subject, prefix, n) == 0)
      p->forgotten = true;
  for (size_t i = 0; i < f->resend.n; i++) {
    pub *p = resend_of(f->resend.v[i]);
    if (p->kind == PUB_ITEM && strncmp(p->subject, prefix, n) == 0)
      p->forgotten = true;
  }
}

/* Publishes session's record (now) or its deletion (now NULL) and, for a deletion, deletes its
 * state and items; rr (or NULL) waits for the record. False when nothing was published. */
static bool session_publish(cph_cflow *f, const char *session, const cph_session_info *now,
                            record_req *rr) {
  char subject[700];
  if (f->quiesced || cph_clog_session_subject(subject, sizeof subject, session) != CPH_OK)
    return false;
  char *data;
  if (now) {
    json_t *def = session_def(now);
    json_t *doc =
        def ? json_pack("{sOso}", "subscribe", json_object_get(def, "subscribe"), "def", def)
            : NULL;
    data = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    if (data)
      cph_ctable_put(f->table, session, (const char *const *)now->subscribe.items,
                     now->subscribe.count, def);
    json_decref(doc);
  } else {
    data = strdup("");
    cph_ctable_remove(f->table, session);
  }
  /* a request waiting for it gives up with the completions' deadline; the sweep's keep trying */
  pub *p = data ? pub_new(f, PUB_SESSION, subject, NULL, data, strlen(data),
                          rr ? DONE_DEADLINE_MS : SESSION_DEADLINE_MS)
                : NULL;
  if (!p) {
    cph_error("cluster log: out of memory publishing the record of session \"%s\"", session);
    return false;
  }
  p->kv_delete = now == NULL;
  p->rr = rr;
  pub_send(f, p);
  if (now)
    return true;
  /* 11.: its state goes too, so a session created again under the id starts afresh. Not fenced
   * (a delete is the user's, as the record's is); a put of this node's that expects the old
   * revision is refused, checked and written over (a delete marker counts as no value). */
  char ssubject[700];
  uint32_t shard = cph_cluster_shard_of(session, cph_cluster_shards(f->s->cluster));
  char *none = strdup("");
  pub *d = none && cph_clog_state_subject(ssubject, sizeof ssubject, shard, session) == CPH_OK
               ? pub_new(f, PUB_SESSION, ssubject, NULL, none, 0, SESSION_DEADLINE_MS)
               : (free(none), NULL);
  if (!d) {
    cph_error("cluster log: out of memory deleting the state of session \"%s\"", session);
    return true;
  }
  d->kv_delete = true;
  state_rev_set(f, session, 0);
  pub_send(f, d);
  /* 13.: and its items' keys, at once and again once the puts still in flight have ended;
   * its items not taken yet are never sent again (a resend could land after the second round) */
  items_forget(f, shard, session);
  if (cph_clog_forget_items(f->log, shard, session) != CPH_OK)
    cph_error("cluster log: the items of deleted session \"%s\" are not deleted from the log "
              "(out of memory, or an id too long for a key)", session);
  return true;
}

void cph_cflow_session_changed(cph_cflow *f, const char *session, const cph_session_info *now) {
  session_publish(f, session, now, NULL);
}

void cph_cflow_session_written(cph_cflow *f, cph_req *r, const char *session,
                               const cph_session_info *now, json_t *answer) {
  record_req *rr = calloc(1, sizeof *rr);
  if (rr && !(rr->session = strdup(session))) {
    free(rr);
    rr = NULL;
  }
  if (!rr) {
    json_decref(answer);
    cph_reply_error(r, 500, "internal", NULL,
                    "session '%s' was written on this node, but out of memory logging its record",
                    session);
    return;
  }
  rr->r = r;
  rr->answer = answer;
  rr->deleted = now == NULL;
  if (!session_publish(f, session, now, rr)) {
    rr->r = NULL;
    record_free(rr);
    cph_reply_error(r, 503, "unavailable", NULL,
                    "session '%s' was %s on this node, but %s, so the cluster log cannot take "
                    "its record now: the node that serves the session next may not know it",
                    session, now ? "written" : "deleted",
                    f->quiesced ? "cephalond is stopping" : "its record cannot be logged");
    return;
  }
  r->held = true;
  rr->next = f->records;
  if (f->records)
    f->records->prev = rr;
  f->records = rr;
}

/* ---------------------------------------------------------------- the record sweep
 *
 * Every second the node looks at the next SWEEP_PAGE of its engine's sessions (in id order,
 * wrapping around) and publishes the record of each one on a shard it serves that the table
 * does not know, or knows without a definition: sessions created before the log was
 * configured (a cluster that ran without :nats), and records the log never took (their
 * publish gave up after 30 s). Once the table is whole it publishes nothing; reading a page
 * is one engine list call on the loop. The built-in janitor is skipped: each node has its own. */
static void on_sweep(evutil_socket_t fd, short what, void *arg) {
  (void)fd;
  (void)what;
  cph_cflow *f = arg;
  if (f->quiesced || !f->log)
    return;
  struct timeval tv = {SWEEP_MS / 1000, (SWEEP_MS % 1000) * 1000};
  evtimer_add(f->ev_sweep, &tv);
  if (!cph_clog_ready(f->log)) {
    f->ready_since_ns = 0;
    return;
  }
  if (!f->ready_since_ns)
    f->ready_since_ns = cph_mono_ns();
  if (cph_mono_ns() - f->ready_since_ns < SWEEP_DELAY_MS * 1000000LL)
    return;
  cph_session_filter flt = {0};
  flt.after = f->sweep_after[0] ? f->sweep_after : NULL;
  flt.limit = SWEEP_PAGE;
  cph_session_info *page = NULL;
  size_t n = 0;
  cph_err err = {0};
  if (cph_engine_list_sessions(f->s->engine, &flt, &page, &n, &err) != CPH_OK)
    return;
  cph_cluster *c = f->s->cluster;
  char node[8], url[8];
  bool janitor = cph_engine_policy(f->s->engine)->sessions.janitor;
  for (size_t i = 0; i < n; i++) {
    if (janitor && strcmp(page[i].id, "janitor") == 0)
      continue; /* every node has its own (:sessions :janitor?): not a session of the cluster */
    const cph_ctable_session *known = cph_ctable_get(f->table, page[i].id);
    uint32_t shard = cph_cluster_shard_of(page[i].id, cph_cluster_shards(c));
    if ((!known || !known->def) &&
        cph_cluster_route(c, shard, node, sizeof node, url, sizeof url) == CPH_CLUSTER_SERVED) {
      cph_info("cluster log: publishing the record of session %s (the session table lacked it)",
               page[i].id);
      cph_cflow_session_changed(f, page[i].id, &page[i]);
    }
  }
  if (n == SWEEP_PAGE)
    snprintf(f->sweep_after, sizeof f->sweep_after, "%s", page[n - 1].id);
  else
    f->sweep_after[0] = '\0'; /* the end: from the start again */
  for (size_t i = 0; i < n; i++)
    cph_session_info_free(&page[i]);
  free(page);
}

/* ================================================================ lifetime */

/* A test's fault injection (cph_cflow.test_*): "N[,M]" in the environment variable `name`. */
static void test_fail_env(const char *name, int *drop, int *unacked) {
  const char *v = getenv(name);
  if (!v || !*v)
    return;
  char *end;
  long n = strtol(v, &end, 10), m = *end == ',' ? strtol(end + 1, NULL, 10) : 0;
  *drop = n > 0 && n < 1000 ? (int)n : 0;
  *unacked = m > 0 && m < 1000 ? (int)m : 0;
  cph_warn("cluster log: %s: the first %d attempts of each fail unsent, the next %d are stored "
           "and answered as lost (for tests)",
           name, *drop, *unacked);
}

int cph_cflow_start(cph_srv *s, cph_cflow **out, cph_err *err) {
  *out = NULL;
  const cph_policy *pol = cph_engine_policy(s->engine);
  cph_cflow *f = calloc(1, sizeof *f);
  if (!f) {
    cph_err_set(err, CPH_ENOMEM, "out of memory");
    return CPH_ENOMEM;
  }
  f->s = s;
  snprintf(f->node, sizeof f->node, "%s", pol->cluster.node);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  f->boot = (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
  f->shards = (uint32_t)pol->cluster.shards;
  f->tracks = calloc(f->shards, sizeof *f->tracks);
  f->last_rebuild_shard = -1;
  f->table = cph_ctable_new((uint32_t)pol->cluster.shards);
  f->ev_retry = evtimer_new(s->base, on_retry, f);
  f->ev_submit = evtimer_new(s->base, on_submit, f);
  f->ev_sweep = evtimer_new(s->base, on_sweep, f);
  f->ev_mark = evtimer_new(s->base, on_mark, f);
  f->ev_resend = evtimer_new(s->base, on_resend, f);
  if (!f->tracks || !f->table || !f->ev_retry || !f->ev_submit || !f->ev_sweep || !f->ev_mark ||
      !f->ev_resend) {
    cph_cflow_free(f);
    cph_err_set(err, CPH_ENOMEM, "out of memory");
    return CPH_ENOMEM;
  }
  /* Events are prepared under the dedupe settings of the start; the engine takes a prep only
   * under the settings in force (cph_event_prep), so a reload changes no verdict. */
  f->prep_shingle_words = (int32_t)pol->dedupe.shingle_words;
  f->prep_min_length = pol->dedupe.min_length;
  f->trim_ns = pol->cluster.log_trim_seconds * 1000000000LL;
  test_fail_env("CPH_TEST_FAIL_HIST_COPIES", &f->test_hist_drop, &f->test_hist_unacked);
  test_fail_env("CPH_TEST_FAIL_ITEMS", &f->test_item_drop, &f->test_item_unacked);
  f->resend_cap = RESEND_CAP_BYTES;
  const char *cap = getenv("CPH_TEST_RESEND_CAP_BYTES");
  if (cap && *cap) {
    f->resend_cap = (size_t)strtoull(cap, NULL, 10);
    cph_warn("cluster log: CPH_TEST_RESEND_CAP_BYTES: at most %zu bytes of copies and items "
             "wait to be sent again (for tests)",
             f->resend_cap);
  }
  int park_unacked = 0; /* not offered for park marks */
  test_fail_env("CPH_TEST_FAIL_PARK_MARKS", &f->test_park_drop, &park_unacked);
  test_fail_env("CPH_TEST_FAIL_UNPARK_MARKS", &f->test_unpark_drop, &park_unacked);
  test_fail_env("CPH_TEST_FAIL_STATES", &f->test_state_drop, &park_unacked);
  cph_clog_hooks hooks = {f,           on_published, on_message,       predecode,
                          predecoded_free, on_session_entry, on_replayed, on_pos, on_items};
  int64_t window = pol->cluster.log_dedupe_seconds ? pol->cluster.log_dedupe_seconds
                                                   : pol->dedupe.key_window_seconds;
  /* Each reply written from now on carries its origin, and the stream replies of a state this
   * node imports join its replies stream (11.). */
  int rc = cph_engine_reply_origins(s->engine, f->node);
  if (rc != CPH_OK) {
    cph_err_set(err, rc, ":cluster :node \"%s\" is too long for a reply's origin (128 bytes "
                "at most)", f->node);
    cph_cflow_free(f);
    return rc;
  }
  rc = cph_clog_start(&pol->cluster, window, s->cluster, s->base, &hooks, &f->log, err);
  if (rc != CPH_OK) {
    cph_cflow_free(f);
    return rc;
  }
  f->started = true;
  if (cph_statezip_packer_start(s->base, CPH_STATEZIP_LEVEL, on_state_packed, f, &f->packer) !=
      CPH_OK)
    cph_warn("cluster log: no thread to pack the sessions' states: they are packed on the loop");
  cph_engine_report_consumed(s->engine, true); /* the done marks (6.) */
  struct timeval first = {SWEEP_MS / 1000, (SWEEP_MS % 1000) * 1000};
  evtimer_add(f->ev_sweep, &first);
  struct timeval mark = {MARK_MS / 1000, (MARK_MS % 1000) * 1000};
  evtimer_add(f->ev_mark, &mark);
  *out = f;
  return CPH_OK;
}

void cph_cflow_stop_begin(cph_cflow *f) {
  if (!f || f->quiesced || f->stopping)
    return;
  f->stopping = true;
  /* Every wait ends now: equal times keep the heap a heap. */
  int64_t now = cph_mono_ns();
  for (size_t i = 0; i < f->resend.n; i++)
    f->resend.v[i]->seq = (uint64_t)now;
  for (park_resend *pr = f->park_resends; pr; pr = pr->next)
    pr->due_ns = now;
  if (f->loose || f->parks_loose || f->park_pending)
    cph_info("cluster log: stopping: %zu copies of replies and items and %zu park marks the log "
             "has not taken yet are sent again now; the stop waits for them (every %d ms, until "
             "its deadline)",
             f->loose, f->parks_loose + f->park_pending, STOP_RESEND_MS);
  resend_arm(f);
  park_resends_due(f);
  unsettled_update(f);
}

void cph_cflow_quiesce(cph_cflow *f) {
  if (!f || f->quiesced)
    return;
  f->quiesced = true;
  while (f->reqs) {
    ingest_req *ir = f->reqs;
    f->reqs = ir->next;
    cph_reply_error(ir->r, 503, "unavailable", NULL,
                    "cephalond is stopping before the cluster log acknowledged these events: "
                    "retry them (with the same keys, a stored one answers duplicate)");
    cph_req_end(ir->r);
    ir->r = NULL;
    /* ir stays reachable from its pubs, freed with them */
  }
  while (f->dones) {
    done_req *dr = f->dones;
    f->dones = dr->next;
    if (dr->kind != MARK_DONE)
      cph_reply_error(dr->r, 503, "unavailable", NULL,
                      "the turn was %s on this node, but cephalond is stopping before the "
                      "cluster log took its %s: the node that serves its session next %s",
                      dr->kind == MARK_PARK ? "parked" : "requeued",
                      dr->kind == MARK_PARK ? "park mark" : "unpark mark", park_lost(dr));
    else if (dr->made_buf[0])
      cph_reply_error(dr->r, 503, "unavailable", NULL,
                      "%s on this node, but cephalond is stopping before the cluster log took "
                      "its session's state: the node that serves the session next may lack %s",
                      dr->made_buf, dr->lacks_buf);
    else
      cph_reply_error(dr->r, 503, "unavailable", NULL,
                      "the turn was completed on this node, but cephalond is stopping before "
                      "the cluster log took the record of what it consumed: the node that "
                      "serves its session next may deliver its input to a turn again");
    cph_req_end(dr->r);
    dr->r = NULL; /* dr stays reachable from its pubs, freed with them */
  }
  while (f->records) {
    record_req *rr = f->records;
    f->records = rr->next;
    cph_reply_error(rr->r, 503, "unavailable", NULL,
                    "session '%s' was %s on this node, but cephalond is stopping before the "
                    "cluster log took its record: the node that serves the session next may "
                    "not know it",
                    rr->session, rr->deleted ? "deleted" : "written");
    cph_req_end(rr->r);
    rr->r = NULL; /* rr stays reachable from its pub, freed with it */
  }
  while (f->waits) {
    pos_req *w = f->waits;
    f->waits = w->next;
    cph_reply_error(w->r, 503, "unavailable", NULL,
                    "cephalond is stopping before min_pos was applied here");
    cph_req_end(w->r);
    free(w);
  }
  /* 13., 14.: what waits to be sent again is given up (freed with f) */
  if (f->hist_pending || f->item_pending)
    cph_error("cluster log: cephalond is stopping before the log took %zu copies of replies "
              "and %zu items: they are DROPPED (the sessions on the other nodes do not see "
              "those replies in their channels; the records move with their sessions only "
              "while their states carry them)",
              f->hist_pending, f->item_pending);
  f->hist_dropped += f->hist_pending;
  f->item_dropped += f->item_pending;
  /* 6.: and the park marks waiting to be sent again */
  if (f->park_pending)
    cph_error("cluster log: cephalond is stopping before the log took the park marks of %zu "
              "turns: a node that takes their sessions over delivers their input again (this "
              "node, back on its data, holds them parked)",
              f->park_pending);
  while (f->park_resends) {
    park_resend *pr = f->park_resends;
    f->park_resends = pr->next;
    f->park_resends_dropped++;
    cph_park_note_free(&pr->note);
    free(pr);
  }
  f->park_pending = 0;
  cph_clog_stop(f->log);
  f->log = NULL;
}

void cph_cflow_free(cph_cflow *f) {
  if (!f)
    return;
  cph_cflow_quiesce(f);
  cph_statezip_packer_stop(f->packer); /* the states it held are in their shards' queues */
  f->packer = NULL;
  for (pub *p = f->packing_head, *next; p; p = next) { /* the items it held */
    next = p->next_packing;
    pub_free(p);
  }
  f->packing_head = f->packing_tail = NULL;
  /* Pubs still waiting (in the map or the retry list), and the requests they belong to. */
  ingest_req **irs = NULL;
  size_t n_irs = 0;
  pub *all = f->retry_head;
  for (uint32_t sh = 0; f->tracks && sh < f->shards; sh++) { /* marks not sent, or checked */
    if (f->tracks[sh].checking) {
      f->tracks[sh].checking->next_retry = all;
      all = f->tracks[sh].checking;
      f->tracks[sh].checking = NULL;
    }
    for (pub *p = f->tracks[sh].done_head, *next; p; p = next) {
      next = p->next_done;
      p->next_retry = all;
      all = p;
    }
  }
  for (size_t i = 0; i < f->pubs.cap; i++)
    if (f->pubs.slots[i].key) {
      pub *p = f->pubs.slots[i].value;
      p->next_retry = all;
      all = p;
    }
  while (all) {
    pub *p = all;
    all = p->next_retry;
    if (p->kind == PUB_INGEST && p->ir && --p->ir->outstanding == 0) {
      ingest_req **g = realloc(irs, (n_irs + 1) * sizeof *g);
      if (g) {
        irs = g;
        irs[n_irs++] = p->ir;
      }
    }
    if (p->kind == PUB_FWD && --p->ap->outstanding == 0)
      applying_finish(f, p->ap);
    if ((p->kind == PUB_DONE || p->kind == PUB_STATE) && --p->dr->outstanding == 0)
      done_req_free(p->dr);
    if (p->kind == PUB_SESSION && p->rr)
      record_free(p->rr);
    pub_free(p);
  }
  for (size_t i = 0; i < n_irs; i++) {
    free(irs[i]->res);
    free(irs[i]);
  }
  free(irs);
  cph_hmap_free(&f->pubs);
  while (f->park_resends) { /* when not quiesced first */
    park_resend *pr = f->park_resends;
    f->park_resends = pr->next;
    cph_park_note_free(&pr->note);
    free(pr);
  }
  for (size_t i = 0; i < f->resend.n; i++) /* waiting for their next attempt (not in pubs) */
    pub_free(resend_of(f->resend.v[i]));
  free(f->resend.v);
  for (size_t i = 0; i < f->item_keys.cap; i++)
    if (f->item_keys.slots[i].key)
      free(f->item_keys.slots[i].value);
  cph_hmap_free(&f->item_keys);
  apply_batch *b = f->blocked_head;
  if (f->forming) {
    f->forming->next = b;
    b = f->forming;
  }
  while (b) {
    apply_batch *next = b->next;
    for (size_t i = 0; i < b->n; i++) {
      b->items[i]->failed = true;
      if (i + 1 == b->n || b->items[i + 1] != b->items[i])
        applying_finish(f, b->items[i]);
    }
    batch_free(b);
    b = next;
  }
  for (uint32_t sh = 0; f->tracks && sh < f->shards; sh++) {
    shard_track *tr = &f->tracks[sh];
    if (tr->rb && !tr->rb->in_engine) /* the engine's last pass answered the others */
      rebuild_free(tr->rb);
    drop_shard(f, sh);
    free(tr->pending.v);
    free(tr->held.v);
  }
  free(f->tracks);
  cph_hmap_free(&f->pending);
  for (size_t i = 0; i < f->state_revs.cap; i++)
    if (f->state_revs.slots[i].key)
      free(f->state_revs.slots[i].value);
  cph_hmap_free(&f->state_revs);
  cph_ctable_free(f->table);
  if (f->ev_mark)
    event_free(f->ev_mark);
  if (f->ev_resend)
    event_free(f->ev_resend);
  if (f->ev_retry)
    event_free(f->ev_retry);
  if (f->ev_submit)
    event_free(f->ev_submit);
  if (f->ev_sweep)
    event_free(f->ev_sweep);
  bool started = f->started;
  free(f);
  if (started) /* every message is released by now */
    cph_clog_close_library();
}

int cph_cflow_metrics(cph_cflow *f, cph_buf *out) {
  cph_clog_stats st = {0};
  if (f->log)
    cph_clog_get_stats(f->log, &st);
  size_t waiting = 0;
  for (ingest_req *ir = f->reqs; ir; ir = ir->next)
    waiting++;
  static const struct {
    const char *name, *type, *help;
  } fam[] = {
      {"cephalon_cluster_log_ready", "gauge",
       "1 while connected to NATS with the log's stream and bucket in place."},
      {"cephalon_cluster_log_shards_bound", "gauge",
       "Shards whose log consumer this node is bound to (it applies their messages)."},
      {"cephalon_cluster_log_published_total", "counter",
       "Messages this node sent to the log: events, forwards, session records, resends."},
      {"cephalon_cluster_log_delivered_total", "counter",
       "Messages the log delivered to this node."},
      {"cephalon_cluster_log_applied_total", "counter",
       "Log messages this node applied to its engine."},
      {"cephalon_cluster_log_forwarded_total", "counter",
       "Forwards to sessions on other shards that the log acknowledged."},
      {"cephalon_cluster_log_apply_failures_total", "counter",
       "Batches of log messages the engine failed to apply (they come again)."},
      {"cephalon_cluster_log_in_flight", "gauge", "Publishes not yet acknowledged by the log."},
      {"cephalon_cluster_log_lag_messages", "gauge",
       "Messages of the shards bound here that this node has not applied yet: not yet "
       "delivered, or delivered and not acknowledged."},
      {"cephalon_cluster_log_waiting_requests", "gauge",
       "POST /v1/events requests waiting for the log's acknowledgement."},
      {"cephalon_cluster_sessions_known", "gauge",
       "Sessions in this node's copy of the cluster's session table."},
      {"cephalon_cluster_rebuilds_total", "counter",
       "Shards this node rebuilt from the log when it started serving them."},
      {"cephalon_cluster_rebuild_events_total", "counter",
       "Events rebuilds delivered again to the sessions of the shards this node took: input "
       "that had reached them on their previous node and was not consumed."},
      {"cephalon_cluster_rebuilding", "gauge",
       "Shards this node serves whose past is being read or rebuilt from (not yet bound)."},
      {"cephalon_cluster_done_marks_total", "counter",
       "Completions and session deletes whose record of the events they consumed the log "
       "acknowledged."},
      {"cephalon_cluster_done_mark_failures_total", "counter",
       "Completions and session deletes whose record the log did not take in time (a "
       "completion then answers 503)."},
      {"cephalon_cluster_park_marks_total", "counter",
       "Turns parked here (:leases :max-attempts) whose park mark the log took: a node that "
       "takes their session over holds their input parked too."},
      {"cephalon_cluster_unpark_marks_total", "counter",
       "Parked turns requeued here whose unpark mark the log took."},
      {"cephalon_cluster_park_mark_failures_total", "counter",
       "Attempts of park and unpark marks the log did not take in time (a fail or requeue then "
       "answers 503; an expiry's is logged); a park mark is sent again until the log takes it."},
      {"cephalon_cluster_park_mark_retries_total", "counter",
       "Park marks sent again after the log did not take them (1 s, doubling up to 30 s, "
       "apart)."},
      {"cephalon_cluster_park_marks_pending", "gauge",
       "Park marks the log did not take, waiting to be sent again."},
      {"cephalon_cluster_parks_rebuilt_total", "counter",
       "Turns another node parked that rebuilds here parked again, with their input."},
      {"cephalon_cluster_watermarks_put_total", "counter",
       "Shard watermarks this node put into the log (bounding a later rebuild's replay)."},
      {"cephalon_cluster_log_trim_enabled", "gauge",
       "1 while this node trims the log of the shards it serves below their watermarks; 0 when "
       ":log-trim-seconds is 0, the NATS server is too old for it, or not known yet."},
      {"cephalon_cluster_log_purges_total", "counter",
       "Trims of a shard's log this node ran (a purge of its events and forwards, and one of its "
       "done marks)."},
      {"cephalon_cluster_log_purged_messages_total", "counter",
       "Messages this node purged from the log: below their shard's watermark, never needed "
       "again."},
      {"cephalon_cluster_log_purge_failures_total", "counter",
       "Trims that failed (NATS did not answer, or refused): tried again at the next watermark."},
      {"cephalon_cluster_history_copies_sent_total", "counter",
       "Copies of this node's sessions' replies, and of events naming one of its sessions, the "
       "log took for the other nodes' copies of their channels' history."},
      {"cephalon_cluster_history_copy_failures_total", "counter",
       "Copies of replies the log did not take within 10 s of their first attempt: each is "
       "sent again until the log takes it."},
      {"cephalon_cluster_history_copy_retries_total", "counter",
       "Copies of replies sent again after the log did not take an attempt (1 s, doubling up "
       "to 30 s, apart)."},
      {"cephalon_cluster_history_copies_pending", "gauge",
       "Copies of replies the log has not taken yet after their first attempt failed: waiting "
       "to be sent again, or being sent again."},
      {"cephalon_cluster_history_copies_dropped_total", "counter",
       "Copies of replies given up (logged): more than 64 MiB of copies and items waited to be "
       "sent again, or out of memory. The sessions of that shard do not see the reply in that "
       "channel."},
      {"cephalon_cluster_history_copies_stored_total", "counter",
       "Copies of other nodes' replies and events this node stored in its copy of their "
       "channel's history."},
      {"cephalon_cluster_item_failures_total", "counter",
       "Items of sessions' states (turn records, seals, memories, kept turn contexts) the log "
       "did not take within 10 s of their first attempt: each is sent again until the log takes "
       "it, a newer put of its key supersedes it, or the node stops serving its shard."},
      {"cephalon_cluster_item_retries_total", "counter",
       "Items sent again after the log did not take an attempt (1 s, doubling up to 30 s, "
       "apart)."},
      {"cephalon_cluster_items_pending", "gauge",
       "Items the log has not taken yet after their first attempt failed: waiting to be sent "
       "again, or being sent again."},
      {"cephalon_cluster_items_dropped_total", "counter",
       "Items given up (logged): more than 64 MiB of copies and items waited to be sent again, "
       "out of memory, or this node no longer serves their shard."},
  };
  const uint64_t v[] = {st.ready,
                        st.bound,
                        st.published,
                        st.delivered,
                        f->applied,
                        f->forwarded,
                        f->apply_failures,
                        (uint64_t)(st.in_flight > 0 ? st.in_flight : 0),
                        st.lag,
                        waiting,
                        cph_ctable_count(f->table),
                        f->rebuilds,
                        f->rebuild_events,
                        st.rebuilding,
                        f->done_marks,
                        f->done_mark_failures,
                        f->park_marks,
                        f->unpark_marks,
                        f->park_mark_failures,
                        f->park_retries,
                        f->park_pending,
                        f->parks_rebuilt,
                        f->marks_put,
                        f->trim_ns && st.trim_allowed > 0,
                        st.trims,
                        st.trim_purged,
                        st.trim_failures,
                        f->hist_sent,
                        f->hist_failures,
                        f->hist_retries,
                        f->hist_pending,
                        f->hist_dropped,
                        f->hist_stored,
                        f->item_failures,
                        f->item_retries,
                        f->item_pending,
                        f->item_dropped};
  for (size_t i = 0; i < sizeof fam / sizeof fam[0]; i++)
    cph_buf_printf(out, "# HELP %s %s\n# TYPE %s %s\n%s %llu\n", fam[i].name, fam[i].help,
                   fam[i].name, fam[i].type, fam[i].name, (unsigned long long)v[i]);
  cph_buf_printf(out,
                 "# HELP cephalon_cluster_rebuild_seconds How long the last rebuild of a shard "
                 "took, reading its past from the log included.\n"
                 "# TYPE cephalon_cluster_rebuild_seconds gauge\n"
                 "cephalon_cluster_rebuild_seconds %.6f\n",
                 f->last_rebuild_s);
  return cph_buf_error(out);
}

json_t *cph_cflow_json(cph_cflow *f) {
  json_t *o = f->log ? cph_clog_json(f->log) : json_pack("{ss}", "state", "stopped");
  if (!o)
    return NULL;
  json_object_set_new(o, "sessions_known", json_integer((json_int_t)cph_ctable_count(f->table)));
  json_t *trim = json_object_get(o, "trim");
  if (trim && !f->trim_ns)
    json_object_set_new(trim, "state", json_string("off"));
  json_object_set_new(o, "applied", json_integer((json_int_t)f->applied));
  json_object_set_new(o, "forwarded", json_integer((json_int_t)f->forwarded));
  size_t waiting = 0;
  for (ingest_req *ir = f->reqs; ir; ir = ir->next)
    waiting++;
  json_object_set_new(o, "waiting_requests", json_integer((json_int_t)waiting));
  size_t waiting_pos = 0;
  for (pos_req *w = f->waits; w; w = w->next)
    waiting_pos++;
  json_object_set_new(o, "min_pos",
                      json_pack("{sIsIsI}", "waiting", (json_int_t)waiting_pos, "waits",
                                (json_int_t)f->pos_waits, "timeouts", (json_int_t)f->pos_timeouts));
  cph_clog_stats st = {0};
  if (f->log)
    cph_clog_get_stats(f->log, &st);
  size_t pending = 0, waiting_done = 0;
  for (uint32_t sh = 0; sh < f->shards; sh++)
    pending += f->tracks[sh].pending.n;
  for (done_req *dr = f->dones; dr; dr = dr->next)
    waiting_done++;
  json_t *rb = json_pack(
      "{sIsIsIsfsfsIsIsIsIsIsIsI}", "in_progress", (json_int_t)st.rebuilding, "rebuilds",
      (json_int_t)f->rebuilds, "events_total", (json_int_t)f->rebuild_events, "last_seconds",
      f->last_rebuild_s, "last_read_seconds", f->last_read_s, "last_events",
      (json_int_t)f->last_rebuild_events, "last_messages", (json_int_t)f->last_rebuild_messages,
      "pending", (json_int_t)pending, "done_marks", (json_int_t)f->done_marks, "done_mark_failures",
      (json_int_t)f->done_mark_failures, "waiting_completions", (json_int_t)waiting_done,
      "watermarks_put", (json_int_t)f->marks_put);
  if (rb)
    json_object_set_new(
        rb, "last_shard",
        f->last_rebuild_shard < 0 ? json_null() : json_integer((json_int_t)f->last_rebuild_shard));
  json_object_set_new(o, "rebuild", rb);
  json_object_set_new(
      o, "states",
      json_pack("{sIsIsIsIsIsIsIsI}", "put", (json_int_t)f->states_put, "put_bytes",
                (json_int_t)f->state_bytes, "put_raw_bytes", (json_int_t)f->state_raw_bytes,
                "pack_us", (json_int_t)(f->state_pack_ns / 1000), "failures",
                (json_int_t)f->state_failures, "loaded", (json_int_t)f->states_loaded,
                "loaded_bytes", (json_int_t)f->state_load_bytes, "loaded_raw_bytes",
                (json_int_t)f->state_load_raw_bytes));
  json_object_set_new(
      o, "items",
      json_pack("{sIsIsIsIsIsIsIsIsIsIsI}", "put", (json_int_t)f->items_put, "put_bytes",
                (json_int_t)f->item_bytes, "failures", (json_int_t)f->item_failures, "retries",
                (json_int_t)f->item_retries, "pending", (json_int_t)f->item_pending,
                "pending_bytes", (json_int_t)f->item_pending_bytes, "dropped",
                (json_int_t)f->item_dropped, "loaded", (json_int_t)f->items_loaded, "refused",
                (json_int_t)f->items_refused, "forgotten", (json_int_t)st.items_forgotten,
                "forget_failures", (json_int_t)st.forget_failures));
  json_object_set_new(o, "channel_memories",
                      json_pack("{sIsIsIsIsIsI}", "items_put", (json_int_t)f->channel_items,
                                "put_bytes", (json_int_t)f->channel_item_bytes, "items_loaded",
                                (json_int_t)f->channel_items_loaded, "loaded",
                                (json_int_t)f->channel_memories_loaded, "held",
                                (json_int_t)f->channel_memories_held, "direct_items_redelivered",
                                (json_int_t)f->direct_items_left));
  json_object_set_new(
      o, "parks",
      json_pack("{sIsIsIsIsIsIsI}", "park_marks", (json_int_t)f->park_marks, "unpark_marks",
                (json_int_t)f->unpark_marks, "failures", (json_int_t)f->park_mark_failures,
                "retries", (json_int_t)f->park_retries, "pending", (json_int_t)f->park_pending,
                "given_up", (json_int_t)f->park_resends_dropped, "rebuilt",
                (json_int_t)f->parks_rebuilt));
  json_object_set_new(
      o, "history_copies",
      json_pack("{sIsIsIsIsIsIsIsI}", "sent", (json_int_t)f->hist_sent, "failures",
                (json_int_t)f->hist_failures, "retries", (json_int_t)f->hist_retries, "pending",
                (json_int_t)f->hist_pending, "pending_bytes",
                (json_int_t)f->hist_pending_bytes, "dropped", (json_int_t)f->hist_dropped,
                "stored", (json_int_t)f->hist_stored, "held", (json_int_t)f->hist_held));
  return o;
}
