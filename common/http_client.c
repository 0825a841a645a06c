/* The blocking HTTP client of cephalonctl, the network providers and cephalon-worker, over
 * libcurl's easy interface: one request per call, the whole exchange bounded by one timeout,
 * connections kept alive through a pool of easy handles. See http_client.h. */
#include "common/http_client.h"

#include <curl/curl.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/buf.h"

#define DEFAULT_TIMEOUT_MS 30000
#define POOL_MAX 16 /* idle easy handles kept (each holds its kept-alive connections) */

/* ---------------------------------------------------------------- URL */

static char *dup_range(const char *s, size_t n) {
  char *p = malloc(n + 1);
  if (p) {
    memcpy(p, s, n);
    p[n] = '\0';
  }
  return p;
}

void cph_httpc_url_free(cph_httpc_url *u) {
  free(u->host);
  free(u->port);
  free(u->host_header);
  free(u->prefix);
  memset(u, 0, sizeof *u);
}

int cph_httpc_url_parse(const char *text, cph_httpc_url *out, const char **why) {
  memset(out, 0, sizeof *out);
  size_t scheme_len;
  if (strncasecmp(text, "https://", 8) == 0) {
    scheme_len = 8;
  } else if (strncasecmp(text, "http://", 7) == 0) {
    scheme_len = 7;
  } else {
    *why = "expected http[s]://HOST[:PORT][/PREFIX]";
    return -1;
  }
  for (const char *p = text; *p; p++) {
    if ((unsigned char)*p <= 0x20 || *p == 0x7f) {
      *why = "spaces and control characters are not allowed";
      return -1;
    }
  }
  const char *auth = text + scheme_len;
  size_t auth_len = strcspn(auth, "/?#");
  const char *rest = auth + auth_len;
  if (strpbrk(rest, "?#")) {
    *why = "a query or fragment is not allowed in the base URL";
    return -1;
  }
  if (memchr(auth, '@', auth_len)) {
    *why = "user info (user@host) is not supported; use --token";
    return -1;
  }

  const char *host = auth, *host_end, *port = NULL;
  if (auth_len > 0 && auth[0] == '[') { /* [IPv6 literal] */
    const char *close = memchr(auth, ']', auth_len);
    if (!close) {
      *why = "unterminated '[' in the host";
      return -1;
    }
    host = auth + 1;
    host_end = close;
    if (close + 1 < rest) {
      if (close[1] != ':') {
        *why = "expected ':' after ']'";
        return -1;
      }
      port = close + 2;
    }
  } else {
    const char *colon = memchr(auth, ':', auth_len);
    host_end = colon ? colon : rest;
    if (colon) {
      if (memchr(colon + 1, ':', (size_t)(rest - colon - 1))) {
        *why = "put an IPv6 address in brackets: http://[::1]:7070";
        return -1;
      }
      port = colon + 1;
    }
  }
  if (host_end == host) {
    *why = "missing host";
    return -1;
  }
  unsigned long port_num = scheme_len == 8 ? 443 : 80;
  if (port && port < rest) { /* "host:" with an empty port means the default, as in RFC 3986 */
    size_t plen = (size_t)(rest - port);
    if (plen > 5 || strspn(port, "0123456789") < plen) {
      *why = "the port must be a number from 1 to 65535";
      return -1;
    }
    port_num = strtoul(port, NULL, 10);
    if (port_num < 1 || port_num > 65535) {
      *why = "the port must be a number from 1 to 65535";
      return -1;
    }
  }
  size_t prefix_len = strlen(rest);
  while (prefix_len > 0 && rest[prefix_len - 1] == '/')
    prefix_len--;

  char port_text[8];
  snprintf(port_text, sizeof port_text, "%lu", port_num);
  out->host = dup_range(host, (size_t)(host_end - host));
  out->port = dup_range(port_text, strlen(port_text));
  out->host_header = dup_range(auth, auth_len);
  out->prefix = dup_range(rest, prefix_len);
  out->https = scheme_len == 8;
  if (!out->host || !out->port || !out->host_header || !out->prefix) {
    cph_httpc_url_free(out);
    *why = "out of memory";
    return -1;
  }
  return 0;
}

/* ---------------------------------------------------------------- libcurl and the pool */

/* Idle easy handles, newest last. A handle keeps its connection cache across
 * curl_easy_reset, so taking the newest one back is what makes keep-alive work. */
