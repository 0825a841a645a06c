/* Argument parsing for cephalonctl's commands (see cli_parse_args in cli.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

static const cli_opt *find_opt(const cli_opt *opts, size_t nopts, const char *name,
                               size_t name_len) {
  for (size_t i = 0; i < nopts; i++)
    if (strlen(opts[i].name) == name_len && strncmp(opts[i].name, name, name_len) == 0)
      return &opts[i];
  return NULL;
}

/* Strict decimal: digits only (no sign, no spaces), at most max. */
static int parse_uint(const char *s, uint64_t max, uint64_t *out) {
  if (!*s || strspn(s, "0123456789") != strlen(s) || strlen(s) > 19)
    return -1;
  uint64_t v = strtoull(s, NULL, 10);
  if (v > max)
    return -1;
  *out = v;
  return 0;
}

static int set_opt(const cli_opt *o, const char *value) {
  switch (o->kind) {
  case CLI_OPT_STRING: {
    const char **dest = o->dest;
    if (*dest) {
      fprintf(stderr, "cephalonctl: %s given twice\n", o->name);
      return -1;
    }
    *dest = value;
    return 0;
  }
  case CLI_OPT_LIST: {
    cli_list *list = o->dest;
    if (list->n == CLI_LIST_MAX) {
      fprintf(stderr, "cephalonctl: %s given more than %d times\n", o->name, CLI_LIST_MAX);
      return -1;
    }
    list->items[list->n++] = value;
    return 0;
  }
  case CLI_OPT_UINT: {
    cli_uint *u = o->dest;
    if (u->set) {
      fprintf(stderr, "cephalonctl: %s given twice\n", o->name);
      return -1;
    }
    if (parse_uint(value, o->max, &u->value) != 0) {
      fprintf(stderr, "cephalonctl: %s wants a whole number from 0 to %llu, got '", o->name,
              (unsigned long long)o->max);
      cli_put_clean(stderr, value);
      fputs("'\n", stderr);
      return -1;
    }
    u->set = true;
    return 0;
  }
  }
  return -1;
}

int cli_parse_args(int argc, char **argv, const cli_opt *opts, size_t nopts, const char **pos,
                   size_t max_pos, size_t *npos) {
  *npos = 0;
  bool options_done = false;
  for (int i = 0; i < argc; i++) {
    const char *arg = argv[i];
    if (!options_done && strcmp(arg, "--") == 0) {
      options_done = true;
      continue;
    }
    if (!options_done && (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0))
      return 1;
    if (options_done || arg[0] != '-' || arg[1] == '\0') {
      if (*npos == max_pos) {
        fprintf(stderr, "cephalonctl: unexpected argument '");
        cli_put_clean(stderr, arg);
        fputs("'\n", stderr);
        return -1;
      }
      pos[(*npos)++] = arg;
      continue;
    }
    const char *eq = strchr(arg, '=');
    size_t name_len = eq ? (size_t)(eq - arg) : strlen(arg);
    const cli_opt *o = find_opt(opts, nopts, arg, name_len);
    if (!o) {
      fprintf(stderr, "cephalonctl: unknown option %.*s\n", (int)name_len, arg);
      return -1;
    }
    const char *value;
    if (eq) {
      value = eq + 1;
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      fprintf(stderr, "cephalonctl: %s needs a value\n", o->name);
      return -1;
    }
    if (!value[0]) {
      fprintf(stderr, "cephalonctl: %s needs a non-empty value\n", o->name);
      return -1;
    }
    if (set_opt(o, value) != 0)
      return -1;
  }
  return 0;
}
