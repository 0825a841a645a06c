/* cephalon-bench worker: cephalon-worker's own cost per turn. cephalond (:sync :none), an
 * instant model endpoint in this process (a fixed chat-completion answer, keep-alive, a
 * thread per connection) and one cephalon-worker --concurrency N; a feeder keeps every
 * session's inbox non-empty for --seconds. Reports turns completed per second and the
 * worker's CPU microseconds per turn (from /proc). No MCP server: the model never asks for
 * tools, so the figure is leasing, the model round trip, heartbeat bookkeeping and complete. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "net.h"
#include "proc.h"

static const char model_answer[] =
    "{\"id\":\"b\",\"object\":\"chat.completion\",\"created\":1,\"model\":\"bench\","
    "\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"ok\"},"
    "\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":1,"
    "\"total_tokens\":6}}";

typedef struct model_srv {
  int fd;
  atomic_bool stop;
  atomic_uint_fast64_t requests;
} model_srv;

typedef struct model_conn {
  model_srv *m;
  int fd;
} model_conn;

/* Reads requests (head + Content-Length body) and answers each with the fixed body. */
static void *model_conn_main(void *arg) {
  model_conn *c = arg;
  char *buf = malloc(1 << 20);
  size_t have = 0;
  char head[160];
  int hl = snprintf(head, sizeof head,
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    "Content-Length: %zu\r\n\r\n",
                    sizeof model_answer - 1);
  while (buf && !atomic_load(&c->m->stop)) {
    char *end = memmem(buf, have, "\r\n\r\n", 4);
    if (end) {
      size_t head_len = (size_t)(end - buf) + 4, body = 0;
      buf[head_len - 1] = '\0';
      char *cl = strcasestr(buf, "\r\ncontent-length:");
      if (cl)
        body = strtoul(cl + 17, NULL, 10);
      if (have >= head_len + body) {
        memmove(buf, buf + head_len + body, have - head_len - body);
        have -= head_len + body;
        atomic_fetch_add(&c->m->requests, 1);
        if (send(c->fd, head, (size_t)hl, MSG_NOSIGNAL) != hl ||
            send(c->fd, model_answer, sizeof model_answer - 1, MSG_NOSIGNAL) !=
                (ssize_t)(sizeof model_answer - 1))
          break;
        continue;
      }
    }
    struct pollfd p = {.fd = c->fd, .events = POLLIN};
    if (poll(&p, 1, 200) <= 0)
      continue;
    if (have == (1 << 20))
      break;
    ssize_t n = recv(c->fd, buf + have, (1 << 20) - have, 0);
    if (n <= 0)
      break;
    have += (size_t)n;
  }
  free(buf);
  close(c->fd);
  free(c);
  return NULL;
}

static void *model_accept_main(void *arg) {
  model_srv *m = arg;
  while (!atomic_load(&m->stop)) {
    struct pollfd p = {.fd = m->fd, .events = POLLIN};
    if (poll(&p, 1, 100) <= 0)
      continue;
    int fd = accept(m->fd, NULL, NULL);
    if (fd < 0)
      continue;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    model_conn *c = malloc(sizeof *c);
    pthread_t t;
    if (!c) {
      close(fd);
      continue;
    }
    *c = (model_conn){m, fd};
    if (pthread_create(&t, NULL, model_conn_main, c) != 0) {
      close(fd);
      free(c);
      continue;
    }
    pthread_detach(t);
  }
  return NULL;
}

/* The last `bytes` bytes of the file at path, to stderr. */
static void print_tail(const char *path, long bytes) {
  FILE *fp = fopen(path, "r");
  if (!fp) {
    fprintf(stderr, "  (cannot open it)\n");
    return;
  }
  if (fseek(fp, 0, SEEK_END) == 0 && ftell(fp) > bytes)
    fseek(fp, -bytes, SEEK_END);
  else
    rewind(fp);
  char line[1024];
  while (fgets(line, sizeof line, fp))
    fprintf(stderr, "  %s", line);
  fclose(fp);
}

/* user + system CPU of pid in microseconds, from /proc/PID/stat; -1 if unknown. */
static int64_t cpu_us(pid_t pid) {
  char path[64], text[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f)
    return -1;
  size_t n = fread(text, 1, sizeof text - 1, f);
  fclose(f);
  text[n] = '\0';
  char *p = strrchr(text, ')');
  unsigned long long ut = 0, st = 0;
  if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) != 2)
    return -1;
  return (int64_t)((ut + st) * 1000000ULL / (unsigned long long)sysconf(_SC_CLK_TCK));
}

static uint64_t completed(cph_bench_conn *c) {
  cph_bench_resp r;
  if (cph_bench_http(c, "GET", "/metrics", NULL, 0, &r) || r.status != 200)
    return 0;
  const char *s = strstr(r.body, "cephalon_turns_completed_total{lane=\"interactive\"} ");
  return s ? strtoull(s + strlen("cephalon_turns_completed_total{lane=\"interactive\"} "), NULL, 10)
           : 0;
}

