/* Field tables: the on-disk layout of every record kind. The order of entries IS the wire
 * order; changing a table means bumping that record's version in DESC(). */
#include <stddef.h>

#include "cephalon/lane.h"
#include "cephalon/policy.h"
#include "codec_internal.h"

#define FIELD(rec, type, member) {#member, type, offsetof(rec, member), 0, 0, 0}
#define ENUM(rec, member, count) {#member, CPH_F_U8, offsetof(rec, member), 0, (count), 0}
#define BYTES(rec, member) \
  {#member, CPH_F_BYTES, offsetof(rec, member), 0, sizeof(((rec *)0)->member), 0}
#define ARRAY(rec, type, member, counter) \
  {#member, type, offsetof(rec, member), offsetof(rec, counter), 0, 0}
#define DESC(var, label, version, rec, table) \
  const cph_record_desc var = {label, version, sizeof(rec), table, sizeof table / sizeof table[0], 0}
/* A record read from version `oldest` on: its later fields were appended with FIELD_SINCE
 * (codec_internal.h says how older records read). */
#define DESC_COMPAT(var, label, version, oldest, rec, table)                                     \
  const cph_record_desc var = {label, version, sizeof(rec), table,                               \
                               sizeof table / sizeof table[0], oldest}
#define ENUM_SINCE(rec, member, count, version) \
  {#member, CPH_F_U8, offsetof(rec, member), 0, (count), (version)}
#define FIELD_SINCE(rec, type, member, version) \
  {#member, type, offsetof(rec, member), 0, 0, (version)}
#define ARRAY_SINCE(rec, type, member, counter, version) \
  {#member, type, offsetof(rec, member), offsetof(rec, counter), 0, (version)}

#define R cph_session_rec
static const cph_field session_fields[] = {
    FIELD(R, CPH_F_STR, id),
    ENUM(R, lane, CPH_LANE_COUNT),
    ENUM(R, state, CPH_SESSION_STATE_COUNT),
    FIELD(R, CPH_F_F64, credits),
    FIELD(R, CPH_F_I64, credits_at_ms),
    FIELD(R, CPH_F_U64, episode),
    ARRAY(R, CPH_F_STR_ARRAY, subscribe, n_subscribe),
    ARRAY(R, CPH_F_STR_ARRAY, member, n_member),
    FIELD(R, CPH_F_U32, autonomy_interval_s),
    FIELD(R, CPH_F_U32, report_interval_s),
    FIELD(R, CPH_F_U32, context_window_tokens),
    FIELD(R, CPH_F_OPT_STR, system),
    ARRAY(R, CPH_F_STR_ARRAY, tools, n_tools),
    FIELD(R, CPH_F_I64, created_ms),
    FIELD(R, CPH_F_I64, updated_ms),
    /* version 2: a version-1 record reads 0, its class's default */
    ENUM_SINCE(R, while_running, CPH_POLICY_WR_COUNT + 1, 2),
    /* version 3 (DESIGN §3.9): an older record reads NULL, no tenant */
    FIELD_SINCE(R, CPH_F_OPT_STR, tenant, 3),
};
DESC_COMPAT(cph_session_desc, "session", 3, 1, R, session_fields);
#undef R

#define R cph_event_rec
static const cph_field event_fields[] = {
    FIELD(R, CPH_F_U64, id),
    FIELD(R, CPH_F_STR, channel),
    FIELD(R, CPH_F_STR, sender),
    FIELD(R, CPH_F_OPT_STR, body),
    FIELD(R, CPH_F_OPT_STR, session),
    ARRAY(R, CPH_F_STR_ARRAY, mentions, n_mentions),
    FIELD(R, CPH_F_OPT_STR, kind),
    FIELD(R, CPH_F_OPT_STR, key),
    FIELD(R, CPH_F_I64, ts_ms),
    FIELD(R, CPH_F_I64, received_ms),
    ENUM(R, status, CPH_EVENT_STATUS_COUNT),
    BYTES(R, body_sha256),
    FIELD(R, CPH_F_U64, simhash),
    FIELD(R, CPH_F_U64, family),
};
DESC(cph_event_desc, "event", 1, R, event_fields);
#undef R

#define R cph_inbox_rec
static const cph_field inbox_fields[] = {
    FIELD(R, CPH_F_STR, session),
    FIELD(R, CPH_F_U64, seq),
    FIELD(R, CPH_F_U64, event_id),
    ENUM(R, status, CPH_INBOX_STATUS_COUNT),
    FIELD(R, CPH_F_BOOL, mentioned),
    FIELD(R, CPH_F_U64, turn_id),
    FIELD(R, CPH_F_U32, attempts),
    FIELD(R, CPH_F_I64, created_ms),
};
DESC(cph_inbox_desc, "inbox message", 1, R, inbox_fields);
#undef R

#define R cph_turn_rec
static const cph_field turn_fields[] = {
    FIELD(R, CPH_F_U64, id),
    FIELD(R, CPH_F_STR, session),
    ENUM(R, lane, CPH_LANE_COUNT),
    ENUM(R, kind, CPH_TURN_KIND_COUNT),
    ENUM(R, state, CPH_TURN_STATE_COUNT),
    BYTES(R, lease),
    FIELD(R, CPH_F_OPT_STR, worker),
    ARRAY(R, CPH_F_U64_ARRAY, inbox_seqs, n_inbox_seqs),
    FIELD(R, CPH_F_U64, job_id),
    FIELD(R, CPH_F_U64, episode),
    FIELD(R, CPH_F_U32, attempts),
    FIELD(R, CPH_F_OPT_STR, input),
    FIELD(R, CPH_F_I64, created_ms),
    FIELD(R, CPH_F_I64, deadline_ms),
    FIELD(R, CPH_F_I64, completed_ms),
    FIELD(R, CPH_F_U64, cost_tokens),
    FIELD(R, CPH_F_U64, tool_calls),
    FIELD(R, CPH_F_OPT_STR, error),
    /* version 2 (cluster mode): an older record reads NULL, made here */
    FIELD_SINCE(R, CPH_F_OPT_STR, origin, 2),
};
DESC_COMPAT(cph_turn_desc, "turn", 2, 1, R, turn_fields);
#undef R

#define R cph_reply_rec
static const cph_field reply_fields[] = {
    FIELD(R, CPH_F_U64, id),
    FIELD(R, CPH_F_STR, session),
    FIELD(R, CPH_F_STR, channel),
    FIELD(R, CPH_F_STR, body),
    ARRAY(R, CPH_F_U64_ARRAY, source_inbox_ids, n_source_inbox_ids),
    FIELD(R, CPH_F_U64, turn_id),
    FIELD(R, CPH_F_I64, ts_ms),
    /* version 2 (cluster mode): an older record reads NULL, no origin */
    FIELD_SINCE(R, CPH_F_OPT_STR, origin, 2),
};
DESC_COMPAT(cph_reply_desc, "reply", 2, 1, R, reply_fields);
#undef R

#define R cph_memory_rec
static const cph_field memory_fields[] = {
    FIELD(R, CPH_F_U64, id),
    FIELD(R, CPH_F_STR, session),
    ENUM(R, kind, CPH_MEMORY_KIND_COUNT),
    FIELD(R, CPH_F_STR, text),
    ARRAY(R, CPH_F_STR_ARRAY, tags, n_tags),
    FIELD(R, CPH_F_U32, tokens_est),
    FIELD(R, CPH_F_I64, created_ms),
    FIELD(R, CPH_F_I64, last_access_ms),
    FIELD(R, CPH_F_U64, access_count),
    FIELD(R, CPH_F_BOOL, deleted),
    ENUM(R, embed_status, CPH_EMBED_STATUS_COUNT),
    FIELD(R, CPH_F_U64, replaced_by),
    FIELD(R, CPH_F_U64, source_event_id),
    FIELD(R, CPH_F_U64, gc_group),
};
DESC(cph_memory_desc, "memory", 1, R, memory_fields);
#undef R

#define R cph_job_rec
static const cph_field job_fields[] = {
    FIELD(R, CPH_F_U64, id),
    FIELD(R, CPH_F_STR, session),
    ENUM(R, kind, CPH_JOB_KIND_COUNT),
    ENUM(R, state, CPH_JOB_STATE_COUNT),
    FIELD(R, CPH_F_OPT_STR, args),
    FIELD(R, CPH_F_U64, group_id),
    FIELD(R, CPH_F_U32, attempts),
    FIELD(R, CPH_F_I64, created_ms),
    FIELD(R, CPH_F_I64, run_after_ms),
    FIELD(R, CPH_F_I64, finished_ms),
    FIELD(R, CPH_F_OPT_STR, error),
};
DESC(cph_job_desc, "job", 1, R, job_fields);
#undef R

#define R cph_outbox_rec
static const cph_field outbox_fields[] = {
    FIELD(R, CPH_F_U64, id),
    ENUM(R, op, CPH_OUTBOX_OP_COUNT),
    ENUM(R, status, CPH_OUTBOX_STATUS_COUNT),
    FIELD(R, CPH_F_U64, memory_id),
    FIELD(R, CPH_F_STR, model),
    FIELD(R, CPH_F_U32, shard),
    FIELD(R, CPH_F_U32, attempts),
    FIELD(R, CPH_F_I64, created_ms),
    FIELD(R, CPH_F_I64, next_attempt_ms),
    FIELD(R, CPH_F_I64, done_ms),
    FIELD(R, CPH_F_OPT_STR, last_error),
};
DESC(cph_outbox_desc, "outbox item", 1, R, outbox_fields);
#undef R

#define R cph_gc_group_rec
static const cph_field gc_group_fields[] = {
    FIELD(R, CPH_F_U64, id),
    FIELD(R, CPH_F_STR, session),
    ENUM(R, state, CPH_GC_STATE_COUNT),
    ARRAY(R, CPH_F_U64_ARRAY, source_ids, n_source_ids),
    FIELD(R, CPH_F_I64, newest_ts_ms),
    FIELD(R, CPH_F_U64, total_tokens_est),
    FIELD(R, CPH_F_STR, group_hash),
    FIELD(R, CPH_F_OPT_STR, summary_text),
    FIELD(R, CPH_F_U64, summary_id),
    FIELD(R, CPH_F_I64, created_ms),
    FIELD(R, CPH_F_I64, updated_ms),
};
DESC(cph_gc_group_desc, "gc group", 1, R, gc_group_fields);
#undef R

#define R cph_aggregate_rec
static const cph_field aggregate_fields[] = {
    FIELD(R, CPH_F_U64, family),
    FIELD(R, CPH_F_U64, dup_count),
    FIELD(R, CPH_F_STR, sample),
    ARRAY(R, CPH_F_STR_ARRAY, channels, n_channels),
    FIELD(R, CPH_F_I64, first_ms),
    FIELD(R, CPH_F_I64, last_ms),
    FIELD(R, CPH_F_U64, simhash),
    BYTES(R, body_sha256),
};
DESC(cph_aggregate_desc, "aggregate", 1, R, aggregate_fields);
#undef R

#define R cph_ctxnode_rec
/* Version 1's fields are version 2's first ones. */
#define CTXNODE_V1_FIELDS                                                                   \
  FIELD(R, CPH_F_U64, id), FIELD(R, CPH_F_I64, depth), FIELD(R, CPH_F_I64, position),       \
      FIELD(R, CPH_F_I64, offset), FIELD(R, CPH_F_STR, content),                             \
      FIELD(R, CPH_F_OPT_STR, role), FIELD(R, CPH_F_I64, ttl), FIELD(R, CPH_F_I64, cadence), \
      ARRAY(R, CPH_F_I64_ARRAY, lc_depth, n_lc_depth),                                       \
      ARRAY(R, CPH_F_I64_ARRAY, lc_position, n_lc_position),                                 \
      ARRAY(R, CPH_F_I64_ARRAY, lc_offset, n_lc_offset),                                     \
      ARRAY(R, CPH_F_I64_ARRAY, lc_ttl, n_lc_ttl), FIELD(R, CPH_F_U32, stage),               \
      FIELD(R, CPH_F_OPT_STR, key), ARRAY(R, CPH_F_STR_ARRAY, tags, n_tags),                 \
      FIELD(R, CPH_F_U64, created_at_episode), FIELD(R, CPH_F_U64, seq),                     \
      FIELD(R, CPH_F_BOOL, waiting)
static const cph_field ctxnode_v1_fields[] = {CTXNODE_V1_FIELDS};
DESC(cph_ctxnode_v1_desc, "context node", 1, R, ctxnode_v1_fields);
static const cph_field ctxnode_fields[] = {CTXNODE_V1_FIELDS, FIELD(R, CPH_F_BOOL, anchored)};
#undef CTXNODE_V1_FIELDS
DESC(cph_ctxnode_desc, "context node", 2, R, ctxnode_fields);
#undef R

#define R cph_ctxhead_rec
static const cph_field ctxhead_fields[] = {
    FIELD(R, CPH_F_U64, episode),
    FIELD(R, CPH_F_U64, next_id),
    FIELD(R, CPH_F_U64, next_seq),
    FIELD(R, CPH_F_I64, shift),
    FIELD(R, CPH_F_U32, count),
};
DESC(cph_ctxhead_desc, "context tree", 1, R, ctxhead_fields);
#undef R

#define R cph_seal_rec
static const cph_field seal_fields[] = {
    FIELD(R, CPH_F_U64, id),
    FIELD(R, CPH_F_STR, session),
    FIELD(R, CPH_F_STR, trigger),
    FIELD(R, CPH_F_U64, episode),
    FIELD(R, CPH_F_I64, created_ms),
    ARRAY(R, CPH_F_STR_ARRAY, roles, n_roles),
    ARRAY(R, CPH_F_STR_ARRAY, contents, n_contents),
    ARRAY(R, CPH_F_STR_ARRAY, coords, n_coords),
    /* version 2 (cluster mode): an older record reads NULL, made here */
    FIELD_SINCE(R, CPH_F_OPT_STR, origin, 2),
};
DESC_COMPAT(cph_seal_desc, "seal", 2, 1, R, seal_fields);
#undef R

#define R cph_turnctx_rec
static const cph_field turnctx_fields[] = {
    FIELD(R, CPH_F_U64, turn_id),
    FIELD(R, CPH_F_STR, session),
    ENUM(R, kind, CPH_TURN_KIND_COUNT),
    FIELD(R, CPH_F_U64, episode),
    FIELD(R, CPH_F_I64, created_ms),
    FIELD(R, CPH_F_U32, omit),
    FIELD(R, CPH_F_OPT_STR, input),
    ARRAY(R, CPH_F_U64_ARRAY, tokens, n_tokens),
    ARRAY(R, CPH_F_STR_ARRAY, channels, n_channels),
    ARRAY(R, CPH_F_U64_ARRAY, staged_events, n_staged_events),
    ARRAY(R, CPH_F_U64_ARRAY, obligations, n_obligations),
    ARRAY(R, CPH_F_STR_ARRAY, obligation_texts, n_obligation_texts),
    ARRAY(R, CPH_F_U64_ARRAY, history, n_history),
    ARRAY(R, CPH_F_U64_ARRAY, memories, n_memories),
    ARRAY(R, CPH_F_STR_ARRAY, tools, n_tools),
    ARRAY(R, CPH_F_STR_ARRAY, msg_roles, n_msg_roles),
    ARRAY(R, CPH_F_STR_ARRAY, msg_contents, n_msg_contents),
    ARRAY(R, CPH_F_STR_ARRAY, msg_coords, n_msg_coords),
    ARRAY(R, CPH_F_U64_ARRAY, msg_nodes, n_msg_nodes),
    ARRAY(R, CPH_F_U64_ARRAY, node_ids, n_node_ids),
    ARRAY(R, CPH_F_STR_ARRAY, node_at, n_node_at),
    ARRAY(R, CPH_F_STR_ARRAY, node_roles, n_node_roles),
    ARRAY(R, CPH_F_STR_ARRAY, node_previews, n_node_previews),
    ARRAY(R, CPH_F_U64_ARRAY, node_hashes, n_node_hashes),
    ARRAY(R, CPH_F_I64_ARRAY, node_ttl, n_node_ttl),
    ARRAY(R, CPH_F_I64_ARRAY, node_cadence, n_node_cadence),
    ARRAY(R, CPH_F_U64_ARRAY, node_created, n_node_created),
    ARRAY(R, CPH_F_U64_ARRAY, node_flags, n_node_flags),
    /* version 2: the texts by hash; a version-1 record reads none and holds its texts */
    ARRAY_SINCE(R, CPH_F_U64_ARRAY, msg_hashes, n_msg_hashes, 2),
    ARRAY_SINCE(R, CPH_F_U64_ARRAY, node_preview_hashes, n_node_preview_hashes, 2),
    /* version 3: the messages and nodes as rows; versions 1 and 2 read false and 0 */
    FIELD_SINCE(R, CPH_F_BOOL, rows, 3),
    FIELD_SINCE(R, CPH_F_U32, row_messages, 3),
};
DESC_COMPAT(cph_turnctx_desc, "turn context", 3, 1, R, turnctx_fields);
/* Version 2: the table without its last two (version-3) fields. */
const cph_record_desc cph_turnctx_v2_desc = {"turn context", 2, sizeof(R), turnctx_fields,
                                             sizeof turnctx_fields / sizeof turnctx_fields[0] - 2,
                                             1};
#undef R
