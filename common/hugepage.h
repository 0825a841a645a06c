/* Huge pages for large arrays that are hit at random (the scheduler's sessions, dedupe's
 * exact-entry filter): on 4 KiB pages nearly every access to such an array misses the TLB.
 * CPH_HUGE_PAGE is the size from which asking is worth it; cph_huge_advise asks. */
#ifndef CEPHALON_COMMON_HUGEPAGE_H
#define CEPHALON_COMMON_HUGEPAGE_H

#include <stddef.h>
#include <sys/mman.h>

#define CPH_HUGE_PAGE ((size_t)2 << 20)

/* Advises the kernel to back [p, p + bytes) with huge pages. Advice only: where the system
 * refuses (transparent huge pages off), the pages stay small and everything works the same. */
static inline void cph_huge_advise(void *p, size_t bytes) {
#ifdef MADV_HUGEPAGE
  (void)madvise(p, bytes, MADV_HUGEPAGE);
#else
  (void)p;
  (void)bytes;
#endif
}

#endif
