#include "listen.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int cph_listen_parse(const char *text, cph_listen_addr *out, cph_err *err) {
  const char *colon;
  const char *host = text;
  size_t host_len;
  if (text[0] == '[') {
    const char *close = strchr(text, ']');
    if (!close || close[1] != ':')
      return cph_err_set(err, CPH_EINVAL, "listen address \"%s\": expected [IPV6]:PORT", text);
    host = text + 1;
    host_len = (size_t)(close - host);
    colon = close + 1;
  } else {
    colon = strrchr(text, ':');
    if (!colon)
      return cph_err_set(err, CPH_EINVAL, "listen address \"%s\": expected HOST:PORT", text);
    host_len = (size_t)(colon - text);
  }
  if (host_len == 0 || host_len >= sizeof out->host)
    return cph_err_set(err, CPH_EINVAL, "listen address \"%s\": bad host", text);
  char *end;
  long port = strtol(colon + 1, &end, 10);
  if (colon[1] == '\0' || *end != '\0' || port < 0 || port > 65535)
    return cph_err_set(err, CPH_EINVAL, "listen address \"%s\": port must be 0..65535", text);
  memcpy(out->host, host, host_len);
  out->host[host_len] = '\0';
  out->port = (uint16_t)port;
  return CPH_OK;
}

bool cph_listen_is_loopback(const cph_listen_addr *a) {
  struct addrinfo hints = {0}, *res;
  hints.ai_socktype = SOCK_STREAM;
  if (getaddrinfo(a->host, NULL, &hints, &res) != 0)
    return false;
  bool all_loopback = true;
  for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
    if (ai->ai_family == AF_INET) {
      const struct sockaddr_in *sin = (const struct sockaddr_in *)ai->ai_addr;
      if ((ntohl(sin->sin_addr.s_addr) >> 24) != 127)
        all_loopback = false;
    } else if (ai->ai_family == AF_INET6) {
      const struct sockaddr_in6 *sin6 = (const struct sockaddr_in6 *)ai->ai_addr;
      if (!IN6_IS_ADDR_LOOPBACK(&sin6->sin6_addr))
        all_loopback = false;
    } else {
      all_loopback = false;
    }
  }
  freeaddrinfo(res);
  return all_loopback;
}
