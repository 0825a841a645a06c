/* The live operations view (GET /v1/top, cephalonctl top). Private to core/; on-demand admin
 * reads, never part of the pass. */
#ifndef CEPHALON_CORE_TOP_H
#define CEPHALON_CORE_TOP_H

#include "cephalon/cephalon.h"

struct cph_sessions;
struct cph_backpressure;

/* The n busiest sessions (0: CPH_TOP_SESSIONS_DEFAULT), as cph_engine_top_sessions says. */
int top_sessions(struct cph_sessions *ss, size_t n, cph_session_info **out, size_t *n_out,
                 cph_err *err);
/* Channels at min_step or above, as cph_engine_channel_steps says. */
int top_channel_steps(struct cph_backpressure *bp, const cph_policy *policy, uint32_t min_step,
                      cph_channel_step **out, size_t *n, cph_err *err);

#endif
