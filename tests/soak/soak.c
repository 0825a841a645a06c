/* cephalon-soak: sustained traffic against the real cephalond on loopback (`make soak`).
 *
 *   cephalon-soak [--duration S] [--sessions N] [--rate EVENTS_PER_S] [--workers N]
 *                 [--warmup S] [--sync always|batch|none]
 *
 * Starts $CPH_BIN_DIR/cephalond with a temp data dir, creates N sessions (default 10,000; each
 * subscribes to its own channel), then for S seconds (default 300) drives, over kept-alive
 * connections: producers posting events to random channels at RATE, workers leasing and
 * completing turns (some minting a memory, so maintenance embeds them), a connector
 * long-polling the replies stream, and a prober making short-lived read requests (new
 * connections each time).
 *
 * Every 10 s it samples the daemon's memory (/proc/PID/status: VmRSS, RssAnon, RssFile) and
 * open descriptors (/proc/PID/fd), and every minute the p99 lease latency (leases answered with
 * a turn). It prints the figures and exits non-zero when, after the warm-up, resident memory
 * grows by more than 10%, descriptors grow, the p99 of the last minute is more than twice the
 * first post-warm-up minute's (and more than 2 ms above it), a request fails, or the daemon
 * does not stop cleanly.
 *
 * The memory gate uses VmRSS - RssFile (the daemon's own anonymous memory): RssFile counts the
 * pages of the LMDB map the daemon has touched, which grows with the stored data (nothing is
 * deleted within a soak) and is the kernel's page cache, not the process's memory. VmRSS is
 * printed too. Traffic goes to 127.0.0.1 only. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "tests/support/daemon.h"
#include "tests/support/hclient.h"
#include "tests/support/testutil.h"

#define SAMPLE_S 10
#define MAX_SAMPLES 4096
#define MAX_MINUTES 1024
#define RSS_GROWTH_MAX 0.10
#define P99_DRIFT_MAX 2.0
#define P99_NOISE_MS 2.0
#define FD_SLACK 2

typedef struct options {
  int duration_s, sessions, rate, workers, warmup_s;
  const char *sync;
} options;

static options opt = {300, 10000, 400, 12, 60, "batch"};
static int g_port;
static atomic_bool g_stop;

/* ---------------------------------------------------------------- counters */

static atomic_long n_events, n_turns, n_replies, n_probes, n_memories;
static atomic_long n_errors;
static char g_first_error[512];
static pthread_mutex_t g_err_mu = PTHREAD_MUTEX_INITIALIZER;

static void soak_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void soak_error(const char *fmt, ...) {
  atomic_fetch_add(&n_errors, 1);
  pthread_mutex_lock(&g_err_mu);
  if (!g_first_error[0]) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_first_error, sizeof g_first_error, fmt, ap);
    va_end(ap);
  }
  pthread_mutex_unlock(&g_err_mu);
}

/* Lease latencies (ms) of leases answered with a turn, per minute of the run. */
typedef struct lat_bucket {
  double *v;
  size_t n, cap;
} lat_bucket;
static lat_bucket g_lat[MAX_MINUTES];      /* leases answered with a turn */
static lat_bucket g_lat_done[MAX_MINUTES]; /* completions: the daemon's service time */
static pthread_mutex_t g_lat_mu = PTHREAD_MUTEX_INITIALIZER;
static int64_t g_t0_ms;

