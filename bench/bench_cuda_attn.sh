#!/usr/bin/env bash
# Sparse attention on a GPU machine in one call: builds the CUDA backend with
# the CPU kernels its tests compare against (as scripts/gpu-suite does), runs
# the op-table tests (tests/unit/test_cuda_backend.c: the tensor-core
# attention's bound among them), then bench/bench_cuda_attn.cu and its torch
# peer (bench/bench_cuda_layer_torch.py --attn) on the same prefill shapes.
# The benchmarks run first, the tests last (TEST_TIMEOUT s, default 60).
# Logs under $OUT (default ./gpu-out).
#
#   bench/bench_cuda_attn.sh [P]      (P: queries of the prefill chunk, 8192)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
P=${1:-8192}
B=${GPU_BUILD:-build-gpu}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}
NVFLAGS="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fPIC -Iinclude -Isrc"
CFLAGS="-std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Wno-unused-parameter -Iinclude -Isrc -pthread -DDI_HAVE_CUDA=1"
LIBS="-L$CUDA_HOME/lib64 -L$CUDA_HOME/targets/x86_64-linux/lib -Wl,-rpath,$CUDA_HOME/lib64 -lcudart -lstdc++ -lm -lpthread -ldl"
t0=$(date +%s)
rm -rf "$B" && mkdir -p "$B/obj"
build_c() { cc $CFLAGS -c "$1" -o "$B/obj/$(echo "$1" | tr / _).o"; }
build_cu() { "$NVCC" $NVFLAGS -Xptxas -v -c "$1" -o "$B/obj/$(basename "$1" .cu).cu.o" 2>"$B/ptxas_$(basename "$1" .cu).txt" || cat "$B/ptxas_$(basename "$1" .cu).txt"; }
export -f build_c build_cu
export B CFLAGS NVCC NVFLAGS
ls src/core/*.c src/backend/*.c src/backend/cpu/*.c src/backend/cuda/*.c src/backend/cuda/*.cu |
    xargs -P "$(nproc)" -I{} bash -c 'case {} in *.cu) build_cu {};; *) build_c {};; esac'
ar rcs "$B/libdi_gpu.a" "$B"/obj/*.o
cc $CFLAGS -Itests/unit tests/unit/test_cuda_backend.c tests/unit/moe_ref.c "$B/libdi_gpu.a" $LIBS -o "$B/test_cuda_backend" &
"$NVCC" $NVFLAGS bench/bench_cuda_attn.cu "$B/libdi_gpu.a" -o "$B/bench_cuda_attn" || echo "bench build failed"
wait
grep -A2 "k_sparse_attn_tc" "$B/ptxas_cuda_attn_tc.txt" | grep -E "registers|spill"
echo "built in $(($(date +%s) - t0)) s"
echo "== attention at prefill shapes =="
timeout 40 "$B/bench_cuda_attn" "$P" 2>&1 | tee "$OUT/bench_attn.txt"
PYTHONUNBUFFERED=1 timeout 40 python3 bench/bench_cuda_layer_torch.py --attn "$P" 2>&1 | tee "$OUT/bench_attn_torch.txt" | grep RESULT
echo "== tests =="
DI_TEST_VERBOSE=1 timeout "${TEST_TIMEOUT:-60}" "$B/test_cuda_backend" >"$OUT/test_backend.log" 2>&1
grep -vE '^  ' "$OUT/test_backend.log" | tail -n 12
grep -E "attn|sparse" "$OUT/test_backend.log"
echo "total $(($(date +%s) - t0)) s"
