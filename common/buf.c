#include "buf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cephalon/error.h"

bool cph_buf_grow(cph_buf *b, size_t extra) {
  if (b->failed)
    return false;
  if (extra > (size_t)-1 / 2 - b->len) {
    b->failed = true;
    return false;
  }
  size_t need = b->len + extra + 1;
  if (need <= b->cap)
    return true;
  size_t cap = b->cap ? b->cap : 64;
  while (cap < need)
    cap *= 2;
  char *p = realloc(b->data, cap);
  if (!p) {
    b->failed = true;
    return false;
  }
  b->data = p;
  b->cap = cap;
  return true;
}

void cph_buf_puts(cph_buf *b, const char *s) { cph_buf_append(b, s, strlen(s)); }

void cph_buf_printf(cph_buf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char small[256];
  int n = vsnprintf(small, sizeof small, fmt, ap);
  va_end(ap);
  if (n < 0) {
    b->failed = true;
    return;
  }
  if ((size_t)n < sizeof small) {
    cph_buf_append(b, small, (size_t)n);
    return;
  }
  if (!cph_buf_grow(b, (size_t)n))
    return;
  va_start(ap, fmt);
  vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

void cph_buf_reset(cph_buf *b) {
  b->len = 0;
  b->failed = false;
  if (b->data)
    b->data[0] = '\0';
}

void cph_buf_free(cph_buf *b) {
  free(b->data);
  b->data = NULL;
  b->len = b->cap = 0;
  b->failed = false;
}

char *cph_buf_steal(cph_buf *b) {
  if (b->failed) {
    cph_buf_free(b);
    return NULL;
  }
  if (!b->data && !cph_buf_grow(b, 0))
    return NULL;
  if (!b->data)
    return NULL;
  b->data[b->len] = '\0';
  char *p = b->data;
  b->data = NULL;
  b->len = b->cap = 0;
  return p;
}

int cph_buf_error(const cph_buf *b) { return b->failed ? CPH_ENOMEM : CPH_OK; }
