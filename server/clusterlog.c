/* Cluster mode: the replicated log on NATS JetStream (see clusterlog.h). */
#include "clusterlog.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <nats/nats.h>
#include <netdb.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "cephalon/cephalon.h"
#include "cluster.h"
#include "common/buf.h"
#include "common/clock.h"
#include "common/log.h"
#include "statezip.h"

#define SYNC_MS 100
#define BIND_THREADS 8
#define ACK_WAIT_S 5
/* Messages a shard's consumer has out unacknowledged. A message can hold 1,000 events
 * (clusterflow.h 1.), and one not acknowledged within ACK_WAIT_S comes again: at ~20k events/s
 * applied, 64 batches are ~3 s of work. Set when the consumer is created (an existing one
 * keeps its own). */
#define MAX_ACK_PENDING 64
#define PUB_MAX_WAIT_MS 3000
#define MAX_IN_FLIGHT 200000
#define DRAIN_CAP 4096 /* items per loop callback; the rest on the next turn of the loop */
#define REF_HEADER "Cph-Ref"
#define REPLAY_THREADS 2
#define REPLAY_IDLE_MS 10000 /* a read of a shard's past that gets nothing this long fails */
#define REPLAY_RETRY_MS 1000 /* after a failed read */
#define EXPECT_HEADER "Nats-Expected-Last-Subject-Sequence"
#define JS_WRONG_LAST_SEQ 10071 /* JetStream's "wrong last sequence": a fenced write */
#define EPOCH_TRIES 20          /* taking a shard's fences, against a late writer */
#define POS_POLL_MS 5        /* min_pos: between two rounds that made no progress */
#define TRIM_WAIT_MS 2000    /* a purge request of the trim thread (a stop waits for it) */
/* The first nats-server whose filtered purges are safe with :replicas > 1 (clusterlog.h,
 * "Trimming"). */
#define TRIM_SAFE_MAJOR 2
#define TRIM_SAFE_MINOR 9
#define TRIM_SAFE_PATCH 18

typedef enum item_kind {
  ITEM_PUB,
  ITEM_MSG,
  ITEM_KV,
  ITEM_REPLAY,
  ITEM_POS,
  ITEM_ITEMS /* a cph_clog_read_items answer: replay (NULL on failure), ref, why */
} item_kind;

typedef struct item {
  struct item *next;
  item_kind kind;
  /* ITEM_PUB, ITEM_POS */
  uint64_t ref;
  int rc;
  uint64_t seq;
  bool dup;
  char *why;
  /* ITEM_MSG */
  cph_clog_msg *msg;
  /* ITEM_KV */
  char *session;
  char *value; /* NULL: deleted */
  size_t vlen;
  /* ITEM_REPLAY */
  cph_clog_replay *replay;
} item;

/* Where a shard this node serves stands before its consumer is bound (clusterlog.h, "Taking
 * a shard over"). */
typedef enum shard_phase {
  PHASE_NONE,      /* not served, or served and its past not read yet */
  PHASE_REPLAYING, /* a replay thread reads its past (or will) */
  PHASE_APPLYING,  /* handed to the loop, which rebuilds from it */
  PHASE_READY      /* rebuilt: bind (again) at the next sync */
} shard_phase;

typedef struct replay_req {
  struct replay_req *next;
  uint32_t shard;
  uint64_t gen;
  /* cph_clog_read_items instead: the owners whose items are read, and the answer's ref */
  char **owners;
  size_t n_owners;
  uint64_t ref;
} replay_req;

static void replay_req_free(replay_req *rq) {
  for (size_t i = 0; i < rq->n_owners; i++)
    free(rq->owners[i]);
  free(rq->owners);
  free(rq);
}

/* A min_pos wait (clusterlog.h, "Waiting for a position"), on the pos thread. */
typedef enum pos_stage {
  POS_SOURCE, /* read the message at pos: its shard */
  POS_ACKED,  /* wait until its shard's consumer acknowledged it */
  POS_LAST,   /* read the stream's last sequence L */
  POS_LOCAL   /* wait until every target shard's consumer, bound here, acknowledged all to L */
} pos_stage;

typedef struct pos_wait {
  struct pos_wait *next;
  uint64_t ref, pos;
  int64_t shard; /* the target shard, or -1: every shard served here */
  int64_t deadline_ns;
  pos_stage stage;
  uint32_t source;     /* POS_ACKED: the shard of the message at pos */
  uint64_t last;       /* POS_LOCAL: L */
  uint32_t next_shard; /* POS_LOCAL with shard -1: the shards below it are done */
  uint64_t target;     /* POS_LOCAL: the newest sequence of the shard being checked, once read */
  bool has_target;
  bool fence_check;    /* a fence check (cph_clog_check_fence) instead: shard, prefix */
  bool state_check;    /* a state check (cph_clog_check_state) instead: prefix (the subject), pos
                          (the epoch) */
  char prefix[400];
  bool masked;     /* shard -1: only the shards whose bit is set in only[] */
  uint8_t only[];  /* (:shards + 7) / 8 bytes when masked */
} pos_wait;

typedef struct shard_sub {
  natsSubscription *sub;
  uint64_t gen; /* which binding: set before subscribing, read by on_delivery */
  struct cph_clog *log;
  uint32_t shard;
  /* Under the log's mu: the shard's messages the log has not delivered to this binding yet —
   * the consumer's backlog at binding, then NumPending of each delivery; and when it was last
   * set (monotonic ns). The backlog read at binding may count a message the previous owner's
   * binding still took and acknowledged, which never comes here: a count that stands still
   * is read again from the consumer (refresh_undelivered). */
  uint64_t undelivered;
  int64_t undelivered_ns;
} shard_sub;

struct cph_clog {
  /* Configuration (copied, never changed). */
  char **urls;
  size_t n_urls;
  char *node;
  /* Fault injection for tests only (test_cluster_join): CPH_TEST_TAKEOVER_DELAY_MS in the
   * environment at start makes each takeover wait that long before its fences, so that a shard
   * can move away meanwhile. Unset (0) in any real use. */
  int test_takeover_delay_ms;
  uint32_t shards;
  int64_t replicas;
  int64_t dedupe_window_s;
  struct cph_cluster *cluster;
  cph_clog_hooks hooks;

  /* The loop's side: the queue's read end. */
  struct event *ev_queue;
  int pipe[2];

  pthread_t thread;
  bool started;

  /* Shared, under mu. */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool stop;
  bool quiesced;
  bool ready; /* connected, stream and bucket in place: js may be used */
  bool connected;
  /* The connection's closed callback ran: libnats calls its connection callbacks in order on
   * one thread, so none of ours (on_disconnected, on_reconnected) runs after it — the stop
   * waits for it before freeing what they touch. */
  bool nc_closed;
  /* The largest message (headers and data) the NATS server connected to takes, its
   * max_payload; 0 until connected. Read at each (re)connection: servers may differ. */
  int64_t max_payload;
  item *head, *tail;
  bool signalled; /* a byte is in the pipe */
  int64_t in_flight;
  uint64_t published, delivered;
  uint64_t held; /* delivered, not yet acknowledged or released */
  uint32_t bound;
  uint64_t bind_gen; /* bindings so far */
  char last_error[256];
  bool table_loaded;        /* the bucket watch delivered every record there was at its start */
  uint8_t *phase;           /* per shard: shard_phase */
  uint64_t *replay_gen;     /* per shard: the replay its phase belongs to */
  int64_t *replay_after_ns; /* per shard: no new replay before (after a failed one) */
  uint64_t replays;         /* replays so far: their generations */
  replay_req *replay_head, *replay_tail;
  uint32_t replaying; /* shards in PHASE_REPLAYING or PHASE_APPLYING */
  pthread_t replay_threads[REPLAY_THREADS];
  size_t n_replay_threads;
  uint8_t *is_bound; /* per shard: bound here (the log thread writes it, under mu) */
  pos_wait *pos_new; /* min_pos waits not taken by the pos thread yet */
  pthread_t pos_thread;
  bool pos_started;
  /* Trimming ("Trimming" in clusterlog.h): per shard the newest request not taken by the trim
   * thread yet (0: none) — purge its in/fwd messages below trim_below[s], its done marks below
   * trim_done_below[s]; a newer request replaces an older one. */
  uint64_t *trim_below, *trim_done_below;
  bool trim_asked;  /* some trim_below[s] is set */
  int trim_allowed; /* 0: not checked yet, 1: purges are safe here, -1: refused (trim_why) */
  char trim_why[200];
  uint64_t trims, trim_purged, trim_failures;
  /* Sessions whose item keys the trim thread deletes (cph_clog_forget_items), each once due. */
  struct forget_job *forgets;
  uint64_t items_forgotten, forget_failures;
  pthread_t trim_thread;
  bool trim_started;

  /* Set by the log thread before ready, then only read until stop. */
  natsConnection *nc;
  jsCtx *js;
  kvStore *kv;
  kvStore *kv_marks;  /* CPH_CLOG_MARKS: the shards' watermarks */
  kvStore *kv_states; /* CPH_CLOG_STATES: the sessions' states */
  kvWatcher *watcher;
  /* The log thread's own: one binding per shard; unbound subscriptions are kept until stop
   * (a message of theirs may still be acknowledged by the loop). */
  shard_sub *subs;
  natsSubscription **graveyard;
  size_t n_graveyard, cap_graveyard;
};

/* ================================================================ the queue */

static void push_item(cph_clog *l, item *it) {
  bool wake = false;
  pthread_mutex_lock(&l->mu);
  if (l->quiesced) {
    if (it->kind == ITEM_MSG)
      l->held--;
    pthread_mutex_unlock(&l->mu);
    if (it->kind == ITEM_MSG) {
      natsMsg_Destroy(it->msg->nats); /* not acknowledged: delivered again */
      if (it->msg->decoded)
        l->hooks.discard(it->msg->decoded);
      free(it->msg);
    }
    cph_clog_replay_free(it->replay);
    free(it->why);
    free(it->session);
    free(it->value);
    free(it);
    return;
  }
  it->next = NULL;
  if (l->tail)
    l->tail->next = it;
  else
    l->head = it;
  l->tail = it;
  if (!l->signalled) {
    l->signalled = true;
    wake = true;
  }
  pthread_mutex_unlock(&l->mu);
  if (wake) {
    char b = 1;
    ssize_t w = write(l->pipe[1], &b, 1);
    (void)w; /* a full pipe already holds a wake */
  }
}

static void on_queue(evutil_socket_t fd, short what, void *arg) {
  (void)what;
  cph_clog *l = arg;
  char buf[64];
  while (read(fd, buf, sizeof buf) > 0) {
  }
  pthread_mutex_lock(&l->mu);
  item *it = l->head;
  size_t n = 0;
  item *last = NULL;
  for (item *p = it; p && n < DRAIN_CAP; p = p->next, n++)
    last = p;
  if (last) {
    l->head = last->next;
    if (!l->head)
      l->tail = NULL;
    last->next = NULL;
  }
  bool more = l->head != NULL;
  l->signalled = more;
  bool quiesced = l->quiesced;
  pthread_mutex_unlock(&l->mu);
  if (more) {
    char b = 1;
    ssize_t w = write(l->pipe[1], &b, 1);
    (void)w;
  }
  while (it) {
    item *next = it->next;
    if (it->kind == ITEM_PUB) {
      pthread_mutex_lock(&l->mu);
      l->in_flight--;
      pthread_mutex_unlock(&l->mu);
      if (!quiesced)
        l->hooks.published(l->hooks.ctx, it->ref, it->rc, it->seq, it->dup, it->why);
    } else if (it->kind == ITEM_MSG) {
      if (quiesced) {
        cph_clog_release(l, it->msg);
      } else {
        l->hooks.message(l->hooks.ctx, it->msg);
      }
    } else if (it->kind == ITEM_POS) {
      if (!quiesced)
        l->hooks.pos(l->hooks.ctx, it->ref, it->rc, it->seq, it->why);
    } else if (it->kind == ITEM_REPLAY) {
      if (quiesced)
        cph_clog_replay_free(it->replay);
      else
        l->hooks.replayed(l->hooks.ctx, it->replay);
    } else if (it->kind == ITEM_ITEMS) {
      if (quiesced)
        cph_clog_replay_free(it->replay);
      else
        l->hooks.items(l->hooks.ctx, it->ref, it->replay, it->why);
    } else if (!quiesced) {
      l->hooks.session(l->hooks.ctx, it->session, it->value, it->vlen);
    }
    free(it->why);
    free(it->session);
    free(it->value);
    free(it);
    it = next;
  }
}

/* ================================================================ libnats callbacks */

static void set_error(cph_clog *l, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_error(cph_clog *l, const char *fmt, ...) {
  char msg[256];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&l->mu);
  bool changed = strcmp(msg, l->last_error) != 0;
  snprintf(l->last_error, sizeof l->last_error, "%s", msg);
  pthread_mutex_unlock(&l->mu);
  if (changed)
    cph_warn("cluster log: %s", msg);
}

static void on_pub_ack(jsCtx *js, natsMsg *msg, jsPubAck *pa, jsPubAckErr *pae, void *closure) {
  (void)js;
  cph_clog *l = closure;
  const char *ref = NULL;
  item *it = calloc(1, sizeof *it);
  if (!it || natsMsgHeader_Get(msg, REF_HEADER, &ref) != NATS_OK || !ref) {
    /* Without an item the publish never answers: only on out of memory. */
    cph_error("cluster log: a publish acknowledgement could not be handed to the loop");
    free(it);
    natsMsg_Destroy(msg);
    return;
  }
  it->kind = ITEM_PUB;
  it->ref = strtoull(ref, NULL, 10);
  if (pa) {
    it->rc = CPH_OK;
    it->seq = pa->Sequence;
    it->dup = pa->Duplicate;
  } else {
    it->rc = pae && pae->ErrCode == JS_WRONG_LAST_SEQ ? CPH_ECONFLICT : CPH_EBUSY;
    char why[256];
    snprintf(why, sizeof why, "%s%s%s", natsStatus_GetText(pae ? pae->Err : NATS_ERR),
             pae && pae->ErrText ? ": " : "", pae && pae->ErrText ? pae->ErrText : "");
    it->why = strdup(why);
  }
  natsMsg_Destroy(msg);
  push_item(l, it);
}

