"""The PyTorch peer of bench_cuda_model.c's per-layer numbers: one V4.1-Flash
layer at real shapes written the straightforward way a PyTorch engine would
(eager ops; torch._scaled_mm FP8 with per-tensor scales for the FP8 linears,
bf16 for the BF16 ones and the grouped wo_a, a loop over the routed experts
with FP8 weights since SM90 torch has no MXFP4 GEMM, attention as batched
matmuls and softmax (one kv head for 64 query heads),
topk on the device), timed on the same GPU in the same scripts/gpu-e2e call.

Two layer kinds, like the engine's cut model (bench/v41_flash_trunc.py):
  window   window-only attention (128 slots)
  source   ratio-1 kv/index source: compressor projections, indexer scores
           over the compressed entries and top-512, attention over the 128
           window slots + the 512 selected entries
Decode: B sequences of context `ctx`, one token each. Prefill: one sequence
of P tokens (attention chunked by query blocks; window attention as a
block-local mask).

With --attn P only the attention op (bench/bench_cuda_attn.cu's peer).

Prints "RESULT torch_layer_<kind>_b<B> <ms> ms" and
"RESULT torch_layer_<kind>_prefill<P> <ms> ms", plus the FP8 GEMM rate
(torch_scaled_mm 8192^3) and the copy bandwidth used as floors.
"""
import sys

from bench_cuda_torch import time_ms  # CUDA-event timed median, same as the kernel peers

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    torch = None

D, HC, H, HD, QR, OR, OG, I, E, TOPK = 5120, 4, 64, 512, 1280, 1024, 8, 2304, 384, 6
WIN, ISEL, IH, IHD = 128, 512, 32, 128


class FP8Linear:
    """[n, k] FP8 weight with a per-tensor scale; activations quantized per tensor."""

    def __init__(self, n, k, dev):
        self.w = torch.randint(0, 120, (n, k), dtype=torch.uint8, device=dev).view(torch.float8_e4m3fn)
        self.s = torch.tensor(0.01, device=dev)

    def __call__(self, x):
        m = x.shape[0]
        pad = (-m) % 16
        if pad:
            x = F.pad(x, (0, 0, 0, pad))
        sa = x.abs().amax().float().clamp(min=1e-4) / 448.0
        xq = (x.float() / sa).to(torch.float8_e4m3fn)
        y = torch._scaled_mm(xq, self.w.t(), scale_a=sa, scale_b=self.s, out_dtype=torch.bfloat16)
        return y[:m] if pad else y


def rms(x, eps=1e-6):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(torch.bfloat16)


