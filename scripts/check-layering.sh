#!/usr/bin/env bash
# The layering check (DESIGN §1), run by ctest as test_layering:
#
#   scripts/check-layering.sh SRC_DIR                 check; exit 1 with one line per problem
#   scripts/check-layering.sh --print-edges SRC_DIR   print today's core edges that lie on a
#                                                     circle, as the allowlist's [core edges]
#
# It reads every #include of the C files and headers in the modules below and resolves it the
# way the compiler does (quotes: the including file's directory, then include/, then the
# source root; angle brackets: include/, then the root; anything else is a system header).
#
# Rule a, module order. Dependencies run one way:
#     server, cli, bench, worker  ->  include/cephalon  ->  core  ->  lanes, store, policy,
#     providers  ->  common
#   A module may include its own headers, include/cephalon/*.h, and the headers of the modules
#   it depends on: core those of lanes, store, policy, providers and common; lanes, store,
#   policy and providers those of common; server, cli, bench and worker only common's (the
#   engine's own headers are private: they reach the engine through include/cephalon).
#   A public header (include/cephalon/) includes only public headers. tests/ may include
#   anything. Including a header of a module above, or skipping the public API, breaks it.
# Rule b, private headers. A sibling's headers are private to it (store may not include
#   policy/*.h). Inside core, a module's private header core/X_internal.h (the state the
#   files of one module share) may be included only by that module's files: core/X.c,
#   core/X.h and core/X_*.{c,h}. No core file reaches into another module's state.
# Rule c, no new include cycles in core. Graph: core/a.c -> core/b.c when a.c includes,
#   directly or through other core headers, a header that b.c implements (core/b.h, or
#   core/b_internal.h; a header with no such .c, like providers.h, adds no edge). An edge that
#   lies on a circle must be listed in the [core edges] section of the allowlist (empty
#   today: core has no circle); a new one fails with the circle as a path, and a listed edge that no longer
#   exists fails too, so the list only shrinks. Edges on no circle need no listing.
# Includes that break rule a or b and are accepted for now are in the [exceptions] section.
#
# Needs only bash, find and awk (POSIX awk; mawk is fine).
set -euo pipefail

mode=check
if [ "${1:-}" = "--print-edges" ]; then
  mode=edges
  shift