static void on_delivery(natsConnection *nc, natsSubscription *sub, natsMsg *msg, void *closure) {
  (void)nc;
  (void)sub;
  shard_sub *ss = closure;
  cph_clog *l = ss->log;
  const char *subject = natsMsg_GetSubject(msg);
  jsMsgMetaData *meta = NULL;
  item *it = calloc(1, sizeof *it);
  cph_clog_msg *m = calloc(1, sizeof *m);
  if (!it || !m || natsMsg_GetMetaData(&meta, msg) != NATS_OK) {
    free(it);
    free(m);
    natsMsg_Destroy(msg); /* not acknowledged: delivered again after AckWait */
    return;
  }
  size_t sl = strlen(subject);
  m->shard = ss->shard;
  m->bind_gen = ss->gen;
  m->fwd = sl > 4 && strcmp(subject + sl - 4, ".fwd") == 0;
  m->seq = meta->Sequence.Stream;
  m->deliveries = meta->NumDelivered;
  m->data = natsMsg_GetData(msg);
  m->len = (size_t)natsMsg_GetDataLength(msg);
  m->nats = msg;
  if (l->hooks.decode)
    m->decoded = l->hooks.decode(l->hooks.ctx, m->data, m->len);
  uint64_t undelivered = meta->NumPending;
  jsMsgMetaData_Destroy(meta);
  it->kind = ITEM_MSG;
  it->msg = m;
  pthread_mutex_lock(&l->mu);
  l->delivered++;
  l->held++;
  if (ss->gen == m->bind_gen) {
    ss->undelivered = undelivered;
    ss->undelivered_ns = cph_mono_ns();
  }
  pthread_mutex_unlock(&l->mu);
  push_item(l, it);
}

static void on_disconnected(natsConnection *nc, void *closure) {
  (void)nc;
  cph_clog *l = closure;
  pthread_mutex_lock(&l->mu);
  l->connected = false;
  bool closing = l->stop;
  pthread_mutex_unlock(&l->mu);
  if (!closing)
    cph_warn("cluster log: disconnected from NATS; reconnecting");
}

static void on_closed(natsConnection *nc, void *closure) {
  (void)nc;
  cph_clog *l = closure;
  pthread_mutex_lock(&l->mu);
  l->nc_closed = true;
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
}

static void on_reconnected(natsConnection *nc, void *closure) {
  cph_clog *l = closure;
  char url[256] = "";
  natsConnection_GetConnectedUrl(nc, url, sizeof url);
  int64_t max = natsConnection_GetMaxPayload(nc);
  pthread_mutex_lock(&l->mu);
  l->connected = true;
  l->max_payload = max;
  pthread_mutex_unlock(&l->mu);
  cph_info("cluster log: reconnected to %s", url);
}

/* ================================================================ the log thread */

/* A session whose item keys are to be deleted: "$KV.CEPH_STATE.<shard>.<session in hex>". */
typedef struct forget_job {
  char *prefix;
  int64_t due_ns; /* CLOCK_MONOTONIC */
  struct forget_job *next;
} forget_job;

static bool stopping(cph_clog *l) {
  pthread_mutex_lock(&l->mu);
  bool s = l->stop;
  pthread_mutex_unlock(&l->mu);
  return s;
}

/* Waits ms or until stop. */
static void nap(cph_clog *l, int ms) {
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  until.tv_nsec += (long)ms * 1000000L;
  until.tv_sec += until.tv_nsec / 1000000000L;
  until.tv_nsec %= 1000000000L;
  pthread_mutex_lock(&l->mu);
  while (!l->stop && pthread_cond_timedwait(&l->cv, &l->mu, &until) != ETIMEDOUT) {
  }
  pthread_mutex_unlock(&l->mu);
}

static bool connect_nats(cph_clog *l) {
  natsOptions *o = NULL;
  char name[300];
  snprintf(name, sizeof name, "cephalond-%s", l->node);
  natsStatus s = natsOptions_Create(&o);
  if (s == NATS_OK)
    s = natsOptions_SetServers(o, (const char **)l->urls, (int)l->n_urls);
  if (s == NATS_OK)
    s = natsOptions_SetName(o, name);
  if (s == NATS_OK)
    s = natsOptions_SetMaxReconnect(o, -1);
  if (s == NATS_OK)
    s = natsOptions_SetReconnectWait(o, 100);
  if (s == NATS_OK)
    s = natsOptions_SetReconnectBufSize(o, 64 * 1024 * 1024);
  if (s == NATS_OK)
    s = natsOptions_SetTimeout(o, 2000);
  if (s == NATS_OK)
    s = natsOptions_UseGlobalMessageDelivery(o, true);
  if (s == NATS_OK)
    s = natsOptions_SetDisconnectedCB(o, on_disconnected, l);
  if (s == NATS_OK)
    s = natsOptions_SetReconnectedCB(o, on_reconnected, l);
  if (s == NATS_OK)
    s = natsOptions_SetClosedCB(o, on_closed, l);
  if (s == NATS_OK)
    s = natsConnection_Connect(&l->nc, o);
  natsOptions_Destroy(o);
  if (s != NATS_OK) {
    set_error(l, "cannot connect to NATS (%s): %s", l->urls[0], natsStatus_GetText(s));
    l->nc = NULL;
    return false;
  }
  jsOptions jo;
  jsOptions_Init(&jo);
  jo.Wait = 2000;
  jo.PublishAsync.MaxPending = MAX_IN_FLIGHT;
  jo.PublishAsync.AckHandler = on_pub_ack;
  jo.PublishAsync.AckHandlerClosure = l;
  jo.PublishAsync.StallWait = 1;
  s = natsConnection_JetStream(&l->js, l->nc, &jo);
  if (s != NATS_OK) {
    set_error(l, "JetStream context: %s", natsStatus_GetText(s));
    natsConnection_Destroy(l->nc);
    l->nc = NULL;
    return false;
  }
  int64_t max = natsConnection_GetMaxPayload(l->nc);
  if (max < CPH_CLOG_PAYLOAD_WANTED)
    cph_warn("cluster log: the NATS server takes messages of %" PRId64 " bytes at most "
             "(max_payload), less than the %d this node's batches and their forwards may need "
             "(clusterflow.c LOG_BATCH_BYTES): set max_payload to 1MB or more in nats-server's "
             "configuration",
             max, CPH_CLOG_PAYLOAD_WANTED);
  pthread_mutex_lock(&l->mu);
  l->connected = true;
  l->max_payload = max;
  pthread_mutex_unlock(&l->mu);
  return true;
}

static bool ensure_stream(cph_clog *l) {
  jsStreamInfo *si = NULL;
  jsErrCode jerr = 0;
  natsStatus s = js_GetStreamInfo(&si, l->js, CPH_CLOG_STREAM, NULL, &jerr);
  if (s == NATS_OK) {
    if (si->Config->Replicas != l->replicas)
      cph_warn("cluster log: stream %s has %" PRId64 " replicas, :cluster :replicas says %" PRId64
               " (the stream is kept as it is)",
               CPH_CLOG_STREAM, si->Config->Replicas, l->replicas);
    jsStreamInfo_Destroy(si);
    return true;
  }
  if (s != NATS_NOT_FOUND && jerr != JSStreamNotFoundErr) {
    set_error(l, "stream %s: %s", CPH_CLOG_STREAM, nats_GetLastError(NULL));
    return false;
  }
  jsStreamConfig cfg;
  jsStreamConfig_Init(&cfg);
  const char *subjects[] = {"ceph.s.>"};
  cfg.Name = CPH_CLOG_STREAM;
  cfg.Description = "cephalon cluster log (DESIGN 14)";
  cfg.Subjects = subjects;
  cfg.SubjectsLen = 1;
  cfg.Storage = js_FileStorage;
  cfg.Replicas = l->replicas;
  cfg.Duplicates = (l->dedupe_window_s > 0 ? l->dedupe_window_s : 120) * 1000000000LL;
  s = js_AddStream(&si, l->js, &cfg, NULL, &jerr);
  if (s != NATS_OK && jerr != JSStreamNameExistErr) {
    set_error(l, "creating stream %s (%" PRId64 " replicas): %s", CPH_CLOG_STREAM, l->replicas,
              nats_GetLastError(NULL));
    return false;
  }
  jsStreamInfo_Destroy(si);
  cph_info("cluster log: stream %s ready (%" PRId64 " replicas)", CPH_CLOG_STREAM, l->replicas);
  return true;
}

/* Opens key-value bucket `name` into *kv, creating it (its newest value per key only, on
 * :replicas servers) when no node has; false with the error set. Used for the sessions' bucket,
 * the watermarks (one key per shard) and the sessions' states (clusterflow.h 11.: one key per
 * session). */
static bool ensure_kv(cph_clog *l, const char *name, kvStore **kv) {
  natsStatus s = js_KeyValue(kv, l->js, name);
  if (s != NATS_OK) {
    kvConfig kc;
    kvConfig_Init(&kc);
    kc.Bucket = name;
    kc.History = 1;
    kc.Replicas = (int)l->replicas;
    kc.StorageType = js_FileStorage;
    s = js_CreateKeyValue(kv, l->js, &kc);
    if (s != NATS_OK)
      s = js_KeyValue(kv, l->js, name); /* another node created it */
  }
  if (s != NATS_OK) {
    set_error(l, "bucket %s: %s", name, nats_GetLastError(NULL));
    *kv = NULL;
    return false;
  }
  return true;
}

static bool ensure_bucket(cph_clog *l) {
  if (!ensure_kv(l, CPH_CLOG_BUCKET, &l->kv))
    return false;
  if (!ensure_kv(l, CPH_CLOG_MARKS, &l->kv_marks)) {
    kvStore_Destroy(l->kv);
    l->kv = NULL;
    return false;
  }
  if (!ensure_kv(l, CPH_CLOG_STATES, &l->kv_states)) {
    kvStore_Destroy(l->kv);
    kvStore_Destroy(l->kv_marks);
    l->kv = NULL;
    l->kv_marks = NULL;
    return false;
  }
  kvWatchOptions wo;
  kvWatchOptions_Init(&wo);
  natsStatus s = kvStore_WatchAll(&l->watcher, l->kv, &wo);
  if (s != NATS_OK) {
    set_error(l, "watching %s: %s", CPH_CLOG_BUCKET, nats_GetLastError(NULL));
    kvStore_Destroy(l->kv);
    kvStore_Destroy(l->kv_marks);
    kvStore_Destroy(l->kv_states);
    l->kv = NULL;
    l->kv_marks = NULL;
    l->kv_states = NULL;
    l->watcher = NULL;
    return false;
  }
  return true;
}

/* Hands the bucket's new entries to the loop; waits up to ms for the first. */
static void read_watcher(cph_clog *l, int ms) {
  for (int n = 0; n < 10000; n++) {
    kvEntry *e = NULL;
    if (kvWatcher_Next(&e, l->watcher, n == 0 ? ms : 1) != NATS_OK)
      return;
    if (!e) { /* the marker: every value there was at the start has come */
      pthread_mutex_lock(&l->mu);
      l->table_loaded = true;
      pthread_cond_broadcast(&l->cv);
      pthread_mutex_unlock(&l->mu);
      continue;
    }
    const char *key = kvEntry_Key(e);
    size_t kl = strlen(key);
    item *it = calloc(1, sizeof *it);
    char *id = malloc(kl / 2 + 1);
    bool ok = it && id && kl % 2 == 0;
    for (size_t i = 0; ok && i < kl / 2; i++) {
      int hi = cph_unhex(key[2 * i]), lo = cph_unhex(key[2 * i + 1]);
      ok = hi >= 0 && lo >= 0;
      id[i] = (char)(hi * 16 + lo);
    }
    if (ok) {
      id[kl / 2] = '\0';
      it->kind = ITEM_KV;
      it->session = id;
      if (kvEntry_Operation(e) == kvOp_Put) {
        it->vlen = (size_t)kvEntry_ValueLen(e);
        it->value = malloc(it->vlen + 1);
        if (it->value) {
          memcpy(it->value, kvEntry_Value(e), it->vlen);
          it->value[it->vlen] = '\0';
        } else {
          ok = false;
        }
      }
    }
    kvEntry_Destroy(e);
    if (!ok) {
      free(id);
      if (it)
        free(it->value);
      free(it);
      continue;
    }
    push_item(l, it);
  }
}