static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static CURL *pool[POOL_MAX];
static size_t pool_n;
static char *default_ca; /* under pool_lock */
static pthread_once_t global_once = PTHREAD_ONCE_INIT;
static CURLcode global_rc = CURLE_FAILED_INIT;

static void global_init(void) { global_rc = curl_global_init(CURL_GLOBAL_DEFAULT); }

int cph_httpc_set_ca_file(const char *path) {
  char *copy = NULL;
  if (path && path[0] && !(copy = strdup(path)))
    return CPH_ENOMEM;
  pthread_mutex_lock(&pool_lock);
  free(default_ca);
  default_ca = copy;
  pthread_mutex_unlock(&pool_lock);
  return CPH_OK;
}

void cph_httpc_global_cleanup(void) {
  pthread_mutex_lock(&pool_lock);
  for (size_t i = 0; i < pool_n; i++)
    curl_easy_cleanup(pool[i]);
  pool_n = 0;
  free(default_ca);
  default_ca = NULL;
  pthread_mutex_unlock(&pool_lock);
  if (global_rc == CURLE_OK)
    curl_global_cleanup();
}

/* A handle from the pool, or a new one; NULL when libcurl cannot start. *ca gets a copy of the
 * default CA file (or NULL); free it after the transfer. */
static CURL *handle_take(char **ca) {
  pthread_once(&global_once, global_init);
  *ca = NULL;
  if (global_rc != CURLE_OK)
    return NULL;
  CURL *h = NULL;
  pthread_mutex_lock(&pool_lock);
  if (pool_n > 0)
    h = pool[--pool_n];
  if (default_ca)
    *ca = strdup(default_ca);
  pthread_mutex_unlock(&pool_lock);
  if (h)
    curl_easy_reset(h);
  else
    h = curl_easy_init();
  return h;
}

static void handle_give_back(CURL *h) {
  pthread_mutex_lock(&pool_lock);
  if (pool_n < POOL_MAX) {
    pool[pool_n++] = h;
    h = NULL;
  }
  pthread_mutex_unlock(&pool_lock);
  if (h)
    curl_easy_cleanup(h);
}

/* ---------------------------------------------------------------- one request */

/* A header value may not carry CR, LF or other control characters (header injection). */
static bool header_safe(const char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < 0x20 || *s == 0x7f)
      return false;
  return true;
}

/* An extra header line is "Name: value" with a token name and no control characters. */
static bool extra_header_ok(const char *h) {
  size_t name = strcspn(h, ":");
  if (name == 0 || h[name] != ':' || !header_safe(h))
    return false;
  for (size_t i = 0; i < name; i++)
    if (h[i] == ' ' || h[i] == '\t' || h[i] == '(' || h[i] == ')' || h[i] == ',' || h[i] == '/' ||
        h[i] == ';' || h[i] == '"')
      return false;
  return true;
}

static const char *unsafe_part(const cph_httpc_request *req) {
  if (req->token && !header_safe(req->token))
    return "the token";
  if (!header_safe(req->path))
    return "the request path";
  if (req->user_agent && !header_safe(req->user_agent))
    return "the user agent";
  if (req->content_type && !header_safe(req->content_type))
    return "the content type";
  for (const char *const *h = req->headers; h && *h; h++)
    if (!extra_header_ok(*h))
      return "an extra header";
  return NULL;
}

void cph_httpc_response_free(cph_httpc_response *resp) {
  free(resp->body);
  memset(resp, 0, sizeof *resp);
}

/* What the callbacks fill while a transfer runs. */
typedef struct transfer {
  cph_buf body;
  bool too_big;
  bool streamed_stop; /* on_data asked to stop */
  const cph_httpc_request *req;
  cph_httpc_response *resp;
} transfer;

static size_t on_body(char *data, size_t size, size_t n, void *arg) {
  transfer *t = arg;
  size_t len = size * n;
  if (t->req->on_data) { /* a stream: handed over as it comes, nothing kept */
    if (t->req->on_data(t->req->on_data_arg, data, len) == 0)
      return len;
    t->streamed_stop = true;
    return 0;
  }
  if (t->body.len + len > CPH_HTTPC_MAX_BODY) {
    t->too_big = true;
    return 0; /* aborts the transfer (CURLE_WRITE_ERROR) */
  }
  cph_buf_append(&t->body, data, len);
  return cph_buf_error(&t->body) ? 0 : len;
}

/* The status line of each answer (interim 1xx ones too: the last one wins) gives the reason
 * phrase, which libcurl does not keep. */
