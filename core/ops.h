/* Operations as the modules of core/ apply them (the type is public: cephalon.h). Private to
 * core/.
 *
 * op_fail() is how a module answers an operation with an error: the code, the request field
 * it concerns ("" for none) and a message. op_queue is a FIFO of operations: the engine's
 * submitted and done queues, and the lease waiters turns.c keeps. */
#ifndef CEPHALON_CORE_OPS_H
#define CEPHALON_CORE_OPS_H

#include <stdbool.h>
#include <stddef.h>

#include "cephalon/cephalon.h"

/* Sets op->rc, op->err and op->field; returns rc. */
int op_fail(cph_op *op, int rc, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

typedef struct op_queue {
  cph_op **items; /* a ring: items[(head + i) % cap] for i < len */
  size_t head, len, cap;
} op_queue;

/* CPH_OK or CPH_ENOMEM (q unchanged). */
int op_queue_push(op_queue *q, cph_op *op);
cph_op *op_queue_pop(op_queue *q); /* NULL when empty */
/* The i-th queued operation, oldest first; NULL past the end. */
static inline cph_op *op_queue_at(const op_queue *q, size_t i) {
  return i < q->len ? q->items[(q->head + i) % q->cap] : NULL;
}
/* Removes op from anywhere in q; true if it was there. */
bool op_queue_remove(op_queue *q, cph_op *op);
void op_queue_free(op_queue *q);

#endif
