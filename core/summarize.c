/* The built-in extractive summariser (core/providers.h). The OpenAI-compatible chat one is a
 * network provider (providers/summarize_openai.c), reached through the engine's
 * cph_providers. */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "core/providers.h"

/* ---------------------------------------------------------------- extractive */

typedef struct sentence {
  const char *p;
  size_t len;    /* trimmed; never 0 */
  size_t order;  /* position across all texts: text order, then position in the text */
  double score;  /* mean corpus frequency of its content words; 0 when it has none */
  bool chosen;
} sentence;

typedef struct word_slot {
  const char *p; /* NULL = empty */
  size_t len;
  uint64_t hash;
  uint32_t count;
} word_slot;

typedef struct word_table {
  word_slot *slots;
  size_t cap; /* power of two, at least twice the number of words ever inserted */
} word_table;

static bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f';
}

static bool word_byte(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c >= 0x80;
}

static unsigned char fold(unsigned char c) {
  return c >= 'A' && c <= 'Z' ? (unsigned char)(c - 'A' + 'a') : c;
}

/* Frequent words that carry no topic. Words shorter than 4 bytes are skipped before this. */
static const char *const stop_words[] = {
    "about", "also",  "been",  "from",  "have", "here",  "into", "just",  "like",
    "more",  "only",  "some",  "than",  "that", "their", "them", "then",  "there",
    "these", "they",  "this",  "very",  "were", "what",  "when", "where", "which",
    "will",  "with",  "would", "your",  "could", "should", "does", "done", "being"};

static bool same_word(const char *a, size_t alen, const char *b, size_t blen) {
  if (alen != blen)
    return false;
  for (size_t i = 0; i < alen; i++)
    if (fold((unsigned char)a[i]) != fold((unsigned char)b[i]))
      return false;
  return true;
}

/* A content word: at least 4 bytes, not a stop word. Short words (a, the, and, is, of) are
 * the "stop-word-ish" part: they are frequent in every text and say nothing of its topic. */
static bool content_word(const char *w, size_t len) {
  if (len < 4)
    return false;
  for (size_t i = 0; i < sizeof stop_words / sizeof *stop_words; i++)
    if (same_word(w, len, stop_words[i], strlen(stop_words[i])))
      return false;
  return true;
}

static uint64_t word_hash(const char *w, size_t len) {
  uint64_t h = UINT64_C(0xcbf29ce484222325);
  for (size_t i = 0; i < len; i++)
    h = (h ^ fold((unsigned char)w[i])) * UINT64_C(0x100000001b3);
  return h ^ (h >> 29);
}

/* The slot of the word: its own, or the empty one where it belongs. Never full (cap >= 2 *
 * words), so the probe ends. */
static word_slot *word_find(word_table *t, const char *w, size_t len) {
  uint64_t h = word_hash(w, len);
  for (size_t i = (size_t)h & (t->cap - 1);; i = (i + 1) & (t->cap - 1)) {
    word_slot *s = &t->slots[i];
    if (!s->p) {
      s->hash = h;
      return s;
    }
    if (s->hash == h && same_word(s->p, s->len, w, len))
      return s;
  }
}

/* Calls fn for every content word of s[0..len). */
static void for_each_word(const char *s, size_t len, void (*fn)(void *, const char *, size_t),
                          void *arg) {
  size_t i = 0;
  while (i < len) {
    if (!word_byte((unsigned char)s[i])) {
      i++;
      continue;
    }
    size_t start = i;
    while (i < len && word_byte((unsigned char)s[i]))
      i++;
    if (content_word(s + start, i - start))
      fn(arg, s + start, i - start);
  }
}

static void count_word(void *arg, const char *w, size_t len) {
  word_slot *s = word_find(arg, w, len);
  if (!s->p) {
    s->p = w;
    s->len = len;
  }
  s->count++;
}

typedef struct score_acc {
  word_table *table;
  double sum;
  size_t words;
} score_acc;

static void score_word(void *arg, const char *w, size_t len) {
  score_acc *a = arg;
  a->sum += word_find(a->table, w, len)->count;
  a->words++;
}

/* Ends of sentences: '.', '!', '?' (and runs of them, plus closing quotes or brackets) when
 * followed by whitespace or the end, and every line break. A '.' inside "3.14" or
 * "example.com" does not end a sentence. */
static size_t sentence_end(const char *s, size_t i, size_t len, size_t *next) {
  for (; i < len; i++) {
    char c = s[i];
    if (c == '\n' || c == '\r') {
      *next = i + 1;
      return i;
    }
    if (c == '.' || c == '!' || c == '?') {
      size_t j = i + 1;
      while (j < len && (s[j] == '.' || s[j] == '!' || s[j] == '?' || s[j] == '"' ||
                         s[j] == '\'' || s[j] == ')' || s[j] == ']'))
        j++;
      if (j == len || is_space(s[j])) {
        *next = j;
        return j;
      }
      i = j - 1;
    }
  }
  *next = len;
  return len;
}

