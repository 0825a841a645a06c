/* The three scheduling lanes. A session's class is its lane (DESIGN §2). Lower value =
 * higher priority in the pick (§3.3). */
#ifndef CEPHALON_LANE_H
#define CEPHALON_LANE_H

typedef enum cph_lane {
  CPH_LANE_INTERACTIVE = 0,
  CPH_LANE_OPERATIONAL = 1,
  CPH_LANE_MAINTENANCE = 2,
  CPH_LANE_COUNT = 3
} cph_lane;

/* "interactive", "operational", "maintenance"; "unknown" for anything else. */
const char *cph_lane_name(cph_lane lane);

/* Parses a lane name; returns CPH_OK and sets *out, or CPH_EINVAL. */
int cph_lane_parse(const char *name, cph_lane *out);

#endif
