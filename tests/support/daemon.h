/* Runs the real cephalond on a free loopback port for integration tests, and a minimal
 * HTTP/1.1 client to talk to it. Traffic goes to 127.0.0.1 only. */
#ifndef CEPHALON_TESTS_DAEMON_H
#define CEPHALON_TESTS_DAEMON_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

typedef struct cph_test_daemon {
  pid_t pid;
  int port;
  char *data_dir; /* owned temp dir, removed by stop unless keep_data */
  char *log_path; /* the daemon's stderr */
  bool keep_data;
} cph_test_daemon;

/* Starts $CPH_BIN_DIR/cephalond --policy policy_path --data <tmp> --listen 127.0.0.1:0 plus
 * extra_args (NULL-terminated, may be NULL) and waits up to 10 s for its ready line. When
 * data_dir is non-NULL it is used (and kept) instead of a fresh temp dir. Returns 0, or -1
 * if it exited or never became ready (its log is printed to stderr). */
int cph_test_daemon_start(cph_test_daemon *d, const char *policy_path, const char *data_dir,
                          const char *const *extra_args);
/* Sends sig and waits for the exit; returns the exit status (or 128+signal). */
int cph_test_daemon_signal_wait(cph_test_daemon *d, int sig);
/* SIGTERM, wait, clean up temp files. */
int cph_test_daemon_stop(cph_test_daemon *d);
/* The daemon's log so far; free() it. */
char *cph_test_daemon_log(const cph_test_daemon *d);
/* Waits up to timeout_ms for `needle` to appear in the log. */
bool cph_test_daemon_log_wait(const cph_test_daemon *d, const char *needle, int timeout_ms);

typedef struct cph_test_response {
  int status;   /* HTTP status, or -1 if the request failed */
  char *body;   /* NUL-terminated; free with cph_test_response_free */
  size_t body_len;
  char *headers;
} cph_test_response;

/* One request with Connection: close. body may be NULL. extra_headers like
 * "Authorization: Bearer x\r\n" or NULL. */
cph_test_response cph_test_http(int port, const char *method, const char *path,
                                const char *extra_headers, const char *body);
void cph_test_response_free(cph_test_response *r);

/* Runs argv (argv[0] is a path) to completion capturing stdout and stderr. Returns the exit
 * status, or -1 on failure to run. */
int cph_test_run(const char *const *argv, char **out, char **err);

/* Starts argv (argv[0] is a path) in the background with stdout and stderr written to the
 * files out_path and err_path (created or emptied); it is killed if the test process dies.
 * Returns its pid, or -1. */
pid_t cph_test_spawn(const char *const *argv, const char *out_path, const char *err_path);
/* Sends sig to pid and reaps it within timeout_ms (else SIGKILLs it and returns -1); returns
 * its exit status, or 128+signal. */
int cph_test_signal_wait(pid_t pid, int sig, int timeout_ms);

#endif