/* Binds to shard s's consumer, creating it first if it is not there. */
static void bind_shard(cph_clog *l, uint32_t s) {
  char durable[32], filter[64], deliver[64];
  snprintf(durable, sizeof durable, "s%" PRIu32, s);
  snprintf(filter, sizeof filter, "ceph.s.%" PRIu32 ".>", s);
  snprintf(deliver, sizeof deliver, "_ceph.dlv.%" PRIu32, s);
  jsConsumerConfig cc;
  jsConsumerConfig_Init(&cc);
  cc.Durable = durable;
  cc.DeliverSubject = deliver;
  cc.FilterSubject = filter;
  cc.AckPolicy = js_AckExplicit;
  cc.AckWait = (int64_t)ACK_WAIT_S * 1000000000LL;
  cc.MaxAckPending = MAX_ACK_PENDING;
  cc.DeliverPolicy = js_DeliverAll;
  jsConsumerInfo *ci = NULL;
  jsErrCode jerr = 0;
  natsStatus st = js_GetConsumerInfo(&ci, l->js, CPH_CLOG_STREAM, durable, NULL, &jerr);
  if (st != NATS_OK)
    st = js_AddConsumer(&ci, l->js, CPH_CLOG_STREAM, &cc, NULL, &jerr);
  if (st != NATS_OK) {
    set_error(l, "consumer %s: %s", durable, nats_GetLastError(NULL));
    return;
  }
  uint64_t backlog = ci->NumPending;
  jsConsumerInfo_Destroy(ci);
  jsSubOptions so;
  jsSubOptions_Init(&so);
  so.Stream = CPH_CLOG_STREAM;
  so.Consumer = durable;
  so.ManualAck = true;
  l->subs[s].log = l;
  l->subs[s].shard = s;
  pthread_mutex_lock(&l->mu);
  l->subs[s].gen = ++l->bind_gen;
  l->subs[s].undelivered = backlog;
  l->subs[s].undelivered_ns = cph_mono_ns();
  pthread_mutex_unlock(&l->mu);
  st = js_Subscribe(&l->subs[s].sub, l->js, filter, on_delivery, &l->subs[s], NULL, &so, &jerr);
  if (st != NATS_OK) {
    /* Typically "already bound": the previous owner has not let go yet. Next sync. */
    cph_debug("cluster log: binding %s: %s", durable, nats_GetLastError(NULL));
    l->subs[s].sub = NULL;
    return;
  }
  natsSubscription_SetPendingLimits(l->subs[s].sub, 1 << 20, 1 << 30);
  pthread_mutex_lock(&l->mu);
  l->bound++;
  l->is_bound[s] = 1;
  pthread_mutex_unlock(&l->mu);
}

static void unbind_shard(cph_clog *l, uint32_t s) {
  natsSubscription *sub = l->subs[s].sub;
  l->subs[s].sub = NULL;
  /* Unsubscribe, never delete: the consumer is the shard's, the next owner binds to it. The
   * library deletes only consumers it created itself, and it created none. */
  natsSubscription_Unsubscribe(sub);
  if (l->n_graveyard == l->cap_graveyard) {
    size_t cap = l->cap_graveyard ? 2 * l->cap_graveyard : 16;
    natsSubscription **g = realloc(l->graveyard, cap * sizeof *g);
    if (!g) {
      natsSubscription_Destroy(sub); /* out of memory: late acks of its messages are lost */
      goto counted;
    }
    l->graveyard = g;
    l->cap_graveyard = cap;
  }
  l->graveyard[l->n_graveyard++] = sub;
counted:
  pthread_mutex_lock(&l->mu);
  l->bound--;
  l->is_bound[s] = 0;
  pthread_mutex_unlock(&l->mu);
}

/* Binding runs on up to BIND_THREADS threads at once: creating a replicated consumer waits on
 * JetStream's Raft (a few hundred ms each), so 85 shards one after the other would take most
 * of a minute at a node's first start. */
typedef struct bind_job {
  cph_clog *log;
  uint32_t *shards;
  size_t n;
  size_t next; /* under log->mu */
} bind_job;

static void *bind_worker(void *arg) {
  bind_job *j = arg;
  for (;;) {
    pthread_mutex_lock(&j->log->mu);
    size_t i = j->next++;
    pthread_mutex_unlock(&j->log->mu);
    if (i >= j->n || stopping(j->log))
      return NULL;
    bind_shard(j->log, j->shards[i]);
  }
}

/* Under l->mu: shard s leaves PHASE_REPLAYING or PHASE_APPLYING for `to`. */
static void phase_leave(cph_clog *l, uint32_t s, shard_phase to) {
  if (l->phase[s] == PHASE_REPLAYING || l->phase[s] == PHASE_APPLYING)
    l->replaying--;
  l->phase[s] = (uint8_t)to;
}

/* A served shard without a binding: its past is read first (a replay request), and it is bound
 * once the loop rebuilt from it (PHASE_READY). Returns true when it is to be bound now. */
static bool shard_wants_binding(cph_clog *l, uint32_t s, int64_t now) {
  pthread_mutex_lock(&l->mu);
  if (l->phase[s] == PHASE_NONE && now >= l->replay_after_ns[s]) {
    replay_req *rq = calloc(1, sizeof *rq);
    if (rq) {
      l->phase[s] = PHASE_REPLAYING;
      l->replaying++;
      rq->shard = s;
      rq->gen = l->replay_gen[s] = ++l->replays;
      rq->next = NULL;
      if (l->replay_tail)
        l->replay_tail->next = rq;
      else
        l->replay_head = rq;
      l->replay_tail = rq;
      pthread_cond_broadcast(&l->cv);
    }
  }
  bool ready = l->phase[s] == PHASE_READY;
  pthread_mutex_unlock(&l->mu);
  return ready;
}

static void sync_shards(cph_clog *l) {
  char node[8], url[8];
  uint32_t *todo = malloc(l->shards * sizeof *todo);
  size_t n = 0;
  int64_t now = cph_mono_ns();
  for (uint32_t s = 0; s < l->shards && !stopping(l); s++) {
    bool served =
        cph_cluster_route(l->cluster, s, node, sizeof node, url, sizeof url) == CPH_CLUSTER_SERVED;
    if (!served) {
      if (l->subs[s].sub)
        unbind_shard(l, s);
      pthread_mutex_lock(&l->mu);
      phase_leave(l, s, PHASE_NONE); /* a replay under way is dropped (its generation) */
      pthread_mutex_unlock(&l->mu);
    } else if (!l->subs[s].sub && shard_wants_binding(l, s, now) && todo) {
      todo[n++] = s;
    }
  }
  bind_job job = {l, todo, n, 0};
  pthread_t th[BIND_THREADS];
  size_t started = 0;
  for (; n > 1 && started < BIND_THREADS && started + 1 < n; started++)
    if (pthread_create(&th[started], NULL, bind_worker, &job) != 0)
      break;
  bind_worker(&job); /* this thread works too (alone for one shard) */
  for (size_t k = 0; k < started; k++)
    pthread_join(th[k], NULL);
  free(todo);
}

/* A bound shard's backlog count that has not moved for UNDELIVERED_STALE_NS while above 0 is
 * read again from its consumer (NumPending): the log's lag then says what is really left.
 * One consumer info request per such shard, on the log thread. */
#define UNDELIVERED_STALE_NS (2 * CPH_NS_PER_S)
static void refresh_undelivered(cph_clog *l) {
  int64_t now = cph_mono_ns();
  for (uint32_t s = 0; s < l->shards && !stopping(l); s++) {
    if (!l->subs[s].sub)
      continue;
    pthread_mutex_lock(&l->mu);
    bool stale = l->subs[s].undelivered > 0 &&
                 now - l->subs[s].undelivered_ns > UNDELIVERED_STALE_NS;
    uint64_t gen = l->subs[s].gen;
    pthread_mutex_unlock(&l->mu);
    if (!stale)
      continue;
    char durable[32];
    snprintf(durable, sizeof durable, "s%" PRIu32, s);
    jsConsumerInfo *ci = NULL;
    jsErrCode jerr = 0;
    if (js_GetConsumerInfo(&ci, l->js, CPH_CLOG_STREAM, durable, NULL, &jerr) != NATS_OK)
      continue; /* the next sync tries again */
    pthread_mutex_lock(&l->mu);
    if (l->subs[s].gen == gen && l->subs[s].undelivered_ns < now) {
      l->subs[s].undelivered = ci->NumPending;
      l->subs[s].undelivered_ns = cph_mono_ns();
    }
    pthread_mutex_unlock(&l->mu);
    jsConsumerInfo_Destroy(ci);
  }
}

/* ================================================================ replays */

void cph_clog_replay_free(cph_clog_replay *rp) {
  if (!rp)
    return;
  for (size_t i = 0; i < rp->n_entries; i++) {
    free(rp->entries[i].data);
    if (rp->entries[i].decoded)
      rp->discard(rp->entries[i].decoded);
  }
  free(rp->entries);
  for (size_t i = 0; i < rp->n_states; i++) {
    free(rp->states[i].session);
    free(rp->states[i].data);
  }
  free(rp->states);
  for (size_t i = 0; i < rp->n_items; i++) {
    free(rp->items[i].session);
    free(rp->items[i].name);
    free(rp->items[i].data);
  }
  free(rp->items);
  free(rp);
}

static bool replay_add(cph_clog_replay *rp, size_t *cap, uint64_t seq, cph_clog_kind kind,
                       const char *data, size_t len) {
  if (rp->n_entries == *cap) {
    size_t c = *cap ? 2 * *cap : 256;
    cph_clog_entry *p = realloc(rp->entries, c * sizeof *p);
    if (!p)
      return false;
    rp->entries = p;
    *cap = c;
  }
  char *copy = malloc(len + 1);
  if (!copy)
    return false;
  memcpy(copy, data, len);
  copy[len] = '\0';
  rp->entries[rp->n_entries++] = (cph_clog_entry){seq, kind, copy, len, NULL};
  return true;
}

/* The newest sequence stored on any of subjects (0: none), or false with why set. */
static bool last_seq(cph_clog *l, const char *const *subjects, size_t n, uint64_t *out, char *why,
                     size_t size) {
  *out = 0;
  for (size_t i = 0; i < n; i++) {
    natsMsg *m = NULL;
    jsErrCode jerr = 0;
    natsStatus st = js_GetLastMsg(&m, l->js, CPH_CLOG_STREAM, subjects[i], NULL, &jerr);
    if (st == NATS_NOT_FOUND || jerr == JSNoMessageFoundErr)
      continue;
    if (st != NATS_OK) {
      snprintf(why, size, "the last message of %s: %s", subjects[i], nats_GetLastError(NULL));
      return false;
    }
    if (natsMsg_GetSequence(m) > *out)
      *out = natsMsg_GetSequence(m);
    natsMsg_Destroy(m);
  }
  return true;
}

/* The next stream message of sub, an ordered consumer, with its stream sequence (and the count
 * still pending after it, pending may be NULL); the consumer's status messages are skipped.
 * NULL with why set ("reading <what>: ...") when the node is stopping, NATS fails, or no
 * message came for REPLAY_IDLE_MS. */
static natsMsg *next_stream_msg(cph_clog *l, natsSubscription *sub, const char *what,
                                uint64_t *seq, uint64_t *pending, char *why, size_t size) {
  int64_t deadline = cph_mono_ns() + (int64_t)REPLAY_IDLE_MS * 1000000;
  for (;;) {
    if (stopping(l) || cph_mono_ns() > deadline) {
      snprintf(why, size, "reading %s: %s", what,
               stopping(l) ? "stopping" : "nothing came for 10 s");
      return NULL;
    }
    natsMsg *m = NULL;
    natsStatus st = natsSubscription_NextMsg(&m, sub, 500);
    if (st == NATS_TIMEOUT)
      continue;
    if (st != NATS_OK) {
      snprintf(why, size, "reading %s: %s", what, natsStatus_GetText(st));
      return NULL;
    }
    jsMsgMetaData *meta = NULL;
    if (natsMsg_GetMetaData(&meta, m) != NATS_OK) {
      natsMsg_Destroy(m);
      continue; /* not a stream message (a status of the ordered consumer) */
    }
    *seq = meta->Sequence.Stream;
    if (pending)
      *pending = meta->NumPending;
    jsMsgMetaData_Destroy(meta);
    return m;
  }
}

/* Appends to rp every message of filter (whose exact subjects are subjects[0..n)) from
 * sequence `from` up to `to`, in stream order, through an ordered consumer (ephemeral, no
 * acknowledgements). False with why set on a NATS error, or when no message came for
 * REPLAY_IDLE_MS (however long the whole read takes). */
static bool replay_range(cph_clog *l, cph_clog_replay *rp, size_t *cap, const char *filter,
                         const char *const *subjects, size_t n, uint64_t from, uint64_t to,
                         char *why, size_t size) {
  uint64_t last = 0;
  if (!last_seq(l, subjects, n, &last, why, size))
    return false;
  if (last < to)
    to = last; /* nothing newer to wait for */
  if (to < from)
    return true;
  jsSubOptions so;
  jsSubOptions_Init(&so);
  so.Stream = CPH_CLOG_STREAM;
  so.Ordered = true;
  so.Config.DeliverPolicy = js_DeliverByStartSequence;
  so.Config.OptStartSeq = from;
  natsSubscription *sub = NULL;
  jsErrCode jerr = 0;
  natsStatus st = js_SubscribeSync(&sub, l->js, filter, NULL, &so, &jerr);
  if (st != NATS_OK) {
    snprintf(why, size, "reading %s from %" PRIu64 ": %s", filter, from, nats_GetLastError(NULL));
    return false;
  }
  natsSubscription_SetPendingLimits(sub, 1 << 20, 1 << 30);
  char what[200];
  snprintf(what, sizeof what, "%s from %" PRIu64 " to %" PRIu64, filter, from, to);
  bool ok = false;
  for (;;) {
    uint64_t seq = 0;
    natsMsg *m = next_stream_msg(l, sub, what, &seq, NULL, why, size);
    if (!m)
      break;
    if (seq > to) {
      natsMsg_Destroy(m);
      ok = true;
      break;
    }
    const char *subject = natsMsg_GetSubject(m);
    size_t sl = strlen(subject);
    cph_clog_kind kind = sl > 4 && strcmp(subject + sl - 4, ".fwd") == 0  ? CPH_CLOG_FWD
                         : sl > 3 && strcmp(subject + sl - 3, ".in") == 0 ? CPH_CLOG_IN
                                                                          : CPH_CLOG_DONE;
    bool added =
        replay_add(rp, cap, seq, kind, natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m));
    natsMsg_Destroy(m);
    if (!added) {
      snprintf(why, size, "out of memory reading %s", filter);
      break;
    }
    if (seq >= to) {
      ok = true;
      break;
    }
  }
  natsSubscription_Unsubscribe(sub);
  natsSubscription_Destroy(sub);
  return ok;
}

