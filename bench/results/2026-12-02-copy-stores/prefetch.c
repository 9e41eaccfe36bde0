#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <time.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
// sources: 1200-byte pieces at 2048-byte slots spread over a 64 MiB ring, visited in a shuffled order of 32-slot groups
int main(){
  size_t B=64<<20, P=1200, SLOT=2048, NS=B/SLOT; int N=200000;
  char*src=aligned_alloc(4096,B); memset(src,2,B);
  char*dst=aligned_alloc(4096,B); memset(dst,2,B);
  size_t*order=malloc(sizeof(size_t)*NS); for(size_t i=0;i<NS;i++)order[i]=i;
  srand(1); for(size_t i=NS-1;i>0;i--){size_t j=rand()%(i+1);size_t t=order[i];order[i]=order[j];order[j]=t;}
  volatile char sink;
  for(int rep=0;rep<3;rep++){
   for(int mode=0;mode<4;mode++){
    size_t at=13; double t=now();
    for(int i=0;i<N;i++){
      const char*s=src+order[i%NS]*SLOT;
      if(mode==1){const char*n=src+order[(i+1)%NS]*SLOT; for(size_t o=0;o<P;o+=64)__builtin_prefetch(n+o);}
      if(mode==2){const char*n=src+order[(i+2)%NS]*SLOT; for(size_t o=0;o<P;o+=64)__builtin_prefetch(n+o);}
      if(mode==3){const char*n=src+order[(i+1)%NS]*SLOT; char x=0; for(size_t o=0;o<P;o+=64)x^=n[o]; sink=x;}
      if(at+P>B-64)at=13; memcpy(dst+at,s,P); at+=P+((i%64==0)?9:0);
    }
    double a=now()-t; printf("mode %d (%s): %.2f GB/s\n",mode,(const char*[]){"plain","prefetch+1","prefetch+2","touch+1"}[mode],P*(double)N/a/1e9);
   }
  }
}
