#define _GNU_SOURCE
#include "api.h"
#include "oas.h"
#include "testutil.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <msgpack.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int connect_loopback(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0)
    return -1;
  struct sockaddr_in sin = {0};
  sin.sin_family = AF_INET;
  sin.sin_port = htons((uint16_t)port);
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&sin, sizeof sin) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

static int write_all(int fd, const void *data, size_t len) {
  const char *p = data;
  while (len) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL); /* a server that stops reading must not kill us */
    if (n <= 0)
      return -1;
    p += n;
    len -= (size_t)n;
  }
  return 0;
}

static int send_request(int fd, const char *method, const char *path, const char *extra_headers,
                        const void *body, size_t body_len) {
  char *head;
  int n = asprintf(&head,
                   "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n%s"
                   "Content-Length: %zu\r\n\r\n",
                   method, path, extra_headers ? extra_headers : "", body_len);
  if (n < 0)
    abort();
  int rc = write_all(fd, head, (size_t)n);
  free(head);
  if (rc == 0 && body_len)
    rc = write_all(fd, body, body_len);
  return rc;
}

cph_test_response cph_test_http_raw(int port, const char *method, const char *path,
                                    const char *extra_headers, const void *body,
                                    size_t body_len) {
  cph_test_response r = {-1, NULL, 0, NULL};
  int fd = connect_loopback(port);
  if (fd < 0)
    return r;
  /* A server that refuses a big body early may close before all of it is written: still
   * read whatever answer it sent. */
  (void)send_request(fd, method, path, extra_headers, body, body_len);
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
  if (len < 12 || strncmp(buf, "HTTP/1.", 7) != 0 || !sep) {
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

cph_test_response cph_test_api(int port, const char *method, const char *path,
                               const char *token, const char *body) {
  char headers[512] = "";
  size_t used = 0;
  if (body)
    used += (size_t)snprintf(headers + used, sizeof headers - used,
                             "Content-Type: application/json\r\n");
  if (token)
    snprintf(headers + used, sizeof headers - used, "Authorization: Bearer %s\r\n", token);
  return cph_test_http_raw(port, method, path, headers, body, body ? strlen(body) : 0);
}

json_t *cph_test_json(const cph_test_response *r) {
  if (!r->body || r->body_len == 0)
    return NULL;
  return json_loadb(r->body, r->body_len, 0, NULL);
}

void cph_test_completion(const json_t *turn, char *path, size_t path_size, char *body,
                         size_t body_size) {
  snprintf(path, path_size, "/v1/turns/%lld/complete",
           (long long)json_integer_value(json_object_get(turn, "id")));
  snprintf(body, body_size, "{\"lease\":\"%s\",\"cost\":{\"tokens\":1,\"tool_calls\":0}}",
           json_string_value(json_object_get(turn, "lease")));
}

void cph_test_expect_error(const cph_test_response *r, int status, const char *code,
                           const char *field) {
  json_t *j = cph_test_json(r);
  json_t *err = json_object_get(j, "error");
  const char *got_code = json_string_value(json_object_get(err, "code"));
  const char *msg = json_string_value(json_object_get(err, "message"));
  json_t *got_field = json_object_get(err, "field");
  bool field_ok = field ? json_is_string(got_field) &&
                              strcmp(json_string_value(got_field), field) == 0
                        : json_is_null(got_field);
  if (r->status != status || !got_code || strcmp(got_code, code) != 0 || !msg || !*msg ||
      !field_ok)
    fail_msg("want %d %s field=%s, got %d: %s", status, code, field ? field : "null", r->status,
             r->body ? r->body : "(no body)");
  json_decref(j);
}

const char *cph_test_header(const cph_test_response *r, const char *name, char *buf,
                            size_t size) {
  if (!r->headers)
    return NULL;
  size_t nlen = strlen(name);
  for (const char *line = r->headers; line && *line;) {
    const char *eol = strstr(line, "\r\n");
    size_t llen = eol ? (size_t)(eol - line) : strlen(line);
    if (llen > nlen && strncasecmp(line, name, nlen) == 0 && line[nlen] == ':') {
      const char *v = line + nlen + 1;
      while (*v == ' ')
        v++;
      size_t vlen = llen - (size_t)(v - line);
      snprintf(buf, size, "%.*s", (int)vlen, v);
      return buf;
    }
    line = eol ? eol + 2 : NULL;
  }
  return NULL;
}

char *cph_test_sha256_hex(const char *s) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  if (EVP_Digest(s, strlen(s), md, &n, EVP_sha256(), NULL) != 1 || n != 32)
    abort();
  char *hex = malloc(65);
  for (unsigned i = 0; i < 32; i++)
    snprintf(hex + 2 * i, 3, "%02x", md[i]);
  return hex;
}

/* A msgpack value as a jansson tree (the kinds an answer holds), NULL for any other kind. */
static json_t *mp_to_json(const msgpack_object *o) {
  switch (o->type) {
  case MSGPACK_OBJECT_NIL: return json_null();
  case MSGPACK_OBJECT_BOOLEAN: return json_boolean(o->via.boolean);
  case MSGPACK_OBJECT_POSITIVE_INTEGER: return json_integer((json_int_t)o->via.u64);
  case MSGPACK_OBJECT_NEGATIVE_INTEGER: return json_integer((json_int_t)o->via.i64);
  case MSGPACK_OBJECT_STR: return json_stringn(o->via.str.ptr, o->via.str.size);
  case MSGPACK_OBJECT_ARRAY: {
    json_t *a = json_array();
    for (uint32_t i = 0; i < o->via.array.size; i++)
      json_array_append_new(a, mp_to_json(&o->via.array.ptr[i]));
    return a;
  }
  case MSGPACK_OBJECT_MAP: {
    json_t *m = json_object();
    for (uint32_t i = 0; i < o->via.map.size; i++) {
      const msgpack_object *k = &o->via.map.ptr[i].key;
      assert_int_equal(k->type, MSGPACK_OBJECT_STR);
      char key[64];
      snprintf(key, sizeof key, "%.*s", (int)k->via.str.size, k->via.str.ptr);
      json_object_set_new(m, key, mp_to_json(&o->via.map.ptr[i].val));
    }
    return m;
  }
  default: return NULL;
  }
}

json_t *cph_test_msgpack_json(const void *body, size_t len) {
  msgpack_unpacked up;
  msgpack_unpacked_init(&up);
  size_t off = 0;
  assert_int_equal(msgpack_unpack_next(&up, body, len, &off), MSGPACK_UNPACK_SUCCESS);
  assert_int_equal(off, len); /* one value, nothing after it */
  json_t *j = mp_to_json(&up.data);
  msgpack_unpacked_destroy(&up);
  return j;
}

void cph_test_promtool_check(const char *text) {
  char *path = cph_test_write_tmpfile(".prom", text);
  const char *argv[] = {"/bin/sh", "-c",
                        "command -v promtool >/dev/null || { echo 'promtool not found: run "
                        "scripts/install-deps.sh (Debian package prometheus)' >&2; exit 127; }; "
                        "exec promtool check metrics < \"$1\"",
                        "sh", path, NULL};
  char *out = NULL, *err = NULL;
  int rc = cph_test_run(argv, &out, &err);
  unlink(path);
  free(path);
  if (rc != 0)
    fail_msg("promtool check metrics exited %d:\n%s%s\n--- the scrape:\n%s", rc, out, err, text);
  free(out);
  free(err);
}

int64_t cph_test_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int cph_test_http_send_only(int port, const char *method, const char *path, const char *body) {
  int fd = connect_loopback(port);
  if (fd < 0)
    return -1;
  if (send_request(fd, method, path, body ? "Content-Type: application/json\r\n" : NULL, body,
                   body ? strlen(body) : 0) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}