/* The fences of a shard this node takes (clusterflow.h 10.), before its past is read: the
 * watermark's key is written again with its own value, expecting the revision just read (or
 * created as 1, expecting none), and an epoch message goes to ceph.s.done.<shard>, expecting the
 * subject's last sequence just read. Either write fails only when another node wrote there in
 * between (a previous owner's late write): then both are read and tried again. From then on a
 * previous owner's watermark put or done mark, which expects what it wrote last, is refused.
 * Each write goes only while this node serves the shard, checked after the read it expects and
 * right before it: a node that released the shard stopped serving it first (cluster.h), so a
 * next owner's fence that this node's read saw is seen released here — without the check, a
 * takeover that lost its shard midway wrote its epoch after the next owner's, and that owner's
 * marks were refused from then on (a completion's 503 there, on a loaded machine at start).
 * Sets rp->from (the watermark), rp->mark_rev and rp->done_last; false with why set. */
static bool fences_ours(cph_clog *l, uint32_t shard, char *why, size_t size) {
  char node[8], url[8];
  if (cph_cluster_route(l->cluster, shard, node, sizeof node, url, sizeof url) ==
      CPH_CLUSTER_SERVED)
    return true;
  snprintf(why, size, "shard %" PRIu32 " moved away while this node was taking it", shard);
  return false;
}

static bool take_fences(cph_clog *l, cph_clog_replay *rp, const char *key, char *why, size_t size) {
  char done[64], epoch[160];
  cph_clog_done_subject(done, sizeof done, rp->shard);
  snprintf(epoch, sizeof epoch, "{\"epoch\":\"%s\"}", l->node);
  for (int t = 0; t < EPOCH_TRIES && !stopping(l); t++) {
    kvEntry *e = NULL;
    natsStatus st = kvStore_Get(&e, l->kv_marks, key);
    uint64_t rev = 0;
    rp->from = 1;
    if (st == NATS_OK) {
      const char *v = kvEntry_ValueString(e);
      char *end = NULL;
      unsigned long long w = v ? strtoull(v, &end, 10) : 0;
      if (v && end != v && *end == '\0' && w >= 1)
        rp->from = (uint64_t)w;
      else
        cph_warn("cluster log: the watermark of shard %" PRIu32 " in %s is malformed "
                 "(\"%.40s\"); reading the shard from the start",
                 rp->shard, CPH_CLOG_MARKS, v ? v : "");
      if (!fences_ours(l, rp->shard, why, size)) {
        kvEntry_Destroy(e);
        return false;
      }
      st = kvStore_UpdateString(&rev, l->kv_marks, key, v ? v : "1", kvEntry_Revision(e));
      kvEntry_Destroy(e);
    } else if (st == NATS_NOT_FOUND) {
      if (!fences_ours(l, rp->shard, why, size))
        return false;
      st = kvStore_CreateString(&rev, l->kv_marks, key, "1");
    } else {
      snprintf(why, size, "the watermark of shard %" PRIu32 ": %s", rp->shard,
               nats_GetLastError(NULL));
      return false;
    }
    if (st != NATS_OK)
      continue; /* written in between (or a NATS error): read again */
    rp->mark_rev = rev;
    uint64_t last = 0;
    const char *subjects[] = {done};
    if (!last_seq(l, subjects, 1, &last, why, size) || !fences_ours(l, rp->shard, why, size))
      return false;
    natsMsg *m = NULL;
    char e_last[24];
    snprintf(e_last, sizeof e_last, "%" PRIu64, last);
    st = natsMsg_Create(&m, done, NULL, epoch, (int)strlen(epoch));
    if (st == NATS_OK)
      st = natsMsgHeader_Set(m, EXPECT_HEADER, e_last);
    jsPubAck *pa = NULL;
    jsErrCode jerr = 0;
    if (st == NATS_OK)
      st = js_PublishMsg(&pa, l->js, m, NULL, &jerr);
    natsMsg_Destroy(m);
    if (st == NATS_OK) {
      rp->done_last = pa->Sequence;
      jsPubAck_Destroy(pa);
      return true;
    }
    if (jerr != JS_WRONG_LAST_SEQ) {
      snprintf(why, size, "the epoch of shard %" PRIu32 ": %s", rp->shard, nats_GetLastError(NULL));
      return false;
    }
  }
  snprintf(why, size, "the fences of shard %" PRIu32 ": written by another node %d times over",
           rp->shard, EPOCH_TRIES);
  return false;
}

/* v (n elements of `size` bytes, room for *cap) with room for one more: v, or grown by
 * doubling; NULL out of memory (v and *cap unchanged). */
static void *room_for(void *v, size_t *cap, size_t n, size_t size) {
  if (n < *cap)
    return v;
  size_t c = *cap ? 2 * *cap : 16;
  void *g = realloc(v, c * size);
  if (g)
    *cap = c;
  return g;
}

/* The info of CEPH_STATE's stream with its subjects that match filter (its keys there, each
 * with its message count), or NULL with why set on a NATS error. */
static jsStreamInfo *state_keys(cph_clog *l, const char *filter, char *why, size_t size) {
  char stream[64];
  snprintf(stream, sizeof stream, "KV_%s", CPH_CLOG_STATES);
  jsOptions o;
  jsOptions_Init(&o);
  o.Stream.Info.SubjectsFilter = filter;
  jsStreamInfo *si = NULL;
  jsErrCode jerr = 0;
  if (js_GetStreamInfo(&si, l->js, stream, &o, &jerr) != NATS_OK) {
    snprintf(why, size, "the keys of %.200s: %.80s", filter, nats_GetLastError(NULL));
    return NULL;
  }
  return si;
}

/* Appends to rp the newest value of every key of CEPH_STATE under filter (a subject ending in
 * ">"; its first plen bytes are "$KV.<bucket>.<shard>.", then comes the session's hex id): the
 * states, and the items. As replay_states. */
static bool read_keys(cph_clog *l, cph_clog_replay *rp, const char *filter, int plen, char *why,
                      size_t size) {
  char stream[64];
  snprintf(stream, sizeof stream, "KV_%s", CPH_CLOG_STATES);
  /* Whether there is any key: an ordered consumer with nothing to deliver never says so. */
  jsStreamInfo *si = state_keys(l, filter, why, size);
  if (!si)
    return false;
  uint64_t left = si->State.Subjects ? (uint64_t)si->State.Subjects->Count : 0;
  jsStreamInfo_Destroy(si);
  if (!left)
    return true;
  jsSubOptions so;
  jsSubOptions_Init(&so);
  so.Stream = stream;
  so.Ordered = true;
  so.Config.DeliverPolicy = js_DeliverLastPerSubject;
  natsSubscription *sub = NULL;
  jsErrCode jerr = 0;
  natsStatus st = js_SubscribeSync(&sub, l->js, filter, NULL, &so, &jerr);
  if (st != NATS_OK) {
    snprintf(why, size, "reading %s: %s", filter, nats_GetLastError(NULL));
    return false;
  }
  natsSubscription_SetPendingLimits(sub, 1 << 20, 1 << 30);
  size_t cap = rp->n_states, items_cap = rp->n_items; /* the arrays hold that many */
  bool ok = false;
  while (!ok) {
    uint64_t seq = 0, pending = 0;
    natsMsg *m = next_stream_msg(l, sub, filter, &seq, &pending, why, size);
    if (!m)
      break;
    const char *subject = natsMsg_GetSubject(m), *op = NULL;
    bool deleted = natsMsgHeader_Get(m, "KV-Operation", &op) == NATS_OK && op &&
                   (strcmp(op, "DEL") == 0 || strcmp(op, "PURGE") == 0);
    const char *hexid = strlen(subject) > (size_t)plen ? subject + plen : "";
    const char *dot = strchr(hexid, '.'); /* an item's key: its name follows */
    size_t hl = dot ? (size_t)(dot - hexid) : strlen(hexid);
    if (dot && deleted) { /* a forgotten item */
      natsMsg_Destroy(m);
      ok = pending == 0;
      continue;
    }
    char *session = hl % 2 == 0 ? malloc(hl / 2 + 1) : NULL;
    bool good = session != NULL;
    for (size_t i = 0; good && i < hl / 2; i++) {
      int hi = cph_unhex(hexid[2 * i]), lo = cph_unhex(hexid[2 * i + 1]);
      good = hi >= 0 && lo >= 0 && (hi || lo);
      session[i] = (char)(hi << 4 | lo);
    }
    if (good)
      session[hl / 2] = '\0';
    int dlen = natsMsg_GetDataLength(m);
    uint8_t *data = NULL;
    if (good && !deleted && (data = malloc(dlen > 0 ? (size_t)dlen : 1)))
      memcpy(data, natsMsg_GetData(m), (size_t)dlen);
    /* subject, hexid and dot point into m: it is destroyed once they were read */
    bool nomem = false;
    if (good && dot) {
      char *name = data ? strdup(dot + 1) : NULL;
      cph_clog_item *g = name ? room_for(rp->items, &items_cap, rp->n_items, sizeof *g) : NULL;
      if (g) {
        rp->items = g;
        rp->items[rp->n_items++] = (cph_clog_item){session, name, data, (size_t)dlen};
      } else {
        free(name);
        nomem = true;
      }
    } else if (good && (deleted || data)) {
      cph_clog_state *g = room_for(rp->states, &cap, rp->n_states, sizeof *g);
      size_t len = data ? (size_t)dlen : 0;
      if (g) {
        rp->states = g;
        rp->states[rp->n_states++] = (cph_clog_state){session, seq, data, len, len};
      } else {
        nomem = true;
      }
    } else if (!good) {
      cph_warn("cluster log: a key of %s that names no session (%s) is skipped", CPH_CLOG_STATES,
               subject);
    } else {
      nomem = true;
    }
    natsMsg_Destroy(m);
    if (nomem || !good) {
      free(session);
      free(data);
    }
    if (nomem) {
      snprintf(why, size, "out of memory reading %s", filter);
      break;
    }
    ok = pending == 0;
  }
  natsSubscription_Unsubscribe(sub);
  natsSubscription_Destroy(sub);
  return ok;
}

/* Appends to rp the newest value of every key of the shard in CEPH_STATE (clusterflow.h 11.),
 * through an ordered consumer delivering the last message per subject: it says how many are
 * left with each (NumPending), so the read ends with the last one; or at once when the stream
 * has no subject of the shard. False with why set on a NATS error or when none came for
 * REPLAY_IDLE_MS. */
static bool replay_states(cph_clog *l, cph_clog_replay *rp, char *why, size_t size) {
  char filter[64];
  int plen = snprintf(filter, sizeof filter, "$KV.%s.%" PRIu32 ".", CPH_CLOG_STATES, rp->shard);
  snprintf(filter + plen, sizeof filter - (size_t)plen, ">");
  return read_keys(l, rp, filter, plen, why, size);
}

/* Unpacks a value as the log stored it, *data[0..*len) (the writer's epoch, then a packed or
 * raw value, statezip.h): a packed one is replaced by the epoch and the raw bytes, a raw one
 * left as it is. CPH_OK; CPH_ENOMEM (*data kept); or statezip's error with bad set. */
static int unpack_value(uint8_t **data, size_t *len, char *bad, size_t bad_size) {
  uint8_t *raw = NULL;
  size_t raw_len = 0;
  int rc = cph_statezip_unpack(*data + CPH_CLOG_EPOCH_BYTES, *len - CPH_CLOG_EPOCH_BYTES,
                               CPH_SESSION_STATE_MAX_BYTES, &raw, &raw_len, bad, bad_size);
  if (rc != CPH_OK || !raw)
    return rc; /* an error, or raw already */
  uint8_t *v = malloc(CPH_CLOG_EPOCH_BYTES + raw_len);
  if (v) {
    memcpy(v, *data, CPH_CLOG_EPOCH_BYTES);
    memcpy(v + CPH_CLOG_EPOCH_BYTES, raw, raw_len);
    free(*data);
    *data = v;
    *len = CPH_CLOG_EPOCH_BYTES + raw_len;
  }
  free(raw);
  return v ? CPH_OK : CPH_ENOMEM;
}

/* Unpacks the packed states of rp (statezip.h), here beside the loop. A value that does not
 * unpack is logged, naming its key, and dropped (data NULL): the session keeps what it has, as
 * with a state its engine refuses. False (why set) only when out of memory. */
static bool unpack_states(cph_clog_replay *rp, char *why, size_t size) {
  for (size_t i = 0; i < rp->n_states; i++) {
    cph_clog_state *st = &rp->states[i];
    if (!st->data || st->len < CPH_CLOG_EPOCH_BYTES)
      continue;
    char bad[200] = "";
    int rc = unpack_value(&st->data, &st->len, bad, sizeof bad);
    if (rc == CPH_ENOMEM) {
      snprintf(why, size, "out of memory unpacking the state of session %s", st->session);
      return false;
    }
    if (rc != CPH_OK) {
      char subject[700];
      size_t skip = strlen("$KV.") + strlen(CPH_CLOG_STATES) + 1;
      if (cph_clog_state_subject(subject, sizeof subject, rp->shard, st->session) != CPH_OK)
        snprintf(subject + skip, sizeof subject - skip, "%" PRIu32 ".(too long)", rp->shard);
      cph_warn("cluster log: the state of session %s (key %s of %s, revision %" PRIu64
               ", %zu bytes) is not taken: %s; the session keeps what it has here",
               st->session, subject + skip, CPH_CLOG_STATES, st->rev, st->len, bad);
      free(st->data);
      st->data = NULL;
      st->len = 0;
    }
  }
  return true;
}

