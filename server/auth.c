#include "auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* Longer bearer values are refused unhashed: no real token is this long. */
#define MAX_TOKEN_BYTES 4096

unsigned cph_auth_scopes(const cph_policy *p, const char *authorization, const char **who) {
  if (who)
    *who = NULL;
  if (!authorization || strncasecmp(authorization, "Bearer ", 7) != 0)
    return 0;
  const char *tok = authorization + 7;
  while (*tok == ' ')
    tok++;
  size_t len = strlen(tok);
  while (len && tok[len - 1] == ' ')
    len--;
  if (len == 0 || len > MAX_TOKEN_BYTES)
    return 0;

  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int md_len = 0;
  if (EVP_Digest(tok, len, md, &md_len, EVP_sha256(), NULL) != 1 || md_len != 32)
    return 0;
  char hex[65];
  for (unsigned i = 0; i < 32; i++)
    snprintf(hex + 2 * i, 3, "%02x", md[i]);

  /* Every configured hash is compared (no early exit), each in constant time, so timing
   * tells nothing about how close a guess came. */
  unsigned scopes = 0;
  for (size_t i = 0; i < p->auth.token_count; i++) {
    const cph_policy_token *t = &p->auth.tokens[i];
    if (!t->sha256 || strlen(t->sha256) != 64)
      continue;
    if (CRYPTO_memcmp(hex, t->sha256, 64) == 0 && !scopes) {
      scopes = t->scopes;
      if (who)
        *who = t->name;
    }
  }
  OPENSSL_cleanse(md, sizeof md);
  return scopes;
}

const char *cph_auth_scope_names(unsigned scopes, char *buf, size_t size) {
  static const struct {
    unsigned bit;
    const char *name;
  } names[] = {{CPH_POLICY_SCOPE_INGEST, "ingest"},
               {CPH_POLICY_SCOPE_WORKER, "worker"},
               {CPH_POLICY_SCOPE_ADMIN, "admin"},
               {CPH_POLICY_SCOPE_READ, "read"}};
  size_t used = 0;
  if (size)
    buf[0] = '\0';
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    if (!(scopes & names[i].bit))
      continue;
    int n = snprintf(buf + used, size - used, "%s%s", used ? " or " : "", names[i].name);
    if (n < 0 || (size_t)n >= size - used)
      break;
    used += (size_t)n;
  }
  return buf;
}
