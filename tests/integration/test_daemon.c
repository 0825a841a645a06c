#define _GNU_SOURCE
/* cephalond as a user runs it: real process, real loopback port, temp data dir. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "tests/support/daemon.h"
#include "tests/support/testutil.h"

static char *copy_example_policy(void) {
  char *src = cph_test_source_path("cephalon.policy.edn.example");
  char *text = cph_test_read_file(src, NULL);
  assert_non_null(text);
  char *path = cph_test_write_tmpfile(".edn", text);
  free(text);
  free(src);
  return path;
}

static void test_daemon_serves_health_and_json_errors(void **state) {
  (void)state;
  char *policy = copy_example_policy();
  cph_test_daemon d;
  assert_int_equal(cph_test_daemon_start(&d, policy, NULL, NULL), 0);
  assert_true(d.port > 0);

  cph_test_response r = cph_test_http(d.port, "GET", "/healthz", NULL, NULL);
  assert_int_equal(r.status, 200);
  assert_string_equal(r.body, "{\"status\":\"ok\"}\n");
  cph_test_response_free(&r);

  r = cph_test_http(d.port, "GET", "/readyz", NULL, NULL);
  assert_int_equal(r.status, 200);
  assert_non_null(strstr(r.body, "\"policy_generation\":1"));
  cph_test_response_free(&r);

  r = cph_test_http(d.port, "GET", "/v1/nothing-here", NULL, NULL);
  assert_int_equal(r.status, 404);
  assert_non_null(strstr(r.headers, "Content-Type: application/json"));
  assert_non_null(strstr(r.body, "\"error\":{\"code\":\"not_found\""));
  cph_test_response_free(&r);

  assert_int_equal(cph_test_daemon_stop(&d), 0);
  unlink(policy);
  free(policy);
}

static void test_sighup_reloads_and_rejects_a_broken_policy(void **state) {
  (void)state;
  char *policy = copy_example_policy();
  cph_test_daemon d;
  assert_int_equal(cph_test_daemon_start(&d, policy, NULL, NULL), 0);

  kill(d.pid, SIGHUP);
  assert_true(cph_test_daemon_log_wait(&d, "policy reloaded from", 5000));
  cph_test_response r = cph_test_http(d.port, "GET", "/readyz", NULL, NULL);
  assert_non_null(strstr(r.body, "\"policy_generation\":2"));
  cph_test_response_free(&r);

  FILE *f = fopen(policy, "w");
  fputs("{:scheduler {:concurrency \"four\"}}\n", f);
  fclose(f);
  kill(d.pid, SIGHUP);
  assert_true(cph_test_daemon_log_wait(&d, "policy reload rejected", 5000));
  char *log = cph_test_daemon_log(&d);
  assert_non_null(strstr(log, ":1:27: :scheduler :concurrency: expected"));
  free(log);
  r = cph_test_http(d.port, "GET", "/readyz", NULL, NULL);
  assert_int_equal(r.status, 200);
  assert_non_null(strstr(r.body, "\"policy_generation\":2")); /* old policy stays */
  cph_test_response_free(&r);

  assert_int_equal(cph_test_daemon_stop(&d), 0);
  unlink(policy);
  free(policy);
}

static void test_refuses_non_loopback_listen_without_auth(void **state) {
  (void)state;
  char *policy = copy_example_policy();
  char *dir = cph_test_tmpdir("noauth");
  char *exe;
  assert_true(asprintf(&exe, "%s/cephalond", getenv("CPH_BIN_DIR")) > 0);
  const char *argv[] = {exe, "--policy", policy, "--data", dir, "--listen", "0.0.0.0:0", NULL};
  char *out, *err;
  assert_int_equal(cph_test_run(argv, &out, &err), 1);
  assert_non_null(strstr(err, "refusing to listen on 0.0.0.0:0 without :auth"));
  free(out);
  free(err);
  free(exe);
  cph_test_rmtree(dir);
  free(dir);
  unlink(policy);
  free(policy);
}

static void test_broken_policy_stops_startup_with_file_line_col(void **state) {
  (void)state;
  char *policy = cph_test_write_tmpfile(".edn", "{:leases {:ttl-seconds 0}}\n");
  char *dir = cph_test_tmpdir("badpol");
  char *exe;
  assert_true(asprintf(&exe, "%s/cephalond", getenv("CPH_BIN_DIR")) > 0);
  const char *argv[] = {exe, "--policy", policy, "--data", dir, "--listen", "127.0.0.1:0", NULL};
  char *out, *err;
  assert_int_equal(cph_test_run(argv, &out, &err), 1);
  char expected[512];
  snprintf(expected, sizeof expected, "%s:1:24: :leases :ttl-seconds:", policy);
  if (!strstr(err, expected))
    fail_msg("stderr '%s' lacks '%s'", err, expected);
  free(out);
  free(err);
  free(exe);
  cph_test_rmtree(dir);
  free(dir);
  unlink(policy);
  free(policy);
}