static size_t on_header(char *data, size_t size, size_t n, void *arg) {
  transfer *t = arg;
  size_t len = size * n;
  if (len > 5 && strncmp(data, "HTTP/", 5) == 0) {
    const char *sp = memchr(data, ' ', len); /* before the status */
    const char *end = data + len;
    while (end > data && (end[-1] == '\r' || end[-1] == '\n'))
      end--;
    t->resp->reason[0] = '\0';
    if (sp && end - sp > 5 && sp[4] == ' ') {
      size_t rn = (size_t)(end - (sp + 5));
      if (rn >= sizeof t->resp->reason)
        rn = sizeof t->resp->reason - 1;
      memcpy(t->resp->reason, sp + 5, rn);
      t->resp->reason[rn] = '\0';
    }
  }
  return len;
}

static int on_progress(void *arg, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow) {
  const cph_httpc_request *req = arg;
  (void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
  return req->cancel(req->cancel_arg) ? 1 : 0;
}

static int map_curl_error(CURLcode c) {
  switch (c) {
  case CURLE_COULDNT_RESOLVE_HOST:
  case CURLE_COULDNT_RESOLVE_PROXY:
  case CURLE_COULDNT_CONNECT:
    return CPH_HTTPC_ECONNECT;
  case CURLE_OPERATION_TIMEDOUT:
    return CPH_HTTPC_ETIMEOUT;
  case CURLE_OUT_OF_MEMORY:
    return CPH_HTTPC_ENOMEM;
  case CURLE_UNSUPPORTED_PROTOCOL:
  case CURLE_URL_MALFORMAT:
    return CPH_HTTPC_EINVAL;
  case CURLE_SSL_CONNECT_ERROR:
  case CURLE_PEER_FAILED_VERIFICATION:
  case CURLE_SSL_CERTPROBLEM:
  case CURLE_SSL_CIPHER:
  case CURLE_SSL_CACERT_BADFILE:
  case CURLE_SSL_ENGINE_NOTFOUND:
  case CURLE_SSL_ENGINE_SETFAILED:
    return CPH_HTTPC_ETLS;
  case CURLE_WEIRD_SERVER_REPLY:
  case CURLE_BAD_CONTENT_ENCODING:
    return CPH_HTTPC_EPROTO;
  default:
    return CPH_HTTPC_EIO;
  }
}

/* The full URL: scheme, the authority as written, the prefix and the path. */
static void build_url(cph_buf *b, const cph_httpc_url *url, const cph_httpc_request *req) {
  bool root = url->prefix[0] == '\0' && req->path[0] == '\0';
  cph_buf_printf(b, "%s://%s%s%s", url->https ? "https" : "http", url->host_header,
                 root ? "/" : url->prefix, req->path);
}

int cph_httpc_do(const cph_httpc_url *url, const cph_httpc_request *req, cph_httpc_response *resp,
                 char *err, size_t err_len) {
  memset(resp, 0, sizeof *resp);
  err[0] = '\0';
  const char *unsafe = unsafe_part(req);
  if (unsafe) {
    /* A header line is not echoed: it may be a credential. */
    snprintf(err, err_len, "%s contains control characters or is malformed", unsafe);
    return CPH_HTTPC_EINVAL;
  }
  char *ca = NULL;
  CURL *h = handle_take(&ca);
  if (!h) {
    snprintf(err, err_len, "libcurl could not start");
    return CPH_HTTPC_ENOMEM;
  }
  int rc = CPH_HTTPC_OK;
  transfer t = {.body = CPH_BUF_INIT, .req = req, .resp = resp};
  cph_buf target = CPH_BUF_INIT, line = CPH_BUF_INIT;
  struct curl_slist *headers = NULL, *more;
  char curl_err[CURL_ERROR_SIZE] = "";
  int timeout_ms = req->timeout_ms > 0 ? req->timeout_ms : DEFAULT_TIMEOUT_MS;

  build_url(&target, url, req);
  cph_buf_putc(&target, '\0');
  /* The caller's extra headers, then ours: Accept and Content-Type only when the caller did
   * not give them (a list with both would send both). */
  bool has_accept = false, has_type = false;
  for (const char *const *x = req->headers; x && *x; x++) {
    has_accept |= strncasecmp(*x, "Accept:", 7) == 0;
    has_type |= strncasecmp(*x, "Content-Type:", 13) == 0;
    if (!(more = curl_slist_append(headers, *x)))
      goto nomem;
    headers = more;
  }
  if (!has_accept && !(more = curl_slist_append(headers, "Accept: application/json")))
    goto nomem;
  headers = has_accept ? headers : more;
  if (req->token) {
    cph_buf_reset(&line);
    cph_buf_printf(&line, "Authorization: Bearer %s", req->token);
    cph_buf_putc(&line, '\0');
    if (cph_buf_error(&line) || !(more = curl_slist_append(headers, line.data)))
      goto nomem;
    headers = more;
  }
  bool has_body = req->body != NULL;
  if (has_body && !has_type) {
    cph_buf_reset(&line);
    cph_buf_printf(&line, "Content-Type: %s",
                   req->content_type ? req->content_type : "application/json");
    cph_buf_putc(&line, '\0');
    if (cph_buf_error(&line) || !(more = curl_slist_append(headers, line.data)))
      goto nomem;
    headers = more;
  }
  /* No "Expect: 100-continue" round trip before bigger bodies. */
  if (!(more = curl_slist_append(headers, "Expect:")))
    goto nomem;
  headers = more;
  if (cph_buf_error(&target))
    goto nomem;

  curl_easy_setopt(h, CURLOPT_URL, target.data);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)timeout_ms);
  curl_easy_setopt(h, CURLOPT_USERAGENT, req->user_agent ? req->user_agent : "cephalon");
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, curl_err);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
  if (req->cancel) {
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, (void *)req);
  }
  const char *ca_file = req->ca_file ? req->ca_file : ca;
  if (ca_file && ca_file[0])
    curl_easy_setopt(h, CURLOPT_CAINFO, ca_file);
  const char *m = req->method;
  if (strcmp(m, "GET") == 0) {
    curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
  } else if (strcmp(m, "HEAD") == 0) {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else {
    /* POST framing for every method with a body; POST and PUT are always framed (some
     * servers answer 411 to a body-less POST without a length). */
    if (has_body || strcmp(m, "POST") == 0 || strcmp(m, "PUT") == 0) {
      curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)(has_body ? req->body_len : 0));
      curl_easy_setopt(h, CURLOPT_POSTFIELDS, has_body ? req->body : "");
    }
    if (strcmp(m, "POST") != 0)
      curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, m);
  }

  CURLcode c = curl_easy_perform(h);
  if (c != CURLE_OK) {
    if (c == CURLE_ABORTED_BY_CALLBACK || t.streamed_stop) {
      rc = CPH_HTTPC_ECANCELED;
      snprintf(err, err_len, "canceled");
    } else if (t.too_big) {
      rc = CPH_HTTPC_EPROTO;
      snprintf(err, err_len, "the answer is larger than %zu bytes", (size_t)CPH_HTTPC_MAX_BODY);
    } else if (c == CURLE_WRITE_ERROR || c == CURLE_OUT_OF_MEMORY) {
      rc = CPH_HTTPC_ENOMEM;
      snprintf(err, err_len, "out of memory");
    } else {
      rc = map_curl_error(c);
      long os_errno = 0;
      curl_easy_getinfo(h, CURLINFO_OS_ERRNO, &os_errno);
      if (c == CURLE_OPERATION_TIMEDOUT)
        snprintf(err, err_len, "timed out after %.3g s", timeout_ms / 1000.0);
      else if (c == CURLE_COULDNT_CONNECT && os_errno != 0)
        snprintf(err, err_len, "%s", strerror((int)os_errno)); /* "Connection refused" */
      else
        snprintf(err, err_len, "%s", curl_err[0] ? curl_err : curl_easy_strerror(c));
    }
    goto out;
  }
  long status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  if (status < 100 || status > 599) {
    rc = CPH_HTTPC_EPROTO;
    snprintf(err, err_len, "the answer has no HTTP status");
    goto out;
  }
  resp->status = (int)status;
  resp->body_len = t.body.len;
  resp->body = t.body.data ? cph_buf_steal(&t.body) : calloc(1, 1);
  if (!resp->body) {
    rc = CPH_HTTPC_ENOMEM;
    snprintf(err, err_len, "out of memory");
  }
  goto out;