/* Unpacks the packed items of rp (a kept turn context or a seal is put packed,
 * clusterflow.c), here beside the loop. One that does not unpack is logged, naming its key,
 * and left out (len 0: nothing imported). False (why set) only when out of memory. */
static bool unpack_items(cph_clog_replay *rp, char *why, size_t size) {
  for (size_t i = 0; i < rp->n_items; i++) {
    cph_clog_item *it = &rp->items[i];
    if (!it->data || it->len < CPH_CLOG_EPOCH_BYTES)
      continue;
    char bad[200] = "";
    int rc = unpack_value(&it->data, &it->len, bad, sizeof bad);
    if (rc == CPH_ENOMEM) {
      snprintf(why, size, "out of memory unpacking item %.80s of session %s", it->name,
               it->session);
      return false;
    }
    if (rc != CPH_OK) {
      cph_warn("cluster log: item %.80s of session %s (%zu bytes) is not taken: %s", it->name,
               it->session, it->len, bad);
      it->len = 0;
    }
  }
  return true;
}

/* Reads what the loop rebuilds shard from (clusterlog.h, "Taking a shard over"): the
 * watermark, then the shard's events from it to the stream's last sequence now, then its
 * done marks from it to the newest. NULL with why set on failure. */
static cph_clog_replay *replay_read(cph_clog *l, uint32_t shard, uint64_t gen, char *why,
                                    size_t size) {
  int64_t t0 = cph_mono_ns();
  cph_clog_replay *rp = calloc(1, sizeof *rp);
  if (!rp) {
    snprintf(why, size, "out of memory");
    return NULL;
  }
  rp->shard = shard;
  rp->gen = gen;
  rp->from = 1;
  char key[16];
  snprintf(key, sizeof key, "%" PRIu32, shard);
  if (l->test_takeover_delay_ms > 0)
    usleep((useconds_t)l->test_takeover_delay_ms * 1000);
  if (!take_fences(l, rp, key, why, size))
    goto fail;
  jsStreamInfo *si = NULL;
  jsErrCode jerr = 0;
  natsStatus st = js_GetStreamInfo(&si, l->js, CPH_CLOG_STREAM, NULL, &jerr);
  if (st != NATS_OK) {
    snprintf(why, size, "stream %s: %s", CPH_CLOG_STREAM, nats_GetLastError(NULL));
    goto fail;
  }
  rp->to = si->State.LastSeq;
  jsStreamInfo_Destroy(si);
  size_t cap = 0;
  char filter[64], in[64], fwd[64], done[64];
  snprintf(filter, sizeof filter, "ceph.s.%" PRIu32 ".>", shard);
  cph_clog_subject(in, sizeof in, shard, false);
  cph_clog_subject(fwd, sizeof fwd, shard, true);
  cph_clog_done_subject(done, sizeof done, shard);
  const char *events[] = {in, fwd}, *marks[] = {done};
  if (!replay_range(l, rp, &cap, filter, events, 2, rp->from, rp->to, why, size))
    goto fail;
  rp->n_events = rp->n_entries;
  /* Marks after rp->to as well: a completion that committed before this node took the shard
   * may have its mark logged after that read (its answer waits for it). */
  if (!replay_range(l, rp, &cap, done, marks, 1, rp->from, UINT64_MAX, why, size))
    goto fail;
  /* After the fences: a put of a previous owner that lands later is refused when this node next
   * writes the key, or is written over (clusterflow.h 11.). */
  if (!replay_states(l, rp, why, size))
    goto fail;
  if (!unpack_states(rp, why, size) || !unpack_items(rp, why, size))
    goto fail;
  if (l->hooks.decode) { /* the messages decoded and prepared here, beside the loop */
    rp->discard = l->hooks.discard;
    for (size_t i = 0; i < rp->n_events; i++)
      rp->entries[i].decoded =
          l->hooks.decode(l->hooks.ctx, rp->entries[i].data, rp->entries[i].len);
  }
  rp->read_ns = cph_mono_ns() - t0;
  return rp;
fail:
  cph_clog_replay_free(rp);
  return NULL;
}

/* Reads the items of rq's owners (each "<'#' and a channel>": under the channel's shard) into
 * a replay of no shard and hands it to the loop (ITEM_ITEMS; NULL with why when a read
 * failed). */
static void read_items_answer(cph_clog *l, replay_req *rq) {
  char why[256] = "";
  cph_clog_replay *rp = calloc(1, sizeof *rp);
  bool ok = rp != NULL;
  if (!ok)
    snprintf(why, sizeof why, "out of memory");
  for (size_t i = 0; ok && i < rq->n_owners; i++) {
    const char *owner = rq->owners[i];
    uint32_t shard = cph_cluster_shard_of(owner + 1, l->shards);
    char filter[1200];
    int plen = snprintf(filter, sizeof filter, "$KV.%s.%" PRIu32 ".", CPH_CLOG_STATES, shard);
    if (cph_clog_state_subject(filter, sizeof filter - 2, shard, owner) != CPH_OK) {
      snprintf(why, sizeof why, "a channel name too long for a key: %.40s", owner + 1);
      ok = false;
      break;
    }
    strcat(filter, ".>"); /* room kept above */
    ok = read_keys(l, rp, filter, plen, why, sizeof why);
  }
  if (ok)
    ok = unpack_items(rp, why, sizeof why);
  if (!ok) {
    cph_clog_replay_free(rp);
    rp = NULL;
  }
  item *it = calloc(1, sizeof *it);
  if (!it) {
    cph_clog_replay_free(rp);
    return; /* the loop's request times out (clusterflow.c) */
  }
  it->kind = ITEM_ITEMS;
  it->ref = rq->ref;
  it->replay = rp;
  it->why = rp ? NULL : strdup(why);
  push_item(l, it);
}

int cph_clog_read_items(cph_clog *l, const char *const *owners, size_t n, uint64_t ref) {
  replay_req *rq = calloc(1, sizeof *rq);
  char **v = rq && n ? calloc(n, sizeof *v) : NULL;
  if (!rq || !v) {
    free(rq);
    free(v);
    return CPH_ENOMEM;
  }
  rq->owners = v;
  rq->ref = ref;
  for (; rq->n_owners < n; rq->n_owners++)
    if (!(v[rq->n_owners] = strdup(owners[rq->n_owners]))) {
      replay_req_free(rq);
      return CPH_ENOMEM;
    }
  pthread_mutex_lock(&l->mu);
  bool ok = l->ready && !l->quiesced && !l->stop;
  if (ok) {
    if (l->replay_tail)
      l->replay_tail->next = rq;
    else
      l->replay_head = rq;
    l->replay_tail = rq;
    pthread_cond_broadcast(&l->cv);
  }
  pthread_mutex_unlock(&l->mu);
  if (!ok) {
    replay_req_free(rq);
    return CPH_EBUSY;
  }
  return CPH_OK;
}

/* A replay thread: reads the past of the shards queued by sync_shards, one at a time, and hands
 * each to the loop (ITEM_REPLAY). Waits until the session table is loaded, so the loop holds
 * every session record there was when it rebuilds (the items come in order). */
static void *replay_thread(void *arg) {
  cph_clog *l = arg;
  pthread_mutex_lock(&l->mu);
  for (;;) {
    while (!l->stop && !(l->replay_head && l->ready && l->table_loaded && !l->quiesced))
      pthread_cond_wait(&l->cv, &l->mu);
    if (l->stop)
      break;
    replay_req *rq = l->replay_head;
    l->replay_head = rq->next;
    if (!l->replay_head)
      l->replay_tail = NULL;
    if (rq->owners) { /* cph_clog_read_items */
      pthread_mutex_unlock(&l->mu);
      read_items_answer(l, rq);
      replay_req_free(rq);
      pthread_mutex_lock(&l->mu);
      continue;
    }
    uint32_t s = rq->shard;
    bool current = l->phase[s] == PHASE_REPLAYING && l->replay_gen[s] == rq->gen;
    pthread_mutex_unlock(&l->mu);
    char why[256] = "";
    cph_clog_replay *rp = current ? replay_read(l, s, rq->gen, why, sizeof why) : NULL;
    pthread_mutex_lock(&l->mu);
    current = l->phase[s] == PHASE_REPLAYING && l->replay_gen[s] == rq->gen;
    if (current && rp) {
      l->phase[s] = PHASE_APPLYING;
    } else if (current) {
      phase_leave(l, s, PHASE_NONE);
      l->replay_after_ns[s] = cph_mono_ns() + (int64_t)REPLAY_RETRY_MS * 1000000;
    }
    pthread_mutex_unlock(&l->mu);
    if (current && rp) {
      item *it = calloc(1, sizeof *it);
      if (it) {
        it->kind = ITEM_REPLAY;
        it->replay = rp;
        push_item(l, it);
      } else {
        cph_clog_replay_free(rp);
        pthread_mutex_lock(&l->mu);
        phase_leave(l, s, PHASE_NONE);
        pthread_mutex_unlock(&l->mu);
      }
    } else {
      if (current)
        set_error(l, "replaying shard %" PRIu32 ": %s (tried again in %d ms)", s, why,
                  REPLAY_RETRY_MS);
      cph_clog_replay_free(rp);
    }
    free(rq);
    pthread_mutex_lock(&l->mu);
  }
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

/* ================================================================ min_pos */

static void pos_answer(cph_clog *l, pos_wait *w, int rc, uint64_t seq, const char *why) {
  item *it = calloc(1, sizeof *it);
  if (it) {
    it->kind = ITEM_POS;
    it->ref = w->ref;
    it->rc = rc;
    it->seq = seq;
    it->why = why ? strdup(why) : NULL;
    push_item(l, it);
  } else {
    cph_error("cluster log: a min_pos answer could not be handed to the loop");
  }
  free(w);
}

/* Whether consumer s<shard> acknowledged every one of its messages up to `upto`, a sequence of
 * one of its messages (or 0): its ack floor reached it. -1 on a NATS error.
 * Not "or nothing is pending or unacknowledged": a consumer's info comes from its leader, whose
 * copy of a replicated stream may not hold the newest messages yet, and it then reports nothing
 * pending for a message the stream's leader acknowledged (test_cluster_minpos saw a read with
 * min_pos miss its forwarded event so, once, on a loaded machine). */
static int pos_acked(cph_clog *l, uint32_t shard, uint64_t upto) {
  char durable[32];
  snprintf(durable, sizeof durable, "s%" PRIu32, shard);
  jsConsumerInfo *ci = NULL;
  jsErrCode jerr = 0;
  if (js_GetConsumerInfo(&ci, l->js, CPH_CLOG_STREAM, durable, NULL, &jerr) != NATS_OK)
    return -1;
  int done = ci->AckFloor.Stream >= upto;
  jsConsumerInfo_Destroy(ci);
  return done;
}

/* Whether target shard s's consumer acknowledged everything of s stored when L was read: its ack
 * floor reached the newest sequence of s's subjects (in, fwd), read once after L — a message of
 * s at or below L is at or below that one; a newer one makes the wait longer, never wrong. -1 on
 * a NATS error. */
static int pos_shard_acked(cph_clog *l, pos_wait *w, uint32_t s) {
  if (!w->has_target) {
    char in[48], fwd[48], why[256];
    snprintf(in, sizeof in, "ceph.s.%" PRIu32 ".in", s);
    snprintf(fwd, sizeof fwd, "ceph.s.%" PRIu32 ".fwd", s);
    const char *const subjects[] = {in, fwd};
    if (!last_seq(l, subjects, 2, &w->target, why, sizeof why))
      return -1;
    w->has_target = true;
  }
  return pos_acked(l, s, w->target);
}

/* Whether shard s is served here, rebuilt and bound (its acknowledgements are this node's). */
static bool pos_local(cph_clog *l, uint32_t s) {
  char node[8], url[8];
  if (cph_cluster_route(l->cluster, s, node, sizeof node, url, sizeof url) != CPH_CLUSTER_SERVED)
    return false;
  pthread_mutex_lock(&l->mu);
  bool b = l->is_bound[s] && l->phase[s] == PHASE_READY;
  pthread_mutex_unlock(&l->mu);
  return b;
}

/* A fence check (cph_clog_check_fence): CPH_OK with *seq, CPH_ECONFLICT, or CPH_EBUSY (not
 * read: try again). */
static int fence_read(cph_clog *l, pos_wait *w, uint64_t *seq) {
  char subject[64];
  cph_clog_done_subject(subject, sizeof subject, (uint32_t)w->shard);
  natsMsg *m = NULL;
  jsErrCode jerr = 0;
  if (js_GetLastMsg(&m, l->js, CPH_CLOG_STREAM, subject, NULL, &jerr) != NATS_OK)
    return CPH_EBUSY; /* there is one: this node's epoch at least */
  const char *id = NULL;
  bool ours = natsMsgHeader_Get(m, "Nats-Msg-Id", &id) == NATS_OK && id &&
              strncmp(id, w->prefix, strlen(w->prefix)) == 0;
  if (!ours) {
    json_t *doc = json_loadb(natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m), 0, NULL);
    const char *epoch = json_string_value(json_object_get(doc, "epoch"));
    ours = epoch && strcmp(epoch, l->node) == 0;
    json_decref(doc);
  }
  *seq = natsMsg_GetSequence(m);
  natsMsg_Destroy(m);
  return ours ? CPH_OK : CPH_ECONFLICT;
}

/* A state check (cph_clog_check_state): CPH_OK with *seq, CPH_ECONFLICT, or CPH_EBUSY (not
 * read: try again). */