/* ---------------------------------------------------------------- one connection, many requests */

/* A loopback connection to port whose reads give up after 5 s: a request left unanswered
 * fails the test instead of hanging it. rcvbuf: its receive buffer's size (0: the system's),
 * set before connect so that the window the server sees stays that small. */
static int connect_to(int port, int rcvbuf) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  assert_true(fd >= 0);
  if (rcvbuf)
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  struct timeval tv = {5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
  return fd;
}

static void send_all(int fd, const char *text) {
  for (size_t off = 0, len = strlen(text); off < len;) {
    ssize_t n = send(fd, text + off, len - off, MSG_NOSIGNAL);
    assert_true(n > 0);
    off += (size_t)n;
  }
}

/* What a connection has sent and not yet been taken as answers. */
typedef struct inbuf {
  char data[1 << 19];
  size_t len;
} inbuf;

/* The next whole answer on fd (status line, headers, Content-Length body): its status, and
 * its body copied into body. Fails the test when the answer does not come whole within the
 * connection's read timeout. */
static int next_answer(int fd, inbuf *in, char *body, size_t body_size) {
  for (;;) {
    in->data[in->len] = '\0';
    char *end = strstr(in->data, "\r\n\r\n");
    const char *cl = end ? strcasestr(in->data, "\r\nContent-Length:") : NULL;
    if (end && cl && cl < end) {
      size_t head = (size_t)(end + 4 - in->data), blen = strtoul(cl + 17, NULL, 10);
      if (in->len >= head + blen) {
        int status = atoi(in->data + 9);
        assert_true(blen < body_size);
        memcpy(body, in->data + head, blen);
        body[blen] = '\0';
        memmove(in->data, in->data + head + blen, in->len - head - blen);
        in->len -= head + blen;
        return status;
      }
    }
    assert_true(in->len < sizeof in->data - 1);
    ssize_t n = recv(fd, in->data + in->len, sizeof in->data - 1 - in->len, 0);
    if (n <= 0)
      fail_msg("the connection ended or stalled with %zu bytes of an answer: '%s'", in->len,
               in->data);
    in->len += (size_t)n;
  }
}

/* True once the server has closed fd (a read returns 0 within the timeout). */
static bool closed_by_server(int fd) {
  char c;
  return recv(fd, &c, 1, 0) == 0;
}

/* An answer is written as soon as it is ready, and the connection then takes its next request
 * (reply.c, write_now): a kept-alive connection carries request after request, answered at
 * once (GET) or after a commit (POST), one at a time or pipelined in one write, each answer
 * in order and whole; and a connection the request asks to close is closed after its answer,
 * for HTTP/1.1's Connection: close and for HTTP/1.0 alike. */
