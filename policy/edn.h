/* The EDN reader and writer. Its API is public — include/cephalon/edn.h, where the types and
 * the contract are — so that programs outside the engine (cephalon-worker) can read EDN too.
 * This header remains for the code that has always included it (tests/unit/test_edn.c,
 * test_policy.c, tests/fuzz/fuzz_edn.c) and adds common/buf.h, the buffer cph_edn_write
 * appends to. The files of the reader and writer share policy/edn_internal.h. */
#ifndef CEPHALON_POLICY_EDN_H
#define CEPHALON_POLICY_EDN_H

#include "cephalon/edn.h"
#include "common/buf.h"

#endif
