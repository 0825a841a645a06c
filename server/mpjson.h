/* msgpack <-> jansson json_t, for the application/msgpack side of the API (DESIGN §9).
 *
 * Reading is a strict, bounded walker over untrusted bytes: every length (string, array and
 * map counts) is checked against the bytes that remain before anything is allocated, so a
 * forged header costs nothing (msgpack_unpack_next would allocate the declared count up
 * front). What JSON cannot say is refused rather than guessed: non-string map keys, ext
 * types, integers above INT64_MAX, NaN/infinity, strings that are not UTF-8 or hold NUL
 * bytes, duplicate keys, nesting deeper than CPH_MPJSON_MAX_DEPTH, and trailing bytes. bin
 * values are read as strings (old packers write strings as raw bytes) under the same rules.
 *
 * Writing packs any json_t tree with msgpack-c. */
#ifndef CEPHALON_SERVER_MPJSON_H
#define CEPHALON_SERVER_MPJSON_H

#include <jansson.h>
#include <stddef.h>

#define CPH_MPJSON_MAX_DEPTH 64

/* Parses exactly one msgpack value filling data[0..len). Returns a new reference, or NULL
 * with err (NUL-terminated, errlen bytes) saying what is wrong and at which byte offset. */
json_t *cph_mpjson_read(const void *data, size_t len, char *err, size_t errlen);

/* Packs v. Returns a malloc'd buffer of *len bytes (free() it), or NULL on out of memory. */
char *cph_mpjson_write(const json_t *v, size_t *len);

#endif
