/* Turn context assembly (DESIGN §6): the five sections, the channel views and the rendered
 * `messages` of every leased turn, inside the session's context_window_tokens.
 *
 * ---- Token estimate ----
 * tok(text) = ceil(bytes/4). Every listed item (an obligation, a history entry, a memory, a
 * tool, a message) costs tok(its texts) + 4, the 4 standing for its id, role or coordinate
 * and punctuation. current_state costs tok of its one-line rendering + 4.
 *
 * ---- Budget split (W = context_window_tokens) ----
 * current_state is always included and comes off the top: A = W - current_state. The rest
 * is shared in this order, each section getting its share of A plus whatever the sections
 * before it left unused (unused share flows on):
 *   pending_obligations 25%  -> available_tools 5%  -> conversation_history 40%
 *                            -> recent_memory 30% (+ everything left over).
 * So the five sections together never exceed W. Each section's use is in ti->tokens.
 *   - pending_obligations: every staged message is listed with its id and sender; previews
 *     shrink (120, 80, 48, 24, 0 bytes, "..." marking a cut) until the list fits; if it does
 *     not fit even without previews, the list keeps the first messages (mentions first) and
 *     `staged_count` still counts all of them (ti->n_obligations < ti->n_staged).
 *   - available_tools: the session's tools in their order while they fit. calls_this_turn is
 *     0 (a turn starts with none) and calls_this_minute is 0: completions report tool calls
 *     only as totals (cost.tool_calls, tool_stats valid/invalid/...), never per tool, so
 *     nothing attributes a call to a tool.
 *   - conversation_history: entries of the channels of this turn's staged messages whose
 *     sender is one of the staged messages' senders or the session itself, excluding the
 *     staged messages and messages still waiting in the session's inbox; the newest that fit,
 *     oldest cut first (a contiguous newest run), listed oldest first. `none` (n_history 0)
 *     on an autonomy tick, or when nothing qualifies.
 *   - recent_memory: memories in the session's scopes (its own id and "#channel" for the
 *     channels of the staged messages; on other turns its subscribed and member channels),
 *     newest first. Raw memories first, inside the raw budget = 60% of the memory budget;
 *     then summaries and aggregates in what the memory budget has left (at most 32 raw and
 *     16 others: see the cost bounds). With a small window
 *     the raw budget holds only a few raw memories while the summaries, which condense many,
 *     still get theirs — raw memory gives way to summaries. A deleted memory never appears;
 *     its summary (replaced_by, followed) stands in for it, once. A raw memory minted from an
 *     event this turn already shows (staged, history or channel view) is skipped: the same
 *     text twice helps nobody. Every memory included counts as an access: access_count += 1
 *     and last_access = now, noted by the lease once it started (memaccess.h: written into
 *     the record with the next flush, and counted by every read before that).
 *
 * ---- messages: the rendered PACT tree combined with the channel view ----
 * The PACT tree (core/pact.h) holds the session's system nodes (depth -1), components
 * (position >= 1 or offset != 0, or any node without a role) and message cores (nodes with a
 * role: the input and reply of every completed turn; an inbox turn's input as its words, the
 * wire's "inbox:" marker left off, an autonomy tick's as "autonomy_tick"). The rule that avoids duplication:
 *   - On an inbox turn the channel view supplies the message cores and the tree's message
 *     cores are not rendered. The cores are the session's own past inputs and replies; the
 *     channel log holds the same conversation message by message with the right speakers,
 *     plus what other users and agents said, so it replaces them. Everything else in the
 *     tree (system nodes, components) is rendered at its coordinates.
 *   - On any other turn (autonomy tick, report) there is no channel view: the tree is
 *     rendered whole, cores included, and the turn's input is the current message.
 * Channel-view messages get core coordinates (position 0, offset 0): the triggering staged
 * messages are at depth 0, the history counts back from the newest at depth 1 (the away block
 * is the newest history message when present). Tree nodes and channel-view messages are
 * merged in PACT render order (depth -1; history oldest -> newest; depth 0; then position,
 * offset), a channel-view core first on a tie, so a component at "d2, 1, 0" follows the
 * second-newest history message. The session's `system` prompt, when set, comes first as
 * "d-1, 0, 0". Nodes without a role are rendered as role "system".
 *
 * messages are held to the window on their own: their fixed part (system prompt, tree nodes
 * other than history cores, the current message(s)) is never cut; their history part (the
 * channel view on an inbox turn; tree cores at depth >= 1 otherwise) gets
 * min(conversation_history budget, W - fixed part) and is cut oldest first.
 *
 * ---- Channel views (multi-agent) ----
 * For each channel of the turn's staged messages the session has a cursor, the channel index
 * (CPH_DB_CHANNEL_LOG key channel\0 + u64 index) of the last message it processed, in
 * CPH_DB_CURSORS (session\0 channel\0 -> u64 big-endian), so it survives restarts. The view
 * reads the channel up to its newest index (`seen_index`) and renders:
 *   - the session's own messages -> `assistant` (wherever they sit relative to the cursor:
 *     its replies land after the cursor the turn left, and are never "missed");
 *   - messages at or before the cursor: users -> `user`, other agents (a sender that is
 *     another session's id) -> `system` with content "[name] body";
 *   - messages after the cursor from others -> ONE `system` message "MESSAGES WHILE YOU WERE
 *     AWAY" followed by a "[sender] body" line each, oldest first;
 *   - then the triggering staged message(s) at depth 0 (users `user`, agents `system`
 *     "[name] body"), in staged order (mentions first, then oldest).
 * Every `user` message carries its sender as `name` (OpenAI's participant field, so the
 * sender sanitised to ^[a-zA-Z0-9_-]{1,64}$: any other character becomes '_'). When several
 * distinct people (users, not agents) speak in the turn's view — history, away block and
 * triggers together — each user message's content is "sender: body" with the real sender;
 * with one person it is the body. Budgets count that prefix for every user message (it may
 * be there), so the choice, made after the history is cut, never breaks the window.
 * This turn's staged messages never appear in the history or away block; messages waiting
 * in the session's inbox (pending, or staged beyond this turn's batch) are left out entirely:
 * they will come as triggers of a later turn.
 * Where a session without a cursor starts:
 *   - mentioned in the channel and not subscribed to it (a member, or an outsider): index 0,
 *     so the whole history is new to it and comes as the away block (§6: "sees all history");
 *     mentioned on the channel's first message there is nothing before it: it starts fresh;
 *   - otherwise (a subscriber, or a session named explicitly): just before its oldest staged
 *     message in the channel. What came before it arrived predates the session's part in the
 *     channel: it is shown as ordinary history, not as missed messages; later messages were
 *     all routed to it, so nothing is "away" on its first turn except other agents' replies.
 * Completing the turn moves each cursor to the view's seen_index (never backwards). The
 * seen indexes ride in the lease (context_views); a failed or expired turn moves nothing, so
 * its input is seen the same way again.
 *
 * ---- Parts left out (ti->omit, the lease's `include`) ----
 * The budgets, the channel views and both history selections are computed whatever the
 * lease asked for: messages are cut against budgets the sections' pricing sets, and the
 * memory section skips what the history and the messages show, so the parts returned are
 * byte for byte those of a whole answer. Left out, pending_obligations, available_tools and
 * conversation_history are priced but not copied into ti; recent_memory is not read at all
 * (no memory counts an access); messages are not rendered.
 *
 * ---- Cost bounds (per turn, whatever the window) ----
 * At most 512 channel-log entries read over the turn's channels (split evenly, at least 64
 * per channel; reading stops earlier once the history budgets are covered), at most 1024
 * memory records read, at most 32 raw and 16 other memories listed (one write each), one
 * tree load. History or memory beyond these is treated as cut. */