static void note_latency(lat_bucket *buckets, double ms) {
  int64_t minute = (cph_hc_now_ms() - g_t0_ms) / 60000;
  if (minute < 0 || minute >= MAX_MINUTES)
    return;
  pthread_mutex_lock(&g_lat_mu);
  lat_bucket *b = &buckets[minute];
  if (b->n == b->cap) {
    size_t cap = b->cap ? b->cap * 2 : 4096;
    double *p = realloc(b->v, cap * sizeof *p);
    if (p) {
      b->v = p;
      b->cap = cap;
    }
  }
  if (b->n < b->cap)
    b->v[b->n++] = ms;
  pthread_mutex_unlock(&g_lat_mu);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double percentile(lat_bucket *b, double p) {
  if (!b->n)
    return 0;
  qsort(b->v, b->n, sizeof *b->v, cmp_double);
  size_t i = (size_t)(p * (double)(b->n - 1) + 0.5);
  return b->v[i < b->n ? i : b->n - 1];
}

/* ---------------------------------------------------------------- a kept-alive connection */

typedef struct kconn {
  int fd;
  char *buf;
  size_t cap;
} kconn;

static void kc_close(kconn *c) {
  if (c->fd >= 0)
    close(c->fd);
  c->fd = -1;
}

static int send_all(int fd, const char *p, size_t len) {
  while (len) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

/* One request on c (reconnecting when needed); the answer's body stays in c->buf (*body,
 * *body_len). Returns the HTTP status, or -1. */
static int kc_request(kconn *c, const char *method, const char *path, const char *body,
                      const char **resp, size_t *resp_len) {
  for (int attempt = 0; attempt < 2; attempt++) {
    if (c->fd < 0 && (c->fd = cph_hc_connect(g_port, 40000)) < 0)
      return -1;
    size_t blen = body ? strlen(body) : 0;
    char head[512];
    int hn = snprintf(head, sizeof head,
                      "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n"
                      "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
                      method, path, blen);
    if (send_all(c->fd, head, (size_t)hn) || (blen && send_all(c->fd, body, blen))) {
      kc_close(c);
      continue; /* the server closed an idle connection: once more on a new one */
    }
    size_t len = 0, head_end = 0, content_length = 0;
    int status = -1;
    bool closing = false;
    for (;;) {
      if (c->cap - len < 4096) {
        size_t cap = c->cap ? c->cap * 2 : 65536;
        char *p = realloc(c->buf, cap);
        if (!p)
          return -1;
        c->buf = p;
        c->cap = cap;
      }
      ssize_t n = recv(c->fd, c->buf + len, c->cap - len - 1, 0);
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0)
        break;
      len += (size_t)n;
      c->buf[len] = '\0';
      if (!head_end) {
        char *sep = strstr(c->buf, "\r\n\r\n");
        if (!sep)
          continue;
        head_end = (size_t)(sep - c->buf) + 4;
        status = atoi(c->buf + 9);
        for (char *line = c->buf; line < sep;) {
          char *eol = strstr(line, "\r\n");
          if (strncasecmp(line, "Content-Length:", 15) == 0)
            content_length = strtoul(line + 15, NULL, 10);
          if (strncasecmp(line, "Connection:", 11) == 0) {
            const char *v = line + 11;
            while (*v == ' ')
              v++;
            closing = strncasecmp(v, "close", 5) == 0;
          }
          line = eol + 2;
        }
      }
      if (head_end && len >= head_end + content_length) {
        *resp = c->buf + head_end;
        *resp_len = content_length;
        c->buf[head_end + content_length] = '\0';
        if (closing)
          kc_close(c);
        return status;
      }
    }
    kc_close(c);
    if (attempt == 0 && len == 0)
      continue; /* closed before answering: a kept-alive connection that timed out */
    return -1;
  }
  return -1;
}

/* ---------------------------------------------------------------- traffic */

static const char *const WORDS[] = {
    "amber",  "basalt", "cobalt", "dune",   "ember",  "fjord",  "garnet", "harbor",
    "indigo", "jasper", "kelp",   "lagoon", "marble", "nectar", "onyx",   "pollen",
    "quartz", "russet", "saffron", "tundra", "umber", "velvet", "willow", "zephyr",
    "anchor", "bramble", "canyon", "delta", "echo",  "falcon", "glacier", "heron",
    "island", "juniper", "kestrel", "lantern", "meadow", "nimbus", "orchid", "prairie",
    "quiver", "raven",  "summit", "thistle", "upland", "valley", "walnut", "yarrow"};
enum { N_WORDS = sizeof WORDS / sizeof WORDS[0] };

/* A message body unlike the others (so dedupe rarely folds it into a family). */
static void message_body(cph_hc_rng *rng, long n, char *out, size_t size) {
  size_t used = (size_t)snprintf(out, size, "m%ld", n);
  for (int i = 0; i < 8 && used < size; i++)
    used += (size_t)snprintf(out + used, size - used, " %s",
                             WORDS[cph_hc_rand_range(rng, 0, N_WORDS - 1)]);
}

static void *producer(void *arg) {
  int idx = (int)(intptr_t)arg;
  cph_hc_rng rng = {0x50a4 + (uint64_t)idx};
  kconn c = {-1, NULL, 0};
  int per_thread = opt.rate / 2 > 0 ? opt.rate / 2 : 1;
  const int batch = 10;
  double interval_ms = 1000.0 * batch / per_thread;
  double next = (double)cph_hc_now_ms();
  long n = 0;
  char json[8192];
  while (!atomic_load(&g_stop)) {
    size_t used = (size_t)snprintf(json, sizeof json, "{\"events\":[");
    for (int i = 0; i < batch; i++, n++) {
      char text[256];
      message_body(&rng, n * 2 + idx, text, sizeof text);
      used += (size_t)snprintf(json + used, sizeof json - used,
                               "%s{\"channel\":\"ch%d\",\"sender\":\"user%d\",\"body\":\"%s\"}",
                               i ? "," : "", (int)cph_hc_rand_range(&rng, 0, opt.sessions - 1),
                               (int)cph_hc_rand_range(&rng, 0, 99), text);
    }
    snprintf(json + used, sizeof json - used, "]}");
    const char *resp;
    size_t rlen;
    int st = kc_request(&c, "POST", "/v1/events", json, &resp, &rlen);
    if (st == 200)
      atomic_fetch_add(&n_events, batch);
    else
      soak_error("ingest answered %d", st);
    next += interval_ms;
    double now = (double)cph_hc_now_ms();
    if (next > now)
      cph_hc_sleep_ms((int)(next - now));
    else if (now - next > 2000)
      next = now; /* fell behind: do not burst to catch up */
  }
  kc_close(&c);
  free(c.buf);
  return NULL;
}

static void *worker(void *arg) {
  int idx = (int)(intptr_t)arg;
  cph_hc_rng rng = {0x3017 + (uint64_t)idx};
  kconn c = {-1, NULL, 0};
  char body[512], path[96];
  snprintf(body, sizeof body, "{\"worker\":\"soak-%d\",\"wait_ms\":1000}", idx);
  while (!atomic_load(&g_stop)) {
    const char *resp;
    size_t rlen;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    int st = kc_request(&c, "POST", "/v1/turns/lease", body, &resp, &rlen);
    clock_gettime(CLOCK_MONOTONIC, &b);
    if (st == 204)
      continue;
    if (st != 200) {
      soak_error("lease answered %d", st);
      cph_hc_sleep_ms(100);
      continue;
    }
    note_latency(g_lat, (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6);
    json_t *j = json_loadb(resp, rlen, 0, NULL);
    json_t *turn = json_object_get(j, "turn");
    long long id = (long long)json_integer_value(json_object_get(turn, "id"));
    char lease[40];
    snprintf(lease, sizeof lease, "%s", json_string_value(json_object_get(turn, "lease")));
    json_decref(j);
    bool memory = cph_hc_rand_range(&rng, 0, 19) == 0;
    char done[512];
    snprintf(done, sizeof done,
             "{\"lease\":\"%s\",\"cost\":{\"tokens\":%d,\"tool_calls\":%d},"
             "\"reply\":{\"body\":\"answer to turn %lld\"}%s}",
             lease, (int)cph_hc_rand_range(&rng, 10, 500), (int)cph_hc_rand_range(&rng, 0, 1), id,
             memory ? ",\"memories\":[{\"text\":\"the user prefers short answers about soak "
                      "testing\"}]" : "");
    snprintf(path, sizeof path, "/v1/turns/%lld/complete", id);
    clock_gettime(CLOCK_MONOTONIC, &a);
    st = kc_request(&c, "POST", path, done, &resp, &rlen);
    clock_gettime(CLOCK_MONOTONIC, &b);
    note_latency(g_lat_done, (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6);
    if (st == 200) {
      atomic_fetch_add(&n_turns, 1);
      if (memory)
        atomic_fetch_add(&n_memories, 1);
    } else {
      soak_error("complete of turn %lld answered %d", id, st);
    }
  }
  kc_close(&c);
  free(c.buf);
  return NULL;
}

static void *connector(void *arg) {
  (void)arg;
  kconn c = {-1, NULL, 0};
  long long after = 0;
  while (!atomic_load(&g_stop)) {
    char path[128];
    snprintf(path, sizeof path, "/v1/replies?after=%lld&wait_ms=1000&limit=1000", after);
    const char *resp;
    size_t rlen;
    int st = kc_request(&c, "GET", path, NULL, &resp, &rlen);
    if (st != 200) {
      soak_error("replies answered %d", st);
      cph_hc_sleep_ms(100);
      continue;
    }
    json_t *j = json_loadb(resp, rlen, 0, NULL);
    atomic_fetch_add(&n_replies, (long)json_array_size(json_object_get(j, "replies")));
    long long next = (long long)json_integer_value(json_object_get(j, "next"));
    if (next > after)
      after = next;
    json_decref(j);
  }
  kc_close(&c);
  free(c.buf);
  return NULL;
}

/* Short-lived connections: every request opens and closes its own. */
static void *prober(void *arg) {
  (void)arg;
  cph_hc_rng rng = {0x9a0b};
  while (!atomic_load(&g_stop)) {
    char path[128];
    int s = (int)cph_hc_rand_range(&rng, 0, opt.sessions - 1);
    switch (cph_hc_rand_range(&rng, 0, 4)) {
    case 0: snprintf(path, sizeof path, "/v1/sessions/s%d", s); break;
    case 1: snprintf(path, sizeof path, "/v1/sessions/s%d/why", s); break;
    case 2: snprintf(path, sizeof path, "/v1/lanes"); break;
    case 3: snprintf(path, sizeof path, "/v1/channels/ch%d", s); break;
    default: snprintf(path, sizeof path, "/healthz"); break;
    }
    int st;
    json_decref(cph_hc_call(g_port, NULL, &st, "GET", path, NULL));
    if (st != 200)
      soak_error("GET %s answered %d", path, st);
    atomic_fetch_add(&n_probes, 1);
    cph_hc_sleep_ms(50);
  }
  return NULL;
}

/* ---------------------------------------------------------------- the daemon's figures */

typedef struct sample {
  int t_s;
  long vm_rss_kb, rss_anon_kb, rss_file_kb;
  int fds;
  long events, turns;
} sample;

static long status_kb(const char *status, const char *key) {
  const char *p = strstr(status, key);
  return p ? strtol(p + strlen(key), NULL, 10) : -1;
}

static bool take_sample(pid_t pid, sample *s) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  char *status = cph_test_read_file(path, NULL);
  if (!status)
    return false;
  s->vm_rss_kb = status_kb(status, "VmRSS:");
  s->rss_anon_kb = status_kb(status, "RssAnon:");
  s->rss_file_kb = status_kb(status, "RssFile:");
  free(status);
  snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
  DIR *d = opendir(path);
  if (!d)
    return false;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));)
    n += e->d_name[0] != '.';
  closedir(d);
  s->fds = n;
  return true;
}

