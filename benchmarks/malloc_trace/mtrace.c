/* An LD_PRELOAD tracer of malloc, free, calloc, realloc, memalign and posix_memalign: each
   call of MTRACE_MIN bytes or more (default 64 KiB; 0: every call) and each free of a traced
   pointer is recorded as (pointer, size, thread, flags), size 0 for a free; flags: 1 malloc,
   8 posix_memalign, 4 the chunk was mapped (glibc's IS_MMAPPED bit). Written to MTRACE_OUT at
   exit. Used by benchmarks/malloc_trace.py (docs/memory.md, "On a CPU"). */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/syscall.h>
#include <stdlib.h>
extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
static size_t MINSZ = 65536;
#define NREC (1<<25)
#define HBITS 24
typedef struct { uint64_t ptr; uint64_t size; uint32_t tid; uint32_t flags; } rec_t;
static rec_t recs[NREC];
static volatile long nrec = 0;
static uint64_t table[1<<HBITS];
static int lockv = 0;
static void lock(void){ while(__sync_lock_test_and_set(&lockv,1)); }
static void unlock(void){ __sync_lock_release(&lockv); }
static unsigned h(uint64_t p){ return (unsigned)((p>>4) * 2654435761u) & ((1<<HBITS)-1); }
static void ins(uint64_t p){ unsigned i=h(p); while(table[i] && table[i]!=1) i=(i+1)&((1<<HBITS)-1); table[i]=p; }
static int del(uint64_t p){ unsigned i=h(p); while(table[i]){ if(table[i]==p){ table[i]=1; return 1;} i=(i+1)&((1<<HBITS)-1);} return 0; }
static void logit(void *p, size_t size, int flags){
  long n = __sync_fetch_and_add(&nrec, 1);
  if (n < NREC) { recs[n].ptr=(uint64_t)p; recs[n].size=size; recs[n].tid=(uint32_t)syscall(SYS_gettid);
    size_t hdr = *((size_t*)p - 1); recs[n].flags = flags | ((hdr & 2) ? 4 : 0); }
}
__attribute__((constructor)) static void init(void){ const char *m = getenv("MTRACE_MIN"); if (m) MINSZ = (size_t)atol(m); }
static void on_alloc_f(void *p, size_t size, int fl){ if(p && size>=MINSZ){ lock(); ins((uint64_t)p); unlock(); logit(p,size,fl);} }
static void on_alloc(void *p, size_t size){ on_alloc_f(p,size,1); }
static void on_free(void *p){ if(!p) return; lock(); int t=del((uint64_t)p); unlock(); if(t){ long n=__sync_fetch_and_add(&nrec,1); if(n<NREC){recs[n].ptr=(uint64_t)p; recs[n].size=0; recs[n].tid=(uint32_t)syscall(SYS_gettid); recs[n].flags=0;} } }
void *malloc(size_t s){ void *p=__libc_malloc(s); on_alloc(p,s); return p; }
void free(void *p){ on_free(p); __libc_free(p); }
void *calloc(size_t n, size_t s){ void *p=__libc_calloc(n,s); on_alloc(p,n*s); return p; }
void *realloc(void *o, size_t s){ on_free(o); void *p=__libc_realloc(o,s); on_alloc(p,s); return p; }
void *memalign(size_t a, size_t s){ void *p=__libc_memalign(a,s); on_alloc(p,s); return p; }
void *aligned_alloc(size_t a, size_t s){ void *p=__libc_memalign(a,s); on_alloc(p,s); return p; }
int posix_memalign(void **m, size_t a, size_t s){ void *p=__libc_memalign(a,s); if(!p) return 12; *m=p; on_alloc_f(p,s,9); return 0; }
__attribute__((destructor)) static void dump(void){
  const char *f = getenv("MTRACE_OUT"); if(!f) return;
  int fd = open(f, O_WRONLY|O_CREAT|O_TRUNC, 0644); if(fd<0) return;
  long n = nrec < NREC ? nrec : NREC; write(fd, recs, n*sizeof(rec_t)); close(fd);
}
