import time, torch
x = torch.tensor([4096], dtype=torch.int32)
def t(fn, n=5000):
    for _ in range(100): fn()
    torch.cuda.synchronize(); s = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize(); return (time.perf_counter() - s) / n * 1e6
print("pin+to", t(lambda: x.pin_memory().to("cuda", non_blocking=True)))
print("to nb", t(lambda: x.to("cuda", non_blocking=True)))
print("min max", t(lambda: (int(x.min()), int(x.max()))))
print("contig", t(lambda: x.contiguous()))
print("empty x3", t(lambda: [torch.empty((2, 8), device="cuda") for _ in range(3)]))
print("empty x1", t(lambda: torch.empty((2, 8 * 66), device="cuda")))
torch.cuda.set_sync_debug_mode("error")
y = x.to("cuda", non_blocking=True); print("no sync error for pageable non_blocking")
