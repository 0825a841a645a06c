/* cephalon-bench: servers, temp dirs and cleanup (proc.h). */
#define _GNU_SOURCE /* asprintf */
#include "proc.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"
#include "net.h"

#define MAX_CHILDREN 32
#define MAX_DIRS 32

/* Registries: pids and dirs to clean up. Written only by the main thread (scenarios start
 * servers before their client threads and stop them after joining them). */
static volatile pid_t children[MAX_CHILDREN];
static char *dirs[MAX_DIRS];

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static void child_add(pid_t pid) {
  for (int i = 0; i < MAX_CHILDREN; i++)
    if (children[i] == 0) {
      children[i] = pid;
      return;
    }
}

static void child_del(pid_t pid) {
  for (int i = 0; i < MAX_CHILDREN; i++)
    if (children[i] == pid)
      children[i] = 0;
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  remove(path);
  return 0;
}

static void rmtree(const char *path) { nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

/* Async-signal-safe calls only (kill, waitpid, fork, execve, _exit): kills the children, then
 * removes the temp dirs with rm -rf (the dir strings were written before the signal). */
static void on_fatal_signal(int sig) {
  for (int i = 0; i < MAX_CHILDREN; i++)
    if (children[i] > 0) {
      kill(children[i], SIGKILL);
      waitpid(children[i], NULL, 0);
    }
  for (int i = 0; i < MAX_DIRS; i++) {
    if (!dirs[i])
      continue;
    pid_t pid = fork();
    if (pid == 0) {
      char *const argv[] = {"rm", "-rf", "--", dirs[i], NULL};
      char *const envp[] = {NULL};
      execve("/bin/rm", argv, envp);
      _exit(127);
    }
    if (pid > 0)
      waitpid(pid, NULL, 0);
  }
  _exit(128 + sig);
}

static void at_exit(void) {
  for (int i = 0; i < MAX_CHILDREN; i++)
    if (children[i] > 0) {
      kill(children[i], SIGKILL);
      waitpid(children[i], NULL, 0);
      children[i] = 0;
    }
  for (int i = 0; i < MAX_DIRS; i++)
    if (dirs[i]) {
      rmtree(dirs[i]);
      free(dirs[i]);
      dirs[i] = NULL;
    }
}

void cph_bench_proc_init(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_fatal_signal;
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  atexit(at_exit);
}

char *cph_bench_tmpdir(const char *tag) {
  const char *base = getenv("TMPDIR");
  char *path;
  if (asprintf(&path, "%s/cephalon-bench-%s.XXXXXX", base && *base ? base : "/tmp", tag) < 0)
    return NULL;
  if (!mkdtemp(path)) {
    fprintf(stderr, "cephalon-bench: mkdtemp %s: %s\n", path, strerror(errno));
    free(path);
    return NULL;
  }
  for (int i = 0; i < MAX_DIRS; i++)
    if (!dirs[i]) {
      dirs[i] = strdup(path);
      break;
    }
  return path;
}

void cph_bench_tmpdir_remove(char *path) {
  if (!path)
    return;
  rmtree(path);
  for (int i = 0; i < MAX_DIRS; i++)
    if (dirs[i] && strcmp(dirs[i], path) == 0) {
      free(dirs[i]);
      dirs[i] = NULL;
    }
  free(path);
}

pid_t cph_bench_spawn(const char *const *argv, const char *log_path) {
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0)
    return -1;
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) /* the bench died before prctl took effect */
      _exit(1);
    int fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    if (null >= 0)
      dup2(null, 0);
    signal(SIGPIPE, SIG_DFL);
    execvp(argv[0], (char *const *)argv);
    fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
    _exit(127);
  }
  child_add(pid);
  return pid;
}

