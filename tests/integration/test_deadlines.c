/* Request deadlines (DESIGN §13, issue 18 item 5), against the real cephalond on loopback with
 * :server :header-timeout-seconds 2 and :body-timeout-seconds 2, all in one run of ~7 s:
 * - 200 clients that trickle their request heads (a byte every 0.5 s) are each closed by the
 *   server within the header timeout (+ slack) of connecting, while ordinary clients keep
 *   getting answers, every one, quickly;
 * - a client that sends a whole head and trickles the body it announced is answered 408 and
 *   closed within the body timeout of its head;
 * - a lease long-poll waiting longer than both timeouts is not cut: it gets its turn;
 * - an idle kept-alive connection outlives the header timeout (idle connections keep
 *   :timeout-seconds), and once it starts trickling its next head it is dropped within the
 *   header timeout of that first byte;
 * - cephalon_http_timeouts_total counts each drop by phase, and the scrape passes promtool;
 * - after a policy reload, new connections get the new header timeout. */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "tests/support/api.h"
#include "tests/support/daemon.h"
#include "tests/support/hclient.h"
#include "tests/support/testutil.h"

enum {
  TRICKLERS = 200,
  TIMEOUT_MS = 2000, /* both timeouts of the policy below */
  /* A drop may come this much after its deadline: the client's poll loop, an ordinary
   * request in flight, two shared cores busy with other tests. */
  SLACK_MS = 1500,
  /* and this much before it, by the client's clock (it starts its clock when connect()
   * returns, the daemon when it accepts) */
  EARLY_MS = 100,
  BYTE_EVERY_MS = 500,
  LEASE_WAIT_MS = 6000,
  TURN_POSTED_AT_MS = 3500,  /* after both timeouts */
  IDLE_UNTIL_MS = 3000,      /* the kept-alive connection starts its next head then */
  RUN_FOR_MS = 9000,         /* the loop ends earlier once everything happened */
};

static const char POLICY[] = "{:server {:header-timeout-seconds 2 :body-timeout-seconds 2}}\n";

/* A request head that never ends within the test (a byte every 0.5 s). */
static const char SLOW_HEAD[] = "GET /v1/lanes HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                "X-Slowly: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";

typedef struct trickler {
  int fd;
  size_t sent;        /* bytes of its text sent */
  int64_t clock_ms;   /* when the server's clock for it started, by ours */
  int64_t closed_ms;  /* when the server closed it; 0 while open */
  char got[512];      /* what the server sent before closing */
  size_t got_len;
} trickler;

static cph_test_daemon g_daemon;
static char *g_policy;

static int teardown(void **state) {
  (void)state;
  if (g_daemon.pid > 0)
    cph_test_daemon_stop(&g_daemon);
  g_daemon.pid = 0;
  if (g_policy) {
    unlink(g_policy);
    free(g_policy);
    g_policy = NULL;
  }
  return 0;
}

/* 200 tricklers, their server ends and the ordinary clients need ~220 sockets here. */
static void ensure_fd_room(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 1024) {
    rl.rlim_cur = rl.rlim_max < 1024 ? rl.rlim_max : 1024;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

static int send_bytes(int fd, const char *p, size_t n) {
  return send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT) == (ssize_t)n ? 0 : -1;
}

/* Reads what is there without waiting; marks the trickler closed at EOF or a reset. */
static void read_some(trickler *t, int64_t now) {
  for (;;) {
    char buf[512];
    ssize_t n = recv(t->fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      size_t room = sizeof t->got - 1 - t->got_len;
      size_t k = (size_t)n < room ? (size_t)n : room;
      memcpy(t->got + t->got_len, buf, k);
      t->got_len += k;
      t->got[t->got_len] = '\0';
      continue;
    }
    if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      t->closed_ms = now;
      close(t->fd);
      t->fd = -1;
    }
    return;
  }
}

