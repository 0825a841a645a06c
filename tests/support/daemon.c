#define _GNU_SOURCE
#include "daemon.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "oas.h"
#include "testutil.h"

#include <sys/prctl.h>

/* In a forked child: it is killed when the test process ends, however it ends — an abort()
 * in a check (the openapi validator's) skips atexit handlers and teardowns, and daemons,
 * etcd and NATS servers left running would load the machine for every later test and bench. */
static void die_with_parent(pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) /* it died before the line above */
    _exit(127);
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static char *bin_path(const char *name) {
  const char *dir = getenv("CPH_BIN_DIR");
  char *p;
  if (asprintf(&p, "%s/%s", dir && *dir ? dir : "build/bin", name) < 0)
    abort();
  return p;
}

char *cph_test_daemon_log(const cph_test_daemon *d) {
  char *s = cph_test_read_file(d->log_path, NULL);
  return s ? s : strdup("");
}

bool cph_test_daemon_log_wait(const cph_test_daemon *d, const char *needle, int timeout_ms) {
  for (int waited = 0; waited <= timeout_ms; waited += 20) {
    char *log = cph_test_daemon_log(d);
    bool found = strstr(log, needle) != NULL;
    free(log);
    if (found)
      return true;
    sleep_ms(20);
  }
  return false;
}

int cph_test_daemon_start(cph_test_daemon *d, const char *policy_path, const char *data_dir,
                          const char *const *extra_args) {
  memset(d, 0, sizeof *d);
  d->keep_data = data_dir != NULL;
  d->data_dir = data_dir ? strdup(data_dir) : cph_test_tmpdir("daemon");
  if (asprintf(&d->log_path, "%s.log", d->data_dir) < 0)
    abort();
  char *exe = bin_path("cephalond");
  const char *argv[48];
  int n = 0;
  /* CPH_DAEMON_WRAPPER (e.g. "valgrind --error-exitcode=99 -q") runs the daemon under a tool:
   * make test-valgrind uses it. Words are split on spaces. */
  char *wrapper = getenv("CPH_DAEMON_WRAPPER") ? strdup(getenv("CPH_DAEMON_WRAPPER")) : NULL;
  for (char *save, *w = wrapper ? strtok_r(wrapper, " ", &save) : NULL; w && n < 16;
       w = strtok_r(NULL, " ", &save))
    argv[n++] = w;
  const char *program = n ? argv[0] : exe;
  argv[n++] = exe;
  argv[n++] = "--policy";
  argv[n++] = policy_path;
  argv[n++] = "--data";
  argv[n++] = d->data_dir;
  argv[n++] = "--listen";
  argv[n++] = "127.0.0.1:0";
  for (int i = 0; extra_args && extra_args[i] && n < 47; i++)
    argv[n++] = extra_args[i];
  argv[n] = NULL;
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    die_with_parent(parent);
    int fd = open(d->log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 2);
      dup2(fd, 1);
      close(fd);
    }
    execvp(program, (char *const *)argv);
    fprintf(stderr, "exec %s: %s\n", exe, strerror(errno));
    _exit(127);
  }
  free(exe);
  d->pid = pid;
  /* a daemon under valgrind starts tens of times slower */
  int ready_ms = wrapper ? 120000 : 10000;
  free(wrapper);
  for (int waited = 0; waited < ready_ms; waited += 20) {
    char *log = cph_test_daemon_log(d);
    /* the ready record: msg="cephalond ready" listen=HOST:PORT ... */
    const char *ready = strstr(log, "msg=\"cephalond ready\"");
    const char *listen = ready ? strstr(ready, " listen=") : NULL;
    if (listen) {
      const char *end = strchr(listen + 1, ' ');
      const char *p = end ? end : listen + strlen(listen);
      while (p > listen && p[-1] != ':') /* the port: the digits after the last ':' */
        p--;
      d->port = atoi(p);
      free(log);
      cph_oas_watch_port(d->port); /* its answers are checked against docs/openapi.json */
      return 0;
    }
    free(log);
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      d->pid = 0;
      char *l = cph_test_daemon_log(d);
      fprintf(stderr, "cephalond exited before ready:\n%s\n", l);
      free(l);
      return -1;
    }
    sleep_ms(20);
  }
  char *l = cph_test_daemon_log(d);
  fprintf(stderr, "cephalond not ready after %d s:\n%s\n", ready_ms / 1000, l);
  free(l);
  /* never leave it running behind a failed start */
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  d->pid = 0;
  return -1;
}

int cph_test_daemon_signal_wait(cph_test_daemon *d, int sig) {
  if (d->pid <= 0)
    return -1;
  kill(d->pid, sig);
  int status = 0;
  for (int waited = 0; waited < 30000; waited += 10) {
    pid_t r = waitpid(d->pid, &status, WNOHANG);
    if (r == d->pid) {
      d->pid = 0;
      cph_oas_unwatch_port(d->port);
      if (WIFEXITED(status))
        return WEXITSTATUS(status);
      return 128 + WTERMSIG(status);
    }
    sleep_ms(10);
  }
  kill(d->pid, SIGKILL);
  waitpid(d->pid, &status, 0);
  d->pid = 0;
  cph_oas_unwatch_port(d->port);
  return -1;
}

