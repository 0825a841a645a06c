/* cephalon-worker's options: flags, and the same options from an EDN file (--config), read
 * with the policy's EDN reader (include/cephalon/edn.h). Flags override the file; --mcp adds
 * to the file's servers. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cephalon/edn.h"
#include "common/buf.h"
#include "worker/worker.h"

static const char usage_text[] =
    "usage: cephalon-worker --daemon URL --llm URL --model NAME [--api-key-env VAR]\n"
    "         [--token-env VAR] [--mcp 'NAME=COMMAND ARGS...']... [--concurrency N]\n"
    "         [--lanes L,...] [--max-tool-rounds N] [--config FILE.edn] [--check]\n"
    "         [--name WORKER] [--ca-file PEM] [--lease-wait-ms MS] [--llm-timeout-ms MS]\n"
    "         [--tool-timeout-ms MS] [--check-config]\n"
    "\n"
    "Leases turns from cephalond, sends their messages to {llm}/chat/completions (OpenAI\n"
    "format) with the tools of the MCP servers, runs the tool calls and completes the turn.\n"
    "Keys come only from environment variables: --api-key-env for the model, --token-env\n"
    "for the daemon. --check probes the daemon, the model and each MCP server and exits;\n"
    "--check-config prints the effective options and exits.\n";

static void set_str(char **dst, const char *v) {
  free(*dst);
  *dst = v && v[0] ? strdup(v) : NULL;
}

/* "NAME=COMMAND ARGS..." into a new spec. -1 with why on a malformed one. */
static int add_mcp(wk_config *cfg, const char *name, const char *command, const char **why) {
  size_t nlen = strlen(name);
  if (nlen == 0 || nlen > 64 ||
      strspn(name, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                   "0123456789_-.") != nlen) {
    *why = "an MCP server's NAME is 1-64 characters of [A-Za-z0-9_.-]";
    return -1;
  }
  if (!command[strspn(command, " \t")]) {
    *why = "an MCP server needs a COMMAND after NAME=";
    return -1;
  }
  for (size_t i = 0; i < cfg->n_mcp; i++)
    if (strcmp(cfg->mcp[i].name, name) == 0) {
      *why = "two MCP servers with the same NAME";
      return -1;
    }
  wk_mcp_spec *p = realloc(cfg->mcp, (cfg->n_mcp + 1) * sizeof *p);
  if (!p) {
    *why = "out of memory";
    return -1;
  }
  cfg->mcp = p;
  p[cfg->n_mcp].name = strdup(name);
  p[cfg->n_mcp].command = strdup(command);
  cfg->n_mcp++;
  return 0;
}

static int add_mcp_spec(wk_config *cfg, const char *spec, const char **why) {
  const char *eq = strchr(spec, '=');
  if (!eq) {
    *why = "expected --mcp 'NAME=COMMAND ARGS...'";
    return -1;
  }
  char name[80];
  snprintf(name, sizeof name, "%.*s", (int)(eq - spec < 79 ? eq - spec : 79), spec);
  if (eq - spec > 64)
    name[0] = '\0'; /* reported as a bad name */
  return add_mcp(cfg, name, eq + 1, why);
}

static int parse_int(const char *s, int lo, int hi, int *out) {
  char *end;
  long v = strtol(s, &end, 10);
  if (!*s || *end || v < lo || v > hi)
    return -1;
  *out = (int)v;
  return 0;
}

/* ---------------------------------------------------------------- the EDN file */

typedef struct file_ctx {
  const char *path;
} file_ctx;

static int file_error(const file_ctx *f, const cph_edn *at, const char *key, const char *fmt,
                      const char *detail) {
  fprintf(stderr, "cephalon-worker: %s:%u:%u: ", f->path, at ? at->pos.line : 1,
          at ? at->pos.column : 1);
  if (key)
    fprintf(stderr, ":%s: ", key);
  fprintf(stderr, fmt, detail);
  fputc('\n', stderr);
  return 2;
}