/* The counter's value for one phase in a /metrics scrape; -1 when absent. */
static long long timeouts_counted(const char *scrape, const char *phase) {
  char needle[96];
  snprintf(needle, sizeof needle, "\ncephalon_http_timeouts_total{phase=\"%s\"} ", phase);
  const char *p = strstr(scrape, needle);
  return p ? strtoll(p + strlen(needle), NULL, 10) : -1;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static void test_trickling_clients_are_dropped_within_the_deadlines_while_others_are_served(
    void **state) {
  (void)state;
  ensure_fd_room();
  g_policy = cph_test_write_tmpfile(".edn", POLICY);
  if (cph_test_daemon_start(&g_daemon, g_policy, NULL, NULL) != 0)
    fail_msg("cephalond did not start");
  int port = g_daemon.port;
  int st;
  json_decref(cph_hc_call(port, NULL, &st, "POST", "/v1/sessions",
                          "{\"id\":\"waiter\",\"class\":\"interactive\"}"));
  assert_int_equal(st, 200);

  /* The kept-alive connection: one answered request, then idle. */
  trickler keep = {.fd = cph_hc_connect(port, 2000)};
  assert_true(keep.fd >= 0);
  const char *first = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  assert_int_equal(send_bytes(keep.fd, first, strlen(first)), 0);
  char answer[512];
  ssize_t n = recv(keep.fd, answer, sizeof answer - 1, 0);
  assert_true(n > 0);
  answer[n] = '\0';
  assert_non_null(strstr(answer, "HTTP/1.1 200"));

  /* The lease long-poll: waits LEASE_WAIT_MS unless a turn comes first. */
  char lease_body[96];
  snprintf(lease_body, sizeof lease_body, "{\"worker\":\"w\",\"wait_ms\":%d}", LEASE_WAIT_MS);
  trickler lease = {.fd = cph_test_http_send_only(port, "POST", "/v1/turns/lease", lease_body)};
  assert_true(lease.fd >= 0);

  /* The body trickler: a whole head announcing 100 bytes, then a byte every 0.5 s. */
  trickler body = {.fd = cph_hc_connect(port, 2000)};
  assert_true(body.fd >= 0);
  const char *head = "POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     "Content-Type: application/json\r\nContent-Length: 100\r\n\r\n";
  assert_int_equal(send_bytes(body.fd, head, strlen(head)), 0);
  body.clock_ms = cph_hc_now_ms();
  const char *body_text = "{\"events\":[{\"channel\":\"general\",\"sender\":\"u\",\"body\":\"x\"}]}";

  /* The 200 head tricklers: connected one after another, each sends its first byte. */
  trickler *t = calloc(TRICKLERS, sizeof *t);
  assert_non_null(t);
  for (int i = 0; i < TRICKLERS; i++) {
    t[i].fd = cph_hc_connect(port, 2000);
    if (t[i].fd < 0)
      fail_msg("trickler %d could not connect (%s)", i, strerror(errno));
    t[i].clock_ms = cph_hc_now_ms();
    assert_int_equal(send_bytes(t[i].fd, SLOW_HEAD, 1), 0);
    t[i].sent = 1;
  }

  int64_t start = cph_hc_now_ms(), next_byte = start + BYTE_EVERY_MS;
  bool turn_posted = false;
  int64_t *lat = calloc(100000, sizeof *lat);
  size_t served = 0, failed = 0;
  struct pollfd *pfd = calloc(TRICKLERS + 3, sizeof *pfd);
  trickler **who = calloc(TRICKLERS + 3, sizeof *who);
  for (;;) {
    int64_t now = cph_hc_now_ms();
    size_t open = 0;
    for (int i = 0; i < TRICKLERS; i++)
      open += t[i].fd >= 0;
    bool done = open == 0 && body.fd < 0 && lease.fd < 0 && keep.fd < 0;
    if (done || now - start > RUN_FOR_MS)
      break;

    /* One byte more from every client still sending. */
    if (now >= next_byte) {
      next_byte += BYTE_EVERY_MS;
      for (int i = 0; i < TRICKLERS; i++)
        if (t[i].fd >= 0 && t[i].sent < sizeof SLOW_HEAD - 1 &&
            send_bytes(t[i].fd, SLOW_HEAD + t[i].sent, 1) == 0)
          t[i].sent++;
      if (body.fd >= 0 && send_bytes(body.fd, body_text + body.sent, 1) == 0)
        body.sent++;
      if (keep.fd >= 0 && now - start >= IDLE_UNTIL_MS) {
        if (keep.sent == 0)
          keep.clock_ms = now;
        if (send_bytes(keep.fd, SLOW_HEAD + keep.sent, 1) == 0)
          keep.sent++;
      }
    }
    if (!turn_posted && now - start >= TURN_POSTED_AT_MS) {
      turn_posted = true;
      json_decref(cph_hc_call(port, NULL, &st, "POST", "/v1/events",
                              "{\"events\":[{\"session\":\"waiter\",\"channel\":\"general\","
                              "\"sender\":\"u\",\"body\":\"your turn\"}]}"));
      assert_int_equal(st, 200);
    }

    /* An ordinary client, served meanwhile. */
    int64_t t0 = cph_hc_now_ms();
    json_decref(cph_hc_call(port, NULL, &st, "GET", (served & 1) ? "/v1/lanes" : "/healthz",
                            NULL));
    if (st == 200) {
      if (served < 100000)
        lat[served] = cph_hc_now_ms() - t0;
      served++;
    } else {
      failed++;
    }

    /* Who did the server close (or answer)? */
    size_t np = 0;
    for (int i = 0; i < TRICKLERS; i++)
      if (t[i].fd >= 0)
        who[np] = &t[i], pfd[np++] = (struct pollfd){.fd = t[i].fd, .events = POLLIN};
    trickler *others[] = {&body, &lease, &keep};
    for (size_t k = 0; k < 3; k++)
      if (others[k]->fd >= 0)
        who[np] = others[k], pfd[np++] = (struct pollfd){.fd = others[k]->fd, .events = POLLIN};
    if (poll(pfd, np, 20) > 0) {
      now = cph_hc_now_ms();
      for (size_t k = 0; k < np; k++)
        if (pfd[k].revents)
          read_some(who[k], now);
    }
  }

  /* Every head trickler: closed, with nothing sent, within the deadline of its connection. */
  int64_t worst = 0, best = INT64_MAX;
  for (int i = 0; i < TRICKLERS; i++) {
    if (!t[i].closed_ms)
      fail_msg("trickler %d (%zu bytes sent) was still open %d ms after connecting", i,
               t[i].sent, RUN_FOR_MS);
    int64_t after = t[i].closed_ms - t[i].clock_ms;
    worst = after > worst ? after : worst;
    best = after < best ? after : best;
    if (t[i].got_len)
      fail_msg("trickler %d was sent \"%s\" before the close (expected nothing)", i, t[i].got);
  }
  print_message("%d head tricklers dropped %lld..%lld ms after connecting (timeout %d ms)\n",
                TRICKLERS, (long long)best, (long long)worst, TIMEOUT_MS);
  assert_true(best >= TIMEOUT_MS - EARLY_MS);
  assert_true(worst <= TIMEOUT_MS + SLACK_MS);

  /* Ordinary clients: all served, quickly. */
  size_t m = served < 100000 ? served : 100000;
  qsort(lat, m, sizeof *lat, cmp_i64);
  print_message("ordinary requests: %zu served, %zu failed; latency p50 %lld ms, p99 %lld ms, "
                "max %lld ms\n",
                served, failed, (long long)lat[m / 2], (long long)lat[m * 99 / 100],
                (long long)lat[m - 1]);
  assert_int_equal(failed, 0);
  assert_true(served >= 50);
  assert_true(lat[m * 99 / 100] <= 250);

  /* The body trickler: answered 408, then closed, within the deadline of its head. */
  assert_true(body.closed_ms > 0);
  int64_t body_after = body.closed_ms - body.clock_ms;
  print_message("body trickler: closed %lld ms after its head, %zu body bytes sent\n",
                (long long)body_after, body.sent);
  assert_true(body_after >= TIMEOUT_MS - EARLY_MS && body_after <= TIMEOUT_MS + SLACK_MS);
  if (!strstr(body.got, "HTTP/1.1 408 ") || !strstr(body.got, "\"request_timeout\""))
    fail_msg("the body trickler got \"%s\", not a 408 request_timeout", body.got);

  /* The lease: waited past both timeouts and got its turn. */
  assert_true(lease.closed_ms > 0);
  if (!strstr(lease.got, "HTTP/1.1 200") || !strstr(lease.got, "\"waiter\""))
    fail_msg("the waiting lease got \"%s\", not its turn", lease.got);
  assert_true(lease.closed_ms - start >= TURN_POSTED_AT_MS);

  /* The kept-alive connection: idle past the header timeout, then dropped 2 s into its
   * trickled head. */
  assert_true(keep.closed_ms > 0 && keep.sent > 0);
  int64_t keep_after = keep.closed_ms - keep.clock_ms;
  print_message("kept-alive connection: idle %d ms, then closed %lld ms after its next head's "
                "first byte\n",
                IDLE_UNTIL_MS, (long long)keep_after);
  assert_true(keep.clock_ms - start >= IDLE_UNTIL_MS);
  assert_true(keep_after >= TIMEOUT_MS - EARLY_MS && keep_after <= TIMEOUT_MS + SLACK_MS);

  /* Counted, by phase; the scrape stays valid Prometheus text. */
  cph_test_response r = cph_test_http(port, "GET", "/metrics", NULL, NULL);
  assert_int_equal(r.status, 200);
  assert_int_equal(timeouts_counted(r.body, "header"), TRICKLERS + 1);
  assert_int_equal(timeouts_counted(r.body, "body"), 1);
  cph_test_promtool_check(r.body);
  cph_test_response_free(&r);
  /* logged with the peer (the first ones of a second at info) */
  assert_true(cph_test_daemon_log_wait(&g_daemon, "msg=\"slow client dropped\" peer=127.0.0.1:",
                                       1000));

  /* A reload applies to connections from then on: a silent one now goes after 1 s. */
  FILE *pf = fopen(g_policy, "w");
  assert_non_null(pf);
  fputs("{:server {:header-timeout-seconds 1 :body-timeout-seconds 2}}\n", pf);
  fclose(pf);
  json_decref(cph_hc_call(port, NULL, &st, "POST", "/v1/admin/policy/reload", NULL));
  assert_int_equal(st, 200);
  trickler silent = {.fd = cph_hc_connect(port, 4000)};
  assert_true(silent.fd >= 0);
  silent.clock_ms = cph_hc_now_ms();
  char c;
  ssize_t got = recv(silent.fd, &c, 1, 0);
  int64_t silent_after = cph_hc_now_ms() - silent.clock_ms;
  close(silent.fd);
  print_message("after a reload to 1 s: a silent connection closed after %lld ms\n",
                (long long)silent_after);
  assert_true(got == 0 || (got < 0 && errno == ECONNRESET));
  assert_true(silent_after >= 1000 - EARLY_MS && silent_after <= 1000 + SLACK_MS);

  free(t);
  free(lat);
  free(pfd);
  free(who);
  assert_int_equal(cph_test_daemon_stop(&g_daemon), 0);
  g_daemon.pid = 0;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_teardown(
          test_trickling_clients_are_dropped_within_the_deadlines_while_others_are_served,
          teardown),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