static int state_read(cph_clog *l, pos_wait *w, uint64_t *seq) {
  char stream[64];
  snprintf(stream, sizeof stream, "KV_%s", CPH_CLOG_STATES);
  natsMsg *m = NULL;
  jsErrCode jerr = 0;
  natsStatus st = js_GetLastMsg(&m, l->js, stream, w->prefix, NULL, &jerr);
  if (st == NATS_NOT_FOUND || jerr == JSNoMessageFoundErr) {
    *seq = 0; /* none (purged): a create expects 0 */
    return CPH_OK;
  }
  if (st != NATS_OK)
    return CPH_EBUSY;
  const char *op = NULL;
  bool deleted = natsMsgHeader_Get(m, "KV-Operation", &op) == NATS_OK && op;
  uint64_t epoch = 0;
  if (!deleted && natsMsg_GetDataLength(m) >= CPH_CLOG_EPOCH_BYTES)
    epoch = cph_clog_epoch_get((const uint8_t *)natsMsg_GetData(m));
  *seq = natsMsg_GetSequence(m);
  natsMsg_Destroy(m);
  return deleted || epoch <= w->pos ? CPH_OK : CPH_ECONFLICT;
}

/* One step of w: true when it advanced (try the next step at once), false when it waits. */
static bool pos_step(cph_clog *l, pos_wait *w) {
  jsErrCode jerr = 0;
  switch (w->stage) {
  case POS_SOURCE: {
    natsMsg *m = NULL;
    natsStatus st = js_GetMsg(&m, l->js, CPH_CLOG_STREAM, w->pos, NULL, &jerr);
    if (st != NATS_OK) {
      /* Not stored yet (a position above the stream's last), or gone: read L, which tells. */
      uint64_t last = 0;
      jsStreamInfo *si = NULL;
      if (js_GetStreamInfo(&si, l->js, CPH_CLOG_STREAM, NULL, &jerr) != NATS_OK)
        return false;
      last = si->State.LastSeq;
      jsStreamInfo_Destroy(si);
      if (last < w->pos)
        return false;
      /* Deleted: purged (clusterflow.h 12.), which only a message its shard's consumer had
       * acknowledged is — so its forwards are at or below L, and nothing of it is left to wait
       * for but what came before L. */
      w->stage = POS_LAST;
      return true;
    }
    const char *subject = natsMsg_GetSubject(m);
    unsigned long shard = 0;
    char kind[8] = "";
    if (sscanf(subject, "ceph.s.%lu.%7s", &shard, kind) == 2 &&
        (strcmp(kind, "in") == 0 || strcmp(kind, "fwd") == 0) && shard < l->shards) {
      w->source = (uint32_t)shard;
      w->stage = POS_ACKED;
    } else {
      w->stage = POS_LAST; /* a done mark, a bucket entry: applied by nobody */
    }
    natsMsg_Destroy(m);
    return true;
  }
  case POS_ACKED:
    if (pos_acked(l, w->source, w->pos) != 1)
      return false;
    w->stage = POS_LAST;
    return true;
  case POS_LAST: {
    jsStreamInfo *si = NULL;
    if (js_GetStreamInfo(&si, l->js, CPH_CLOG_STREAM, NULL, &jerr) != NATS_OK)
      return false;
    w->last = si->State.LastSeq;
    jsStreamInfo_Destroy(si);
    w->stage = POS_LOCAL;
    return true;
  }
  case POS_LOCAL:
    if (w->shard >= 0) {
      if (!pos_local(l, (uint32_t)w->shard) || pos_shard_acked(l, w, (uint32_t)w->shard) != 1)
        return false;
      w->next_shard = l->shards;
      return true;
    }
    while (w->next_shard < l->shards) {
      char node[8], url[8];
      uint32_t s = w->next_shard;
      if ((!w->masked || (w->only[s >> 3] & (1u << (s & 7)))) &&
          cph_cluster_route(l->cluster, s, node, sizeof node, url, sizeof url) ==
              CPH_CLUSTER_SERVED) {
        if (!pos_local(l, s) || pos_shard_acked(l, w, s) != 1)
          return false;
      }
      w->next_shard++;
      w->has_target = false;
    }
    return true;
  }
  return false;
}

/* The pos thread: takes new waits, steps every wait as far as it goes, answers those that
 * reached their position or their deadline, then naps POS_POLL_MS. */
static void *pos_thread(void *arg) {
  cph_clog *l = arg;
  pos_wait *waits = NULL;
  pthread_mutex_lock(&l->mu);
  for (;;) {
    while (!l->stop && !waits && !(l->pos_new && l->ready))
      pthread_cond_wait(&l->cv, &l->mu);
    if (l->stop)
      break;
    if (l->ready)
      while (l->pos_new) {
        pos_wait *w = l->pos_new;
        l->pos_new = w->next;
        w->next = waits;
        waits = w;
      }
    pthread_mutex_unlock(&l->mu);
    pos_wait **pp = &waits;
    while (*pp) {
      pos_wait *w = *pp;
      if (w->fence_check || w->state_check) {
        uint64_t seq = 0;
        int rc = w->fence_check ? fence_read(l, w, &seq) : state_read(l, w, &seq);
        if (rc != CPH_EBUSY || cph_mono_ns() >= w->deadline_ns) {
          *pp = w->next;
          pos_answer(l, w, rc == CPH_EBUSY ? CPH_ETIMEDOUT : rc, seq, NULL);
        } else {
          pp = &w->next;
        }
        continue;
      }
      while (w->stage != POS_LOCAL || w->next_shard < l->shards)
        if (!pos_step(l, w) || stopping(l))
          break;
      bool reached = w->stage == POS_LOCAL && w->next_shard >= l->shards;
      if (reached || cph_mono_ns() >= w->deadline_ns) {
        *pp = w->next;
        if (reached) {
          pos_answer(l, w, CPH_OK, 0, NULL);
        } else {
          char why[160];
          snprintf(why, sizeof why, "log position %" PRIu64 " was not applied here in time (%s)",
                   w->pos,
                   w->stage == POS_SOURCE  ? "not in the log yet"
                   : w->stage == POS_ACKED ? "its shard's owner has not applied it yet"
                                           : "this node has not applied what it caused yet");
          pos_answer(l, w, CPH_ETIMEDOUT, 0, why);
        }
      } else {
        pp = &w->next;
      }
    }
    if (waits)
      nap(l, POS_POLL_MS);
    pthread_mutex_lock(&l->mu);
  }
  pthread_mutex_unlock(&l->mu);
  while (waits) {
    pos_wait *w = waits;
    waits = w->next;
    free(w);
  }
  return NULL;
}

/* ================================================================ trimming */

/* The version nats-server states in the INFO line it greets a client with, read from a
 * connection of our own to the server the log is connected to (libnats does not expose it).
 * False when it could not be read. */
static bool server_version(cph_clog *l, int *major, int *minor, int *patch) {
  char url[256] = "";
  if (natsConnection_GetConnectedUrl(l->nc, url, sizeof url) != NATS_OK || !url[0])
    return false;
  /* nats://[user:pass@]host:port */
  char *host = strstr(url, "://");
  host = host ? host + 3 : url;
  char *at = strrchr(host, '@');
  if (at)
    host = at + 1;
  char *colon = strrchr(host, ':');
  if (!colon || strchr(host, ']'))
    return false; /* no port, or an IPv6 literal: not worth parsing here */
  *colon = '\0';
  const char *port = colon + 1;
  struct addrinfo hints = {0}, *ai = NULL;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(host, port, &hints, &ai) != 0 || !ai)
    return false;
  int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
  bool ok = false;
  if (fd >= 0) {
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      char buf[4096];
      size_t n = 0;
      while (n < sizeof buf - 1) {
        ssize_t k = read(fd, buf + n, sizeof buf - 1 - n);
        if (k <= 0)
          break;
        n += (size_t)k;
        buf[n] = '\0';
        if (strstr(buf, "\r\n"))
          break;
      }
      buf[n] = '\0';
      json_t *info = strncmp(buf, "INFO ", 5) == 0 ? json_loads(buf + 5, JSON_DISABLE_EOF_CHECK,
                                                                NULL)
                                                     : NULL;
      const char *v = json_string_value(json_object_get(info, "version"));
      ok = v && sscanf(v, "%d.%d.%d", major, minor, patch) == 3;
      json_decref(info);
    }
    close(fd);
  }
  freeaddrinfo(ai);
  return ok;
}

/* Whether this node may purge (clusterlog.h, "Trimming"); sets l->trim_allowed once it knows.
 * The trim thread's own: the only writer of l->trim_allowed (under mu, which other threads read
 * it under). */
static bool trim_allowed(cph_clog *l) {
  if (l->trim_allowed)
    return l->trim_allowed > 0;
  if (l->replicas <= 1) { /* no Raft group under the stream: purges are applied directly */
    pthread_mutex_lock(&l->mu);
    l->trim_allowed = 1;
    pthread_mutex_unlock(&l->mu);
    return true;
  }
  int ma = 0, mi = 0, pa = 0;
  if (!server_version(l, &ma, &mi, &pa))
    return false; /* asked again at the next request */
  bool safe = ma != TRIM_SAFE_MAJOR   ? ma > TRIM_SAFE_MAJOR
              : mi != TRIM_SAFE_MINOR ? mi > TRIM_SAFE_MINOR
                                      : pa >= TRIM_SAFE_PATCH;
  pthread_mutex_lock(&l->mu);
  l->trim_allowed = safe ? 1 : -1;
  if (!safe)
    snprintf(l->trim_why, sizeof l->trim_why,
             "nats-server %d.%d.%d with :replicas %" PRId64 ": a filtered purge is not safe "
             "before %d.%d.%d (a restarted server would drop the stream's head)",
             ma, mi, pa, l->replicas, TRIM_SAFE_MAJOR, TRIM_SAFE_MINOR, TRIM_SAFE_PATCH);
  pthread_mutex_unlock(&l->mu);
  if (!safe)
    cph_warn("cluster log: the log is not trimmed: %s", l->trim_why);
  return safe;
}

/* Purges the messages of stream CEPH on `filter` below sequence `below` (JetStream's
 * STREAM.PURGE with filter and seq; js_PurgeStream does not return the count). The count
 * purged, or -1 with why set. */
static int64_t purge_below(cph_clog *l, const char *filter, uint64_t below, char *why,
                           size_t size) {
  char body[160];
  int len = snprintf(body, sizeof body, "{\"filter\":\"%s\",\"seq\":%" PRIu64 "}", filter, below);
  natsMsg *reply = NULL;
  natsStatus st = natsConnection_Request(&reply, l->nc, "$JS.API.STREAM.PURGE." CPH_CLOG_STREAM,
                                         body, len, TRIM_WAIT_MS);
  if (st != NATS_OK) {
    snprintf(why, size, "purging %s below %" PRIu64 ": %s", filter, below, natsStatus_GetText(st));
    return -1;
  }
  json_t *doc = json_loadb(natsMsg_GetData(reply), (size_t)natsMsg_GetDataLength(reply), 0, NULL);
  natsMsg_Destroy(reply);
  int64_t n = -1;
  if (json_is_true(json_object_get(doc, "success"))) {
    n = (int64_t)json_integer_value(json_object_get(doc, "purged"));
  } else {
    const char *e =
        json_string_value(json_object_get(json_object_get(doc, "error"), "description"));
    snprintf(why, size, "purging %s below %" PRIu64 ": %s", filter, below, e ? e : "no answer");
  }
  json_decref(doc);
  return n;
}

/* One shard's trim ("Trimming" in clusterlog.h): its in/fwd messages below the lower of
 * `below` and its consumer's ack floor + 1, its done marks below the lower of `below` and
 * `done_below`. The messages purged, or -1 with why set. */
static int64_t trim_shard(cph_clog *l, uint32_t shard, uint64_t below, uint64_t done_below,
                          char *why, size_t size) {
  char durable[32], filter[64];
  snprintf(durable, sizeof durable, "s%" PRIu32, shard);
  jsConsumerInfo *ci = NULL;
  jsErrCode jerr = 0;
  if (js_GetConsumerInfo(&ci, l->js, CPH_CLOG_STREAM, durable, NULL, &jerr) != NATS_OK) {
    snprintf(why, size, "consumer %s: %s", durable, nats_GetLastError(NULL));
    return -1;
  }
  uint64_t acked = ci->AckFloor.Stream;
  jsConsumerInfo_Destroy(ci);
  uint64_t events = below < acked + 1 ? below : acked + 1;
  int64_t total = 0;
  if (events > 1) {
    /* ceph.*.<shard>.> matches exactly the shard's in and fwd subjects in CEPH, and is no
     * subset of any consumer's filter (ceph.s.<shard>.>, ceph.s.done.<shard>): nats-server
     * before 2.9.15 drops every acknowledgement still pending of each consumer whose filter
     * contains a purge's subject (nats-server 6c9a9fb), so their unacknowledged messages would
     * never come again. A wider subject leaves the consumers alone, which is right here: only
     * messages at or below the consumer's ack floor go. */
    snprintf(filter, sizeof filter, "ceph.*.%" PRIu32 ".>", shard);
    int64_t n = purge_below(l, filter, events, why, size);
    if (n < 0)
      return -1;
    total += n;
  }
  uint64_t marks = below < done_below ? below : done_below;
  if (marks > 1) {
    cph_clog_done_subject(filter, sizeof filter, shard);
    int64_t n = purge_below(l, filter, marks, why, size);
    if (n < 0)
      return -1;
    total += n;
  }
  return total;
}

/* Deletes the item keys under job's prefix: a delete marker each. The keys deleted, or -1 with
 * why set. */