#ifndef CEPHALON_CORE_CONTEXT_H
#define CEPHALON_CORE_CONTEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cephalon/cephalon.h"
#include "env.h"
#include "chantail.h"
#include "memory.h"
#include "session.h"
#include "sessions.h"
#include "store/store.h"
#include "trees.h"

/* The most channel-log entries a turn reads over its channels (split evenly, at least
 * CONTEXT_HISTORY_READS_MIN each): what history a turn can show. A session's state for the
 * cluster log carries as much of each channel (core/handover.c). */
#define CONTEXT_HISTORY_READS_MAX 512
#define CONTEXT_HISTORY_READS_MIN 64
/* The most raw memories a turn lists: the newest of its scopes but those of the events its
 * history shows. A state carries that many more than the history entries it carries. */
#define CONTEXT_RAW_ITEMS_MAX 32

/* A lease's working arrays (context.c: the history entries read, the channel view's messages
 * to render, the tree's render order cut to the budget), kept between leases so that a lease
 * neither allocates them nor grows them entry by entry. Holds nothing between leases but
 * capacity: every assembly starts with them empty. */
typedef struct context_scratch {
  struct hentry *entries;
  size_t cap_entries;
  struct ritem *items;
  size_t cap_items;
  size_t *order;
  size_t cap_order;
} context_scratch;

