#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
#include <immintrin.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void ntcopy(char*d,const char*s,size_t n){
  size_t head=(16-((uintptr_t)d&15))&15; if(head>n)head=n; memcpy(d,s,head); d+=head;s+=head;n-=head;
  size_t i=0; for(;i+64<=n;i+=64){
    __m128i a=_mm_loadu_si128((const __m128i*)(s+i)),b=_mm_loadu_si128((const __m128i*)(s+i+16)),c=_mm_loadu_si128((const __m128i*)(s+i+32)),e=_mm_loadu_si128((const __m128i*)(s+i+48));
    _mm_stream_si128((__m128i*)(d+i),a);_mm_stream_si128((__m128i*)(d+i+16),b);_mm_stream_si128((__m128i*)(d+i+32),c);_mm_stream_si128((__m128i*)(d+i+48),e);}
  for(;i+16<=n;i+=16) _mm_stream_si128((__m128i*)(d+i),_mm_loadu_si128((const __m128i*)(s+i)));
  memcpy(d+i,s+i,n-i);
}
typedef void(*cp)(char*,const char*,size_t);
static void run(const char*name,cp f,char*dst,char*src,size_t B,size_t S,size_t piece,size_t gap,int N){
  double t=now(); for(int i=0;i<N;i++){char*d=dst+(i%(B/S))*S; const char*s=src+(i%(B/S))*S; for(size_t o=0;o+piece+gap<=S;o+=piece+gap) f(d+o+gap,s+o,piece);} _mm_sfence(); double a=now()-t;
  printf("%-8s piece %5zu gap %2zu: %.1f GB/s\n",name,piece,gap,S*(double)N/a/1e9);
}
static void mc(char*d,const char*s,size_t n){memcpy(d,s,n);}
int main(){
  size_t S=256<<10; int N=4000; size_t B=64<<20;
  char*big=aligned_alloc(4096,B); memset(big,2,B);
  char*big2=aligned_alloc(4096,B); memset(big2,2,B);
  for(int rep=0;rep<2;rep++){
   size_t pieces[]={4096,1200}; size_t gaps[]={0,9};
   for(int p=0;p<2;p++)for(int g=0;g<2;g++){run("memcpy",mc,big2,big,B,S,pieces[p],gaps[g],N);run("nt",ntcopy,big2,big,B,S,pieces[p],gaps[g],N);}
  }
}