class Layer:
    def __init__(self, kind, dev):
        bf = torch.bfloat16
        self.kind = kind
        self.fn = [torch.randn(24, HC * D, device=dev) * 0.01 for _ in range(2)]
        self.wq_a, self.wq_b = FP8Linear(QR, D, dev), FP8Linear(H * HD, QR, dev)
        self.wkv, self.wo_b = FP8Linear(HD, D, dev), FP8Linear(D, OG * OR, dev)
        self.wo_a = torch.randn(OG, H * HD // OG, OR, device=dev, dtype=bf) * 0.01
        self.gate = torch.randn(E, D, device=dev, dtype=bf) * 0.01
        self.bias = torch.randn(E, device=dev) * 0.01
        self.shared = [FP8Linear(I, D, dev), FP8Linear(I, D, dev), FP8Linear(D, I, dev)]
        self.experts = [[FP8Linear(I, D, dev), FP8Linear(I, D, dev), FP8Linear(D, I, dev)] for _ in range(E)]
        if kind == "source":
            self.c_wkv = torch.randn(HD, D, device=dev, dtype=bf) * 0.01
            self.c_wgate = torch.randn(HD, D, device=dev, dtype=bf) * 0.01
            self.i_wq = FP8Linear(IH * IHD, QR, dev)
            self.i_wp = torch.randn(IH, D, device=dev, dtype=bf) * 0.01
            self.i_wk = torch.randn(IHD, HD, device=dev, dtype=bf) * 0.01

    def mhc(self, s, site):
        b = s.shape[0]
        flat = s.reshape(b, -1).float()
        mix = (flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + 1e-6)) @ self.fn[site].t()
        pre = torch.sigmoid(mix[:, :HC])
        post = 2 * torch.sigmoid(mix[:, HC:2 * HC])
        comb = torch.softmax(mix[:, 2 * HC:].view(b, HC, HC), -1)
        for _ in range(20):
            comb = comb / comb.sum(-1, keepdim=True)
            comb = comb / comb.sum(-2, keepdim=True)
        x = rms((pre[:, :, None] * s.float()).sum(1).to(torch.bfloat16))
        return x, post, comb

    def expand(self, s, y, post, comb):
        return (post[:, :, None] * y.float()[:, None, :] + comb @ s.float()).to(torch.bfloat16)

    def expert(self, x, w):
        g, u = w[0](x), w[1](x)
        return w[2]((F.silu(g.float().clamp(max=10)) * u.float().clamp(-10, 10)).to(torch.bfloat16))

    def moe(self, x):
        logits = x.float() @ self.gate.float().t()
        sc = torch.sqrt(F.softplus(logits))
        ids = torch.topk(sc + self.bias, TOPK, dim=-1).indices
        w = sc.gather(1, ids)
        w = w / w.sum(-1, keepdim=True) * 1.5
        y = self.expert(x, self.shared).float()
        for e in torch.unique(ids).tolist():  # the loop a straightforward engine runs
            rows, slot = (ids == e).nonzero(as_tuple=True)
            y.index_add_(0, rows, self.expert(x[rows], self.experts[e]).float() * w[rows, slot, None])
        return y.to(torch.bfloat16)

    def attend(self, q, keys):
        """q [n, H, HD]; keys [n, S, HD] (K = V, one kv head shared by the
        64 heads: batched matmuls, as SDPA's math path would do without
        expanding the keys per head)."""
        p = torch.softmax(torch.bmm(q, keys.transpose(1, 2)).float() * HD ** -0.5, -1)
        return torch.bmm(p.to(torch.bfloat16), keys).reshape(q.shape[0], H * HD)

    def attention(self, x, win, comp, comp_keys, prefill):
        n = x.shape[0]
        qa = rms(self.wq_a(x))
        q = self.wq_b(qa).view(n, H, HD)
        kv = rms(self.wkv(x))
        if self.kind == "source":
            ckv, cg = x @ self.c_wkv.t(), x @ self.c_wgate.t()
            kv = kv + 0 * (ckv * torch.sigmoid(cg))  # the compressor's work, folded in
            iq = self.i_wq(qa).view(n, IH, IHD)
            iw = x @ self.i_wp.t()
            sel = []
            for c0 in range(0, n, 1024):  # chunks of queries: [c, IH, n_comp] scores
                sc = torch.relu(torch.einsum("qhd,kd->qhk", iq[c0:c0 + 1024], comp_keys))
                sc = (sc * iw[c0:c0 + 1024, :, None]).sum(1)
                sel.append(torch.topk(sc, min(ISEL, sc.shape[1]), dim=-1).indices)
            sel = torch.cat(sel)
        outs = []
        for c0 in range(0, n, 1024):
            c1 = min(n, c0 + 1024)
            if prefill:  # each query's own 128-slot window out of this chunk
                idx = (torch.arange(c0, c1, device=x.device)[:, None] - torch.arange(WIN, device=x.device)).clamp(min=0)
                keys = kv[idx]
            else:
                keys = win[c0:c1]
            if self.kind == "source":
                keys = torch.cat([keys, comp[sel[c0:c1]]], 1)
            outs.append(self.attend(q[c0:c1], keys))
        o = torch.cat(outs).view(n, OG, H * HD // OG)
        o = torch.bmm(o.transpose(0, 1), self.wo_a).transpose(0, 1).reshape(n, OG * OR)
        return self.wo_b(o)

    def forward(self, s, win, comp, comp_keys, prefill=False):
        x, post, comb = self.mhc(s, 0)
        s = self.expand(s, self.attention(x, win, comp, comp_keys, prefill), post, comb)
        x, post, comb = self.mhc(s, 1)
        return self.expand(s, self.moe(x), post, comb)


def attn_op_peer(P):
    """The attention op alone at bench/bench_cuda_attn.cu's prefill shapes:
    P queries of 64 heads, window-only (each query's 128 window rows of the
    chunk) and window + 512 selected compressed entries; keys gathered per
    query, q.k and p.v as batched bf16 matmuls, softmax in fp32 with the sink
    as one more logit, 1024 queries at a time."""
    dev, bf = torch.device("cuda"), torch.bfloat16
    q = torch.randn(P, H, HD, device=dev, dtype=bf)
    kv = torch.randn(P, HD, device=dev, dtype=bf)
    comp = torch.randn(P, HD, device=dev, dtype=bf)
    sink = torch.randn(H, device=dev)
    i = torch.arange(P, device=dev)
    widx = (i[:, None] - (WIN - 1) + torch.arange(WIN, device=dev)).clamp(min=0)
    j = torch.arange(ISEL, device=dev)
    sidx = torch.where(i[:, None] + 1 >= ISEL, j * (i[:, None] + 1) // ISEL, j.clamp(max=P - 1))

    def attn(with_sel):
        outs = []
        for c0 in range(0, P, 1024):
            c1 = min(P, c0 + 1024)
            keys = kv[widx[c0:c1]]
            if with_sel:
                keys = torch.cat([keys, comp[sidx[c0:c1]]], 1)
            s = torch.bmm(q[c0:c1], keys.transpose(1, 2)).float() * HD ** -0.5
            s = torch.cat([s, sink.view(1, H, 1).expand(c1 - c0, H, 1)], -1)
            p = torch.softmax(s, -1)[..., :-1]
            outs.append(torch.bmm(p.to(bf), keys))
        return torch.cat(outs)

    for name, with_sel in (("window", False), ("source", True)):
        slots = WIN + (ISEL if with_sel else 0)
        with torch.no_grad():
            t = time_ms(lambda: attn(with_sel), reps=5, warmup=1)
        print(f"RESULT torch_attn_{name}_prefill{P} {t:.3f} ms {4 * H * HD * slots * P / t / 1e9:.1f} TFLOP/s")
    return 0


def main():
    if torch is None or not torch.cuda.is_available():
        print("torch sees no CUDA device; skipping")
        return 0
    args = sys.argv[1:]
    if args[:1] == ["--attn"]:
        return attn_op_peer(int(args[1]) if len(args) > 1 else 8192)
    batches = [int(b) for b in (args[0] if args else "1,8,64,256").split(",")]
    P = int(args[1]) if len(args) > 1 else 8192
    ctx = int(args[2]) if len(args) > 2 else 32
    dev = torch.device("cuda")
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    n = 1 << 30
    src = torch.randint(0, 255, (n,), dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    print(f"RESULT torch_copy_bw {2 * n / (time_ms(lambda: dst.copy_(src), reps=10) * 1e-3) / 1e9:.1f} GB/s")
    del src, dst
    f8 = torch.float8_e4m3fn
    a = (torch.randn(8192, 8192, device=dev) * 4).to(f8)
    b = (torch.randn(8192, 8192, device=dev) * 4).to(f8)
    one = torch.ones((), device=dev)
    t = time_ms(lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), reps=10)
    print(f"RESULT torch_scaled_mm_8192 {2 * 8192 ** 3 / t / 1e9:.1f} TFLOP/s")
    del a, b
    for kind in ("window", "source"):
        try:
            layer = Layer(kind, dev)
        except RuntimeError as e:
            print(f"torch layer {kind}: {e}")
            continue
        n_comp = max(ctx, 1)
        for B in batches:
            try:
                s = torch.randn(B, HC, D, device=dev, dtype=torch.bfloat16)
                win = torch.randn(B, WIN, HD, device=dev, dtype=torch.bfloat16)
                comp = torch.randn(n_comp, HD, device=dev, dtype=torch.bfloat16)
                ck = torch.randn(n_comp, IHD, device=dev, dtype=torch.bfloat16)
                with torch.no_grad():
                    t = time_ms(lambda: layer.forward(s, win, comp, ck), reps=5, warmup=2)
                print(f"RESULT torch_layer_{kind}_b{B} {t:.3f} ms")
            except RuntimeError as e:
                print(f"torch layer {kind} batch {B}: {str(e)[:300]}")
        try:
            s = torch.randn(P, HC, D, device=dev, dtype=torch.bfloat16)
            comp = torch.randn(P, HD, device=dev, dtype=torch.bfloat16)
            ck = torch.randn(P, IHD, device=dev, dtype=torch.bfloat16)
            with torch.no_grad():
                t = time_ms(lambda: layer.forward(s, None, comp, ck, prefill=True), reps=2, warmup=1)
            print(f"RESULT torch_layer_{kind}_prefill{P} {t:.3f} ms  {P / t * 1e3:.0f} tokens/s")
        except RuntimeError as e:
            print(f"torch layer {kind} prefill: {str(e)[:300]}")
        del layer
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
