#include "pass.h"

static const char *const job_names[CPH_PASS_JOB_COUNT] = {
    "agent_turn", "poll_inbox", "check_credits", "top_up_credits", "reconcile"};

const char *cph_pass_job_name(cph_pass_job job) {
  return (unsigned)job < CPH_PASS_JOB_COUNT ? job_names[job] : "unknown";
}

static void trace(const cph_pass_hooks *h, cph_pass_job job) {
  if (h->trace)
    h->trace(h->ctx, job);
}

void cph_sched_pass(cph_sched *s, const cph_pass_hooks *h, cph_pass_result *out) {
  out->started = 0;
  out->staged = 0;

  trace(h, CPH_PASS_AGENT_TURN);
  if (h->agent_turn) {
    out->started = h->agent_turn(h->ctx);
  } else {
    uint32_t waiting = h->workers_waiting ? h->workers_waiting(h->ctx) : 0;
    cph_pick pick;
    while (out->started < waiting && cph_sched_pick(s, &pick) == 0) {
      if (h->start_turn)
        h->start_turn(h->ctx, &pick);
      out->started++;
    }
  }

  trace(h, CPH_PASS_POLL_INBOX);
  if (h->poll_inbox)
    out->staged = h->poll_inbox(h->ctx);

  trace(h, CPH_PASS_CHECK_CREDITS);
  cph_sched_check_credits(s);

  trace(h, CPH_PASS_TOP_UP_CREDITS);
  cph_sched_top_up(s);

  trace(h, CPH_PASS_RECONCILE);
  if (h->reconcile)
    h->reconcile(h->ctx);
}