/* ---------------------------------------------------------------- main */

static void usage(void) {
  fprintf(stderr, "usage: cephalon-soak [--duration S] [--sessions N] [--rate EVENTS_PER_S] "
                  "[--workers N] [--warmup S] [--sync always|batch|none]\n");
}

/* The sessions, then one event on every channel: what each session and channel keeps in
 * memory exists before the warm-up ends, so growth after it is not first use. */
static bool create_sessions(void) {
  kconn c = {-1, NULL, 0};
  bool ok = true;
  for (int i = 0; i < opt.sessions && ok; i++) {
    char body[160];
    snprintf(body, sizeof body,
             "{\"id\":\"s%d\",\"class\":\"interactive\",\"subscribe\":[\"ch%d\"]}", i, i);
    const char *resp;
    size_t rlen;
    int st = kc_request(&c, "POST", "/v1/sessions", body, &resp, &rlen);
    if (st != 200) {
      fprintf(stderr, "soak: creating session s%d: status %d\n", i, st);
      ok = false;
    }
  }
  cph_hc_rng rng = {0x7e57};
  size_t cap = 1 << 20;
  char *json = malloc(cap);
  for (int i = 0; i < opt.sessions && ok && json; i += 500) {
    size_t used = (size_t)snprintf(json, cap, "{\"events\":[");
    for (int k = i; k < i + 500 && k < opt.sessions; k++) {
      char text[256];
      message_body(&rng, -1 - k, text, sizeof text);
      used += (size_t)snprintf(json + used, cap - used,
                               "%s{\"channel\":\"ch%d\",\"sender\":\"setup\",\"body\":\"%s\"}",
                               k > i ? "," : "", k, text);
    }
    snprintf(json + used, cap - used, "]}");
    const char *resp;
    size_t rlen;
    int st = kc_request(&c, "POST", "/v1/events", json, &resp, &rlen);
    if (st != 200) {
      fprintf(stderr, "soak: first events: status %d\n", st);
      ok = false;
    }
  }
  free(json);
  kc_close(&c);
  free(c.buf);
  return ok;
}