nomem:
  rc = CPH_HTTPC_ENOMEM;
  snprintf(err, err_len, "out of memory");
out:
  /* The handle must not keep pointers into this call's memory. */
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, NULL);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, NULL);
  handle_give_back(h);
  curl_slist_free_all(headers);
  cph_buf_free(&t.body);
  cph_buf_free(&target);
  cph_buf_free(&line);
  free(ca);
  if (rc != CPH_HTTPC_OK) {
    free(resp->body);
    memset(resp, 0, sizeof *resp);
  }
  return rc;
}

int cph_httpc_errcode(int httpc_rc) {
  switch (httpc_rc) {
  case CPH_HTTPC_OK:
    return CPH_OK;
  case CPH_HTTPC_ETIMEOUT:
    return CPH_ETIMEDOUT;
  case CPH_HTTPC_ENOMEM:
    return CPH_ENOMEM;
  case CPH_HTTPC_EINVAL:
    return CPH_EINVAL;
  case CPH_HTTPC_EPROTO:
    return CPH_EPARSE;
  default:
    return CPH_EIO; /* ECONNECT, EIO, ETLS */
  }
}

/* ---------------------------------------------------------------- the providers' helpers */

int cph_httpc_post_json(const char *base_url, const char *path, const char *body, size_t body_len,
                        const char *bearer, int timeout_ms, cph_httpc_response *resp,
                        cph_err *err) {
  memset(resp, 0, sizeof *resp);
  /* Messages name the URL as configured plus the path: userinfo is refused by the parser,
   * so the text holds no credential. */
  const char *shown = base_url ? base_url : "";
  int shown_len = (int)strlen(shown);
  while (shown_len > 0 && path[0] == '/' && shown[shown_len - 1] == '/')
    shown_len--; /* the parser drops it too: "http://h/x/" + "/op" is http://h/x/op */
  cph_httpc_url url;
  const char *why = NULL;
  if (cph_httpc_url_parse(shown, &url, &why) != 0) {
    cph_httpc_url_free(&url);
    return cph_err_set(err, CPH_EINVAL, "POST %.*s%s: bad URL: %s", shown_len, shown, path, why);
  }
  cph_httpc_request req = {
      .method = "POST",
      .path = path,
      .token = bearer,
      .body = body,
      .body_len = body_len,
      .timeout_ms = timeout_ms,
  };
  char detail[400];
  int rc = cph_httpc_do(&url, &req, resp, detail, sizeof detail);
  cph_httpc_url_free(&url);
  if (rc != CPH_HTTPC_OK)
    return cph_err_set(err, cph_httpc_errcode(rc), "POST %.*s%s: %s%s", shown_len, shown, path,
                       rc == CPH_HTTPC_ECONNECT ? "cannot connect: " : "", detail);
  return CPH_OK;
}

