#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
#include <immintrin.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
// NT only for whole 64-byte aligned lines inside [d, d+n); regular stores elsewhere
static void lineNT(char*d,const char*s,size_t n){
  uintptr_t a=((uintptr_t)d+63)&~(uintptr_t)63; size_t head=a-(uintptr_t)d; if(head>n)head=n;
  memcpy(d,s,head); size_t i=head;
  for(;i+64<=n;i+=64){
    __m128i x0=_mm_loadu_si128((const __m128i*)(s+i)),x1=_mm_loadu_si128((const __m128i*)(s+i+16)),x2=_mm_loadu_si128((const __m128i*)(s+i+32)),x3=_mm_loadu_si128((const __m128i*)(s+i+48));
    _mm_stream_si128((__m128i*)(d+i),x0);_mm_stream_si128((__m128i*)(d+i+16),x1);_mm_stream_si128((__m128i*)(d+i+32),x2);_mm_stream_si128((__m128i*)(d+i+48),x3);}
  memcpy(d+i,s+i,n-i);
}
static void mc(char*d,const char*s,size_t n){memcpy(d,s,n);}
typedef void(*cp)(char*,const char*,size_t);
int main(int argc,char**argv){
  size_t B=64<<20, SLOT=2048, NS=B/SLOT; int N=300000; int hot=argc>1;
  char*src=aligned_alloc(4096,B); memset(src,2,B);
  char*dst=aligned_alloc(4096,B); memset(dst,2,B);
  size_t*order=malloc(sizeof(size_t)*NS); for(size_t i=0;i<NS;i++)order[i]=i;
  srand(1); for(size_t i=NS-1;i>0;i--){size_t j=rand()%(i+1);size_t t=order[i];order[i]=order[j];order[j]=t;}
  size_t*len=malloc(sizeof(size_t)*N); for(int i=0;i<N;i++) len[i]=1100+rand()%300;
  for(int rep=0;rep<3;rep++) for(int m=0;m<2;m++){
    cp f=m?lineNT:mc; size_t at=0,tot=0; double t=now();
    for(int i=0;i<N;i++){
      const char*s=hot? src+(i%64)*SLOT : src+order[i%NS]*SLOT;
      if(at+len[i]>B-4096)at=0; f(dst+at,s,len[i]); at+=len[i]; tot+=len[i];
      if(i%64==63) at+=9; // record header
    }
    _mm_sfence(); double a=now()-t; printf("%s src, %s: %.2f GB/s\n",hot?"hot":"cold",m?"lineNT":"memcpy",tot/a/1e9);
  }
}