/* Appends the sentences of text to *v (growing it); false on out-of-memory. */
static bool split_sentences(const char *text, sentence **v, size_t *n, size_t *cap) {
  size_t len = strlen(text), i = 0;
  while (i < len) {
    while (i < len && is_space(text[i]))
      i++;
    if (i == len)
      break;
    size_t next, end = sentence_end(text, i, len, &next);
    while (end > i && is_space(text[end - 1]))
      end--;
    if (end > i) {
      if (*n == *cap) {
        size_t ncap = *cap ? *cap * 2 : 16;
        sentence *nv = realloc(*v, ncap * sizeof *nv);
        if (!nv)
          return false;
        *v = nv;
        *cap = ncap;
      }
      (*v)[*n] = (sentence){.p = text + i, .len = end - i, .order = *n};
      (*n)++;
    }
    i = next;
  }
  return true;
}

/* Best first: higher score, then earlier. */
static int by_score(const void *a, const void *b) {
  const sentence *x = *(const sentence *const *)a, *y = *(const sentence *const *)b;
  if (x->score != y->score)
    return x->score > y->score ? -1 : 1;
  return x->order < y->order ? -1 : x->order > y->order;
}

/* One byte between sentences: a space after a sentence that ends in punctuation, else a line
 * break, so a line that had none is not run into the next. */
static char separator_after(const sentence *s) {
  char c = s->p[s->len - 1];
  return c == '.' || c == '!' || c == '?' || c == '"' || c == '\'' || c == ')' || c == ']'
             ? ' '
             : '\n';
}

/* The longest prefix of s within budget bytes, cut at a space when one lies in the second
 * half, else at a UTF-8 character boundary; at least one character. */
static size_t truncated_len(const sentence *s, size_t budget) {
  if (s->len <= budget)
    return s->len;
  size_t cut = budget;
  while (cut > 0 && ((unsigned char)s->p[cut] & 0xC0) == 0x80) /* inside a character */
    cut--;
  for (size_t i = cut; i > budget / 2; i--)
    if (is_space(s->p[i])) {
      cut = i;
      break;
    }
  while (cut > 0 && is_space(s->p[cut - 1]))
    cut--;
  if (cut == 0) { /* one character, however long the budget says it may be */
    cut = 1;
    while (cut < s->len && ((unsigned char)s->p[cut] & 0xC0) == 0x80)
      cut++;
  }
  return cut;
}

char *cph_summarize_extractive(const char *const *texts, size_t n, size_t max_tokens) {
  sentence *sents = NULL, **rank = NULL;
  size_t ns = 0, cap = 0, words = 0;
  word_table table = {NULL, 0};
  cph_buf out = CPH_BUF_INIT;
  char *result = NULL;

  for (size_t t = 0; t < n; t++) {
    if (!texts[t])
      continue;
    if (!split_sentences(texts[t], &sents, &ns, &cap))
      goto out;
    /* Upper bound on distinct content words: each takes 4 bytes and a separator. */
    words += strlen(texts[t]) / 5 + 1;
  }
  if (ns == 0) { /* nothing but whitespace */
    result = calloc(1, 1);
    goto out;
  }

  table.cap = 16;
  while (table.cap < 2 * words)
    table.cap *= 2;
  if (!(table.slots = calloc(table.cap, sizeof *table.slots)))
    goto out;
  for (size_t i = 0; i < ns; i++)
    for_each_word(sents[i].p, sents[i].len, count_word, &table);
  for (size_t i = 0; i < ns; i++) {
    score_acc a = {&table, 0, 0};
    for_each_word(sents[i].p, sents[i].len, score_word, &a);
    sents[i].score = a.words ? a.sum / (double)a.words : 0;
  }

  if (!(rank = malloc(ns * sizeof *rank)))
    goto out;
  for (size_t i = 0; i < ns; i++)
    rank[i] = &sents[i];
  qsort(rank, ns, sizeof *rank, by_score);

  /* Greedy by rank: take each sentence that still fits (one separator byte each), so a long
   * sentence that does not fit leaves room for shorter ones further down. Output is
   * ceil(bytes/4) tokens, so the budget is max_tokens * 4 bytes. */
  size_t budget = max_tokens == 0 ? 4 : max_tokens > SIZE_MAX / 4 ? SIZE_MAX : max_tokens * 4;
  size_t used = 0, taken = 0;
  for (size_t r = 0; r < ns; r++) {
    size_t need = rank[r]->len + (taken ? 1 : 0);
    if (need <= budget - used) {
      rank[r]->chosen = true;
      used += need;
      taken++;
    }
  }
  if (taken == 0) { /* even the best sentence is too long: its head, never nothing */
    cph_buf_append(&out, rank[0]->p, truncated_len(rank[0], budget));
  } else {
    const sentence *prev = NULL;
    for (size_t i = 0; i < ns; i++) {
      if (!sents[i].chosen)
        continue;
      if (prev)
        cph_buf_putc(&out, separator_after(prev));
      cph_buf_append(&out, sents[i].p, sents[i].len);
      prev = &sents[i];
    }
  }
  result = cph_buf_steal(&out); /* NULL if an append failed */
out:
  cph_buf_free(&out);
  free(table.slots);
  free(rank);
  free(sents);
  return result;
}

/* ---------------------------------------------------------------- network (the table) */

int cph_summarize_remote(const cph_providers *prov, const cph_policy_summarizer *cfg,
                         const char *const *texts, size_t n, char **out, cph_err *err) {
  *out = NULL;
  if (!prov || !prov->summarize)
    return cph_err_set(err, CPH_ESTATE,
                       "summarizer: :providers :summarizer :kind :openai is not available: the "
                       "engine was opened without network providers");
  return prov->summarize(prov->ctx, cfg, texts, n, out, err);
}
