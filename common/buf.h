/* cph_buf — a growable byte buffer, always NUL-terminated when data is non-NULL.
 *
 * Contract: on allocation failure the buffer becomes "failed" (sticky): later appends do
 * nothing and cph_buf_error() returns CPH_ENOMEM, so a writer can append freely and check
 * once at the end. */
#ifndef CEPHALON_COMMON_BUF_H
#define CEPHALON_COMMON_BUF_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

typedef struct cph_buf {
  char *data;  /* NULL until the first append */
  size_t len;  /* bytes used, excluding the trailing NUL */
  size_t cap;  /* bytes allocated */
  bool failed; /* an allocation failed; contents are incomplete */
} cph_buf;

#define CPH_BUF_INIT {NULL, 0, 0, false}

/* The appends' slow path: makes room for `extra` more bytes and the NUL (false: failed). */
bool cph_buf_grow(cph_buf *b, size_t extra);

/* Inline: a response body is written a few bytes at a time, so the common case — room left —
 * must cost a compare and a copy, not a call. */
static inline void cph_buf_append(cph_buf *b, const void *data, size_t len) {
  if ((b->failed || b->cap - b->len <= len) && !cph_buf_grow(b, len))
    return;
  if (len)
    memcpy(b->data + b->len, data, len);
  b->len += len;
  b->data[b->len] = '\0';
}

static inline void cph_buf_putc(cph_buf *b, char c) { cph_buf_append(b, &c, 1); }

void cph_buf_puts(cph_buf *b, const char *s);
void cph_buf_printf(cph_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void cph_buf_reset(cph_buf *b); /* len = 0, keeps the allocation, clears failure */
void cph_buf_free(cph_buf *b);
/* Hands the contents to the caller (free() it) and resets b; NULL if failed or empty
 * ("" is returned as an allocated empty string). */
char *cph_buf_steal(cph_buf *b);
int cph_buf_error(const cph_buf *b); /* CPH_OK or CPH_ENOMEM */

/* The value of a lower-case hex digit (as the cluster log's keys spell bytes), or -1. */
static inline int cph_unhex(char c) {
  return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

#endif
