/* A threaded loopback HTTP(S) server whose answers a test computes: stands in for an
 * OpenAI-compatible model endpoint (POST /chat/completions, GET /models) that must look at
 * what it is asked (the messages, the tools) before answering, answer several clients at
 * once, keep connections alive, answer slowly, or speak TLS.
 *
 *   static void answer(void *arg, const cph_md_request *rq, cph_md_answer *out) {
 *     out->status = 200;
 *     out->body = cph_md_chat_text("hello", 7);  // malloc'd; the double frees it
 *   }
 *   cph_md *m = cph_md_start(answer, state, NULL, NULL);  // or cert/key PEM paths for TLS
 *   ... point the code under test at cph_md_url(m) ...
 *   cph_md_stop(m);
 *
 * Behaviour: 127.0.0.1, a kernel-chosen port, a thread per connection, HTTP/1.1 keep-alive
 * (Content-Length framed requests and answers). The handler runs on the connection's thread
 * (it must be thread-safe). delay_ms holds the answer back, cut short by stop or by the
 * client hanging up. Setup failures abort the test. */
#ifndef CEPHALON_TESTS_MODEL_DOUBLE_H
#define CEPHALON_TESTS_MODEL_DOUBLE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct cph_md_request {
  const char *method;
  const char *path;
  const char *headers; /* "Name: value\r\n" lines */
  const char *body;
  size_t body_len;
  json_t *json; /* the body parsed, or NULL */
} cph_md_request;

typedef struct cph_md_answer {
  int status;     /* 0 = close the connection without answering */
  char *body;     /* malloc'd (freed by the double), NULL = empty */
  int delay_ms;
} cph_md_answer;

typedef void (*cph_md_handler)(void *arg, const cph_md_request *rq, cph_md_answer *out);

typedef struct cph_md cph_md;

/* cert_pem and key_pem: both NULL for plain http, else the server speaks https with them. */
cph_md *cph_md_start(cph_md_handler handler, void *arg, const char *cert_pem,
                     const char *key_pem);
void cph_md_stop(cph_md *m);
int cph_md_port(const cph_md *m);
const char *cph_md_url(const cph_md *m); /* "http[s]://127.0.0.1:PORT" */
/* Requests answered or being answered so far. */
size_t cph_md_count(cph_md *m);
/* Connections accepted so far (a client that keeps its connection alive opens one). */
size_t cph_md_connections(cph_md *m);

/* OpenAI chat-completion bodies (malloc'd JSON text). */
char *cph_md_chat_text(const char *content, int total_tokens);
/* One tool call: arguments is the raw string the model "wrote" (may be invalid JSON). */
char *cph_md_chat_tool_call(const char *call_id, const char *tool, const char *arguments,
                            int total_tokens);
/* {"error": {"message", "type"}} */
char *cph_md_error_body(const char *message);

/* Header value (case-insensitive) from rq->headers into buf; false if absent. */
bool cph_md_header(const cph_md_request *rq, const char *name, char *buf, size_t len);

/* Writes a self-signed certificate for 127.0.0.1 (CN and subjectAltName IP) with the
 * openssl CLI into dir/cert.pem and dir/key.pem. Aborts the test on failure. */
void cph_md_make_cert(const char *dir);

#endif
