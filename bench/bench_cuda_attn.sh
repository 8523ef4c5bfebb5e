#!/usr/bin/env bash
# Sparse attention on a GPU machine in one call: builds the CUDA backend with
# the CPU kernels its tests compare against, then
#   - bench/bench_cuda_attn.cu at prefill shapes (and, unless NO_TORCH=1, its
#     torch peer bench/bench_cuda_layer_torch.py --attn on the same shapes);
#   - the op-table tests (tests/unit/test_cuda_backend.c, the tensor-core
#     attention's bound among them; TEST_TIMEOUT s, default 60);
#   - with --layers, the per-layer prefill of P tokens of the dummy
#     real-shape model (bench/bench_cuda_model.c -lp P, the 6-layer cut of
#     bench/v41_flash_trunc.py; needs the whole library, so GPU_DEPS and
#     DEEPINFER_SHARED_DIR as for scripts/gpu-e2e; LAYER_TIMEOUT s, 60).
# Logs under $OUT (default ./gpu-out).
#
#   bench/bench_cuda_attn.sh [--layers] [P]      (P: prefill tokens, 8192)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
LAYERS=0
[ "${1:-}" = "--layers" ] && { LAYERS=1; shift; }
P=${1:-8192}
B=${GPU_BUILD:-build-gpu}
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
export PATH="$(dirname "$NVCC"):$PATH"
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}
NVFLAGS="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fPIC -Iinclude -Isrc"
CFLAGS="-std=c11 -D_GNU_SOURCE -O2 -g -Wall -Wextra -Wno-unused-parameter -Iinclude -Isrc -pthread -DDI_HAVE_CUDA=1"
LIBS="-L$CUDA_HOME/lib64 -L$CUDA_HOME/targets/x86_64-linux/lib -Wl,-rpath,$CUDA_HOME/lib64 -lcudart -lstdc++ -lm -lpthread -ldl"
t0=$(date +%s)
if [ $LAYERS = 1 ]; then
    D=$(cd "${GPU_DEPS:?GPU_DEPS: cJSON / utf8proc for the whole library}" && pwd)
    CFLAGS="$CFLAGS -I$D/include"
    LIBS="-L$D/lib -Wl,-rpath,$D/lib -lcjson -lutf8proc $LIBS -lcublas -lcublasLt"
    CFLAGS="-I$D/include" LDFLAGS="-L$D/lib -Wl,-rpath,$D/lib" make -j"$(nproc)" BUILD="$B" "$B/libdeepinfer.a" \
        >"$OUT/build.log" 2>&1 || { tail -n 20 "$OUT/build.log"; exit 1; }
    LIB="$B/libdeepinfer.a"
    cc $CFLAGS bench/bench_cuda_model.c "$LIB" $LIBS -o "$B/bench_cuda_model" &
else
    rm -rf "$B" && mkdir -p "$B/obj"
    build_c() { cc $CFLAGS -c "$1" -o "$B/obj/$(echo "$1" | tr / _).o"; }
    build_cu() { "$NVCC" $NVFLAGS -c "$1" -o "$B/obj/$(basename "$1" .cu).cu.o"; }
    export -f build_c build_cu
    export B CFLAGS NVCC NVFLAGS
    ls src/core/*.c src/backend/*.c src/backend/cpu/*.c src/backend/cuda/*.c src/backend/cuda/*.cu |
        xargs -P "$(nproc)" -I{} bash -c 'case {} in *.cu) build_cu {};; *) build_c {};; esac'
    LIB="$B/libdi_gpu.a"
    ar rcs "$LIB" "$B"/obj/*.o
fi
cc $CFLAGS -Itests/unit tests/unit/test_cuda_backend.c tests/unit/moe_ref.c "$LIB" $LIBS -o "$B/test_cuda_backend" &
{ "$NVCC" $NVFLAGS -c bench/bench_cuda_attn.cu -o "$B/bench_cuda_attn.o" &&
    cc "$B/bench_cuda_attn.o" "$LIB" $LIBS -o "$B/bench_cuda_attn"; } || echo "bench build failed"
wait
echo "built in $(($(date +%s) - t0)) s"

echo "== attention at prefill shapes =="
timeout 40 "$B/bench_cuda_attn" "$P" 2>&1 | tee "$OUT/bench_attn.txt"
[ "${NO_TORCH:-0}" = 1 ] ||
    PYTHONUNBUFFERED=1 timeout 40 python3 bench/bench_cuda_layer_torch.py --attn "$P" 2>&1 |
    tee "$OUT/bench_attn_torch.txt" | grep RESULT
echo "== tests =="
DI_TEST_VERBOSE=1 timeout "${TEST_TIMEOUT:-60}" "$B/test_cuda_backend" >"$OUT/test_backend.log" 2>&1
grep -vE '^  ' "$OUT/test_backend.log" | tail -n 12
grep -E "attn|sparse" "$OUT/test_backend.log"
if [ $LAYERS = 1 ]; then
    echo "== per-layer prefill of $P tokens, dummy real-shape model =="
    python3 bench/v41_flash_trunc.py "${DEEPINFER_SHARED_DIR:-../shared}/golden/v41-flash-config.json" "$B/v41-flash-6l.json"
    # -p 64 first: its passes upload every weight, so the layer times do not
    timeout "${LAYER_TIMEOUT:-60}" stdbuf -oL "$B/bench_cuda_model" "$B/v41-flash-6l.json" -p 64 -b 0 -l 0 -lp "$P" \
        >"$OUT/model_layers.txt" 2>&1
    grep -E "dummy weights|prefill of|^layer|^[0-9] |RESULT layer|RESULT (copy|gemm)" "$OUT/model_layers.txt"
fi
echo "total $(($(date +%s) - t0)) s"
