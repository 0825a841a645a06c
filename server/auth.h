/* Bearer-token authentication (DESIGN §9). The policy lists tokens by the hex SHA-256 of the
 * token, never the token; a request's token is hashed and compared in constant time with each
 * configured hash. Tokens are never logged: only the matching entry's name is. */
#ifndef CEPHALON_SERVER_AUTH_H
#define CEPHALON_SERVER_AUTH_H

#include <stddef.h>

#include "cephalon/policy.h"

/* The scopes (CPH_POLICY_SCOPE_* bits) granted by the `Authorization` header value, which may
 * be NULL: 0 when it is absent, not `Bearer <token>`, or the token is unknown. *who (may be
 * NULL) gets the matching token's name, or NULL. */
unsigned cph_auth_scopes(const cph_policy *p, const char *authorization, const char **who);

/* "ingest or read" for a scope mask, into buf (for 403 messages). */
const char *cph_auth_scope_names(unsigned scopes, char *buf, size_t size);

#endif