static int status_code(int status) {
  switch (status) {
  case 401:
    return CPH_EAUTH;
  case 403:
    return CPH_EFORBIDDEN;
  case 404:
    return CPH_ENOTFOUND;
  case 408:
  case 504:
    return CPH_ETIMEDOUT;
  case 429:
  case 503:
    return CPH_EBUSY;
  default:
    return status >= 400 && status < 500 ? CPH_EINVAL : CPH_EIO;
  }
}

int cph_httpc_check_status(const cph_httpc_response *resp, const char *what, const char *url,
                           cph_err *err) {
  if (resp->status >= 200 && resp->status < 300)
    return CPH_OK;
  /* The first line of the body, trimmed, control characters replaced: servers put their
   * error there, and a log line must stay one line. */
  char excerpt[201] = "";
  if (resp->body) {
    const char *b = resp->body + strspn(resp->body, " \t\r\n");
    size_t n = strcspn(b, "\r\n");
    if (n > 200)
      n = 200;
    for (size_t i = 0; i < n; i++) {
      unsigned char c = (unsigned char)b[i];
      excerpt[i] = c < 0x20 || c == 0x7f ? '?' : (char)c;
    }
    excerpt[n] = '\0';
  }
  return cph_err_set(err, status_code(resp->status), "%s %s: HTTP %d%s%s%s%s", what, url,
                     resp->status, resp->reason[0] ? " " : "", resp->reason, excerpt[0] ? ": " : "",
                     excerpt);
}

int cph_httpc_bearer_from_env(const char *env_name, const char **token, cph_err *err) {
  *token = NULL;
  if (!env_name || !env_name[0])
    return CPH_OK;
  const char *v = getenv(env_name);
  if (!v || !v[0])
    return cph_err_set(err, CPH_EAUTH, "environment variable %s (api-key-env) is not set",
                       env_name);
  if (!header_safe(v))
    return cph_err_set(err, CPH_EAUTH,
                       "environment variable %s (api-key-env) holds control characters", env_name);
  *token = v;
  return CPH_OK;
}
