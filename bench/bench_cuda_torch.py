"""PyTorch peers for bench_cuda_ops.cu, timed on the same GPU in the same
scripts/gpu-suite call (performance.md §1.4, METHOD.md):

- device-to-device copy bandwidth (bytes read + written),
- torch._scaled_mm FP8 GEMMs (per-tensor and per-row scales: torch has no
  32x32 block-scaled FP8 GEMM on SM90, so per-row is the closest peer) on the
  shapes bench_cuda_ops.cu times,
- the straightforward decode matrix-vector a PyTorch engine would run: bf16
  weights (dequantized, 2 bytes per weight) times m activation rows.

Arguments --gemm / --matvec time only that half (plus the copy).
Prints "RESULT name value unit" lines. Times are medians of CUDA-event timed
repetitions after warm-up; inputs are random, never zeros; decode weights
rotate over copies larger than L2.
"""
import statistics
import sys

try:
    import torch
except ImportError:  # the CPU machines have no torch: nothing to compare here
    torch = None


def time_ms(fn, reps=20, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def plain_peers(dev, copy_bw):
    """Peers of bench_cuda_ops --plain: the decode products without
    activation quantization as a PyTorch engine runs them (bf16 weights and
    activations, torch.matmul; the grouped wo_a as one batched matmul over
    its 8 groups), and the mHC mixing (RMS scale, the 24 projections,
    sigmoids, softmax and 20 Sinkhorn iterations in torch ops), each
    captured in a CUDA graph, weights rotated over copies larger than L2."""
    shapes = [("head", 129280, 5120, 1), ("gate", 384, 5120, 1), ("cmp_wkv", 512, 5120, 1),
              ("idx_wp", 32, 5120, 1), ("idx_wk", 128, 512, 1), ("wo_a", 8 * 1024, 4096, 8)]
    for name, n_, k, g in shapes:
        copies = max(2, (512 << 20) // (n_ * k * 2) + 1)
        copies = min(copies, 64)
        ws = [torch.randn(g, n_ // g, k, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
        for m in (1, 8, 16, 64):
            x = torch.randn(g, m, k, device=dev, dtype=torch.bfloat16)

            def run():
                for w in ws:
                    if g == 1:
                        x[0] @ w[0].t()
                    else:
                        torch.bmm(x, w.transpose(1, 2))

            run()
            gr = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gr):
                run()
            t = time_ms(gr.replay, reps=10) / copies
            print(f"RESULT torch_plain_{name}_{n_}x{k}_m{m} {t * 1e3:.2f} us "
                  f"{n_ * k * 2 / (t * 1e-3) / 1e9:.0f} GB/s (bf16 weights)")
        del ws
    hc, d, iters = 4, 5120, 20
    nm = (2 + hc) * hc
    fn = torch.randn(nm, hc * d, device=dev) * 0.01
    base = torch.randn(nm, device=dev)
    scale = torch.rand(3, device=dev) + 0.5
    for m in (1, 8, 64):
        s = torch.randn(m, hc * d, device=dev)

        def mix():
            r = torch.rsqrt((s * s).mean(dim=1, keepdim=True) + 1e-6)
            mx = (s @ fn.t()) * r
            pre = torch.sigmoid(mx[:, :hc] * scale[0] + base[:hc]) + 1e-6
            post = 2 * torch.sigmoid(mx[:, hc:2 * hc] * scale[1] + base[hc:2 * hc])
            c = (mx[:, 2 * hc:] * scale[2] + base[2 * hc:]).view(m, hc, hc)
            c = torch.softmax(c, dim=2) + 1e-6
            for it in range(iters):
                if it > 0:
                    c = c / (c.sum(dim=2, keepdim=True) + 1e-6)
                c = c / (c.sum(dim=1, keepdim=True) + 1e-6)
            return pre, post, c

        mix()
        gr = torch.cuda.CUDAGraph()
        with torch.cuda.graph(gr):
            mix()
        t = time_ms(gr.replay, reps=20)
        print(f"RESULT torch_hc_mix_m{m} {t * 1e3:.2f} us")


def main():
    if torch is None or not torch.cuda.is_available():
        print("torch sees no CUDA device; skipping")
        return 0
    # --decode: the peers of bench_cuda_ops --decode only (small decode
    # matrices, the MoE loop at batch 1, 8, 16)
    decode_only = "--decode" in sys.argv[1:]
    do_gemm = "--matvec" not in sys.argv[1:] and not decode_only
    do_matvec = "--gemm" not in sys.argv[1:]
    dev = torch.device("cuda")
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    n = 2 << 30
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    t = time_ms(lambda: dst.copy_(src))
    copy_bw = 2 * n / (t * 1e-3)
    print(f"RESULT torch_copy_bw {copy_bw / 1e9:.1f} GB/s")
    del src, dst
    if "--plain" in sys.argv[1:]:
        plain_peers(dev, copy_bw)
        return 0

    shapes = [(8192, 8192, 8192), (8192, 5120, 5120), (8192, 32768, 1280),
              (4096, 5120, 2304), (4096, 2304, 5120)] if do_gemm else []
    f8 = torch.float8_e4m3fn
    for m, n_, k in shapes:
        a = (torch.randn(m, k, device=dev) * 4).to(f8)
        b = (torch.randn(n_, k, device=dev) * 4).to(f8)
        flops = 2.0 * m * n_ * k
        one = torch.ones((), device=dev)
        t = time_ms(lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one,
                                             out_dtype=torch.bfloat16))
        print(f"RESULT torch_scaled_mm_tensor_{m}x{n_}x{k} {flops / t / 1e9:.1f} TFLOP/s")
        sa = torch.rand(m, 1, device=dev) + 0.5
        sb = torch.rand(1, n_, device=dev) + 0.5
        try:
            t = time_ms(lambda: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb,
                                                 out_dtype=torch.bfloat16))
            print(f"RESULT torch_scaled_mm_row_{m}x{n_}x{k} {flops / t / 1e9:.1f} TFLOP/s")
        except RuntimeError as e:  # older builds have no row-wise scaling
            print(f"torch row-wise _scaled_mm failed: {e}")
        del a, b

    if not do_matvec:
        return 0
    decode = [("wq_b", 32768, 1280), ("wq_a", 1280, 5120), ("wo_b", 5120, 8192),
              ("shared_w1", 2304, 5120), ("shared_w2", 5120, 2304),
              ("expert_w1", 2304, 5120)]
    if decode_only:
        decode = [d for d in decode if d[0] in ("wq_a", "shared_w1", "shared_w2", "expert_w1")]
    for name, n_, k in decode:
        copies = max(2, (512 << 20) // (n_ * k * 2) + 1)
        ws = [torch.randn(n_, k, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
        for m in (1, 8, 16):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)

            def run():
                for w in ws:
                    x @ w.t()

            # captured in a CUDA graph, as bench_cuda_ops.cu does, so that
            # launch overhead does not count against either side
            run()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                run()
            t = time_ms(g.replay, reps=10) / copies
            fp8_bytes = n_ * k + n_ * k / 1024  # what the same layer reads in FP8
            print(f"RESULT torch_bf16_matvec_{name}_{n_}x{k}_m{m} {t * 1e3:.2f} us "
                  f"{n_ * k * 2 / (t * 1e-3) / 1e9:.0f} GB/s "
                  f"(fp8 floor {fp8_bytes / copy_bw * 1e6:.2f} us)")
        del ws
    # MoE decode step, up-projections of the routed experts (top-6 of 384,
    # uniform random routing), as a plain loop over the active experts on
    # bf16 weights, captured in a CUDA graph; several steps per replay with
    # different routings so the weights read are cold
    E, n_, k = 384, 2304, 5120
    w1 = torch.randn(E, n_, k, device=dev, dtype=torch.bfloat16)
    for tokens in ((1, 8, 16) if decode_only else (1, 8, 64)):
        x = torch.randn(tokens, k, device=dev, dtype=torch.bfloat16)
        gen = torch.Generator().manual_seed(tokens)
        steps, distinct = [], 0
        while distinct * n_ * k * 2 < 1 << 30 or len(steps) < 2:
            route = torch.stack([torch.randperm(E, generator=gen)[:6] for _ in range(tokens)])
            groups = [(int(e), (route == e).any(dim=1).nonzero().flatten().to(dev))
                      for e in route.unique()]
            steps.append(groups)
            distinct += len(groups)

        def step_all():
            for groups in steps:
                for e, rows in groups:
                    x[rows] @ w1[e].t()

        step_all()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step_all()
        t = time_ms(g.replay, reps=5) / len(steps)
        print(f"RESULT torch_moe_w1_loop_b{tokens} {t * 1e3:.2f} us "
              f"({distinct / len(steps):.0f} experts/step, bf16 weights)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
