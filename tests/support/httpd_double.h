/* An HTTP server double for tests: stands in for an embeddings endpoint, a chat endpoint or an
 * HTTP vector index, answering from a script and recording what it was asked.
 *
 *   cph_httpd *d = cph_httpd_start();
 *   cph_httpd_script(d, (cph_httpd_reply[]){{200, "{\"deleted\":[1]}"}, {500, "boom"}}, 2);
 *   ... point the code under test at cph_httpd_url(d) (http://127.0.0.1:PORT) ...
 *   cph_httpd_request r;
 *   cph_httpd_request_at(d, 0, &r);   // method, path, headers, body of the first request
 *   cph_httpd_request_free(&r);
 *   cph_httpd_stop(d);
 *
 * Behaviour:
 * - Listens on 127.0.0.1, port chosen by the kernel, served by one thread of the calling
 *   process: one connection at a time, one request per connection (the answer says
 *   `Connection: close`). Request bodies need a Content-Length (no chunked uploads).
 * - Each request takes the next scripted reply; when the script is used up, the default reply
 *   (initially 200 `{}`) answers. A reply with status 0 closes the connection without
 *   answering; delay_ms holds the answer back (timeout tests) without blocking stop — and is
 *   cut short when the client hangs up, so a timed-out client does not stall the next one.
 * - Every request is recorded, before it is answered, to a log file (cph_httpd_log_path) that
 *   other processes can read too; so once a client has its answer, its request is in the log.
 *   Record format: "> METHOD PATH BODY_LEN\n", the header lines as received ("Name: value\n"),
 *   "\n", BODY_LEN bytes of body, "\n".
 * - Setup failures (no socket, no thread) abort the test with a message: a double that cannot
 *   start is a broken test machine, not a result. */
#ifndef CEPHALON_TESTS_HTTPD_DOUBLE_H
#define CEPHALON_TESTS_HTTPD_DOUBLE_H

#include <stdbool.h>
#include <stddef.h>

typedef struct cph_httpd_reply {
  int status;       /* HTTP status; 0 = close the connection without an answer */
  const char *body; /* NULL = empty; sent as application/json */
  int delay_ms;     /* wait this long before answering */
} cph_httpd_reply;

typedef struct cph_httpd cph_httpd;

cph_httpd *cph_httpd_start(void);
/* Stops the server thread, removes the log file and frees d (NULL is fine). A client still
 * waiting on a delayed answer sees the connection close. */
void cph_httpd_stop(cph_httpd *d);

int cph_httpd_port(const cph_httpd *d);
const char *cph_httpd_url(const cph_httpd *d); /* "http://127.0.0.1:PORT", no trailing '/' */
const char *cph_httpd_log_path(const cph_httpd *d);

/* Replaces the queue of scripted replies with a copy of replies[0..n). */
void cph_httpd_script(cph_httpd *d, const cph_httpd_reply *replies, size_t n);
/* The reply used once the script is empty. */
void cph_httpd_set_default(cph_httpd *d, cph_httpd_reply reply);

/* A computed answer, for doubles whose reply depends on the request (an embeddings endpoint
 * that embeds what it is sent). Called on the server thread with the request's method, target
 * and body; it fills *out (body: malloc'd or NULL, freed by the double). */
typedef void (*cph_httpd_handler)(const char *method, const char *path, const char *body,
                                  size_t body_len, void *ctx, cph_httpd_reply *out);
/* Once the script is empty, fn answers instead of the default reply; NULL goes back to the
 * default. ctx is passed to fn, which may run until cph_httpd_stop or the next set_handler. */
void cph_httpd_set_handler(cph_httpd *d, cph_httpd_handler fn, void *ctx);

/* Requests recorded so far. */
size_t cph_httpd_count(cph_httpd *d);

typedef struct cph_httpd_request {
  char *method;
  char *path;    /* the request target as sent, e.g. "/v1/embeddings" */
  char *headers; /* header lines, each "Name: value\n" */
  char *body;    /* NUL-terminated */
  size_t body_len;
} cph_httpd_request;

/* The i-th request (0-based), read back from the log file. False when there is none. */
bool cph_httpd_request_at(cph_httpd *d, size_t i, cph_httpd_request *out);
/* The value of header name (case-insensitive) in r, copied into buf; false when absent. */
bool cph_httpd_request_header(const cph_httpd_request *r, const char *name, char *buf,
                              size_t len);
void cph_httpd_request_free(cph_httpd_request *r);

#endif
