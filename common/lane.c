#include "cephalon/lane.h"

#include <string.h>

#include "cephalon/error.h"

static const char *const lane_names[CPH_LANE_COUNT] = {"interactive", "operational",
                                                        "maintenance"};

const char *cph_lane_name(cph_lane lane) {
  return (unsigned)lane < CPH_LANE_COUNT ? lane_names[lane] : "unknown";
}

int cph_lane_parse(const char *name, cph_lane *out) {
  for (int i = 0; i < CPH_LANE_COUNT; i++) {
    if (strcmp(name, lane_names[i]) == 0) {
      *out = (cph_lane)i;
      return CPH_OK;
    }
  }
  return CPH_EINVAL;
}