static int64_t forget_items(cph_clog *l, const forget_job *job, char *why, size_t size) {
  char filter[1200];
  snprintf(filter, sizeof filter, "%s.>", job->prefix);
  jsStreamInfo *si = state_keys(l, filter, why, size);
  if (!si)
    return -1;
  jsErrCode jerr = 0;
  int64_t n = 0;
  for (int i = 0; si->State.Subjects && i < si->State.Subjects->Count && n >= 0; i++) {
    natsMsg *m = NULL;
    jsPubAck *pa = NULL;
    natsStatus st = natsMsg_Create(&m, si->State.Subjects->List[i].Subject, NULL, NULL, 0);
    if (st == NATS_OK)
      st = natsMsgHeader_Set(m, "KV-Operation", "DEL");
    if (st == NATS_OK)
      st = js_PublishMsg(&pa, l->js, m, NULL, &jerr);
    if (st == NATS_OK)
      n++;
    else {
      snprintf(why, size, "deleting %.200s: %.80s", si->State.Subjects->List[i].Subject,
               nats_GetLastError(NULL));
      n = -1;
    }
    jsPubAck_Destroy(pa);
    natsMsg_Destroy(m);
  }
  jsStreamInfo_Destroy(si);
  return n;
}

/* Runs the forget jobs that are due (called with l->mu held; unlocks while it works). Those
 * that fail come again FORGET_RETRY_MS later. */
#define FORGET_RETRY_MS 5000
static void forgets_run(cph_clog *l) {
  int64_t now = cph_mono_ns();
  forget_job **at = &l->forgets, *due = NULL;
  while (*at) {
    forget_job *j = *at;
    if (j->due_ns <= now) {
      *at = j->next;
      j->next = due;
      due = j;
    } else {
      at = &j->next;
    }
  }
  while (due) {
    forget_job *j = due;
    due = j->next;
    pthread_mutex_unlock(&l->mu);
    char why[300] = "";
    int64_t n = forget_items(l, j, why, sizeof why);
    if (n < 0)
      cph_warn("cluster log: deleting the items of a deleted session (%s): %s (tried again "
               "in %d s)", j->prefix, why, FORGET_RETRY_MS / 1000);
    pthread_mutex_lock(&l->mu);
    if (n >= 0) {
      l->items_forgotten += (uint64_t)n;
      free(j->prefix);
      free(j);
    } else {
      l->forget_failures++;
      j->due_ns = cph_mono_ns() + (int64_t)FORGET_RETRY_MS * 1000000;
      j->next = l->forgets;
      l->forgets = j;
    }
  }
}

/* When the next forget job is due (INT64_MAX: none). */
static int64_t forgets_next(const cph_clog *l) {
  int64_t next = INT64_MAX;
  for (const forget_job *j = l->forgets; j; j = j->next)
    if (j->due_ns < next)
      next = j->due_ns;
  return next;
}

/* The trim thread: takes the newest request of each shard and purges, one shard at a time,
 * while this node still serves it; and deletes the item keys of deleted sessions when due. */
static void *trim_thread(void *arg) {
  cph_clog *l = arg;
  pthread_mutex_lock(&l->mu);
  for (;;) {
    while (!l->stop && !(l->ready && !l->quiesced &&
                         (l->trim_asked || forgets_next(l) <= cph_mono_ns()))) {
      int64_t next = l->ready && !l->quiesced ? forgets_next(l) : INT64_MAX;
      if (next == INT64_MAX) {
        pthread_cond_wait(&l->cv, &l->mu);
      } else {
        struct timespec until = {(time_t)(next / 1000000000), (long)(next % 1000000000)};
        pthread_cond_timedwait(&l->cv, &l->mu, &until);
      }
    }
    if (l->stop)
      break;
    forgets_run(l);
    if (!l->trim_asked)
      continue;
    l->trim_asked = false;
    for (uint32_t s = 0; s < l->shards && !l->stop && !l->quiesced; s++) {
      uint64_t below = l->trim_below[s], done_below = l->trim_done_below[s];
      if (!below)
        continue;
      l->trim_below[s] = l->trim_done_below[s] = 0;
      pthread_mutex_unlock(&l->mu);
      char node[8], url[8], why[256] = "";
      int64_t n = 0;
      bool go = trim_allowed(l) && cph_cluster_route(l->cluster, s, node, sizeof node, url,
                                                     sizeof url) == CPH_CLUSTER_SERVED;
      if (go && (n = trim_shard(l, s, below, done_below, why, sizeof why)) < 0)
        cph_warn("cluster log: trimming shard %" PRIu32 ": %s (tried again later)", s, why);
      pthread_mutex_lock(&l->mu);
      if (go && n >= 0) {
        l->trims++;
        l->trim_purged += (uint64_t)n;
      } else if (go) {
        l->trim_failures++;
      }
    }
  }
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

static void *log_thread(void *arg) {
  cph_clog *l = arg;
  while (!stopping(l)) {
    if (!l->nc && !connect_nats(l)) {
      nap(l, 500);
      continue;
    }
    if (!l->kv) {
      if (!ensure_stream(l) || !ensure_bucket(l)) {
        nap(l, 500);
        continue;
      }
      pthread_mutex_lock(&l->mu);
      l->ready = true;
      l->last_error[0] = '\0';
      pthread_cond_broadcast(&l->cv); /* the replay threads */
      pthread_mutex_unlock(&l->mu);
      cph_info("cluster log: ready (NATS %s, stream %s, bucket %s)", l->urls[0], CPH_CLOG_STREAM,
               CPH_CLOG_BUCKET);
    }
    pthread_mutex_lock(&l->mu);
    bool quiesced = l->quiesced;
    pthread_mutex_unlock(&l->mu);
    if (!quiesced) {
      sync_shards(l);
      refresh_undelivered(l);
    }
    read_watcher(l, SYNC_MS);
  }
  return NULL;
}

/* ================================================================ the loop's side */

int cph_clog_start(const cph_policy_cluster *cfg, int64_t dedupe_window_s,
                   struct cph_cluster *cluster, struct event_base *base,
                   const cph_clog_hooks *hooks, cph_clog **out, cph_err *err) {
  *out = NULL;
  if (cfg->nats_count == 0) {
    cph_err_set(err, CPH_EINVAL, ":cluster :nats lists no URL");
    return CPH_EINVAL;
  }
  cph_clog *l = calloc(1, sizeof *l);
  if (!l)
    goto nomem;
  l->pipe[0] = l->pipe[1] = -1;
  pthread_mutex_init(&l->mu, NULL);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&l->cv, &ca);
  pthread_condattr_destroy(&ca);
  l->node = strdup(cfg->node);
  const char *delay = getenv("CPH_TEST_TAKEOVER_DELAY_MS");
  l->test_takeover_delay_ms = delay ? atoi(delay) : 0;
  if (l->test_takeover_delay_ms > 0)
    cph_warn("cluster log: CPH_TEST_TAKEOVER_DELAY_MS: every takeover waits %d ms (for tests)",
             l->test_takeover_delay_ms);
  l->shards = (uint32_t)cfg->shards;
  l->replicas = cfg->replicas;
  l->dedupe_window_s = dedupe_window_s;
  l->cluster = cluster;
  l->hooks = *hooks;
  l->urls = calloc(cfg->nats_count, sizeof *l->urls);
  l->subs = calloc(l->shards, sizeof *l->subs);
  l->phase = calloc(l->shards, sizeof *l->phase);
  l->replay_gen = calloc(l->shards, sizeof *l->replay_gen);
  l->replay_after_ns = calloc(l->shards, sizeof *l->replay_after_ns);
  l->is_bound = calloc(l->shards, sizeof *l->is_bound);
  l->trim_below = calloc(l->shards, sizeof *l->trim_below);
  l->trim_done_below = calloc(l->shards, sizeof *l->trim_done_below);
  if (!l->node || !l->urls || !l->subs || !l->phase || !l->replay_gen || !l->replay_after_ns ||
      !l->is_bound || !l->trim_below || !l->trim_done_below)
    goto nomem;
  for (size_t i = 0; i < cfg->nats_count; i++, l->n_urls++)
    if (!(l->urls[i] = strdup(cfg->nats[i])))
      goto nomem;
  if (pipe(l->pipe) != 0)
    goto io;
  fcntl(l->pipe[0], F_SETFL, O_NONBLOCK);
  fcntl(l->pipe[1], F_SETFL, O_NONBLOCK);
  fcntl(l->pipe[0], F_SETFD, FD_CLOEXEC);
  fcntl(l->pipe[1], F_SETFD, FD_CLOEXEC);
  l->ev_queue = event_new(base, l->pipe[0], EV_READ | EV_PERSIST, on_queue, l);
  if (!l->ev_queue || event_add(l->ev_queue, NULL) != 0)
    goto io;
  if (nats_Open(-1) != NATS_OK)
    goto io;
  if (pthread_create(&l->thread, NULL, log_thread, l) != 0)
    goto io;
  l->started = true;
  for (; l->n_replay_threads < REPLAY_THREADS; l->n_replay_threads++)
    if (pthread_create(&l->replay_threads[l->n_replay_threads], NULL, replay_thread, l) != 0)
      goto io;
  if (pthread_create(&l->pos_thread, NULL, pos_thread, l) != 0)
    goto io;
  l->pos_started = true;
  if (pthread_create(&l->trim_thread, NULL, trim_thread, l) != 0)
    goto io;
  l->trim_started = true;
  *out = l;
  return CPH_OK;
nomem:
  cph_clog_stop(l);
  cph_err_set(err, CPH_ENOMEM, "out of memory starting the cluster log");
  return CPH_ENOMEM;
io:
  cph_clog_stop(l);
  cph_err_set(err, CPH_EIO, "cannot start the cluster log: %s", strerror(errno));
  return CPH_EIO;
}

void cph_clog_quiesce(cph_clog *l) {
  if (!l)
    return;
  pthread_mutex_lock(&l->mu);
  bool was = l->quiesced;
  l->quiesced = true;
  item *it = l->head;
  l->head = l->tail = NULL;
  pthread_mutex_unlock(&l->mu);
  if (was)
    return;
  while (it) { /* not acknowledged: the next owner gets them */
    item *next = it->next;
    if (it->kind == ITEM_MSG)
      cph_clog_release(l, it->msg);
    cph_clog_replay_free(it->replay);
    free(it->why);
    free(it->session);
    free(it->value);
    free(it);
    it = next;
  }
}

/* How long a stop waits for the connection's closed callback, and for libnats's threads (its
 * timers, the asynchronous publishes' handler, message delivery) to end. A thread still
 * running at exit races the process's end: in one clean-clone CI run two sanitized daemons
 * whose stops took ~500 ms longer than usual (the old wait) exited by abort (134) — likely
 * LeakSanitizer's scan at exit meeting such a thread (not reproduced since). A normal stop's
 * threads end in a few milliseconds. */
#define CLOSE_WAIT_MS 5000

void cph_clog_stop(cph_clog *l) {
  if (!l)
    return;
  cph_clog_quiesce(l);
  pthread_mutex_lock(&l->mu);
  l->stop = true;
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
  if (l->started)
    pthread_join(l->thread, NULL);
  for (size_t i = 0; i < l->n_replay_threads; i++)
    pthread_join(l->replay_threads[i], NULL);
  if (l->pos_started)
    pthread_join(l->pos_thread, NULL);
  if (l->trim_started)
    pthread_join(l->trim_thread, NULL);
  while (l->pos_new) {
    pos_wait *w = l->pos_new;
    l->pos_new = w->next;
    free(w);
  }
  while (l->replay_head) {
    replay_req *rq = l->replay_head;
    l->replay_head = rq->next;
    replay_req_free(rq);
  }
  if (l->watcher) {
    kvWatcher_Stop(l->watcher);
    kvWatcher_Destroy(l->watcher);
  }
  kvStore_Destroy(l->kv);
  kvStore_Destroy(l->kv_marks);
  kvStore_Destroy(l->kv_states);
  for (uint32_t s = 0; l->subs && s < l->shards; s++)
    if (l->subs[s].sub) {
      natsSubscription_Unsubscribe(l->subs[s].sub);
      natsSubscription_Destroy(l->subs[s].sub);
    }
  for (size_t i = 0; i < l->n_graveyard; i++)
    natsSubscription_Destroy(l->graveyard[i]);
  free(l->graveyard);
  bool callbacks_done = true;
  if (l->nc) {
    natsConnection_Close(l->nc);
    /* its disconnected callback may still be under way on libnats's thread: wait for the
     * closed one, which comes after it (without it, ASan saw on_disconnected write into
     * the freed log at a stop) */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += CLOSE_WAIT_MS / 1000;
    pthread_mutex_lock(&l->mu);
    while (!l->nc_closed &&
           pthread_cond_timedwait(&l->cv, &l->mu, &until) != ETIMEDOUT) {
    }
    callbacks_done = l->nc_closed;
    pthread_mutex_unlock(&l->mu);
  }
  jsCtx_Destroy(l->js);
  natsConnection_Destroy(l->nc);
  if (l->ev_queue)
    event_free(l->ev_queue);
  /* Items that came in after quiesce were dropped by push_item. */
  if (l->pipe[0] >= 0)
    close(l->pipe[0]);
  if (l->pipe[1] >= 0)
    close(l->pipe[1]);
  for (size_t i = 0; i < l->n_urls; i++)
    free(l->urls[i]);
  free(l->urls);
  free(l->subs);
  free(l->phase);
  free(l->replay_gen);
  free(l->replay_after_ns);
  free(l->is_bound);
  free(l->trim_below);
  free(l->trim_done_below);
  while (l->forgets) {
    forget_job *j = l->forgets;
    l->forgets = j->next;
    free(j->prefix);
    free(j);
  }
  free(l->node);
  if (!callbacks_done) { /* a callback may still come: the log's struct stays (exiting) */
    cph_warn("cluster log: NATS did not report the connection closed within %d ms",
             CLOSE_WAIT_MS);
    return;
  }
  pthread_cond_destroy(&l->cv);
  pthread_mutex_destroy(&l->mu);
  free(l);
}

