#define _GNU_SOURCE
#include "testutil.h"

#include <errno.h>
#include <ftw.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *tmp_root(void) {
  const char *t = getenv("TMPDIR");
  return t && *t ? t : "/tmp";
}

char *cph_test_tmpdir(const char *tag) {
  char *path;
  if (asprintf(&path, "%s/cph-%s-XXXXXX", tmp_root(), tag) < 0)
    abort();
  if (!mkdtemp(path)) {
    fprintf(stderr, "mkdtemp %s: %s\n", path, strerror(errno));
    abort();
  }
  return path;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  return remove(path);
}

void cph_test_rmtree(const char *path) { nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

char *cph_test_write_tmpfile(const char *suffix, const char *text) {
  char *path;
  if (asprintf(&path, "%s/cph-file-XXXXXX%s", tmp_root(), suffix) < 0)
    abort();
  int fd = mkstemps(path, (int)strlen(suffix));
  if (fd < 0)
    abort();
  size_t len = strlen(text);
  if (write(fd, text, len) != (ssize_t)len)
    abort();
  close(fd);
  return path;
}

char *cph_test_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return NULL;
  size_t cap = 4096, n = 0;
  char *buf = malloc(cap);
  size_t got;
  while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
    n += got;
    if (cap - n - 1 == 0) {
      char *p = realloc(buf, cap *= 2);
      if (!p) {
        free(buf);
        buf = NULL;
      }
      buf = p;
    }
  }
  fclose(f);
  if (!buf)
    return NULL;
  buf[n] = '\0';
  if (len)
    *len = n;
  return buf;
}

char *cph_test_source_path(const char *rel) {
  const char *root = getenv("CPH_SOURCE_DIR");
  char *path;
  if (asprintf(&path, "%s/%s", root && *root ? root : ".", rel) < 0)
    abort();
  return path;
}

void cph_test_copy_file(const char *from, const char *to) {
  size_t len;
  char *data = cph_test_read_file(from, &len);
  FILE *out = data ? fopen(to, "wb") : NULL;
  bool ok = out && fwrite(data, 1, len, out) == len;
  if (out && fclose(out) != 0)
    ok = false;
  free(data);
  if (!ok) {
    fprintf(stderr, "copying %s to %s failed: %s\n", from, to, strerror(errno));
    abort();
  }
}
