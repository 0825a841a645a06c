/* Shared helpers for tests: temporary directories and files. */
#ifndef CEPHALON_TESTS_TESTUTIL_H
#define CEPHALON_TESTS_TESTUTIL_H

#include <stddef.h>

/* A fresh empty directory under $TMPDIR (or /tmp); free() the result. Aborts on failure. */
char *cph_test_tmpdir(const char *tag);
/* rm -rf path. */
void cph_test_rmtree(const char *path);
/* Writes text to a new temp file with the given suffix; free() the returned path. */
char *cph_test_write_tmpfile(const char *suffix, const char *text);
/* Reads a whole file; free() the result; NULL if unreadable. *len may be NULL. */
char *cph_test_read_file(const char *path, size_t *len);
/* Copies the file from to the new file to. Aborts on failure. */
void cph_test_copy_file(const char *from, const char *to);
/* $CPH_SOURCE_DIR/rel (or ./rel); free() the result. */
char *cph_test_source_path(const char *rel);

#endif