int cph_test_daemon_stop(cph_test_daemon *d) {
  int rc = d->pid > 0 ? cph_test_daemon_signal_wait(d, SIGTERM) : 0;
  if (rc != 0 && d->log_path) { /* what it said before its log goes: a failed stop's why */
    char *log = cph_test_daemon_log(d);
    size_t n = strlen(log);
    fprintf(stderr, "cephalond on port %d stopped with status %d; the end of its log:\n%s\n",
            d->port, rc, n > 4000 ? log + n - 4000 : log);
    free(log);
  }
  if (!d->keep_data)
    cph_test_rmtree(d->data_dir);
  unlink(d->log_path);
  free(d->data_dir);
  free(d->log_path);
  d->data_dir = d->log_path = NULL;
  return rc;
}

cph_test_response cph_test_http(int port, const char *method, const char *path,
                                const char *extra_headers, const char *body) {
  cph_test_response r = {-1, NULL, 0, NULL};
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    return r;
  struct sockaddr_in sin = {0};
  sin.sin_family = AF_INET;
  sin.sin_port = htons((uint16_t)port);
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&sin, sizeof sin) != 0) {
    close(fd);
    return r;
  }
  char *req;
  size_t blen = body ? strlen(body) : 0;
  int n = asprintf(&req,
                   "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s"
                   "Content-Length: %zu\r\n\r\n",
                   method, path, extra_headers ? extra_headers : "", blen);
  if (n < 0)
    abort();
  if (write(fd, req, (size_t)n) != n || (blen && write(fd, body, blen) != (ssize_t)blen)) {
    free(req);
    close(fd);
    return r;
  }
  free(req);
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  ssize_t got;
  while ((got = read(fd, buf + len, cap - len - 1)) > 0) {
    len += (size_t)got;
    if (cap - len - 1 == 0)
      buf = realloc(buf, cap *= 2);
  }
  close(fd);
  buf[len] = '\0';
  char *sep = strstr(buf, "\r\n\r\n");
  if (strncmp(buf, "HTTP/1.", 7) != 0 || !sep) {
    free(buf);
    return r;
  }
  r.status = atoi(buf + 9);
  *sep = '\0';
  r.headers = strdup(buf);
  r.body_len = len - (size_t)(sep + 4 - buf);
  r.body = malloc(r.body_len + 1);
  memcpy(r.body, sep + 4, r.body_len);
  r.body[r.body_len] = '\0';
  free(buf);
  cph_oas_expect_answer(port, method, path, r.status, r.headers, r.body, r.body_len);
  return r;
}

void cph_test_response_free(cph_test_response *r) {
  free(r->body);
  free(r->headers);
  r->body = r->headers = NULL;
}

static char *drain_fd(int fd) {
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  ssize_t got;
  while ((got = read(fd, buf + len, cap - len - 1)) > 0) {
    len += (size_t)got;
    if (cap - len - 1 == 0)
      buf = realloc(buf, cap *= 2);
  }
  buf[len] = '\0';
  return buf;
}

/* In a forked child: stdout to o, stderr to e, then argv; never returns (126: o or e did not
 * open, 127: no exec). */
static void exec_with_output(const char *const *argv, int o, int e) {
  if (o < 0 || e < 0)
    _exit(126);
  dup2(o, 1);
  dup2(e, 2);
  close(o);
  close(e);
  execv(argv[0], (char *const *)argv);
  fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
  _exit(127);
}

int cph_test_run(const char *const *argv, char **out, char **err) {
  char *out_path = cph_test_write_tmpfile(".out", "");
  char *err_path = cph_test_write_tmpfile(".err", "");
  pid_t pid = fork();
  if (pid == 0)
    exec_with_output(argv, open(out_path, O_WRONLY | O_TRUNC), open(err_path, O_WRONLY | O_TRUNC));
  int status = -1;
  if (pid > 0)
    waitpid(pid, &status, 0);
  int fo = open(out_path, O_RDONLY), fe = open(err_path, O_RDONLY);
  char *o = drain_fd(fo), *e = drain_fd(fe);
  close(fo);
  close(fe);
  unlink(out_path);
  unlink(err_path);
  free(out_path);
  free(err_path);
  if (out)
    *out = o;
  else
    free(o);
  if (err)
    *err = e;
  else
    free(e);
  if (pid < 0 || !WIFEXITED(status))
    return -1;
  return WEXITSTATUS(status);
}

pid_t cph_test_spawn(const char *const *argv, const char *out_path, const char *err_path) {
  pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) {
    die_with_parent(parent);
    exec_with_output(argv, open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600),
                     open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600));
  }
  return pid;
}

int cph_test_signal_wait(pid_t pid, int sig, int timeout_ms) {
  kill(pid, sig);
  int status;
  for (int waited = 0;; waited += 10) {
    pid_t got = waitpid(pid, &status, WNOHANG);
    if (got == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (got < 0)
      return -1;
    if (waited >= timeout_ms) { /* it would not stop: no process of a test outlives it */
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    struct timespec ts = {0, 10000000L};
    nanosleep(&ts, NULL);
  }
}