fi
if [ $# -ne 1 ] || [ ! -d "$1" ]; then
  echo "usage: $0 [--print-edges] SRC_DIR" >&2
  exit 2
fi
cd "$1"
allow=scripts/layering-allow.txt
[ -f "$allow" ] || { echo "check-layering: $allow is missing" >&2; exit 2; }

modules="common store policy lanes providers core include server cli bench worker tests"
dirs=""
for m in $modules; do
  if [ -d "$m" ]; then dirs="$dirs $m"; fi
done
# shellcheck disable=SC2086
files=$(find $dirs -type f \( -name '*.c' -o -name '*.h' \) ! -path '*/node_modules/*' | LC_ALL=C sort)

# Input: the allowlist, then a "@@FILES@@" line and the file list; awk reads the files itself.
check() {
  { cat "$allow"; echo "@@FILES@@"; echo "$files"; } | awk -v mode="$mode" -v allow_path="$allow" '
function module_of(p,   parts, n) {
  n = split(p, parts, "/")
  if (parts[1] == "include")
    return (n >= 3 && parts[2] == "cephalon") ? "api" : ""
  return (parts[1] in rank) ? parts[1] : ""
}
# "core/dedupe_internal.h" -> "core/dedupe": the module a private header belongs to.
function internal_owner(r,   o) {
  o = r
  sub(/_internal\.h$/, "", o)
  return o
}
# True when file f belongs to the module of header r: core/X.c, core/X.h or core/X_*.
function same_module(f, r,   o) {
  o = internal_owner(r)
  return f == o ".c" || f == o ".h" || index(f, o "_") == 1
}
function norm(p,   parts, n, i, out, k, j, s) {
  n = split(p, parts, "/")
  k = 0
  for (i = 1; i <= n; i++) {
    if (parts[i] == "" || parts[i] == ".")
      continue
    if (parts[i] == "..") {
      if (k > 0) k--
      continue
    }
    out[++k] = parts[i]
  }
  s = ""
  for (j = 1; j <= k; j++)
    s = s (j > 1 ? "/" : "") out[j]
  return s
}
function dirname(p,   i) {
  i = match(p, /\/[^\/]*$/)
  return i ? substr(p, 1, i - 1) : ""
}
function resolve(from, target, angle,   c) {
  if (!angle) {
    c = norm(dirname(from) "/" target)
    if (c in exists) return c
  }
  c = norm("include/" target)
  if (c in exists) return c
  c = norm(target)
  if (c in exists) return c
  return ""
}
function may_depend(src, tgt) {
  if (src == tgt || src == "tests") return 1
  if (src == "api") return 0
  if (tgt == "api") return 1
  return ((src SUBSEP tgt) in deps)
}
function allowed_text(src) {
  if (src == "api") return "a public header may include only include/cephalon/*.h"
  return src " may include only its own headers, include/cephalon/*.h" (src_deps[src] == "" ? "" : " and those of " src_deps[src])
}
function problem(msg) {
  if (mode == "edges") return
  print "check-layering: " msg
  failures++
}
function trim(s) {
  sub(/^[ \t]+/, "", s)
  sub(/[ \t]+$/, "", s)
  return s
}
# The .c that implements a core header, or "".
function impl_of(h,   stem, c) {
  if (h !~ /^core\/[^\/]*\.h$/) return ""
  stem = substr(h, 1, length(h) - 2)
  sub(/_internal$/, "", stem)
  c = stem ".c"
  return (c in exists) ? c : ""
}
# Adds the edges from core file f for every core header reachable from h through core headers;
# via is how f reaches h ("core/a.h -> core/b.h").
function reach(f, h, via, line,   list, n, i, impl) {
  if ((f SUBSEP h) in seen_from) return
  seen_from[f, h] = 1
  impl = impl_of(h)
  if (impl != "" && impl != f && !((f SUBSEP impl) in edge)) {
    edge[f, impl] = via
    edge_line[f, impl] = line
    edges_out[f] = edges_out[f] " " impl
    edge_list[++n_edges] = f SUBSEP impl
  }
  n = split(core_incs[h], list, " ")
  for (i = 1; i <= n; i++)
    reach(f, list[i], via " -> " list[i], line)
}
# One path from a to b over the current edges, as "a -> ... -> b", or "".
function path(a, b,   queue, head, tail, parent, u, list, n, i, v, p) {
  head = 1; tail = 0
  queue[++tail] = a
  parent[a] = ""
  while (head <= tail) {
    u = queue[head++]
    if (u == b) break
    n = split(edges_out[u], list, " ")
    for (i = 1; i <= n; i++) {
      v = list[i]
      if (!(v in parent)) {
        parent[v] = u
        queue[++tail] = v
      }
    }
  }
  if (!(b in parent)) return ""
  p = b
  for (u = parent[b]; u != ""; u = parent[u])
    p = u " -> " p
  return p
}

BEGIN {
  rank["common"] = 0
  rank["store"] = 1; rank["policy"] = 1; rank["lanes"] = 1; rank["providers"] = 1
  rank["core"] = 2
  rank["api"] = 3
  rank["server"] = 4; rank["cli"] = 4; rank["bench"] = 4; rank["worker"] = 4
  rank["tests"] = 5
  split("store policy lanes providers", lower, " ")
  for (i in lower) {
    deps[lower[i], "common"] = 1
    deps["core", lower[i]] = 1
    src_deps[lower[i]] = "common"
  }
  deps["core", "common"] = 1
  src_deps["core"] = "lanes, store, policy, providers, common"
  split("server cli bench worker", top, " ")
  for (i in top) {
    deps[top[i], "common"] = 1
    src_deps[top[i]] = "common"
  }
  stage = "allow"
  section = ""
}

# ---- the allowlist
stage == "allow" && $0 == "@@FILES@@" { stage = "list"; next }
stage == "allow" {
  line = $0
  sub(/#.*/, "", line)
  line = trim(line)
  if (line == "") next
  if (line ~ /^\[.*\]$/) { section = line; next }
  if (section == "[exceptions]" || section == "[core edges]") {
    if (split(line, w, /[ \t]*->[ \t]*/) != 2) {
      problem(allow_path ":" FNR ": expected \"FILE -> FILE\", got \"" line "\"")
      next
    }
    if (section == "[exceptions]") allow_exc[w[1], w[2]] = FNR
    else allow_edge[w[1], w[2]] = FNR
  } else {
    problem(allow_path ":" FNR ": an entry outside [exceptions] or [core edges]: \"" line "\"")
  }
  next
}

# ---- the file list
stage == "list" {
  if ($0 != "") { exists[$0] = 1; order[++n_files] = $0 }
  next
}

END {
  # ---- the includes of every file
  for (fi = 1; fi <= n_files; fi++) {
    f = order[fi]
    src = module_of(f)
    lineno = 0
    while ((getline line < f) > 0) {
      lineno++
      if (line !~ /^[ \t]*#[ \t]*include[ \t]*[<"]/) continue
      t = line
      sub(/^[ \t]*#[ \t]*include[ \t]*/, "", t)
      angle = substr(t, 1, 1) == "<"
      t = substr(t, 2)
      sub(angle ? ">.*" : "\".*", "", t)
      r = resolve(f, t, angle)
      if (r == "") continue
      n_includes++
      shown = "#include " (angle ? "<" t ">" : "\"" t "\"")
      tgt = module_of(r)
      if (src == "core" && r ~ /^core\//) {
        core_incs[f] = core_incs[f] " " r
        if (!((f SUBSEP r) in inc_line)) inc_line[f, r] = lineno
      }
      if (src == "" || tgt == "") continue
      msg = ""
      if (!may_depend(src, tgt)) {
        if (src == "api")
          msg = r " is not public: " allowed_text(src) " [rule a: module order]"
        else if (rank[tgt] == rank[src])
          msg = r " is private to " tgt ", a sibling of " src " [rule b: private header]"
        else if (rank[tgt] > rank[src])
          msg = src " may not depend on " tgt ", which is above it (server, cli, bench, worker -> include/cephalon -> core -> lanes, store, policy, providers -> common) [rule a: module order]"
        else
          msg = r " is private to " tgt ": " allowed_text(src) " [rule a: module order]"
      } else if (r ~ /^core\/[a-z0-9_]+_internal\.h$/ && !same_module(f, r)) {
        msg = r " is private to the files of its module (" internal_owner(r) ".c, " internal_owner(r) "_*.c) [rule b: private header]"
      }
      if (msg == "") continue
      if ((f SUBSEP r) in allow_exc) {
        exc_used[f, r] = 1
        continue
      }
      problem(f ":" lineno ": " shown ": " msg)
    }
    close(f)
  }

  # ---- the allowlist only shrinks
  for (k in allow_exc) {
    if (!(k in exc_used)) {
      split(k, w, SUBSEP)
      problem(allow_path ":" allow_exc[k] ": the exception " w[1] " -> " w[2] " is no longer needed: delete the line (the list only shrinks)")
    }
  }

  # ---- core edges and circles
  for (fi = 1; fi <= n_files; fi++) {
    f = order[fi]
    if (f !~ /^core\/[^\/]*\.c$/) continue
    n = split(core_incs[f], list, " ")
    for (i = 1; i <= n; i++)
      reach(f, list[i], list[i], inc_line[f, list[i]])
  }
  if (mode == "edges") {
    for (i = 1; i <= n_edges; i++) {
      split(edge_list[i], w, SUBSEP)
      if (path(w[2], w[1]) != "")
        printf "%s -> %s  # includes %s\n", w[1], w[2], edge[w[1], w[2]]
    }
    exit 0
  }
  for (k in allow_edge) {
    if (!(k in edge)) {
      split(k, w, SUBSEP)
      problem(allow_path ":" allow_edge[k] ": the core edge " w[1] " -> " w[2] " no longer exists: delete the line (the list only shrinks) [rule c]")
    }
  }
  # One message per circle: the edges of a circle already reported are not reported again.
  accepted = 0
  for (i = 1; i <= n_edges; i++) {
    k = edge_list[i]
    if (k in allow_edge) { accepted++; continue }
    if (k in reported) continue
    split(k, w, SUBSEP)
    p = path(w[2], w[1])
    if (p == "") continue
    n = split(w[1] " -> " p, list, / -> /)
    unlisted = ""
    for (j = 1; j < n; j++) {
      e = list[j] SUBSEP list[j + 1]
      reported[e] = 1
      if (!(e in allow_edge))
        unlisted = unlisted (unlisted == "" ? "" : "; ") list[j] ":" edge_line[e] " includes " edge[e] " (implemented by " list[j + 1] ")"
    }
    problem(w[1] ":" edge_line[k] ": a circle in core: " w[1] " -> " p "; edges not in [core edges] of " allow_path ": " unlisted " [rule c: include cycle in core]")
  }

  if (failures) {
    print "check-layering: FAILED: " failures " problem(s); the rules are at the top of scripts/check-layering.sh"
    exit 1
  }
  printf "check-layering: OK: %d files, %d includes of project headers, %d core edges (%d on the circles accepted in %s)\n", n_files, n_includes, n_edges, accepted, allow_path
}
'
}

if [ "$mode" = edges ]; then
  check | LC_ALL=C sort
else
  check
fi