int main(int argc, char **argv) {
  static const struct option longopts[] = {{"duration", required_argument, NULL, 'd'},
                                           {"sessions", required_argument, NULL, 's'},
                                           {"rate", required_argument, NULL, 'r'},
                                           {"workers", required_argument, NULL, 'w'},
                                           {"warmup", required_argument, NULL, 'u'},
                                           {"sync", required_argument, NULL, 'y'},
                                           {"help", no_argument, NULL, 'h'},
                                           {NULL, 0, NULL, 0}};
  for (int ch; (ch = getopt_long(argc, argv, "", longopts, NULL)) != -1;) {
    switch (ch) {
    case 'd': opt.duration_s = atoi(optarg); break;
    case 's': opt.sessions = atoi(optarg); break;
    case 'r': opt.rate = atoi(optarg); break;
    case 'w': opt.workers = atoi(optarg); break;
    case 'u': opt.warmup_s = atoi(optarg); break;
    case 'y': opt.sync = optarg; break;
    case 'h': usage(); return 0;
    default: usage(); return 2;
    }
  }
  if (opt.duration_s < 30 || opt.sessions < 1 || opt.rate < 1 || opt.workers < 1 ||
      opt.workers > 256 || opt.warmup_s < 0 || opt.warmup_s + 20 > opt.duration_s) {
    usage();
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);

  /* Budgets that never throttle the soak; maintenance sized to embed what is minted; a
   * dedupe window shorter than the warm-up so its rings are full before measuring. */
  char policy_text[1024];
  snprintf(policy_text, sizeof policy_text,
           "{:scheduler {:concurrency 64\n"
           "             :lanes {:interactive {:turns 100000000 :tool-calls 100000000}\n"
           "                     :maintenance {:turns 100000 :tool-calls 100000}}}\n"
           " :maintenance {:workers 2 :embeddings {:batch-size 256}}\n"
           " :dedupe {:window-seconds 30}\n"
           " :store {:sync :%s}\n"
           " :server {:max-long-polls-per-client 1024}}\n",
           opt.sync);
  char *policy = cph_test_write_tmpfile(".edn", policy_text);
  cph_test_daemon d;
  if (cph_test_daemon_start(&d, policy, NULL, NULL) != 0) {
    unlink(policy);
    free(policy);
    return 1;
  }
  g_port = d.port;
  printf("soak: cephalond pid %d on 127.0.0.1:%d; %d sessions, %d events/s, %d workers, %d s "
         "(warm-up %d s), :sync :%s\n",
         (int)d.pid, d.port, opt.sessions, opt.rate, opt.workers, opt.duration_s, opt.warmup_s,
         opt.sync);
  fflush(stdout);
  int64_t c0 = cph_hc_now_ms();
  bool ok = create_sessions();
  printf("soak: %d sessions created and their channels used once in %.1f s\n", opt.sessions,
         (double)(cph_hc_now_ms() - c0) / 1000.0);
  fflush(stdout);

  int rc = 0;
  pthread_t threads[300];
  int n_threads = 0;
  g_t0_ms = cph_hc_now_ms();
  if (ok) {
    for (int i = 0; i < 2; i++)
      pthread_create(&threads[n_threads++], NULL, producer, (void *)(intptr_t)i);
    for (int i = 0; i < opt.workers; i++)
      pthread_create(&threads[n_threads++], NULL, worker, (void *)(intptr_t)i);
    pthread_create(&threads[n_threads++], NULL, connector, NULL);
    pthread_create(&threads[n_threads++], NULL, prober, NULL);
  }

  static sample samples[MAX_SAMPLES];
  int n_samples = 0, minutes_printed = 0;
  printf("%6s %10s %10s %10s %5s %9s %9s %8s\n", "t_s", "VmRSS_kB", "RssAnon_kB",
         "RssFile_kB", "fds", "events/s", "turns/s", "errors");
  long last_events = 0, last_turns = 0;
  while (ok && n_samples < MAX_SAMPLES) {
    int64_t next = g_t0_ms + (int64_t)(n_samples + 1) * SAMPLE_S * 1000;
    while (cph_hc_now_ms() < next)
      cph_hc_sleep_ms(50);
    sample *s = &samples[n_samples];
    s->t_s = (n_samples + 1) * SAMPLE_S;
    if (!take_sample(d.pid, s)) {
      fprintf(stderr, "soak: cephalond (pid %d) is gone\n", (int)d.pid);
      rc = 1;
      break;
    }
    s->events = atomic_load(&n_events);
    s->turns = atomic_load(&n_turns);
    printf("%6d %10ld %10ld %10ld %5d %9.0f %9.0f %8ld\n", s->t_s, s->vm_rss_kb, s->rss_anon_kb,
           s->rss_file_kb, s->fds, (double)(s->events - last_events) / SAMPLE_S,
           (double)(s->turns - last_turns) / SAMPLE_S, atomic_load(&n_errors));
    last_events = s->events;
    last_turns = s->turns;
    n_samples++;
    int minute = s->t_s / 60;
    if (minute > minutes_printed) {
      pthread_mutex_lock(&g_lat_mu);
      lat_bucket *b = &g_lat[minute - 1];
      double p50 = percentile(b, 0.50), p99 = percentile(b, 0.99);
      double c99 = percentile(&g_lat_done[minute - 1], 0.99);
      size_t nb = b->n;
      pthread_mutex_unlock(&g_lat_mu);
      printf("       minute %d: %zu leases with a turn, lease latency p50 %.2f ms p99 %.2f ms; "
             "complete p99 %.2f ms\n",
             minute, nb, p50, p99, c99);
      minutes_printed = minute;
    }
    fflush(stdout);
    if (s->t_s >= opt.duration_s)
      break;
  }
  atomic_store(&g_stop, true);
  for (int i = 0; i < n_threads; i++)
    pthread_join(threads[i], NULL);

  /* ---- verdict ---- */
  int warm = opt.warmup_s / SAMPLE_S; /* index of the first sample after the warm-up */
  if (rc == 0 && n_samples > warm + 2) {
    long base = samples[warm].vm_rss_kb - samples[warm].rss_file_kb, peak = base;
    long vm_base = samples[warm].vm_rss_kb, vm_peak = vm_base;
    int fd_first = samples[warm].fds, fd_last_min = samples[n_samples - 1].fds;
    for (int i = warm; i < n_samples; i++) {
      long own = samples[i].vm_rss_kb - samples[i].rss_file_kb;
      if (own > peak)
        peak = own;
      if (samples[i].vm_rss_kb > vm_peak)
        vm_peak = samples[i].vm_rss_kb;
    }
    for (int i = n_samples - 3; i < n_samples; i++)
      if (samples[i].fds < fd_last_min)
        fd_last_min = samples[i].fds;
    int fd_first_max = fd_first;
    for (int i = warm; i < warm + 3 && i < n_samples; i++)
      if (samples[i].fds > fd_first_max)
        fd_first_max = samples[i].fds;
    double growth = base > 0 ? (double)(peak - base) / (double)base : 0;
    double vm_growth = vm_base > 0 ? (double)(vm_peak - vm_base) / (double)vm_base : 0;
    int first_min = (opt.warmup_s + 59) / 60; /* the first whole minute after the warm-up */
    int last_min = n_samples * SAMPLE_S / 60 - 1;
    if (last_min < first_min)
      last_min = first_min;
    double p99_first = percentile(&g_lat[first_min], 0.99);
    double p99_last = percentile(&g_lat[last_min], 0.99);
    double p99_max = 0;
    for (int m = first_min; m <= last_min; m++) {
      double p = percentile(&g_lat[m], 0.99);
      if (p > p99_max)
        p99_max = p;
    }
    long secs = n_samples * SAMPLE_S;
    printf("soak: %ld events (%.0f/s), %ld turns (%.0f/s), %ld replies read, %ld memories "
           "minted, %ld probes, %ld errors\n",
           atomic_load(&n_events), (double)atomic_load(&n_events) / (double)secs,
           atomic_load(&n_turns), (double)atomic_load(&n_turns) / (double)secs,
           atomic_load(&n_replies), atomic_load(&n_memories), atomic_load(&n_probes),
           atomic_load(&n_errors));
    printf("soak: own memory (VmRSS-RssFile) %ld kB after warm-up, peak %ld kB: %+.1f%% "
           "(limit +%.0f%%)\n",
           base, peak, growth * 100, RSS_GROWTH_MAX * 100);
    printf("soak: VmRSS %ld kB after warm-up, peak %ld kB: %+.1f%% (LMDB pages: RssFile %ld -> "
           "%ld kB)\n",
           vm_base, vm_peak, vm_growth * 100, samples[warm].rss_file_kb,
           samples[n_samples - 1].rss_file_kb);
    printf("soak: descriptors %d after warm-up, %d at the end\n", fd_first,
           samples[n_samples - 1].fds);
    printf("soak: lease p99 %.2f ms in minute %d, %.2f ms in minute %d, worst %.2f ms (a lease "
           "long-polls: this includes waiting for work); complete p99 %.2f -> %.2f ms\n",
           p99_first, first_min + 1, p99_last, last_min + 1, p99_max,
           percentile(&g_lat_done[first_min], 0.99), percentile(&g_lat_done[last_min], 0.99));
    if (growth > RSS_GROWTH_MAX) {
      printf("soak: FAIL: memory grew %.1f%% after the warm-up\n", growth * 100);
      rc = 1;
    }
    if (fd_last_min > fd_first_max + FD_SLACK) {
      printf("soak: FAIL: descriptors grew from %d to %d\n", fd_first_max, fd_last_min);
      rc = 1;
    }
    if (p99_last > P99_DRIFT_MAX * p99_first && p99_last - p99_first > P99_NOISE_MS) {
      printf("soak: FAIL: lease p99 drifted from %.2f to %.2f ms\n", p99_first, p99_last);
      rc = 1;
    }
    if (atomic_load(&n_turns) == 0 || atomic_load(&n_events) == 0) {
      printf("soak: FAIL: no traffic went through\n");
      rc = 1;
    }
  } else if (rc == 0) {
    printf("soak: FAIL: too few samples (%d)\n", n_samples);
    rc = 1;
  }
  if (atomic_load(&n_errors)) {
    printf("soak: FAIL: %ld requests failed; the first: %s\n", atomic_load(&n_errors),
           g_first_error);
    rc = 1;
  }
  if (rc) { /* what the daemon said, for the post-mortem */
    char *log = cph_test_daemon_log(&d);
    size_t len = strlen(log);
    printf("--- the last of cephalond's log ---\n%s\n", len > 4000 ? log + len - 4000 : log);
    free(log);
  }
  int stop_rc = cph_test_daemon_stop(&d);
  if (stop_rc != 0) {
    printf("soak: FAIL: cephalond stopped with status %d\n", stop_rc);
    rc = 1;
  }
  unlink(policy);
  free(policy);
  for (int m = 0; m < MAX_MINUTES; m++) {
    free(g_lat[m].v);
    free(g_lat_done[m].v);
  }
  printf("soak: %s\n", rc ? "FAILED" : "passed");
  return rc;
}
