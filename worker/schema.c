/* Tool arguments against the tool's JSON Schema, top level only: the arguments are an object,
 * the `required` properties are there, and each property the schema declares has the declared
 * `type` (a name or a list of names). Deeper structure is the tool's to judge. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "worker/worker.h"

static bool is_type(const json_t *v, const char *type) {
  if (strcmp(type, "string") == 0)
    return json_is_string(v);
  if (strcmp(type, "integer") == 0)
    return json_is_integer(v) ||
           (json_is_real(v) && floor(json_real_value(v)) == json_real_value(v));
  if (strcmp(type, "number") == 0)
    return json_is_number(v);
  if (strcmp(type, "boolean") == 0)
    return json_is_boolean(v);
  if (strcmp(type, "array") == 0)
    return json_is_array(v);
  if (strcmp(type, "object") == 0)
    return json_is_object(v);
  if (strcmp(type, "null") == 0)
    return json_is_null(v);
  return true; /* a type we do not know: not ours to refuse */
}

/* True when v matches `type` (a string or an array of strings); absent type matches. */
static bool matches(const json_t *v, const json_t *type, char *names, size_t names_len) {
  names[0] = '\0';
  if (json_is_string(type)) {
    snprintf(names, names_len, "%s", json_string_value(type));
    return is_type(v, json_string_value(type));
  }
  if (json_is_array(type)) {
    size_t i;
    json_t *t;
    bool any = json_array_size(type) == 0;
    json_array_foreach(type, i, t) {
      if (!json_is_string(t))
        return true;
      size_t used = strlen(names);
      snprintf(names + used, names_len - used, "%s%s", i ? " or " : "", json_string_value(t));
      any |= is_type(v, json_string_value(t));
    }
    return any;
  }
  return true;
}

int wk_schema_check(const json_t *schema, const json_t *args, char *why, size_t why_len) {
  why[0] = '\0';
  if (!json_is_object(args)) {
    snprintf(why, why_len, "arguments must be a JSON object");
    return -1;
  }
  if (!json_is_object(schema))
    return 0;
  const json_t *required = json_object_get(schema, "required");
  size_t i;
  json_t *r;
  json_array_foreach(required, i, r) {
    if (json_is_string(r) && !json_object_get(args, json_string_value(r))) {
      snprintf(why, why_len, "missing required property \"%s\"", json_string_value(r));
      return -1;
    }
  }
  const json_t *props = json_object_get(schema, "properties");
  if (!json_is_object(props))
    return 0;
  const char *key;
  json_t *v;
  json_object_foreach((json_t *)args, key, v) {
    const json_t *p = json_object_get(props, key);
    char names[128];
    if (json_is_object(p) && !matches(v, json_object_get(p, "type"), names, sizeof names)) {
      snprintf(why, why_len, "property \"%s\" must be %s", key, names);
      return -1;
    }
  }
  return 0;
}