int cph_bench_worker(int argc, char **argv) {
  uint64_t concurrency = 8, seconds = 10, sessions = 64;
  for (int i = 1; i < argc;) {
    int r;
    if ((r = cph_bench_opt_u64(argc, argv, &i, "--concurrency", 1, 256, &concurrency)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--seconds", 1, 600, &seconds)) ||
        (r = cph_bench_opt_u64(argc, argv, &i, "--sessions", 1, 10000, &sessions))) {
      if (r < 0)
        return 2;
      continue;
    }
    fprintf(stderr, "usage: cephalon-bench worker [--concurrency N] [--seconds S] "
                    "[--sessions N]\n");
    return strcmp(argv[i], "--help") == 0 ? 0 : 2;
  }
  char policy[2048];
  if (cph_bench_policy(policy, sizeof policy, "none", 64, 10, 1, NULL))
    return 1;
  cph_bench_daemon d;
  if (cph_bench_daemon_start(&d, policy, NULL, 20000)) {
    cph_bench_daemon_free(&d);
    return 1;
  }
  int status = 1;
  pid_t worker = -1;
  model_srv m = {.fd = socket(AF_INET, SOCK_STREAM, 0)};
  atomic_init(&m.stop, false);
  atomic_init(&m.requests, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t sl = sizeof sa;
  pthread_t acceptor;
  if (m.fd < 0 || bind(m.fd, (struct sockaddr *)&sa, sizeof sa) || listen(m.fd, 128) ||
      getsockname(m.fd, (struct sockaddr *)&sa, &sl) ||
      pthread_create(&acceptor, NULL, model_accept_main, &m)) {
    fprintf(stderr, "cephalon-bench worker: cannot start the model endpoint\n");
    goto out_daemon;
  }
  cph_bench_conn c = CPH_BENCH_CONN_INIT;
  cph_bench_resp r;
  char body[256];
  if (cph_bench_conn_open(&c, d.port)) {
    fprintf(stderr, "cephalon-bench worker: cannot connect to cephalond\n");
    goto out_model;
  }
  for (uint64_t i = 0; i < sessions; i++) {
    snprintf(body, sizeof body, "{\"id\":\"w-%" PRIu64 "\",\"class\":\"interactive\"}", i);
    if (cph_bench_http(&c, "POST", "/v1/sessions", body, strlen(body), &r) ||
        (r.status != 200 && r.status != 201)) {
      fprintf(stderr, "cephalon-bench worker: cannot create session %" PRIu64 "\n", i);
      goto out_model;
    }
  }
  char daemon_url[64], llm_url[64], conc[16], log_path[512];
  snprintf(daemon_url, sizeof daemon_url, "http://127.0.0.1:%d", d.port);
  snprintf(llm_url, sizeof llm_url, "http://127.0.0.1:%d/v1", ntohs(sa.sin_port));
  snprintf(conc, sizeof conc, "%" PRIu64, concurrency);
  snprintf(log_path, sizeof log_path, "%s/worker.log", d.dir);
  char *bin = cph_bench_bin("cephalon-worker");
  const char *wargv[] = {bin,      "--daemon",      daemon_url, "--llm", llm_url, "--model",
                         "bench",  "--concurrency", conc,       "--lease-wait-ms", "1000", NULL};
  worker = cph_bench_spawn(wargv, log_path);
  free(bin);
  if (worker < 0)
    goto out_model;

  /* The feeder: keeps a few events queued per session (one request per round). */
  uint64_t start_done = completed(&c), t0_cpu = (uint64_t)cpu_us(worker);
  struct timespec t0, now;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  double elapsed = 0;
  uint64_t posted = 0;
  while (elapsed < (double)seconds) {
    uint64_t done = completed(&c) - start_done;
    if (posted < done + 4 * sessions) {
      char *ev = malloc(64 + sessions * 96);
      size_t len = (size_t)sprintf(ev, "{\"events\":[");
      for (uint64_t i = 0; i < sessions; i++)
        len += (size_t)sprintf(ev + len, "%s{\"session\":\"w-%" PRIu64
                                         "\",\"sender\":\"b\",\"body\":\"q %" PRIu64 "\"}",
                               i ? "," : "", i, posted + i);
      len += (size_t)sprintf(ev + len, "]}");
      int bad = cph_bench_http(&c, "POST", "/v1/events", ev, len, &r) || r.status != 200;
      free(ev);
      if (bad) {
        fprintf(stderr, "cephalon-bench worker: POST /v1/events failed\n");
        goto out_worker;
      }
      posted += sessions;
    } else {
      usleep(20000);
    }
    clock_gettime(CLOCK_MONOTONIC, &now);
    elapsed = (double)(now.tv_sec - t0.tv_sec) + (double)(now.tv_nsec - t0.tv_nsec) / 1e9;
  }
  uint64_t turns = completed(&c) - start_done;
  int64_t cpu = cpu_us(worker) - (int64_t)t0_cpu;
  printf("cephalond          :store :sync :none; %" PRIu64 " sessions kept busy\n", sessions);
  printf("worker             cephalon-worker --concurrency %" PRIu64
         ", instant model endpoint in process, no tools\n",
         concurrency);
  printf("turns              %" PRIu64 " completed in %.2f s; model requests %" PRIu64 "\n",
         turns, elapsed, (uint64_t)atomic_load(&m.requests));
  printf("worker concurrency=%" PRIu64 " turns_per_s=%.0f worker_cpu_us_per_turn=%.1f "
         "turns=%" PRIu64 " seconds=%.2f\n",
         concurrency, (double)turns / elapsed, turns ? (double)cpu / (double)turns : 0.0, turns,
         elapsed);
  status = turns > 0 ? 0 : 1;
  if (!turns) { /* the run directory goes with the daemon: say what the worker said */
    fprintf(stderr, "cephalon-bench worker: no turn completed; the end of %s:\n", log_path);
    print_tail(log_path, 4096);
  }
out_worker:
  cph_bench_stop(worker, SIGTERM, 10000);
out_model:
  cph_bench_conn_free(&c);
  atomic_store(&m.stop, true);
  if (m.fd >= 0) {
    pthread_join(acceptor, NULL);
    close(m.fd);
  }
out_daemon:
  cph_bench_daemon_free(&d);
  return status;
}
