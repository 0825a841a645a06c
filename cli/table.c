/* Aligned text tables for cephalonctl's human output. */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

void cli_table_init(cli_table *t, size_t ncols, const char *const *headers,
                    unsigned right_aligned) {
  memset(t, 0, sizeof *t);
  t->ncols = ncols;
  t->headers = headers;
  t->right_aligned = right_aligned;
}

void cli_table_add(cli_table *t, const char *const *cells) {
  if (t->failed)
    return;
  if (t->rows == t->cap) {
    size_t cap = t->cap ? t->cap * 2 : 16;
    char **p = realloc(t->cells, cap * t->ncols * sizeof *p);
    if (!p) {
      t->failed = true;
      return;
    }
    t->cells = p;
    t->cap = cap;
  }
  char **row = t->cells + t->rows * t->ncols;
  for (size_t c = 0; c < t->ncols; c++) {
    row[c] = strdup(cells[c] ? cells[c] : "-");
    if (!row[c])
      t->failed = true;
  }
  t->rows++; /* counted even when a strdup failed, so free() sees every cell */
}

static void print_row(const cli_table *t, const char *const *row, const size_t *width,
                      FILE *out) {
  for (size_t c = 0; c < t->ncols; c++) {
    bool last = c + 1 == t->ncols;
    int w = (int)width[c];
    if (t->right_aligned & (1u << c))
      fprintf(out, "%*s", w, row[c]);
    else if (last) /* no trailing blanks */
      fputs(row[c], out);
    else
      fprintf(out, "%-*s", w, row[c]);
    fputs(last ? "\n" : "  ", out);
  }
}

int cli_table_print(const cli_table *t, FILE *out) {
  if (t->failed) {
    fprintf(stderr, "cephalonctl: out of memory\n");
    return CLI_EXIT_FAIL;
  }
  size_t *width = calloc(t->ncols, sizeof *width);
  if (!width) {
    fprintf(stderr, "cephalonctl: out of memory\n");
    return CLI_EXIT_FAIL;
  }
  for (size_t c = 0; c < t->ncols; c++) {
    width[c] = strlen(t->headers[c]);
    for (size_t r = 0; r < t->rows; r++) {
      size_t n = strlen(t->cells[r * t->ncols + c]);
      if (n > width[c])
        width[c] = n;
    }
  }
  print_row(t, t->headers, width, out);
  for (size_t r = 0; r < t->rows; r++)
    print_row(t, (const char *const *)(t->cells + r * t->ncols), width, out);
  free(width);
  return CLI_EXIT_OK;
}

void cli_table_free(cli_table *t) {
  for (size_t i = 0; i < t->rows * t->ncols; i++)
    free(t->cells[i]);
  free(t->cells);
  memset(t, 0, sizeof *t);
}