static int file_str(const file_ctx *f, const cph_edn *v, const char *key, char **dst) {
  if (v->type != CPH_EDN_STRING)
    return file_error(f, v, key, "expected a string, got %s", cph_edn_type_name(v->type));
  set_str(dst, v->u.str.ptr);
  return 0;
}

static int file_int(const file_ctx *f, const cph_edn *v, const char *key, int lo, int hi,
                    int *dst) {
  if (v->type != CPH_EDN_INT || v->u.integer < lo || v->u.integer > hi) {
    char what[96];
    snprintf(what, sizeof what, "an integer from %d to %d", lo, hi);
    fprintf(stderr, "cephalon-worker: %s:%u:%u: :%s: expected %s, got ", f->path, v->pos.line,
            v->pos.column, key, what);
    cph_buf b = CPH_BUF_INIT;
    cph_edn_write(v, &b);
    cph_buf_putc(&b, '\0');
    fprintf(stderr, "%s\n", b.data ? b.data : "?");
    cph_buf_free(&b);
    return 2;
  }
  *dst = (int)v->u.integer;
  return 0;
}

static const char *const file_keys[] = {
    "daemon",  "llm",           "model",          "api-key-env",     "token-env",
    "mcp",     "concurrency",   "lanes",          "max-tool-rounds", "name",
    "ca-file", "lease-wait-ms", "llm-timeout-ms", "tool-timeout-ms", NULL};

static int apply_key(wk_config *cfg, const file_ctx *f, const cph_edn *key, const cph_edn *v) {
  const char *k = key->u.str.ptr;
  if (strcmp(k, "daemon") == 0)
    return file_str(f, v, k, &cfg->daemon);
  if (strcmp(k, "llm") == 0)
    return file_str(f, v, k, &cfg->llm);
  if (strcmp(k, "model") == 0)
    return file_str(f, v, k, &cfg->model);
  if (strcmp(k, "api-key-env") == 0)
    return file_str(f, v, k, &cfg->api_key_env);
  if (strcmp(k, "token-env") == 0)
    return file_str(f, v, k, &cfg->token_env);
  if (strcmp(k, "name") == 0)
    return file_str(f, v, k, &cfg->worker_name);
  if (strcmp(k, "ca-file") == 0)
    return file_str(f, v, k, &cfg->ca_file);
  if (strcmp(k, "concurrency") == 0)
    return file_int(f, v, k, 1, 256, &cfg->concurrency);
  if (strcmp(k, "max-tool-rounds") == 0)
    return file_int(f, v, k, 0, 1000, &cfg->max_tool_rounds);
  if (strcmp(k, "lease-wait-ms") == 0)
    return file_int(f, v, k, 0, 60000, &cfg->lease_wait_ms);
  if (strcmp(k, "llm-timeout-ms") == 0)
    return file_int(f, v, k, 1, 86400000, &cfg->llm_timeout_ms);
  if (strcmp(k, "tool-timeout-ms") == 0)
    return file_int(f, v, k, 1, 86400000, &cfg->tool_timeout_ms);
  if (strcmp(k, "lanes") == 0) {
    if (v->type != CPH_EDN_VECTOR && v->type != CPH_EDN_LIST)
      return file_error(f, v, k, "expected a vector of lane keywords, got %s",
                        cph_edn_type_name(v->type));
    cph_buf b = CPH_BUF_INIT;
    for (size_t i = 0; i < v->u.coll.count; i++) {
      const cph_edn *l = &v->u.coll.items[i];
      if (l->type != CPH_EDN_KEYWORD && l->type != CPH_EDN_STRING) {
        cph_buf_free(&b);
        return file_error(f, l, k, "expected a lane keyword (:interactive), got %s",
                          cph_edn_type_name(l->type));
      }
      if (i)
        cph_buf_putc(&b, ',');
      cph_buf_puts(&b, l->u.str.ptr);
    }
    cph_buf_putc(&b, '\0');
    set_str(&cfg->lanes, b.data);
    cph_buf_free(&b);
    return 0;
  }
  if (strcmp(k, "mcp") == 0) {
    if (v->type != CPH_EDN_MAP)
      return file_error(f, v, k, "expected a map of server name to command, got %s",
                        cph_edn_type_name(v->type));
    for (size_t i = 0; i < v->u.coll.count; i++) {
      const cph_edn *name = &v->u.coll.items[2 * i], *cmd = &v->u.coll.items[2 * i + 1];
      if (name->type != CPH_EDN_STRING && name->type != CPH_EDN_KEYWORD)
        return file_error(f, name, k, "expected a server name (a string), got %s",
                          cph_edn_type_name(name->type));
      if (cmd->type != CPH_EDN_STRING)
        return file_error(f, cmd, k, "expected a command line (a string), got %s",
                          cph_edn_type_name(cmd->type));
      const char *why = NULL;
      if (add_mcp(cfg, name->u.str.ptr, cmd->u.str.ptr, &why) != 0)
        return file_error(f, name, k, "%s", why);
    }
    return 0;
  }
  cph_buf known = CPH_BUF_INIT;
  for (const char *const *p = file_keys; *p; p++)
    cph_buf_printf(&known, "%s:%s", p == file_keys ? "" : " ", *p);
  cph_buf_putc(&known, '\0');
  fprintf(stderr, "cephalon-worker: %s:%u:%u: unknown key :%s (known: %s)\n", f->path,
          key->pos.line, key->pos.column, k, known.data ? known.data : "");
  cph_buf_free(&known);
  return 2;
}

