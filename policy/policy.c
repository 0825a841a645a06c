/* The policy's public API that neither loads nor prints: new, free, equal, and the per-channel
 * lookups. policy_internal.h says which file does what; nothing here knows an individual key. */
#include "cephalon/policy.h"

#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "policy/policy_internal.h"

cph_policy *cph_policy_new_default(void) {
  cph_policy *p = calloc(1, sizeof *p);
  if (!p)
    return NULL;
  if (cph__policy_init_fields(&cph__policy_schema, p) != CPH_OK ||
      !(p->source = strdup("(defaults)"))) {
    cph_policy_free(p);
    return NULL;
  }
  return p;
}

void cph_policy_free(cph_policy *p) {
  if (!p)
    return;
  cph__policy_free_fields(&cph__policy_schema, p);
  free(p->source);
  free(p);
}

bool cph_policy_equal(const cph_policy *a, const cph_policy *b) {
  return cph__policy_equal_fields(&cph__policy_schema, a, b);
}

/* Binary search in an array of entries sorted by the char * id at id_off. */
static const void *find_channel(const void *arr, size_t n, size_t size, size_t id_off,
                                const char *id) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const void *e = (const char *)arr + mid * size;
    int r = strcmp(id, get_str(e, id_off));
    if (r == 0)
      return e;
    if (r < 0)
      hi = mid;
    else
      lo = mid + 1;
  }
  return NULL;
}

const cph_policy_channel *cph_policy_backpressure_for(const cph_policy *p, const char *channel) {
  const cph_policy_backpressure *bp = &p->backpressure;
  const cph_policy_channel *c =
      channel ? find_channel(bp->channels, bp->channel_count, sizeof *bp->channels,
                             offsetof(cph_policy_channel, channel), channel)
              : NULL;
  return c ? c : &bp->defaults;
}

const cph_policy_retention *cph_policy_retention_for(const cph_policy *p, const char *channel) {
  const cph_policy_retention_section *rs = &p->maintenance.retention;
  const cph_policy_retention *r =
      channel ? find_channel(rs->channels, rs->channel_count, sizeof *rs->channels,
                             offsetof(cph_policy_retention, channel), channel)
              : NULL;
  return r ? r : &rs->events;
}

bool cph_policy_dedupe_is_bulk(const cph_policy *p, const char *channel, const char *sender) {
  const cph_policy_dedupe *d = &p->dedupe;
  for (size_t i = 0; i < d->bulk_count; i++)
    if ((channel && strcmp(d->bulk[i], channel) == 0) ||
        (sender && strcmp(d->bulk[i], sender) == 0))
      return true;
  return false;
}

static const char *enum_name(const char *const *names, size_t count, int v) {
  return v >= 0 && (size_t)v < count ? names[v] : "unknown";
}

const char *cph_policy_log_level_name(cph_policy_log_level v) {
  return enum_name(cph__policy_log_levels, 4, (int)v);
}
const char *cph_policy_sync_name(cph_policy_sync v) {
  return enum_name(cph__policy_syncs, 3, (int)v);
}
const char *cph_policy_provider_kind_name(cph_policy_provider_kind v) {
  return enum_name(cph__policy_provider_kinds, 2, (int)v);
}
const char *cph_policy_index_kind_name(cph_policy_index_kind v) {
  return enum_name(cph__policy_index_kinds, 2, (int)v);
}
const char *cph_policy_while_running_name(cph_policy_while_running v) {
  return enum_name(cph__policy_while_runnings, CPH_POLICY_WR_COUNT, (int)v);
}
int cph_policy_while_running_parse(const char *name, cph_policy_while_running *out) {
  for (int i = 0; name && i < CPH_POLICY_WR_COUNT; i++)
    if (strcmp(name, cph__policy_while_runnings[i]) == 0) {
      *out = (cph_policy_while_running)i;
      return CPH_OK;
    }
  return CPH_EINVAL;
}
