/* libFuzzer target: the msgpack record decoders (store/records.h), every record kind.
 *
 * Input: byte 0 picks the record kind (modulo the 12 kinds), the rest is the stored value.
 * Checks the decoder's contract: a rejected value leaves the record zeroed and says why
 * (CPH_ECORRUPT with a message); an accepted one re-encodes, and the re-encoding decodes and
 * encodes to the very same bytes (the codec is a fixed point after one round). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store/records.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const cph_record_desc *const descs[] = {
    &cph_session_desc, &cph_event_desc,     &cph_inbox_desc,     &cph_turn_desc,
    &cph_reply_desc,   &cph_memory_desc,    &cph_job_desc,       &cph_outbox_desc,
    &cph_gc_group_desc, &cph_aggregate_desc, &cph_ctxnode_desc,  &cph_seal_desc,
    &cph_ctxhead_desc, &cph_ctxnode_v1_desc,
    &cph_turnctx_desc,
};

/* Large enough for every record struct (checked against each desc at run time). */
typedef union any_rec {
  cph_session_rec session;
  cph_event_rec event;
  cph_inbox_rec inbox;
  cph_turn_rec turn;
  cph_reply_rec reply;
  cph_memory_rec memory;
  cph_job_rec job;
  cph_outbox_rec outbox;
  cph_gc_group_rec gc_group;
  cph_aggregate_rec aggregate;
  cph_ctxnode_rec ctxnode;
  cph_seal_rec seal;
  cph_ctxhead_rec ctxhead;
  cph_turnctx_rec turnctx;
} any_rec;

static void fuzz_fail(const cph_record_desc *d, const char *what, const char *msg) {
  fprintf(stderr, "fuzz_records: %s: %s %s\n", cph_record_name(d), what, msg ? msg : "");
  abort();
}

static bool is_zero(const void *p, size_t n) {
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i])
      return false;
  return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  const cph_record_desc *d = descs[data[0] % (sizeof descs / sizeof descs[0])];
  any_rec rec, again;
  memset(&rec, 0, sizeof rec); /* decode zeroes only the kind's own size */
  memset(&again, 0, sizeof again);
  cph_err err = {0};
  int rc = cph_record_decode(d, data + 1, size - 1, &rec, &err);
  if (rc != CPH_OK) {
    if (rc != CPH_ECORRUPT && rc != CPH_ENOMEM)
      fuzz_fail(d, "decode failed with an undocumented code", err.msg);
    if (err.msg[0] == '\0')
      fuzz_fail(d, "decode failed without a message", NULL);
    if (!is_zero(&rec, sizeof rec))
      fuzz_fail(d, "a failed decode left the record non-zero", err.msg);
    return 0;
  }
  cph_buf enc = CPH_BUF_INIT, enc2 = CPH_BUF_INIT;
  if (cph_record_encode(d, &rec, &enc) != CPH_OK)
    fuzz_fail(d, "re-encoding a decoded record failed", NULL);
  if (cph_record_decode(d, enc.data, enc.len, &again, &err) != CPH_OK)
    fuzz_fail(d, "the re-encoding does not decode:", err.msg);
  if (cph_record_encode(d, &again, &enc2) != CPH_OK)
    fuzz_fail(d, "encoding the second decode failed", NULL);
  if (enc.len != enc2.len || memcmp(enc.data, enc2.data, enc.len) != 0)
    fuzz_fail(d, "encode(decode(encode(x))) differs from encode(x)", NULL);
  cph_buf_free(&enc);
  cph_buf_free(&enc2);
  cph_record_free(d, &again);
  cph_record_free(d, &rec);
  return 0;
}