static int load_file(wk_config *cfg, const char *path) {
  FILE *fp = fopen(path, "rb");
  if (!fp) {
    fprintf(stderr, "cephalon-worker: cannot read %s: %m\n", path);
    return 2;
  }
  cph_buf text = CPH_BUF_INIT;
  char chunk[8192];
  size_t n;
  while ((n = fread(chunk, 1, sizeof chunk, fp)) > 0)
    cph_buf_append(&text, chunk, n);
  fclose(fp);
  cph_edn *root = NULL;
  cph_edn_error err;
  int rc = cph_edn_parse(text.data ? text.data : "", text.len, NULL, &root, &err);
  cph_buf_free(&text);
  if (rc != 0) {
    fprintf(stderr, "cephalon-worker: %s:%u:%u: %s\n", path, err.line, err.column, err.message);
    return 2;
  }
  file_ctx f = {path};
  rc = 0;
  if (root->type != CPH_EDN_MAP) {
    rc = file_error(&f, root, NULL, "expected a map of options, got %s",
                    cph_edn_type_name(root->type));
  }
  for (size_t i = 0; rc == 0 && root->type == CPH_EDN_MAP && i < root->u.coll.count; i++) {
    const cph_edn *k = &root->u.coll.items[2 * i], *v = &root->u.coll.items[2 * i + 1];
    if (k->type != CPH_EDN_KEYWORD)
      rc = file_error(&f, k, NULL, "expected a keyword key (:daemon), got %s",
                      cph_edn_type_name(k->type));
    else
      rc = apply_key(cfg, &f, k, v);
  }
  cph_edn_free(root);
  return rc;
}

/* ---------------------------------------------------------------- argv */

enum {
  OPT_DAEMON = 256,
  OPT_LLM,
  OPT_MODEL,
  OPT_API_KEY_ENV,
  OPT_TOKEN_ENV,
  OPT_MCP,
  OPT_CONCURRENCY,
  OPT_LANES,
  OPT_ROUNDS,
  OPT_CONFIG,
  OPT_CHECK,
  OPT_NAME,
  OPT_CA,
  OPT_LEASE_WAIT,
  OPT_LLM_TIMEOUT,
  OPT_TOOL_TIMEOUT,
  OPT_HELP,
  OPT_CHECK_CONFIG
};

