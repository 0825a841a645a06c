/* What the OpenAI-compatible providers (embed_openai.c, summarize_openai.c) share: one JSON
 * request and its JSON answer, and the wording of a broken answer. Private to providers/.
 * `what` names the provider in every message ("embeddings", "summarizer"). */
#ifndef CEPHALON_PROVIDERS_OPENAI_HTTP_H
#define CEPHALON_PROVIDERS_OPENAI_HTTP_H

#include <jansson.h>

#include "cephalon/error.h"

/* POSTs req to url (the endpoint itself) with the bearer token (NULL: none), bounded by
 * timeout_ms, and parses a 2xx answer as JSON into *answer (a new reference). Errors:
 * "<what> URL: out of memory", "<what>: <transport failure>", the status check of
 * common/http_client.h, and CPH_EPARSE "<what> URL: bad answer: not JSON ...". */
int openai_post(const char *what, const char *url, const char *bearer, int timeout_ms,
                const json_t *req, json_t **answer, cph_err *err);

/* "<what> URL: bad answer: <fmt ...>" as CPH_EPARSE: the server broke the contract. */
int openai_bad_answer(cph_err *err, const char *what, const char *url, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#endif
