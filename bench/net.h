/* cephalon-bench: loopback connections and the small protocol clients the scenarios drive
 * servers with — HTTP/1.1 keep-alive (cephalond), the beanstalkd text protocol and RESP
 * (Redis). Every connection goes to 127.0.0.1 only. Blocking sockets with send and receive
 * timeouts (CPH_BENCH_IO_TIMEOUT_S), so no call waits forever; one connection per thread.
 *
 * Every function returns 0 on success or -1 on a failure (connection closed, timeout,
 * malformed answer); a connection that failed must be closed. */
#ifndef CEPHALON_BENCH_NET_H
#define CEPHALON_BENCH_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CPH_BENCH_IO_TIMEOUT_S 30

typedef struct cph_bench_conn {
  int fd;        /* -1 when closed */
  int port;
  char *buf;     /* received bytes; [off, len) not consumed yet */
  size_t cap, len, off;
  char *aux;     /* bodies that cannot stay in buf (chunked, or followed by more bytes) */
  size_t aux_cap;
} cph_bench_conn;

/* Zero it before first use: CPH_BENCH_CONN_INIT. */
#define CPH_BENCH_CONN_INIT {-1, 0, NULL, 0, 0, 0, NULL, 0}

/* Connects to 127.0.0.1:port with TCP_NODELAY and the I/O timeouts. */
int cph_bench_conn_open(cph_bench_conn *c, int port);
/* Closes the socket; the buffers stay for a reconnect. */
void cph_bench_conn_close(cph_bench_conn *c);
/* Closes and frees the buffers. */
void cph_bench_conn_free(cph_bench_conn *c);
/* Writes all of data. */
int cph_bench_conn_write(cph_bench_conn *c, const void *data, size_t len);
/* The next line, without its "\r\n", NUL-terminated in place; valid until the next read. */
int cph_bench_conn_line(cph_bench_conn *c, char **line, size_t *len);
/* The next n bytes (not NUL-terminated); valid until the next read. */
int cph_bench_conn_bytes(cph_bench_conn *c, size_t n, char **out);

/* A free loopback TCP port now (bound and released: a server started right after gets it
 * unless another process races for it; callers retry on a failed start). 0 on failure. */
int cph_bench_free_port(void);
/* True once something accepts connections on 127.0.0.1:port. */
bool cph_bench_port_open(int port);

/* ---- HTTP/1.1 ---- */

typedef struct cph_bench_resp {
  int status;
  char *body; /* into the connection's buffer, NUL-terminated; valid until the next request */
  size_t body_len;
} cph_bench_resp;

/* One request on a kept-alive connection; (re)connects when the connection is closed (also
 * after a server's "Connection: close"). body may be NULL. Reads the answer whole
 * (Content-Length or chunked). */
int cph_bench_http(cph_bench_conn *c, const char *method, const char *path, const char *body,
                   size_t body_len, cph_bench_resp *r);

/* Finds "key": in a JSON text and returns a pointer to its value, or NULL. A flat scan,
 * enough for the answers the bench reads (keys it looks for are unique where it looks). */
const char *cph_bench_json_find(const char *json, const char *key);
/* The unsigned integer value of "key" in json; -1 if absent. */
int cph_bench_json_u64(const char *json, const char *key, uint64_t *out);
/* The string value of "key" (no escapes expected) copied into out (size cap). */
int cph_bench_json_str(const char *json, const char *key, char *out, size_t cap);

#endif