static void test_one_connection_carries_requests_in_order_and_closes_when_asked(void **state) {
  (void)state;
  char *policy = copy_example_policy();
  cph_test_daemon d;
  assert_int_equal(cph_test_daemon_start(&d, policy, NULL, NULL), 0);
  char body[8192], req[1024];
  inbuf *in = calloc(1, sizeof *in);
  assert_non_null(in);

  /* one at a time on a kept-alive connection: a session, then events and reads */
  int fd = connect_to(d.port, 0);
  const char *create = "{\"id\":\"ka\",\"class\":\"interactive\",\"subscribe\":[\"general\"]}";
  snprintf(req, sizeof req,
           "POST /v1/sessions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           "Content-Length: %zu\r\n\r\n%s",
           strlen(create), create);
  send_all(fd, req);
  assert_int_equal(next_answer(fd, in, body, sizeof body), 200);
  for (int i = 0; i < 40; i++) {
    char ev[256];
    snprintf(ev, sizeof ev,
             "{\"events\":[{\"channel\":\"general\",\"sender\":\"u\",\"body\":\"m%d\"}]}", i);
    snprintf(req, sizeof req,
             "POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             "Content-Length: %zu\r\n\r\n%s",
             strlen(ev), ev);
    send_all(fd, req);
    int status = next_answer(fd, in, body, sizeof body);
    char id[32];
    snprintf(id, sizeof id, "{\"id\":%d,", i + 1); /* its own answer, not another's */
    if (status != 200 || !strstr(body, id) || !strstr(body, "\"status\":\"queued\""))
      fail_msg("event %d on the kept-alive connection: %d %s", i, status, body);
    send_all(fd, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    assert_int_equal(next_answer(fd, in, body, sizeof body), 200);
    assert_string_equal(body, "{\"status\":\"ok\"}\n");
  }

  /* pipelined: four requests in one write, the last asking to close */
  const char *ev = "{\"events\":[{\"channel\":\"general\",\"sender\":\"u\",\"body\":\"last\"}]}";
  snprintf(req, sizeof req,
           "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
           "POST /v1/events HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
           "Content-Length: %zu\r\n\r\n%s"
           "GET /v1/sessions/ka HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
           "GET /v1/nothing-here HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
           strlen(ev), ev);
  send_all(fd, req);
  assert_int_equal(next_answer(fd, in, body, sizeof body), 200);
  assert_string_equal(body, "{\"status\":\"ok\"}\n");
  assert_int_equal(next_answer(fd, in, body, sizeof body), 200);
  assert_non_null(strstr(body, "{\"id\":41,\"status\":\"queued\""));
  assert_int_equal(next_answer(fd, in, body, sizeof body), 200);
  if (!strstr(body, "\"id\":\"ka\"") || !strstr(body, "\"staged\":41"))
    fail_msg("the session read after 41 events on its connection: %s", body);
  assert_int_equal(next_answer(fd, in, body, sizeof body), 404);
  assert_true(closed_by_server(fd));
  close(fd);

  /* HTTP/1.0 without keep-alive: answered (without a length: the close ends it), then closed */
  fd = connect_to(d.port, 0);
  in->len = 0;
  send_all(fd, "GET /healthz HTTP/1.0\r\n\r\n");
  ssize_t n = -1;
  while (in->len < sizeof in->data - 1 &&
         (n = recv(fd, in->data + in->len, sizeof in->data - 1 - in->len, 0)) > 0)
    in->len += (size_t)n;
  assert_int_equal(n, 0); /* closed by the server, not timed out */
  in->data[in->len] = '\0';
  if (strncmp(in->data, "HTTP/1.0 200 ", 13) != 0 ||
      !strstr(in->data, "\r\n\r\n{\"status\":\"ok\"}\n"))
    fail_msg("the HTTP/1.0 answer: '%s'", in->data);
  close(fd);

  free(in);
  assert_int_equal(cph_test_daemon_stop(&d), 0);
  unlink(policy);
  free(policy);
}

/* Answers larger than the socket takes at once (a client that reads late, with a small receive
 * buffer): what write_now could not write goes out through evhttp's write event, every answer
 * arrives whole and in order, and the connection then carries the next request. */
static void test_an_answer_the_socket_takes_in_pieces_arrives_whole(void **state) {
  (void)state;
  char *policy = copy_example_policy();
  cph_test_daemon d;
  assert_int_equal(cph_test_daemon_start(&d, policy, NULL, NULL), 0);
  char *spec_path = cph_test_source_path("docs/openapi.json");
  size_t spec_len = 0;
  char *spec = cph_test_read_file(spec_path, &spec_len);
  assert_non_null(spec);
  assert_true(spec_len > 100000); /* far more than a 4 KiB receive buffer holds */
  inbuf *in = calloc(1, sizeof *in);
  char *body = malloc(spec_len + 1);
  assert_non_null(in);
  assert_non_null(body);

  int fd = connect_to(d.port, 4096);
  /* 64 answers pipelined, 17 MB: more than the server's socket buffer grows to (4 MiB,
   * tcp_wmem), so answers go out in pieces through evhttp's write event (strace: writev
   * calls of 127,188 and 152,428 bytes of an answer's 268,062) */
  enum { PIPELINED = 64 };
  for (int i = 0; i < PIPELINED; i++)
    send_all(fd, "GET /v1/openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  usleep(300 * 1000); /* the server has written what the socket took, and waits */
  for (int i = 0; i < PIPELINED; i++) {
    assert_int_equal(next_answer(fd, in, body, spec_len + 1), 200);
    if (strlen(body) != spec_len || memcmp(body, spec, spec_len) != 0)
      fail_msg("answer %d: %zu bytes, not docs/openapi.json's %zu", i, strlen(body), spec_len);
  }
  send_all(fd, "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  assert_int_equal(next_answer(fd, in, body, spec_len + 1), 200);
  assert_string_equal(body, "{\"status\":\"ok\"}\n");
  close(fd);

  free(body);
  free(in);
  free(spec);
  free(spec_path);
  assert_int_equal(cph_test_daemon_stop(&d), 0);
  unlink(policy);
  free(policy);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_daemon_serves_health_and_json_errors),
      cmocka_unit_test(test_sighup_reloads_and_rejects_a_broken_policy),
      cmocka_unit_test(test_refuses_non_loopback_listen_without_auth),
      cmocka_unit_test(test_broken_policy_stops_startup_with_file_line_col),
      cmocka_unit_test(test_one_connection_carries_requests_in_order_and_closes_when_asked),
      cmocka_unit_test(test_an_answer_the_socket_takes_in_pieces_arrives_whole),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
