/* The engine handle: policy in force + store. */
#include <stdlib.h>
#include <string.h>

#include "cephalon/cephalon.h"
#include "store/store.h"

struct cph_engine {
  cph_policy *policy;
  uint64_t policy_generation;
  cph_store *store;
  char *data_dir;
};

static cph_sync_mode sync_mode_of(const cph_policy *p) {
  switch (p->store.sync) {
  case CPH_POLICY_SYNC_BATCH:
    return CPH_SYNC_BATCH;
  case CPH_POLICY_SYNC_NONE:
    return CPH_SYNC_NONE;
  default:
    return CPH_SYNC_ALWAYS;
  }
}

int cph_engine_open(cph_policy *policy, const cph_engine_options *opts, cph_engine **out,
                    cph_err *err) {
  *out = NULL;
  cph_engine *e = calloc(1, sizeof *e);
  if (!e) {
    cph_policy_free(policy);
    return cph_err_set(err, CPH_ENOMEM, "out of memory opening the engine");
  }
  e->policy = policy;
  e->policy_generation = 1;
  const char *dir = opts && opts->data_dir ? opts->data_dir : policy->server.data_dir;
  e->data_dir = strdup(dir);
  int rc;
  if (!e->data_dir) {
    rc = cph_err_set(err, CPH_ENOMEM, "out of memory opening the engine");
    goto fail;
  }
  cph_store_options so = {e->data_dir, (size_t)policy->server.map_size_mb << 20,
                          sync_mode_of(policy)};
  rc = cph_store_open(&so, &e->store, err);
  if (rc)
    goto fail;
  *out = e;
  return CPH_OK;
fail:
  cph_engine_close(e);
  return rc;
}

void cph_engine_close(cph_engine *e) {
  if (!e)
    return;
  cph_store_close(e->store);
  cph_policy_free(e->policy);
  free(e->data_dir);
  free(e);
}

int cph_engine_reload(cph_engine *e, cph_policy *policy, cph_err *err) {
  cph_err_clear(err);
  int rc = cph_store_set_sync_mode(e->store, sync_mode_of(policy), err);
  if (rc) {
    cph_policy_free(policy);
    return rc;
  }
  bool restart_needed = policy->server.map_size_mb != e->policy->server.map_size_mb ||
                        strcmp(policy->server.data_dir, e->policy->server.data_dir) != 0 ||
                        strcmp(policy->server.listen, e->policy->server.listen) != 0;
  if (restart_needed)
    cph_err_set(err, CPH_OK,
                ":server :listen, :data-dir and :map-size-mb take effect at the next restart");
  cph_policy_free(e->policy);
  e->policy = policy;
  e->policy_generation++;
  return CPH_OK;
}

const cph_policy *cph_engine_policy(const cph_engine *e) { return e->policy; }
uint64_t cph_engine_policy_generation(const cph_engine *e) { return e->policy_generation; }

int cph_engine_storage_stats(cph_engine *e, cph_engine_storage *out) {
  cph_store_stats st;
  int rc = cph_store_stats_get(e->store, &st);
  if (rc)
    return rc;
  out->map_size_bytes = st.map_size;
  out->used_bytes = st.used_bytes;
  return CPH_OK;
}
