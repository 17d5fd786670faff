/* Replays a trace written by mtrace.c through this process's glibc: every block written
   (memset), freed where the trace frees it. At record `m1` (before the model's build) the
   resident set is read, at record `m2` (after it) the kernel's high-water mark is reset, as
   the measured process does; prints the high-water mark above the first. Requests under `lo`
   bytes after record `m2` are left out. Usage: replay TRACE M1 M2 [LO]. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <malloc.h>
#include <fcntl.h>
#include <unistd.h>
typedef struct { uint64_t ptr; uint64_t size; uint32_t tid; uint32_t flags; } rec_t;
#define HB 23
static uint64_t keys[1<<HB]; static void *vals[1<<HB];
static unsigned h(uint64_t p){ return (unsigned)((p>>4)*2654435761u) & ((1<<HB)-1); }
static void put(uint64_t k, void *v){ unsigned i=h(k); while(keys[i] && keys[i]!=1) i=(i+1)&((1<<HB)-1); keys[i]=k; vals[i]=v; }
static void *take(uint64_t k){ unsigned i=h(k); while(keys[i]){ if(keys[i]==k){ keys[i]=1; return vals[i]; } i=(i+1)&((1<<HB)-1);} return 0; }
static long rss(void){ FILE *f=fopen("/proc/self/statm","r"); long a,b; fscanf(f,"%ld %ld",&a,&b); fclose(f); return b*4; }
static long hwm(void){ FILE *f=fopen("/proc/self/status","r"); char line[256]; long v=0; while(fgets(line,256,f)) if(!strncmp(line,"VmHWM:",6)) v=atol(line+6); fclose(f); return v; }
static void reset(void){ int fd=open("/proc/self/clear_refs",O_WRONLY); write(fd,"5",1); close(fd); }
int main(int argc, char **argv){
  FILE *f=fopen(argv[1],"rb"); fseek(f,0,SEEK_END); long n=ftell(f)/sizeof(rec_t); fseek(f,0,SEEK_SET);
  rec_t *r=malloc(n*sizeof(rec_t)); fread(r,sizeof(rec_t),n,f); fclose(f);
  long m1=atol(argv[2]), m2=atol(argv[3]); long lo = argc>4 ? atol(argv[4]) : 0;
  memset(keys,0,sizeof keys); memset(vals,0,sizeof vals);
  long base=0;
  for(long i=0;i<n;i++){
    if(i==m1) base=rss();
    if(i==m2) reset();
    if(r[i].size){
      if(i>m2 && r[i].size<lo) continue;
      void *p; if (r[i].flags & 8) { if(posix_memalign(&p,64,r[i].size)) p=0; } else p = malloc(r[i].size);
      if(!p) continue;
      memset(p,1,r[i].size); put(r[i].ptr,p);
    } else { void *p=take(r[i].ptr); if(p) free(p); }
  }
  printf("above_m1_MiB %.1f\n", (hwm()-base)/1024.0);
}
