/* Memories (DESIGN §7): minting, and the embed queue they join. Retrieval is in search.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "memory.h"

static uint32_t tokens_estimate(const char *text) {
  size_t n = strlen(text);
  size_t t = (n + 3) / 4; /* ceil(bytes/4), DESIGN §6 */
  return t > UINT32_MAX ? UINT32_MAX : (uint32_t)t;
}

int memory_mint(cph_memory *mem, cph_txn *t, const char *scope, uint8_t kind, const char *text,
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
  rc = cph_txn_append_record(t, CPH_DB_MEMORIES, &k, &cph_memory_desc, &m); /* ids ascend */
  if (rc == CPH_OK) { /* turns read their scopes' memories through this index (context.c) */
    cph_key sk;
    memory_scope_prefix(&sk, scope, kind == CPH_MEMORY_RAW);
    cph_key_u64(&sk, id);
    uint8_t source[8];
    cph_be64_put(source, source_event_id);
    rc = cph_txn_put(t, CPH_DB_MEMORY_SCOPES, &sk, source, sizeof source);
  }
  if (rc == CPH_OK && embed) {
    rc = cph_txn_append(t, CPH_DB_EMBED_QUEUE, &k, "", 0);
    if (rc == CPH_OK)
      mem->embed_queue_len++; /* recounted from the database at open */
  }
  if (rc == CPH_OK && id_out)
    *id_out = id;
  return rc;
}

int memory_read(cph_txn *t, uint64_t id, cph_memory_rec *m, const char *reader) {
  cph_key k = cph_key_of_u64(id);
  cph_val v;
  int rc = cph_txn_get(t, CPH_DB_MEMORIES, &k, &v);
  if (rc)
    return rc;
  cph_err derr;
  if (cph_record_decode(&cph_memory_desc, v.data, v.len, m, &derr)) {
    cph_log(CPH_LOG_WARN, "%s: skipping memory %llu: %s", reader, (unsigned long long)id,
            derr.msg);
    return CPH_ENOTFOUND;
  }
  return CPH_OK;
}

int memory_flush_accesses(cph_memory *mem, cph_txn *t) {
  if (!memaccess_flush_allowed(&mem->access))
    return CPH_OK;
  cph_txn c;
  int rc = cph_txn_begin_child(t, &c);
  size_t cursor = 0;
  uint64_t id, count;
  int64_t last_ms;
  while (rc == CPH_OK && memaccess_next_done(&mem->access, &cursor, &id, &count, &last_ms)) {
    cph_memory_rec m;
    int grc = memory_read(&c, id, &m, "memory access counts");
    if (grc == CPH_ENOTFOUND) /* deleted since (or undecodable): nothing to add to */
      continue;
    if (grc) {
      rc = grc;
      break;
    }
    m.access_count += count;
    if (last_ms > m.last_access_ms)
      m.last_access_ms = last_ms;
    cph_key k = cph_key_of_u64(id);
    rc = cph_txn_put_record(&c, CPH_DB_MEMORIES, &k, &cph_memory_desc, &m);
    cph_record_free(&cph_memory_desc, &m);
  }
  if (rc == CPH_OK)
    rc = cph_txn_commit(&c);
  else
    cph_txn_abort(&c);
  if (rc == CPH_OK)
    memaccess_flushed(&mem->access);
  else
    cph_log(CPH_LOG_WARN, "memory access counts: %s; kept for the next flush", cph_strerror(rc));
  return rc;
}

void memory_family_tag(uint64_t family, char out[32]) {
  snprintf(out, 32, "family:%llu", (unsigned long long)family);
}

int memory_add_tag(cph_txn *t, uint64_t id, const char *tag) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_u64(&k, id);
  cph_memory_rec m;
  int rc = cph_txn_get_record(t, CPH_DB_MEMORIES, &k, &cph_memory_desc, &m);
  if (rc)
    return rc;
  char **tags = realloc(m.tags, (m.n_tags + 1) * sizeof *tags);
  if (!tags) {
    cph_record_free(&cph_memory_desc, &m);
    return CPH_ENOMEM;
  }
  m.tags = tags;
  if (!(tags[m.n_tags] = strdup(tag))) {
    cph_record_free(&cph_memory_desc, &m);
    return CPH_ENOMEM;
  }
  m.n_tags++;
  rc = cph_txn_put_record(t, CPH_DB_MEMORIES, &k, &cph_memory_desc, &m);
  cph_record_free(&cph_memory_desc, &m);
  return rc;
}

int memory_set_text(cph_memory *mem, cph_txn *t, uint64_t id, const char *text) {
  cph_key k;
  cph_key_reset(&k);
  cph_key_u64(&k, id);
  cph_memory_rec m;
  int rc = cph_txn_get_record(t, CPH_DB_MEMORIES, &k, &cph_memory_desc, &m);
  if (rc)
    return rc;
  char *old = m.text;
  m.text = (char *)text;
  m.tokens_est = tokens_estimate(text);
  bool reembed = m.embed_status == CPH_EMBED_READY;
  if (reembed)
    m.embed_status = CPH_EMBED_PENDING; /* its vector describes the old text */
  rc = cph_txn_put_record(t, CPH_DB_MEMORIES, &k, &cph_memory_desc, &m);
  m.text = old;
  cph_record_free(&cph_memory_desc, &m);
  if (rc == CPH_OK && reembed) {
    rc = cph_txn_put(t, CPH_DB_EMBED_QUEUE, &k, "", 0);
    if (rc == CPH_OK)
      mem->embed_queue_len++;
  }
  return rc;
}
