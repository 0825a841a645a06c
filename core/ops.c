/* Operation errors and queues (contract in ops.h). */
#include "ops.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

int op_fail(cph_op *op, int rc, const char *field, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  cph_err_vset(&op->err, rc, fmt, ap);
  va_end(ap);
  op->rc = rc;
  snprintf(op->field, sizeof op->field, "%s", field ? field : "");
  return rc;
}

int op_queue_push(op_queue *q, cph_op *op) {
  if (q->len == q->cap) {
    size_t cap = q->cap ? q->cap * 2 : 64;
    cph_op **items = malloc(cap * sizeof *items);
    if (!items)
      return CPH_ENOMEM;
    for (size_t i = 0; i < q->len; i++)
      items[i] = q->items[(q->head + i) % q->cap];
    free(q->items);
    q->items = items;
    q->head = 0;
    q->cap = cap;
  }
  q->items[(q->head + q->len) % q->cap] = op;
  q->len++;
  return CPH_OK;
}

cph_op *op_queue_pop(op_queue *q) {
  if (!q->len)
    return NULL;
  cph_op *op = q->items[q->head];
  q->head = (q->head + 1) % q->cap;
  q->len--;
  return op;
}

bool op_queue_remove(op_queue *q, cph_op *op) {
  for (size_t i = 0; i < q->len; i++) {
    if (q->items[(q->head + i) % q->cap] != op)
      continue;
    for (size_t j = i; j + 1 < q->len; j++)
      q->items[(q->head + j) % q->cap] = q->items[(q->head + j + 1) % q->cap];
    q->len--;
    return true;
  }
  return false;
}

void op_queue_free(op_queue *q) {
  free(q->items);
  *q = (op_queue){0};
}