/* What the context module is handed; the engine wires it at open. It keeps no state of its
 * own but the scratch arrays: the cursors are in the store, the trees are the tree store's.
 * context_edit.h takes it too. */
typedef struct cph_context {
  cph_core_env *env;      /* the default window, the scheduler (current_state), the store */
  cph_sessions *sessions; /* which senders are sessions; the channels' subscribers */
  cph_trees *trees;       /* the sessions' PACT trees */
  cph_chantails *tails;   /* channels' recent history kept warm (chantail.h) */
  cph_memory *memory;     /* accesses not yet in the records; records kept decoded */
  context_scratch scratch; /* context_assemble's alone (not reentrant: the pass thread's) */
} cph_context;

void context_init(cph_context *cx, cph_core_env *env, cph_sessions *sessions, cph_trees *trees,
                  cph_chantails *tails, cph_memory *memory);
/* Frees the scratch arrays. */
void context_free(cph_context *cx);

/* The session's PACT tree as a lease read it, in render order: loaded and sorted once by
 * context_assemble, read again by the kept context (turnlog_keep), then handed back to the
 * tree store's cache by context_tree_release. The caller (the lease) holds it between the two
 * and must not change the tree. */
typedef struct context_tree {
  cph_pact_tree tree;
  size_t *order; /* tree.n node indexes: the live nodes in render order (cph_pact_render_order),
                  * then the waiting ones in tree order */
  size_t n_live;
  bool loaded; /* tree and order must be freed (context_tree_release) */
  bool ok;     /* the session's tree as the lease's transaction reads it, ordered */
  bool held;     /* held past the lease's pass (context_tree_hold) */
  uint64_t hold; /* then the tree store's token for it (0: none, never cached again) */
} context_tree;

/* Builds ti's sections, channel views and messages. The caller has filled ti->session, lane,
 * kind, episode, input and staged (in staged order) from rec, the session's record. Reads and
 * writes (memory accesses) through t. Job turns get current_state and tools only, and leave
 * *tree not ok. *tree (zeroed by the caller) receives the tree the turn was rendered from;
 * release it with context_tree_release whatever the outcome. CPH_OK, or a store / allocation
 * error (t's sticky error says which). */
int context_assemble(cph_context *cx, cph_txn *t, csession *s, const cph_session_rec *rec,
                     cph_turn_info *ti, context_tree *tree);
/* Frees tree; a tree that is ok goes back to the tree store's cache, so call it only while
 * the tree still matches what the lease's transaction's parent holds (read, not changed). */
void context_tree_release(cph_context *cx, const char *session, context_tree *tree);
/* The tree is held past the lease's pass (turnlog.h, "Deferred keeping"): its release, on the
 * loop, gives it back to the cache only if nothing changed the session's tree since
 * (trees_hold). Loop only, like the release. */
void context_tree_hold(cph_context *cx, const char *session, context_tree *tree);
/* Frees what context_assemble added to ti (cph_turn_info_free calls it). */
void context_turn_free(cph_turn_info *ti);

/* A turn's channel views as its lease carries them to completion: per channel of its staged
 * messages, the newest channel index the turn saw (channels[i], seen[i]; both owned). */
typedef struct context_views {
  char **channels;
  uint64_t *seen;
  size_t n;
} context_views;

/* Copies ti's channel views (channel, seen_index) into v. CPH_ENOMEM leaves v with none:
 * completing the turn then moves no cursor. */
int context_views_copy(context_views *v, const cph_turn_info *ti);
void context_views_free(context_views *v);
/* At completion, in the completion's txn: each of the session's cursors in v moves to its
 * seen index (never backwards). */
int context_cursors_advance(cph_txn *t, const char *session, const context_views *v);
/* The session's cursor on channel chan (its channel-log index of the last message it
 * processed) into *index: CPH_OK, CPH_ENOTFOUND when it has none, or the store's error. */
int context_cursor_get(cph_txn *t, const char *session, const char *chan, uint64_t *index);
/* Deletes every cursor of a session (for session deletion). */
int context_cursors_delete(cph_txn *t, const char *session);

#endif
