/* statezip — a session's state as the cluster log stores it (clusterflow.h 11.): packed with
 * zlib, and a thread that packs beside the loop.
 *
 * A packed value: "CPHZ", be32 the raw length (the state's bytes, CPH_SESSION_STATE_MAX_BYTES
 * at most), then a zlib stream (deflate with its adler-32 check) of exactly that many bytes,
 * and nothing after it. A raw state begins with "CPHS" (core/handover.c), so the first four
 * bytes tell the two apart: a value that is not packed is a raw state (as every build before
 * this one wrote, and as a state is still put when packing it makes it no smaller) and is read
 * as it is. Why zlib: a state holds the same conversation several times (the tree's cores, its
 * channels' history, its kept turn contexts), which deflate folds at a few hundred µs per state
 * (docs/cluster-scaling.md has the figures); the library is everywhere and reads what any
 * version wrote.
 *
 * Thread: the functions may be called from any thread. A packer owns one thread; it packs the
 * jobs in the order they were submitted and hands each back on the loop, in that order. */
#ifndef CEPHALON_SERVER_STATEZIP_H
#define CEPHALON_SERVER_STATEZIP_H

#include <event2/event.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cephalon/error.h"

#define CPH_STATEZIP_MAGIC "CPHZ"
#define CPH_STATEZIP_HEADER 8 /* the magic and the be32 raw length */
/* deflate's level. Measured on 40 states of the bench's (~60 KB each, docs/cluster-scaling.md):
 * level 1 packs to 9.4 KB in ~360 µs, level 6 to 8.3 KB in ~750 µs — 11% fewer bytes for twice
 * the time, on the one thread that packs every state of the node. */
#define CPH_STATEZIP_LEVEL 1

/* Whether value[0..len) is packed (begins with the magic). */
bool cph_statezip_packed(const uint8_t *value, size_t len);

/* Packs raw[0..len) at level (1-9) into a malloc'd *out of *out_len bytes whose first headroom
 * bytes are left for the caller (the cluster log's epoch) and the packed value follows.
 * CPH_OK; CPH_ELIMIT when len is over max_raw (nothing packed); CPH_ENOMEM. */
int cph_statezip_pack(const uint8_t *raw, size_t len, int level, size_t max_raw, size_t headroom,
                      uint8_t **out, size_t *out_len);

/* Reads a stored value. Not packed: CPH_OK with *out NULL — value is the raw state, used as it
 * is. Packed: CPH_OK with the raw state in a malloc'd *out of *out_len bytes; or CPH_ECORRUPT
 * with why set (a cut header or stream, a stream that does not inflate, fails its check, has
 * bytes after its end, or inflates to other than the stated length) or CPH_ELIMIT (a stated
 * length over max_raw), *out NULL. Never writes more than min(stated, max_raw) bytes: the
 * stated length is not trusted beyond max_raw. CPH_ENOMEM. */
int cph_statezip_unpack(const uint8_t *value, size_t len, size_t max_raw, uint8_t **out,
                        size_t *out_len, char *why, size_t why_size);

/* A packing job; the caller owns it (it may sit in the caller's own struct). */
typedef struct cph_statezip_job {
  /* in, borrowed until the job is handed back */
  const uint8_t *raw;
  size_t raw_len;
  size_t headroom; /* as cph_statezip_pack's */
  void *tag;       /* the caller's */
  /* out: *out malloc'd (the caller frees it), headroom bytes then the value, or NULL (out of
   * memory). packed false: the value is the raw state itself — packing did not make it
   * smaller, or it is over CPH_SESSION_STATE_MAX_BYTES (which handover_export never makes). */
  uint8_t *out;
  size_t out_len;
  bool packed;
  int64_t pack_ns; /* the time the packing took */
  struct cph_statezip_job *next; /* the packer's */
} cph_statezip_job;

/* Fills job's out fields by packing job->raw now, on the calling thread. */
void cph_statezip_job_run(cph_statezip_job *job, int level);

typedef struct cph_statezip_packer cph_statezip_packer;

/* Starts a packer: its thread packs at level, and done(arg, job) runs on base's loop for each
 * job, in submission order. CPH_OK, CPH_ENOMEM or CPH_EIO (no thread or pipe): *out NULL. */
int cph_statezip_packer_start(struct event_base *base, int level,
                              void (*done)(void *arg, cph_statezip_job *job), void *arg,
                              cph_statezip_packer **out);
/* Queues job. False when the packer does not take it (NULL, stopping): then it never calls back
 * for it and the caller packs it itself (cph_statezip_job_run). */
bool cph_statezip_packer_submit(cph_statezip_packer *p, cph_statezip_job *job);
/* Joins the thread and frees p (NULL is fine). Jobs not handed back yet never are: they are the
 * caller's again, their out freed and NULL. */
void cph_statezip_packer_stop(cph_statezip_packer *p);

#endif
