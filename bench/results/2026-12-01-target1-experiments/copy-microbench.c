// Copy speed on this machine: gcc -O2 copy-microbench.c -o m && taskset -c 1 ./m (see summary.md).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(){
  size_t S=256<<10; int N=4000;
  char*src=aligned_alloc(4096,S); memset(src,1,S);
  char*dst=aligned_alloc(4096,2<<20); memset(dst,0,2<<20);
  double t=now(); for(int i=0;i<N;i++){memcpy(dst+(i%4)*S,src,S);} double a=now()-t;
  printf("hot src, reused dst: %.1f GB/s\n", S*(double)N/a/1e9);
  // cold source: cycle through 64 MiB of sources
  size_t B=64<<20; char*big=aligned_alloc(4096,B); memset(big,2,B);
  t=now(); for(int i=0;i<N;i++){memcpy(dst+(i%4)*S,big+(i%(B/S))*S,S);} a=now()-t;
  printf("cold src (64MiB ring), reused dst: %.1f GB/s\n", S*(double)N/a/1e9);
  char*big2=aligned_alloc(4096,B); memset(big2,2,B);
  t=now(); for(int i=0;i<N;i++){memcpy(big2+(i%(B/S))*S,big+(i%(B/S))*S,S);} a=now()-t;
  printf("cold src, cold dst: %.1f GB/s\n", S*(double)N/a/1e9);
  t=now(); for(int i=0;i<N;i++){memcpy(big2+(i%(B/S))*S,src,S);} a=now()-t;
  printf("hot src, cold dst: %.1f GB/s\n", S*(double)N/a/1e9);
}