int cph_bench_stop(pid_t pid, int sig, int timeout_ms) {
  if (pid <= 0)
    return -1;
  kill(pid, sig);
  int status = 0;
  pid_t r = 0;
  for (int waited = 0; waited < timeout_ms; waited += 5) {
    r = waitpid(pid, &status, WNOHANG);
    if (r != 0)
      break;
    sleep_ms(5);
  }
  if (r == 0) {
    kill(pid, SIGKILL);
    r = waitpid(pid, &status, 0);
  }
  child_del(pid);
  if (r != pid)
    return -1;
  if (WIFEXITED(status))
    return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

bool cph_bench_alive(pid_t pid) {
  if (pid <= 0)
    return false;
  if (waitpid(pid, NULL, WNOHANG) == 0)
    return true;
  child_del(pid);
  return false;
}

char *cph_bench_bin(const char *name) {
  const char *dir = getenv("CPH_BIN_DIR");
  char *p = NULL;
  if (dir && *dir) {
    if (asprintf(&p, "%s/%s", dir, name) < 0)
      return NULL;
    return p;
  }
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = '\0';
    char *slash = strrchr(self, '/');
    if (slash) {
      *slash = '\0';
      if (asprintf(&p, "%s/%s", self, name) < 0)
        return NULL;
      if (access(p, X_OK) == 0)
        return p;
      free(p);
    }
  }
  if (asprintf(&p, "build/bin/%s", name) < 0)
    return NULL;
  return p;
}

static char *read_file(const char *path) {
  FILE *f = fopen(path, "r");
  if (!f)
    return NULL;
  size_t cap = 4096, len = 0;
  char *s = malloc(cap);
  size_t n;
  while (s && (n = fread(s + len, 1, cap - len - 1, f)) > 0) {
    len += n;
    if (cap - len - 1 == 0) {
      char *b = realloc(s, cap * 2);
      if (!b) {
        free(s);
        s = NULL;
        break;
      }
      s = b;
      cap *= 2;
    }
  }
  fclose(f);
  if (s)
    s[len] = '\0';
  return s;
}

int64_t cph_bench_rss(pid_t pid, int64_t *anon_out) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
  char *s = read_file(path);
  if (!s)
    return -1;
  int64_t rss = -1, anon = -1;
  const char *p = strstr(s, "VmRSS:");
  if (p)
    rss = strtoll(p + 6, NULL, 10) * 1024;
  p = strstr(s, "RssAnon:");
  if (p)
    anon = strtoll(p + 8, NULL, 10) * 1024;
  free(s);
  if (anon_out)
    *anon_out = anon;
  return rss;
}

/* ---------------------------------------------------------------- cephalond */

int64_t cph_bench_cpu_ns(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  char *s = read_file(path);
  /* the command name (field 2) may hold spaces: count fields from its closing paren */
  const char *p = s ? strrchr(s, ')') : NULL;
  unsigned long long utime = 0, stime = 0;
  int got = p ? sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime,
                       &stime)
              : 0;
  free(s);
  long hz = sysconf(_SC_CLK_TCK);
  if (got != 2 || hz <= 0)
    return -1;
  return (int64_t)((utime + stime) * (1000000000ull / (unsigned long long)hz));
}

static void print_log(const char *what, const char *log_path) {
  char *log = read_file(log_path);
  fprintf(stderr, "cephalon-bench: %s; its log:\n%s\n", what, log ? log : "(none)");
  free(log);
}

