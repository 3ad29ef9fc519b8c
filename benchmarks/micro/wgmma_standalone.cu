// Standalone check and timing of the wgmma rung without building the torch extension (about
// 20 s to compile on the GPU machine instead of the extension's minute):
//   nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I csrc -o /tmp/wgmma benchmarks/micro/wgmma_standalone.cu && /tmp/wgmma
// Compares against a naive float reference on partial tiles, batches, odd n, float16, and times
// 4096^3 and 8192^3 (no cuBLAS here: the ratio comes from opforge bench).
#include "matmul/cuda/matmul_wgmma.cu"
#include <cstdio>
#include <vector>
#include <cmath>
using namespace opforge;
template<class T> __global__ void ref(const T*a,const T*bt,float*c,int m,int n,int k,int B){
 long i=blockIdx.x*(long)blockDim.x+threadIdx.x; if(i>=(long)B*m*n)return;
 int b=i/((long)m*n),r=(i/n)%m,j=i%n; float s=0;
 for(int q=0;q<k;q++)s+=(float)a[((long)b*m+r)*k+q]*(float)bt[((long)b*n+j)*k+q];
 c[i]=s;}
template<class T> __global__ void cv(const T*c,float*o,long N){long i=blockIdx.x*(long)blockDim.x+threadIdx.x;if(i<N)o[i]=(float)c[i];}
template<class T> int go(int B,int m,int n,int k,DType dt,int reps){
 long na=(long)B*m*k,nb=(long)B*n*k,nc=(long)B*m*n; std::vector<T> ha(na),hb(nb);
 unsigned s=12345; auto r=[&]{s=s*1664525u+1013904223u;return ((s>>9)&1023)/512.f-1.f;};
 for(auto&x:ha)x=(T)r(); for(auto&x:hb)x=(T)r();
 T*a,*b,*c;float*rf,*cf; cudaMalloc(&a,na*2);cudaMalloc(&b,nb*2);cudaMalloc(&c,nc*2+2);cudaMalloc(&rf,nc*4);cudaMalloc(&cf,nc*4);
 cudaMemcpy(a,ha.data(),na*2,cudaMemcpyHostToDevice);cudaMemcpy(b,hb.data(),nb*2,cudaMemcpyHostToDevice);
 cudaMemset(c,0xff,nc*2+2);
 GemmParams p; p.a=a;p.b=b;p.c=c;p.batch=B;p.m=m;p.n=n;p.k=k;p.a_bs=(long)m*k;p.a_rs=k;p.a_cs=1;p.b_bs=(long)n*k;p.b_rs=1;p.b_cs=k;p.c_bs=(long)m*n;p.c_rs=n;p.dtype=dt;
 int e=matmul_wgmma_cuda(p,0); cudaError_t e2=cudaDeviceSynchronize();
 if(e||e2){printf("B%d m%d n%d k%d: launch %d sync %s\n",B,m,n,k,e,cudaGetErrorString(e2));return 1;}
 ref<T><<<(nc+255)/256,256>>>(a,b,rf,m,n,k,B); cv<T><<<(nc+255)/256,256>>>(c,cf,nc);
 std::vector<float> hr(nc),hc(nc); cudaMemcpy(hr.data(),rf,nc*4,cudaMemcpyDeviceToHost);cudaMemcpy(hc.data(),cf,nc*4,cudaMemcpyDeviceToHost);
 unsigned short g; cudaMemcpy(&g,c+nc,2,cudaMemcpyDeviceToHost);
 double me=0; long bad=0; for(long i=0;i<nc;i++){double d=fabs(hr[i]-hc[i]);if(!(d<=0.02*fabs(hr[i])+0.05*sqrt((double)k)/8+0.02))bad++; if(!(d<=me))me=d;}
 float ms=0; if(reps){cudaEvent_t x,y;cudaEventCreate(&x);cudaEventCreate(&y);matmul_wgmma_cuda(p,0);cudaEventRecord(x);for(int i=0;i<reps;i++)matmul_wgmma_cuda(p,0);cudaEventRecord(y);cudaEventSynchronize(y);cudaEventElapsedTime(&ms,x,y);ms/=reps;}
 printf("%s B%d m%d n%d k%d: maxerr %.4g bad %ld guard %s %s\n",dt==DType::kBFloat16?"bf16":"f16",B,m,n,k,me,bad,g==0xffff?"ok":"CLOBBERED",reps?"":"");
 if(reps)printf("   %.3f ms  %.1f TFLOP/s\n",ms,2.0*B*m*n*k/ms/1e9);
 cudaFree(a);cudaFree(b);cudaFree(c);cudaFree(rf);cudaFree(cf);return bad!=0;}
int main(){int f=0;
 f|=go<__nv_bfloat16>(1,128,128,64,DType::kBFloat16,0);
 f|=go<__nv_bfloat16>(1,128,128,1024,DType::kBFloat16,0);
 f|=go<__nv_bfloat16>(1,300,200,200,DType::kBFloat16,0);
 f|=go<__nv_bfloat16>(3,130,257,72,DType::kBFloat16,0);
 f|=go<__nv_bfloat16>(5,1,1,8,DType::kBFloat16,0);
 f|=go<__half>(2,777,333,520,DType::kFloat16,0);
 f|=go<__nv_bfloat16>(1,2048,2048,2048,DType::kBFloat16,0);
 f|=go<__nv_bfloat16>(1,4096,4096,4096,DType::kBFloat16,20);
 f|=go<__nv_bfloat16>(1,8192,8192,8192,DType::kBFloat16,10);
 printf("%s\n",f?"FAIL":"ALL OK");return f;}
