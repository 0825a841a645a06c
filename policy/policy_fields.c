/* Defaults, free, copy and equality of the structs a schema table describes. */
#include "policy/policy_internal.h"

#include <stdlib.h>
#include <string.h>

#include "cephalon/error.h"

void cph__policy_free_array(const ps_field *f, void *base) {
  void *arr = get_ptr(base, f->off);
  size_t n = get_size(base, f->count_off);
  for (size_t i = 0; i < n; i++)
    cph__policy_free_fields(f->child, element(arr, f->child, i));
  free(arr);
  set_ptr(base, f->off, NULL);
  set_size(base, f->count_off, 0);
}

void cph__policy_free_strings(const ps_field *f, void *base) {
  char **arr = get_ptr(base, f->off);
  size_t n = get_size(base, f->count_off);
  for (size_t i = 0; i < n; i++)
    free(arr[i]);
  free(arr);
  set_ptr(base, f->off, NULL);
  set_size(base, f->count_off, 0);
}

void cph__policy_free_fields(const ps_table *t, void *base) {
  for (size_t i = 0; i < t->count; i++) {
    const ps_field *f = &t->fields[i];
    switch (f->kind) {
    case PS_STR:
      free(get_str(base, f->off));
      set_str(base, f->off, NULL);
      break;
    case PS_SECTION:
      cph__policy_free_fields(f->child, at(base, f->off));
      break;
    case PS_CHANNELS:
    case PS_VECTOR:
      cph__policy_free_array(f, base);
      break;
    case PS_STRINGS:
      cph__policy_free_strings(f, base);
      break;
    default:
      break;
    }
  }
  if (t->id_off != PS_NO_ID) {
    free(get_str(base, t->id_off));
    set_str(base, t->id_off, NULL);
  }
}

void cph__policy_derive_defaults(const ps_table *t, void *base, const cph_edn *const *given) {
  for (size_t i = 0; i < t->count; i++) {
    const ps_field *f = &t->fields[i];
    if (f->neg_of && !(given && given[i]))
      set_num(base, f->off, -get_num(base, sibling(t, f->neg_of)->off));
  }
}

int cph__policy_init_fields(const ps_table *t, void *base) {
  for (size_t i = 0; i < t->count; i++) {
    const ps_field *f = &t->fields[i];
    switch (f->kind) {
    case PS_INT:
      set_int(base, f->off, f->idef);
      break;
    case PS_NUM:
      set_num(base, f->off, f->ddef);
      break;
    case PS_BOOL:
      set_bool(base, f->off, f->idef != 0);
      break;
    case PS_CHOICE:
      set_choice(base, f->off, (int)f->idef);
      break;
    case PS_SCOPES:
      set_scopes(base, f->off, 0);
      break;
    case PS_STR:
      if (f->sdef) {
        char *s = strdup(f->sdef);
        if (!s)
          return CPH_ENOMEM;
        set_str(base, f->off, s);
      }
      break;
    case PS_SECTION:
      if (f->flags & PS_OPTIONAL)
        set_bool(base, f->present_off, false);
      if (cph__policy_init_fields(f->child, at(base, f->off)) != CPH_OK)
        return CPH_ENOMEM;
      break;
    case PS_CHANNELS:
    case PS_VECTOR:
    case PS_STRINGS:
      set_ptr(base, f->off, NULL);
      set_size(base, f->count_off, 0);
      break;
    }
  }
  cph__policy_derive_defaults(t, base, NULL);
  return CPH_OK;
}

static int dup_str(const char *s, char **out) {
  *out = NULL;
  if (s && !(*out = strdup(s)))
    return CPH_ENOMEM;
  return CPH_OK;
}