static int daemon_spawn(cph_bench_daemon *d, int timeout_ms) {
  char *exe = cph_bench_bin("cephalond");
  char *policy = NULL;
  if (!exe || asprintf(&policy, "%s/policy.edn", d->dir) < 0) {
    free(exe);
    return -1;
  }
  const char *argv[] = {exe,      "--policy", policy, "--data", d->data_dir,
                        "--listen", "127.0.0.1:0", NULL};
  unlink(d->log_path); /* a restart must not find the previous run's ready line */
  int64_t t0 = cph_bench_now_ns();
  d->pid = cph_bench_spawn(argv, d->log_path);
  free(policy);
  if (d->pid < 0) {
    free(exe);
    return -1;
  }
  for (int64_t deadline = t0 + (int64_t)timeout_ms * 1000000; cph_bench_now_ns() < deadline;) {
    char *log = read_file(d->log_path);
    const char *ready = log ? strstr(log, "msg=\"cephalond ready\"") : NULL;
    const char *listen = ready ? strstr(ready, " listen=") : NULL;
    if (listen) {
      d->ready_ns = cph_bench_now_ns() - t0;
      d->ready_cpu_ns = cph_bench_cpu_ns(d->pid);
      const char *end = strchr(listen + 1, ' ');
      const char *p = end ? end : listen + strlen(listen);
      while (p > listen && p[-1] != ':')
        p--;
      d->port = atoi(p);
      free(log);
      free(exe);
      return 0;
    }
    free(log);
    if (!cph_bench_alive(d->pid)) {
      d->pid = 0;
      print_log("cephalond exited before it was ready", d->log_path);
      free(exe);
      return -1;
    }
    sleep_ms(1);
  }
  print_log("cephalond not ready in time", d->log_path);
  cph_bench_stop(d->pid, SIGKILL, 1000);
  d->pid = 0;
  free(exe);
  return -1;
}

int cph_bench_daemon_start(cph_bench_daemon *d, const char *policy_text, const char *data_dir,
                           int timeout_ms) {
  memset(d, 0, sizeof *d);
  d->dir = cph_bench_tmpdir("cephalond");
  if (!d->dir)
    return -1;
  char *policy = NULL;
  if (asprintf(&policy, "%s/policy.edn", d->dir) < 0 ||
      asprintf(&d->log_path, "%s/cephalond.log", d->dir) < 0 ||
      (data_dir ? asprintf(&d->data_dir, "%s", data_dir)
                : asprintf(&d->data_dir, "%s/data", d->dir)) < 0) {
    free(policy);
    return -1;
  }
  FILE *f = fopen(policy, "w");
  free(policy);
  if (!f || fputs(policy_text, f) < 0 || fclose(f) != 0)
    return -1;
  return daemon_spawn(d, timeout_ms);
}

int cph_bench_daemon_restart(cph_bench_daemon *d, int timeout_ms) {
  if (d->pid > 0)
    cph_bench_daemon_stop(d);
  return daemon_spawn(d, timeout_ms);
}

int cph_bench_daemon_stop(cph_bench_daemon *d) {
  if (d->pid <= 0)
    return 0;
  int rc = cph_bench_stop(d->pid, SIGTERM, 30000);
  d->pid = 0;
  return rc;
}

void cph_bench_daemon_free(cph_bench_daemon *d) {
  cph_bench_daemon_stop(d);
  cph_bench_tmpdir_remove(d->dir);
  free(d->data_dir);
  free(d->log_path);
  memset(d, 0, sizeof *d);
}

int cph_bench_policy(char *buf, size_t cap, const char *sync, int concurrency,
                     int maint_turns_per_minute, int trickle_per_minute, const char *extra) {
  /* CPH_BENCH_MAP_SIZE_MB overrides the map size: valgrind cannot map 64 GiB, so a profile of
   * the daemon under it (CPH_BIN_DIR pointing at a wrapper script) needs a smaller one. */
  const char *map_env = getenv("CPH_BENCH_MAP_SIZE_MB");
  long map_mb = map_env ? strtol(map_env, NULL, 10) : 65536;
  if (map_mb < 64 || map_mb > 1048576)
    map_mb = 65536;
  int n = snprintf(
      buf, cap,
      "{:scheduler {:concurrency %d\n"
      "             :lanes {:interactive {:turns 100000000 :tool-calls 100000000}\n"
      "                     :operational {:turns 100000000 :tool-calls 100000000}\n"
      "                     :maintenance {:turns %d :tool-calls %d}}}\n"
      " :maintenance {:outbox {:min-batches-per-minute %d}}\n"
      " :store {:sync :%s}\n"
      " :backpressure {:defaults {:max-step 0}}\n"
      " :server {:map-size-mb %ld :log-level :info}\n"
      " %s}\n",
      concurrency, maint_turns_per_minute, 2 * maint_turns_per_minute, trickle_per_minute, sync,
      map_mb, extra ? extra : "");
  return n > 0 && (size_t)n < cap ? 0 : -1;
}