static const struct option options[] = {
    {"daemon", required_argument, NULL, OPT_DAEMON},
    {"llm", required_argument, NULL, OPT_LLM},
    {"model", required_argument, NULL, OPT_MODEL},
    {"api-key-env", required_argument, NULL, OPT_API_KEY_ENV},
    {"token-env", required_argument, NULL, OPT_TOKEN_ENV},
    {"mcp", required_argument, NULL, OPT_MCP},
    {"concurrency", required_argument, NULL, OPT_CONCURRENCY},
    {"lanes", required_argument, NULL, OPT_LANES},
    {"max-tool-rounds", required_argument, NULL, OPT_ROUNDS},
    {"config", required_argument, NULL, OPT_CONFIG},
    {"check", no_argument, NULL, OPT_CHECK},
    {"name", required_argument, NULL, OPT_NAME},
    {"ca-file", required_argument, NULL, OPT_CA},
    {"lease-wait-ms", required_argument, NULL, OPT_LEASE_WAIT},
    {"llm-timeout-ms", required_argument, NULL, OPT_LLM_TIMEOUT},
    {"tool-timeout-ms", required_argument, NULL, OPT_TOOL_TIMEOUT},
    {"help", no_argument, NULL, OPT_HELP},
    {"check-config", no_argument, NULL, OPT_CHECK_CONFIG},
    {NULL, 0, NULL, 0},
};

static int usage_error(const char *fmt, const char *arg) {
  fprintf(stderr, "cephalon-worker: ");
  fprintf(stderr, fmt, arg);
  fprintf(stderr, "\n%s", usage_text);
  return 2;
}

static int check_lanes(const char *lanes) {
  char copy[256];
  snprintf(copy, sizeof copy, "%s", lanes);
  char *save = NULL;
  for (char *l = strtok_r(copy, ",", &save); l; l = strtok_r(NULL, ",", &save))
    if (strcmp(l, "interactive") != 0 && strcmp(l, "operational") != 0)
      return -1;
  return 0;
}

int wk_config_load(wk_config *cfg, int argc, char **argv) {
  memset(cfg, 0, sizeof *cfg);
  cfg->concurrency = 1;
  cfg->max_tool_rounds = 8;
  cfg->lease_wait_ms = 5000;
  cfg->llm_timeout_ms = 300000;
  cfg->tool_timeout_ms = 120000;

  /* First pass: the file, so that flags override it whatever their order. */
  opterr = 0;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, "", options, NULL)) != -1)
    if (c == OPT_CONFIG) {
      int rc = load_file(cfg, optarg);
      if (rc)
        return rc;
    }
  opterr = 1;
  optind = 1;
  while ((c = getopt_long(argc, argv, "", options, NULL)) != -1) {
    const char *why = NULL;
    int *num = NULL, lo = 1, hi = 86400000;
    switch (c) {
    case OPT_DAEMON:
      set_str(&cfg->daemon, optarg);
      break;
    case OPT_LLM:
      set_str(&cfg->llm, optarg);
      break;
    case OPT_MODEL:
      set_str(&cfg->model, optarg);
      break;
    case OPT_API_KEY_ENV:
      set_str(&cfg->api_key_env, optarg);
      break;
    case OPT_TOKEN_ENV:
      set_str(&cfg->token_env, optarg);
      break;
    case OPT_NAME:
      set_str(&cfg->worker_name, optarg);
      break;
    case OPT_CA:
      set_str(&cfg->ca_file, optarg);
      break;
    case OPT_LANES:
      set_str(&cfg->lanes, optarg);
      break;
    case OPT_CONFIG:
      break;
    case OPT_CHECK:
      cfg->check = true;
      break;
    case OPT_CHECK_CONFIG:
      cfg->check_config = true;
      break;
    case OPT_MCP:
      if (add_mcp_spec(cfg, optarg, &why) != 0)
        return usage_error("--mcp: %s", why);
      break;
    case OPT_CONCURRENCY:
      num = &cfg->concurrency, hi = 256;
      break;
    case OPT_ROUNDS:
      num = &cfg->max_tool_rounds, lo = 0, hi = 1000;
      break;
    case OPT_LEASE_WAIT:
      num = &cfg->lease_wait_ms, lo = 0, hi = 60000;
      break;
    case OPT_LLM_TIMEOUT:
      num = &cfg->llm_timeout_ms;
      break;
    case OPT_TOOL_TIMEOUT:
      num = &cfg->tool_timeout_ms;
      break;
    case OPT_HELP:
      fputs(usage_text, stdout);
      return 1;
    default:
      fputs(usage_text, stderr);
      return 2;
    }
    if (num && parse_int(optarg, lo, hi, num) != 0)
      return usage_error("bad number '%s'", optarg);
  }
  if (optind < argc)
    return usage_error("unexpected argument '%s'", argv[optind]);
  if (!cfg->daemon)
    return usage_error("%s", "--daemon URL is required");
  if (!cfg->llm)
    return usage_error("%s", "--llm URL is required");
  if (!cfg->model)
    return usage_error("%s", "--model NAME is required");
  if (cfg->lanes && check_lanes(cfg->lanes) != 0)
    return usage_error("--lanes: '%s': expected interactive and/or operational", cfg->lanes);
  const char *urls[2] = {cfg->daemon, cfg->llm};
  for (int i = 0; i < 2; i++) {
    cph_httpc_url u;
    const char *why = NULL;
    int bad = cph_httpc_url_parse(urls[i], &u, &why);
    cph_httpc_url_free(&u);
    if (bad)
      return usage_error(i ? "--llm: %s" : "--daemon: %s", why);
  }
  if (!cfg->worker_name) {
    char host[64] = "host", name[128];
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    snprintf(name, sizeof name, "cephalon-worker-%s-%ld", host, (long)getpid());
    set_str(&cfg->worker_name, name);
  }
  return 0;
}

