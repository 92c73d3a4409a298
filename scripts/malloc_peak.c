/* Bytes in use through malloc, and their peak, for a process it is preloaded into (glibc).

   gcc -O2 -shared -fPIC -o /tmp/libmalloc_peak.so scripts/malloc_peak.c
   LD_PRELOAD=/tmp/libmalloc_peak.so python scripts/step_memory.py DIR

   Every allocation is counted at its usable size (malloc_usable_size) as it is made and
   freed; malloc_peak_now() / malloc_peak_max() read the count and its highest value so far,
   malloc_peak_reset() starts a new peak from the present count. SIGUSR2 writes both to
   stderr (a server's peak, read from outside). What the count leaves out: Python's small-object
   arenas and other mmap users that bypass malloc. The resident size minus this count is
   the C library's free memory kept in its heap (fragmentation) plus those. */
#define _GNU_SOURCE
#include <malloc.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);

static _Atomic long now_bytes = 0, max_bytes = 0;

static void count(void *p) {
    if (!p) return;
    long n = (long)malloc_usable_size(p);
    long cur = atomic_fetch_add(&now_bytes, n) + n;
    long seen = atomic_load(&max_bytes);
    while (cur > seen && !atomic_compare_exchange_weak(&max_bytes, &seen, cur)) {}
}

static void uncount(void *p) {
    if (p) atomic_fetch_sub(&now_bytes, (long)malloc_usable_size(p));
}

void *malloc(size_t n) { void *p = __libc_malloc(n); count(p); return p; }
void free(void *p) { uncount(p); __libc_free(p); }
void *calloc(size_t a, size_t b) { void *p = __libc_calloc(a, b); count(p); return p; }
void *realloc(void *old, size_t n) {
    long before = old ? (long)malloc_usable_size(old) : 0;
    void *p = __libc_realloc(old, n);
    if (p || n == 0) atomic_fetch_sub(&now_bytes, before);
    count(p);
    return p;
}
void *memalign(size_t a, size_t n) { void *p = __libc_memalign(a, n); count(p); return p; }
void *aligned_alloc(size_t a, size_t n) { void *p = __libc_memalign(a, n); count(p); return p; }
int posix_memalign(void **out, size_t a, size_t n) {
    void *p = __libc_memalign(a, n);
    if (!p) return 12; /* ENOMEM */
    count(p);
    *out = p;
    return 0;
}

long malloc_peak_now(void) { return atomic_load(&now_bytes); }
long malloc_peak_max(void) { return atomic_load(&max_bytes); }
void malloc_peak_reset(void) { atomic_store(&max_bytes, atomic_load(&now_bytes)); }

static void report(int sig) {
    (void)sig;
    char line[96];
    int n = snprintf(line, sizeof line, "malloc_peak: in use %ld MB, peak %ld MB\n",
                     atomic_load(&now_bytes) >> 20, atomic_load(&max_bytes) >> 20);
    if (n > 0) (void)!write(2, line, (size_t)n);
}

__attribute__((constructor)) static void install(void) { signal(SIGUSR2, report); }