/* ---------------------------------------------------------------- anchors */

/* An anchor's command line, built per attempt (the port changes between attempts). */
typedef struct argv_buf {
  const char *argv[24];
  char port[16];
  char path[4300];
} argv_buf;

typedef int (*make_argv_fn)(const cph_bench_server *s, bool flag, argv_buf *b);

/* Starts the server make_argv describes until it listens; retries with another free port
 * when one was taken meanwhile. */
static int server_start(cph_bench_server *s, const char *tag, make_argv_fn make_argv,
                        bool flag) {
  memset(s, 0, sizeof *s);
  s->dir = cph_bench_tmpdir(tag);
  if (!s->dir)
    return -1;
  char log_path[4200];
  snprintf(log_path, sizeof log_path, "%s/server.log", s->dir);
  for (int attempt = 0; attempt < 5; attempt++) {
    argv_buf b;
    s->port = cph_bench_free_port();
    if (!s->port || make_argv(s, flag, &b))
      break;
    s->pid = cph_bench_spawn(b.argv, log_path);
    if (s->pid < 0)
      break;
    for (int waited = 0; waited < 10000; waited += 5) {
      if (cph_bench_port_open(s->port))
        return 0;
      if (!cph_bench_alive(s->pid))
        break;
      sleep_ms(5);
    }
    cph_bench_stop(s->pid, SIGKILL, 1000);
    s->pid = 0;
  }
  print_log("an anchor server did not start", log_path);
  cph_bench_tmpdir_remove(s->dir);
  s->dir = NULL;
  return -1;
}

static int beanstalkd_argv(const cph_bench_server *s, bool fsync_every_op, argv_buf *b) {
  int n = 0;
  snprintf(b->port, sizeof b->port, "%d", s->port);
  b->argv[n++] = "beanstalkd";
  b->argv[n++] = "-l";
  b->argv[n++] = "127.0.0.1";
  b->argv[n++] = "-p";
  b->argv[n++] = b->port;
  if (fsync_every_op) {
    snprintf(b->path, sizeof b->path, "%s/binlog", s->dir);
    if (mkdir(b->path, 0755) != 0 && errno != EEXIST)
      return -1;
    b->argv[n++] = "-b";
    b->argv[n++] = b->path;
    b->argv[n++] = "-f";
    b->argv[n++] = "0";
  }
  b->argv[n] = NULL;
  return 0;
}

static int redis_argv(const cph_bench_server *s, bool appendfsync_always, argv_buf *b) {
  int n = 0;
  snprintf(b->port, sizeof b->port, "%d", s->port);
  snprintf(b->path, sizeof b->path, "%s", s->dir);
  b->argv[n++] = "redis-server";
  b->argv[n++] = "--bind";
  b->argv[n++] = "127.0.0.1";
  b->argv[n++] = "--port";
  b->argv[n++] = b->port;
  b->argv[n++] = "--dir";
  b->argv[n++] = b->path;
  b->argv[n++] = "--save";
  b->argv[n++] = "";
  b->argv[n++] = "--daemonize";
  b->argv[n++] = "no";
  b->argv[n++] = "--appendonly";
  b->argv[n++] = appendfsync_always ? "yes" : "no";
  if (appendfsync_always) {
    b->argv[n++] = "--appendfsync";
    b->argv[n++] = "always";
  }
  b->argv[n] = NULL;
  return 0;
}

int cph_bench_beanstalkd_start(cph_bench_server *s, bool fsync_every_op) {
  return server_start(s, "beanstalkd", beanstalkd_argv, fsync_every_op);
}

int cph_bench_redis_start(cph_bench_server *s, bool appendfsync_always) {
  return server_start(s, "redis", redis_argv, appendfsync_always);
}

void cph_bench_server_stop(cph_bench_server *s) {
  if (s->pid > 0)
    cph_bench_stop(s->pid, SIGTERM, 10000);
  s->pid = 0;
  cph_bench_tmpdir_remove(s->dir);
  s->dir = NULL;
}
