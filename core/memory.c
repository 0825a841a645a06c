/* Memories (DESIGN §7): minting, and the embed queue they join. Retrieval is in search.c. */
#include <stdlib.h>
#include <string.h>

#include "engine_internal.h"

static uint32_t tokens_estimate(const char *text) {
  size_t n = strlen(text);
  size_t t = (n + 3) / 4; /* ceil(bytes/4), DESIGN §6 */
  return t > UINT32_MAX ? UINT32_MAX : (uint32_t)t;
}

int memory_mint(cph_engine *e, cph_txn *t, const char *scope, uint8_t kind, const char *text,
                uint64_t source_event_id, bool embed, uint64_t *id_out) {
  uint64_t id = 0;
  int rc = cph_txn_next_id(t, "memory", &id);
  if (rc)
    return rc;
  cph_memory_rec m = {0};
  m.id = id;
  m.session = (char *)scope;
  m.kind = kind;
  m.text = (char *)text;
  m.tokens_est = tokens_estimate(text);
  m.created_ms = cph_wall_ms();
  m.embed_status = embed ? CPH_EMBED_PENDING : CPH_EMBED_NONE;
  m.source_event_id = source_event_id;
  cph_key k;
  cph_key_reset(&k);
  cph_key_u64(&k, id);
  rc = cph_txn_put_record(t, CPH_DB_MEMORIES, &k, &cph_memory_desc, &m);
  if (rc == CPH_OK) { /* turns read their scopes' memories through this index (context.c) */
    cph_key sk;
    memory_scope_prefix(&sk, scope, kind == CPH_MEMORY_RAW);
    cph_key_u64(&sk, id);
    uint8_t source[8];
    cph_be64_put(source, source_event_id);
    rc = cph_txn_put(t, CPH_DB_MEMORY_SCOPES, &sk, source, sizeof source);
  }
  if (rc == CPH_OK && embed) {
    rc = cph_txn_put(t, CPH_DB_EMBED_QUEUE, &k, "", 0);
    if (rc == CPH_OK)
      e->embed_queue_len++; /* recounted from the database at open */
  }
  if (rc == CPH_OK && id_out)
    *id_out = id;
  return rc;
}