static void print_quoted(FILE *out, const char *v) {
  fputc('"', out);
  for (const char *p = v ? v : ""; *p; p++) {
    if (*p == '"' || *p == '\\')
      fputc('\\', out);
    fputc(*p, out);
  }
  fputc('"', out);
}

static void print_str(FILE *out, const char *key, const char *v) {
  fprintf(out, " :%s ", key);
  print_quoted(out, v);
  fputc('\n', out);
}

void wk_config_print(const wk_config *cfg, FILE *out) {
  fputs("{", out);
  print_str(out, "daemon", cfg->daemon);
  print_str(out, "llm", cfg->llm);
  print_str(out, "model", cfg->model);
  print_str(out, "api-key-env", cfg->api_key_env);
  print_str(out, "token-env", cfg->token_env);
  print_str(out, "name", cfg->worker_name);
  print_str(out, "ca-file", cfg->ca_file);
  fputs(" :mcp {", out);
  for (size_t i = 0; i < cfg->n_mcp; i++) {
    fprintf(out, "%s", i ? "\n       " : "");
    print_quoted(out, cfg->mcp[i].name);
    fputc(' ', out);
    print_quoted(out, cfg->mcp[i].command);
  }
  fputs("}\n :lanes [", out);
  char copy[256];
  snprintf(copy, sizeof copy, "%s", cfg->lanes ? cfg->lanes : "interactive,operational");
  char *save = NULL;
  int k = 0;
  for (char *l = strtok_r(copy, ",", &save); l; l = strtok_r(NULL, ",", &save))
    fprintf(out, "%s:%s", k++ ? " " : "", l);
  fprintf(out,
          "]\n :concurrency %d\n :max-tool-rounds %d\n :lease-wait-ms %d\n :llm-timeout-ms %d\n"
          " :tool-timeout-ms %d}\n",
          cfg->concurrency, cfg->max_tool_rounds, cfg->lease_wait_ms, cfg->llm_timeout_ms,
          cfg->tool_timeout_ms);
}

void wk_config_free(wk_config *cfg) {
  free(cfg->daemon);
  free(cfg->llm);
  free(cfg->model);
  free(cfg->api_key_env);
  free(cfg->token_env);
  free(cfg->worker_name);
  free(cfg->lanes);
  free(cfg->ca_file);
  for (size_t i = 0; i < cfg->n_mcp; i++) {
    free(cfg->mcp[i].name);
    free(cfg->mcp[i].command);
  }
  free(cfg->mcp);
  memset(cfg, 0, sizeof *cfg);
}
