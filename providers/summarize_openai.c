/* The OpenAI-compatible chat summariser (cph_summarize_openai, providers/providers.h). */
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/http_client.h"
#include "providers/openai_http.h"
#include "providers/providers.h"

static bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
}

#define SYSTEM_PROMPT                                                                              \
  "Summarise the following notes into one short, factual summary. Keep names, numbers, "           \
  "decisions and open questions; drop greetings and repetition. Answer with the summary only."

/* The user message: the texts separated by blank lines, as "- " items so the model sees
 * where one note ends. */
static int user_message(const char *const *texts, size_t n, cph_buf *b) {
  for (size_t i = 0; i < n; i++) {
    if (i)
      cph_buf_puts(b, "\n\n");
    cph_buf_puts(b, "- ");
    cph_buf_puts(b, texts[i] ? texts[i] : "");
  }
  return cph_buf_error(b);
}

static json_t *chat_request(const cph_policy_summarizer *cfg, const char *user) {
  json_t *root = json_object(), *messages = json_array(), *sys = json_object(),
         *usr = json_object();
  bool ok = root && messages && sys && usr &&
            !json_object_set_new(sys, "role", json_string("system")) &&
            !json_object_set_new(sys, "content", json_string(SYSTEM_PROMPT)) &&
            !json_object_set_new(usr, "role", json_string("user")) &&
            !json_object_set_new(usr, "content", json_string(user)) &&
            !json_array_append(messages, sys) && !json_array_append(messages, usr) &&
            !json_object_set_new(root, "model", json_string(cfg->model ? cfg->model : "")) &&
            !json_object_set(root, "messages", messages) &&
            !json_object_set_new(root, "max_tokens", json_integer((json_int_t)cfg->max_tokens));
  json_decref(sys);
  json_decref(usr);
  json_decref(messages);
  if (!ok) {
    json_decref(root);
    return NULL;
  }
  return root;
}

int cph_summarize_openai(const cph_policy_summarizer *cfg, const char *const *texts, size_t n,
                         char **out, cph_err *err) {
  *out = NULL;
  const char *url = cfg->url ? cfg->url : "";
  if (!url[0])
    return cph_err_set(err, CPH_EINVAL, "summarizer: no :url configured");
  const char *bearer;
  int rc = cph_httpc_bearer_from_env(cfg->api_key_env, &bearer, err);
  if (rc)
    return rc;

  cph_buf user = CPH_BUF_INIT;
  json_t *req = NULL, *answer = NULL;
  if (user_message(texts, n, &user) != CPH_OK) {
    rc = cph_err_set(err, CPH_ENOMEM, "summarizer %s: out of memory", url);
    goto out;
  }
  for (size_t i = 0; i < n; i++) { /* json_string refuses invalid UTF-8: say which text */
    json_t *probe = json_string(texts[i] ? texts[i] : "");
    if (!probe) {
      rc = cph_err_set(err, CPH_EINVAL, "summarizer %s: text %zu is not valid UTF-8", url, i);
      goto out;
    }
    json_decref(probe);
  }
  if (!(req = chat_request(cfg, user.data ? user.data : ""))) {
    rc = cph_err_set(err, CPH_ENOMEM, "summarizer %s: out of memory", url);
    goto out;
  }
  /* cfg->url is the endpoint itself (e.g. http://127.0.0.1:8080/v1/chat/completions). */
  if ((rc = openai_post("summarizer", url, bearer, (int)cfg->timeout_ms, req, &answer, err)))
    goto out;
  const json_t *choices = json_is_object(answer) ? json_object_get(answer, "choices") : NULL;
  const json_t *first = json_is_array(choices) ? json_array_get(choices, 0) : NULL;
  const json_t *msg = json_is_object(first) ? json_object_get(first, "message") : NULL;
  const json_t *content = json_is_object(msg) ? json_object_get(msg, "content") : NULL;
  if (!json_is_string(content)) {
    rc = openai_bad_answer(err, "summarizer", url,
                           "expected a string at choices[0].message.content");
    goto out;
  }
  const char *text = json_string_value(content);
  size_t len = json_string_length(content);
  while (len > 0 && is_space(*text)) {
    text++;
    len--;
  }
  while (len > 0 && is_space(text[len - 1]))
    len--;
  /* An empty summary would replace its sources with nothing: refuse it. */
  if (len == 0) {
    rc = openai_bad_answer(err, "summarizer", url, "choices[0].message.content is empty");
    goto out;
  }
  if (memchr(text, '\0', len)) {
    rc = openai_bad_answer(err, "summarizer", url,
                           "choices[0].message.content contains a NUL character");
    goto out;
  }
  if (!(*out = malloc(len + 1))) {
    rc = cph_err_set(err, CPH_ENOMEM, "summarizer %s: out of memory", url);
    goto out;
  }
  memcpy(*out, text, len);
  (*out)[len] = '\0';
  rc = CPH_OK;
out:
  cph_buf_free(&user);
  json_decref(req);
  json_decref(answer);
  return rc;
}
