/* Per-channel backpressure (DESIGN §5). Private to core/.
 *
 * Per channel the engine keeps events per minute (a sliding 60 s window of one-second buckets
 * on the engine clock) and, per family, duplicates joining it per minute (a sliding minute of
 * five-second slots, for the BP_FAMILIES_TRACKED fastest families of the channel). The check —
 * backpressure_tick(), from the pass's reconcile, at most once a second — evaluates the
 * triggers:
 *   events       events in the last 60 s > :max-events-per-minute (0 = no limit);
 *   family       one family grew by more than :max-family-growth-per-minute (0 = no limit);
 *   embed_queue  e->embed_queue_len > :maintenance :embeddings :max-queue;
 *   maintenance  the maintenance lane had no budget while work waited at more than
 *                BP_MAINT_STREAK_MAX consecutive checks.
 * A trigger holds only while its figure is over its limit. The last two are engine-wide; they
 * apply only to loud channels: at least BP_LOUD_MIN_EPM new events in the last minute and at
 * least 1/BP_LOUD_SHARE of all new events, where new means anything but a further repeat of a
 * family the channel tracks (such a repeat mints and embeds nothing; the repeat that starts a
 * family mints its aggregate memory and counts). So channels are never degraded for load they
 * did not cause — quiet ones, and ones whose traffic is one alert repeated.
 *
 * Steps: while a trigger holds the channel degrades one step per :backpressure :interval-s —
 * the first step at once, the next ones an interval apart — never beyond its :max-step:
 *   1 aggregate-only   events are stored (metadata + hash), families updated, no raw memory;
 *                      near duplicates of any sender fold into one counted inbox entry per
 *                      family (events that name a session are never near-folded);
 *   2 skip embeddings  aggregate memories are minted without an embedding;
 *   3 widen dedupe     the dedupe window is x4;
 *   4 delay reports    backpressure_reports_delayed() is true (for the report scheduler);
 *   5 drop payloads    events staged to nobody are stored with body NULL (hash + metadata).
 * Recovery (hysteresis): after :recover-intervals consecutive calm intervals — counted from
 * the first calm check — the channel steps back one, and so on down to its floor.
 * :degrade-to-aggregate-only? true makes step 1 the channel's floor: the channel is
 * aggregate-only whenever it carries traffic (also before any trigger; triggers take it
 * further, recovery stops at 1). An idle channel has nothing to coalesce, so "floor while the
 * channel is busy" and "always" coincide; the read reports step 1 for it.
 *
 * Aggregate-only does not hide the channel's traffic from its sessions: near duplicates fold
 * into counted inbox entries there (ingest.c, DESIGN §5), and nothing routed vanishes.
 *
 * Causes: every step change names why, in one log line ("backpressure: channel #ops: step
 * 0 -> 1 aggregate_only (family_growth 57/min > 50)"), and the channel keeps it as its cause
 * (cph_channel_info.trigger, the metric's trigger label): the first trigger holding at that
 * check (events, family, embed_queue, maintenance) with its figure and limit; "policy" when
 * the floor raised it or a lowered :max-step capped it, or when recovery reached the floor.
 * Recovering above the floor keeps the trigger that raised it; step 0 has none.
 *
 * The step persists in CPH_DB_CHANNELS (channel -> 27 bytes: version 2, step, since_ms, cause,
 * figure, limit; version 1 had the first three, its cause reads "unknown"; no record = step
 * 0), written in a child txn of the pass; memory follows only after it committed. The
 * hysteresis counters are not persisted: a restart starts them afresh. */
#ifndef CEPHALON_CORE_BACKPRESSURE_H
#define CEPHALON_CORE_BACKPRESSURE_H

#include <stdbool.h>
#include <stdint.h>

#include "cephalon/error.h"

#include "cephalon/cephalon.h"
#include "cephalon/policy.h"

struct cph_txn;
/* The state this module owns: per channel its rates, family growth, step and why. */
typedef struct cph_backpressure cph_backpressure;

enum {
  BP_STEP_NORMAL = 0,
  BP_STEP_AGGREGATE_ONLY = 1,
  BP_STEP_SKIP_AGGREGATE_EMBEDDINGS = 2,
  BP_STEP_WIDEN_DEDUPE = 3,
  BP_STEP_DELAY_REPORTS = 4,
  BP_STEP_DROP_PAYLOADS = 5,
  BP_STEP_MAX = 5
};

#define BP_DEDUPE_WIDEN 4        /* step 3 multiplies the dedupe window by this */
#define BP_MAINT_STREAK_MAX 2    /* checks in a row without maintenance budget tolerated */
#define BP_LOUD_MIN_EPM 60       /* engine-wide triggers: a channel's events per minute ... */
#define BP_LOUD_SHARE 4          /* ... and at least 1/4 of all events */
#define BP_FAMILIES_TRACKED 8    /* families per channel whose growth is tracked */

/* Builds the state (persisted steps) reading through t. */
int backpressure_open(struct cph_txn *t, const cph_policy *p, int64_t now_ns,
                      cph_backpressure **out, cph_err *err);
void backpressure_close(cph_backpressure *bp);

/* The channel's effective step now (floor and :max-step applied). O(1) + O(log overrides). */
int backpressure_step(const cph_backpressure *bp, const cph_policy *p, const char *chan);
/* Whether a memory minted from this channel at `step` gets an embedding: not for aggregates
 * from step 2, and not at all while degraded when :pause-on-backpressure? is set. */
bool backpressure_embed_allowed(const cph_policy *p, int step, bool aggregate);
/* Step 4: reports of sessions on this channel wait :report-delay-factor times longer. */
bool backpressure_reports_delayed(const cph_backpressure *bp, const cph_policy *p,
                                  const char *chan);

/* After an event's txn committed: counts it at now_ns (family_joined != 0: it grew that
 * family). */
void backpressure_note_event(cph_backpressure *bp, const char *chan, uint64_t family_joined,
                             int64_t now_ns);

/* The engine-wide load a check compares: the owners of these facts hand them in. */
typedef struct backpressure_load {
  uint64_t embed_queue;     /* memories waiting for an embedding (memory) */
  bool maintenance_starved; /* the maintenance lane had no budget while work waited (lanes) */
} backpressure_load;
/* The check, from reconcile (engine clock now_ns, wall now_ms; works at most once a second):
 * triggers, steps, persistence in a child txn of parent. */
void backpressure_tick(cph_backpressure *bp, const cph_policy *p, struct cph_txn *parent,
                       int64_t now_ns, int64_t now_ms, const backpressure_load *load);

/* Every channel tracked with its effective step (for the per-channel metric). */
void backpressure_foreach(const cph_backpressure *bp, const cph_policy *p,
                          void (*fn)(void *ctx, const char *chan, int step), void *ctx);
/* What holds the channel at its step ("none" at step 0): the metric's trigger label. */
const char *backpressure_trigger(const cph_backpressure *bp, const cph_policy *p,
                                 const char *chan);
/* Fills out's step, rates, triggers and settings for channel id (not its subscribers, which
 * the sessions registry knows). True when backpressure knows the channel (traffic or a
 * policy override). */
bool backpressure_channel_info(cph_backpressure *bp, const cph_policy *p, const char *id,
                               int64_t now_ns, cph_channel_info *out);

#endif