void cph_clog_close_library(void) {
  natsStatus s = nats_CloseAndWait(CLOSE_WAIT_MS);
  if (s != NATS_OK)
    cph_warn("cluster log: libnats's threads did not end within %d ms (%s); exiting anyway",
             CLOSE_WAIT_MS, natsStatus_GetText(s));
}

void cph_clog_subject(char *buf, size_t size, uint32_t shard, bool fwd) {
  snprintf(buf, size, "ceph.s.%" PRIu32 ".%s", shard, fwd ? "fwd" : "in");
}

void cph_clog_done_subject(char *buf, size_t size, uint32_t shard) {
  snprintf(buf, size, "ceph.s.done.%" PRIu32, shard);
}

void cph_clog_mark_subject(char *buf, size_t size, uint32_t shard) {
  snprintf(buf, size, "$KV.%s.%" PRIu32, CPH_CLOG_MARKS, shard);
}

void cph_clog_rebuilt(cph_clog *l, uint32_t shard, uint64_t gen) {
  pthread_mutex_lock(&l->mu);
  if (shard < l->shards && l->phase[shard] == PHASE_APPLYING && l->replay_gen[shard] == gen)
    phase_leave(l, shard, PHASE_READY);
  pthread_mutex_unlock(&l->mu);
}

void cph_clog_rebuild_failed(cph_clog *l, uint32_t shard, uint64_t gen) {
  pthread_mutex_lock(&l->mu);
  if (shard < l->shards && l->phase[shard] == PHASE_APPLYING && l->replay_gen[shard] == gen) {
    phase_leave(l, shard, PHASE_NONE);
    l->replay_after_ns[shard] = cph_mono_ns() + (int64_t)REPLAY_RETRY_MS * 1000000;
  }
  pthread_mutex_unlock(&l->mu);
}

/* Appends session's id in hex to the n bytes of buf already written (n < 0: snprintf failed).
 * CPH_ELIMIT when it does not fit in size. */
static int append_hex_id(char *buf, size_t size, int n, const char *session) {
  static const char hex[] = "0123456789abcdef";
  size_t sl = strlen(session);
  if (n < 0 || (size_t)n + 2 * sl + 1 > size)
    return CPH_ELIMIT;
  for (size_t i = 0; i < sl; i++) {
    buf[n++] = hex[(unsigned char)session[i] >> 4];
    buf[n++] = hex[(unsigned char)session[i] & 15];
  }
  buf[n] = '\0';
  return CPH_OK;
}

int cph_clog_session_subject(char *buf, size_t size, const char *session) {
  return append_hex_id(buf, size, snprintf(buf, size, "$KV.%s.", CPH_CLOG_BUCKET), session);
}

int cph_clog_state_subject(char *buf, size_t size, uint32_t shard, const char *session) {
  return append_hex_id(
      buf, size, snprintf(buf, size, "$KV.%s.%" PRIu32 ".", CPH_CLOG_STATES, shard), session);
}

int cph_clog_item_subject(char *buf, size_t size, uint32_t shard, const char *session,
                          const char *name) {
  int rc = cph_clog_state_subject(buf, size, shard, session);
  size_t n = strlen(buf);
  if (rc == CPH_OK && n + 1 + strlen(name) + 1 > size)
    rc = CPH_ELIMIT;
  if (rc == CPH_OK)
    snprintf(buf + n, size - n, ".%s", name);
  return rc;
}

int cph_clog_forget_items(cph_clog *l, uint32_t shard, const char *session) {
  char prefix[1024];
  if (cph_clog_state_subject(prefix, sizeof prefix, shard, session) != CPH_OK)
    return CPH_EINVAL;
  /* twice: at once, and once the item puts still in flight have ended */
  forget_job *j[2] = {calloc(1, sizeof *j[0]), calloc(1, sizeof *j[1])};
  for (int k = 0; k < 2; k++)
    if (!j[k] || !(j[k]->prefix = strdup(prefix))) {
      for (int i = 0; i < 2; i++)
        if (j[i])
          free(j[i]->prefix);
      free(j[0]);
      free(j[1]);
      return CPH_ENOMEM;
    }
  int64_t now = cph_mono_ns();
  j[0]->due_ns = now;
  j[1]->due_ns = now + (int64_t)CPH_CLOG_FORGET_DELAY_MS * 1000000;
  pthread_mutex_lock(&l->mu);
  j[1]->next = l->forgets;
  j[0]->next = j[1];
  l->forgets = j[0];
  pthread_cond_broadcast(&l->cv);
  pthread_mutex_unlock(&l->mu);
  return CPH_OK;
}

/* Under mu: cph_clog_max_payload. */
static int64_t data_room_locked(const cph_clog *l) {
  return l->max_payload > CPH_CLOG_HEADER_ROOM ? l->max_payload - CPH_CLOG_HEADER_ROOM : 0;
}

int64_t cph_clog_max_payload(cph_clog *l) {
  pthread_mutex_lock(&l->mu);
  int64_t room = data_room_locked(l);
  pthread_mutex_unlock(&l->mu);
  return room;
}

int cph_clog_publish(cph_clog *l, const char *subject, const char *msgid, const void *data,
                     size_t len, bool kv_delete, int64_t max_wait_ms, uint64_t ref,
                     uint64_t expect) {
  pthread_mutex_lock(&l->mu);
  bool ok = l->ready && !l->quiesced && l->in_flight < MAX_IN_FLIGHT;
  int64_t room = data_room_locked(l);
  bool too_large = room && (int64_t)len > room;
  if (ok && !too_large)
    l->in_flight++;
  pthread_mutex_unlock(&l->mu);
  if (too_large)
    return CPH_ELIMIT;
  if (!ok)
    return CPH_EBUSY;
  natsMsg *m = NULL;
  char refs[24];
  snprintf(refs, sizeof refs, "%" PRIu64, ref);
  natsStatus s = natsMsg_Create(&m, subject, NULL, data, (int)len);
  if (s == NATS_OK)
    s = natsMsgHeader_Set(m, REF_HEADER, refs);
  if (s == NATS_OK && kv_delete)
    s = natsMsgHeader_Set(m, "KV-Operation", "DEL");
  if (s == NATS_OK && expect != CPH_CLOG_NO_EXPECT) {
    char e[24];
    snprintf(e, sizeof e, "%" PRIu64, expect);
    s = natsMsgHeader_Set(m, EXPECT_HEADER, e);
  }
  jsPubOptions po;
  jsPubOptions_Init(&po);
  po.MsgId = msgid;
  po.MaxWait = max_wait_ms < 50                ? 50
               : max_wait_ms > PUB_MAX_WAIT_MS ? PUB_MAX_WAIT_MS
                                               : max_wait_ms;
  if (s == NATS_OK)
    s = js_PublishMsgAsync(l->js, &m, &po);
  if (s != NATS_OK) {
    natsMsg_Destroy(m); /* NULL once the library took it */
    pthread_mutex_lock(&l->mu);
    l->in_flight--;
    pthread_mutex_unlock(&l->mu);
    set_error(l, "publish to %s: %s", subject, natsStatus_GetText(s));
    return s == NATS_NO_MEMORY ? CPH_ENOMEM : s == NATS_MAX_PAYLOAD ? CPH_ELIMIT : CPH_EBUSY;
  }
  pthread_mutex_lock(&l->mu);
  l->published++;
  pthread_mutex_unlock(&l->mu);
  return CPH_OK;
}

/* A delivered message leaves this node's hands. */
static void let_go(cph_clog *l) {
  pthread_mutex_lock(&l->mu);
  l->held--;
  pthread_mutex_unlock(&l->mu);
}

void cph_clog_ack(cph_clog *l, cph_clog_msg *m) {
  natsMsg_Ack(m->nats, NULL); /* fire and forget: a lost ack means one more delivery */
  natsMsg_Destroy(m->nats);
  if (m->decoded)
    l->hooks.discard(m->decoded);
  free(m);
  let_go(l);
}

void cph_clog_release(cph_clog *l, cph_clog_msg *m) {
  natsMsg_Destroy(m->nats);
  if (m->decoded)
    l->hooks.discard(m->decoded);
  free(m);
  let_go(l);
}

/* Under mu: messages of the shards bound here that this node has not applied — not yet
 * delivered, or delivered and not yet acknowledged. */
static uint64_t lag_locked(const cph_clog *l) {
  uint64_t lag = l->held;
  for (uint32_t s = 0; l->is_bound && s < l->shards; s++)
    if (l->is_bound[s])
      lag += l->subs[s].undelivered;
  return lag;
}

void cph_clog_get_stats(cph_clog *l, cph_clog_stats *out) {
  pthread_mutex_lock(&l->mu);
  out->ready = l->ready && l->connected;
  out->bound = l->bound;
  out->published = l->published;
  out->delivered = l->delivered;
  out->in_flight = l->in_flight;
  out->rebuilding = l->replaying;
  out->lag = lag_locked(l);
  out->trim_allowed = l->trim_allowed;
  out->trims = l->trims;
  out->trim_purged = l->trim_purged;
  out->trim_failures = l->trim_failures;
  out->items_forgotten = l->items_forgotten;
  out->forget_failures = l->forget_failures;
  pthread_mutex_unlock(&l->mu);
}

int cph_clog_trim(cph_clog *l, uint32_t shard, uint64_t below, uint64_t done_below) {
  if (shard >= l->shards || below <= 1)
    return CPH_EINVAL;
  pthread_mutex_lock(&l->mu);
  bool ok = l->ready && !l->quiesced && !l->stop && l->trim_allowed >= 0;
  if (ok) {
    l->trim_below[shard] = below;
    l->trim_done_below[shard] = done_below;
    l->trim_asked = true;
    pthread_cond_broadcast(&l->cv);
  }
  pthread_mutex_unlock(&l->mu);
  return ok ? CPH_OK : CPH_EBUSY;
}

bool cph_clog_ready(cph_clog *l) {
  pthread_mutex_lock(&l->mu);
  bool r = l->ready && l->connected;
  pthread_mutex_unlock(&l->mu);
  return r;
}

json_t *cph_clog_json(cph_clog *l) {
  pthread_mutex_lock(&l->mu);
  const char *state = !l->ready ? "connecting" : l->connected ? "ready" : "reconnecting";
  json_t *o = json_pack("{sssssIsIsIsIsIsIss}", "state", state, "stream", CPH_CLOG_STREAM,
                        "replicas", (json_int_t)l->replicas, "shards_bound", (json_int_t)l->bound,
                        "published", (json_int_t)l->published, "delivered",
                        (json_int_t)l->delivered, "in_flight", (json_int_t)l->in_flight, "lag",
                        (json_int_t)lag_locked(l), "last_error", l->last_error);
  if (o)
    json_object_set_new(
        o, "trim",
        json_pack("{sssIsIsIss}", "state",
                  l->trim_allowed > 0    ? "trimming"
                  : l->trim_allowed < 0 ? "refused"
                                        : "unchecked",
                  "purges", (json_int_t)l->trims, "purged_messages", (json_int_t)l->trim_purged,
                  "failures", (json_int_t)l->trim_failures, "refused_why", l->trim_why));
  pthread_mutex_unlock(&l->mu);
  return o;
}

static int pos_queue(cph_clog *l, pos_wait *w) {
  pthread_mutex_lock(&l->mu);
  bool ok = l->ready && !l->quiesced && !l->stop;
  if (ok) {
    w->next = l->pos_new;
    l->pos_new = w;
    pthread_cond_broadcast(&l->cv);
  }
  pthread_mutex_unlock(&l->mu);
  if (!ok) {
    free(w);
    return CPH_EBUSY;
  }
  return CPH_OK;
}

int cph_clog_check_fence(cph_clog *l, uint32_t shard, const char *mark_prefix, int64_t wait_ms,
                         uint64_t ref) {
  pos_wait *w = calloc(1, sizeof *w);
  if (!w)
    return CPH_ENOMEM;
  w->ref = ref;
  w->shard = shard;
  w->fence_check = true;
  snprintf(w->prefix, sizeof w->prefix, "%s", mark_prefix);
  w->deadline_ns = cph_mono_ns() + wait_ms * 1000000;
  return pos_queue(l, w);
}

int cph_clog_check_state(cph_clog *l, const char *subject, uint64_t epoch, int64_t wait_ms,
                         uint64_t ref) {
  pos_wait *w = calloc(1, sizeof *w);
  if (!w)
    return CPH_ENOMEM;
  if (strlen(subject) >= sizeof w->prefix) {
    free(w);
    return CPH_ELIMIT;
  }
  w->ref = ref;
  w->pos = epoch;
  w->state_check = true;
  snprintf(w->prefix, sizeof w->prefix, "%s", subject);
  w->deadline_ns = cph_mono_ns() + wait_ms * 1000000;
  return pos_queue(l, w);
}

int cph_clog_wait_pos(cph_clog *l, uint64_t pos, int64_t shard, const uint8_t *only,
                      int64_t wait_ms, uint64_t ref) {
  size_t bytes = only && shard < 0 ? (l->shards + 7) / 8 : 0;
  pos_wait *w = calloc(1, sizeof *w + bytes);
  if (!w)
    return CPH_ENOMEM;
  w->ref = ref;
  w->pos = pos;
  w->shard = shard >= 0 && shard < (int64_t)l->shards ? shard : -1;
  if (bytes) {
    w->masked = true;
    memcpy(w->only, only, bytes);
  }
  w->deadline_ns = cph_mono_ns() + wait_ms * 1000000;
  w->stage = POS_SOURCE;
  return pos_queue(l, w);
}