int cph__policy_copy_fields(const ps_table *t, void *dst, const void *src) {
  char *s;
  for (size_t i = 0; i < t->count; i++) {
    const ps_field *f = &t->fields[i];
    switch (f->kind) {
    case PS_INT:
      set_int(dst, f->off, get_int(src, f->off));
      break;
    case PS_NUM:
      set_num(dst, f->off, get_num(src, f->off));
      break;
    case PS_BOOL:
      set_bool(dst, f->off, get_bool(src, f->off));
      break;
    case PS_CHOICE:
      set_choice(dst, f->off, get_choice(src, f->off));
      break;
    case PS_SCOPES:
      set_scopes(dst, f->off, get_scopes(src, f->off));
      break;
    case PS_STR:
      if (dup_str(get_str(src, f->off), &s) != CPH_OK)
        return CPH_ENOMEM;
      set_str(dst, f->off, s);
      break;
    case PS_SECTION:
      if (f->flags & PS_OPTIONAL)
        set_bool(dst, f->present_off, get_bool(src, f->present_off));
      if (cph__policy_copy_fields(f->child, at(dst, f->off), cat(src, f->off)) != CPH_OK)
        return CPH_ENOMEM;
      break;
    case PS_CHANNELS:
    case PS_VECTOR: {
      size_t n = get_size(src, f->count_off);
      if (n == 0)
        break;
      void *arr = calloc(n, f->child->size);
      if (!arr)
        return CPH_ENOMEM;
      set_ptr(dst, f->off, arr);
      set_size(dst, f->count_off, n);
      const void *src_arr = get_ptr(src, f->off);
      for (size_t j = 0; j < n; j++)
        if (cph__policy_copy_fields(f->child, element(arr, f->child, j),
                                    celement(src_arr, f->child, j)) != CPH_OK)
          return CPH_ENOMEM;
      break;
    }
    case PS_STRINGS: {
      size_t n = get_size(src, f->count_off);
      if (n == 0)
        break;
      char **arr = calloc(n, sizeof *arr);
      if (!arr)
        return CPH_ENOMEM;
      /* Published at once: NULL entries are safe to free if a strdup below fails. */
      set_ptr(dst, f->off, arr);
      set_size(dst, f->count_off, n);
      char *const *src_arr = get_ptr(src, f->off);
      for (size_t j = 0; j < n; j++)
        if (dup_str(src_arr[j], &arr[j]) != CPH_OK)
          return CPH_ENOMEM;
      break;
    }
    }
  }
  if (t->id_off != PS_NO_ID) {
    if (dup_str(get_str(src, t->id_off), &s) != CPH_OK)
      return CPH_ENOMEM;
    set_str(dst, t->id_off, s);
  }
  return CPH_OK;
}

static bool str_equal(const char *a, const char *b) {
  return a == b || (a && b && strcmp(a, b) == 0);
}

bool cph__policy_equal_fields(const ps_table *t, const void *a, const void *b) {
  if (t->id_off != PS_NO_ID && !str_equal(get_str(a, t->id_off), get_str(b, t->id_off)))
    return false;
  for (size_t i = 0; i < t->count; i++) {
    const ps_field *f = &t->fields[i];
    bool same = true;
    switch (f->kind) {
    case PS_INT:
      same = get_int(a, f->off) == get_int(b, f->off);
      break;
    case PS_NUM:
      same = get_num(a, f->off) == get_num(b, f->off);
      break;
    case PS_BOOL:
      same = get_bool(a, f->off) == get_bool(b, f->off);
      break;
    case PS_CHOICE:
      same = get_choice(a, f->off) == get_choice(b, f->off);
      break;
    case PS_SCOPES:
      same = get_scopes(a, f->off) == get_scopes(b, f->off);
      break;
    case PS_STR:
      same = str_equal(get_str(a, f->off), get_str(b, f->off));
      break;
    case PS_SECTION:
      if ((f->flags & PS_OPTIONAL) &&
          get_bool(a, f->present_off) != get_bool(b, f->present_off))
        return false;
      same = cph__policy_equal_fields(f->child, cat(a, f->off), cat(b, f->off));
      break;
    case PS_CHANNELS:
    case PS_VECTOR: {
      size_t n = get_size(a, f->count_off);
      if (n != get_size(b, f->count_off))
        return false;
      const void *aa = get_ptr(a, f->off), *ba = get_ptr(b, f->off);
      for (size_t j = 0; j < n && same; j++)
        same = cph__policy_equal_fields(f->child, celement(aa, f->child, j),
                                        celement(ba, f->child, j));
      break;
    }
    case PS_STRINGS: {
      /* In order: the list is kept as written, so a reordered list counts as a change
       * (harmless for reload, which at worst re-applies the same set). */
      size_t n = get_size(a, f->count_off);
      if (n != get_size(b, f->count_off))
        return false;
      char *const *aa = get_ptr(a, f->off), *const *ba = get_ptr(b, f->off);
      for (size_t j = 0; j < n && same; j++)
        same = str_equal(aa[j], ba[j]);
      break;
    }
    }
    if (!same)
      return false;
  }
  return true;
}
