"""Chapter 03's exercises: every reference solution passes its checker, and plausible wrong answers fail it with a
message that names the failing case."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import mta  # noqa: F401  (sets the runtime before any kernel below is defined)
from conftest import assert_stubs_not_attempted, load_solutions
from mta.course.exercises import ch03
from mta.kernel_parts import key_tile_bounds

SOLUTIONS = load_solutions("ch03")
_fold_key_tiles = SOLUTIONS._fold_key_tiles
NO_KERNEL = "launched no Triton kernel of its own"


# ------------------------------------------------------------------------------------------- solutions pass
def test_solution_1_passes(capsys):
    result = ch03.check_forward_kernel(SOLUTIONS.attention_forward)
    assert result.passed and result.attempted
    assert f"all {len(ch03.FORWARD_CASES) + 1} cases pass" in capsys.readouterr().out  # and the batched case


def test_solution_2_passes():
    assert ch03.check_key_tiles_visited(SOLUTIONS.key_tiles_visited).passed
    assert ch03.check_visited_ratio(SOLUTIONS.visited_ratio).passed


def test_solution_3_passes():
    assert ch03.check_ds_formula(SOLUTIONS.ds_from_formula).passed


def test_solution_4_passes():
    assert ch03.check_rowsum_do_o(SOLUTIONS.rowsum_do_o).passed


def test_solution_5_passes(capsys):
    assert ch03.check_dkdv_kernel(SOLUTIONS.attention_dkdv).passed
    assert f"all {len(ch03.BACKWARD_CASES)} cases pass" in capsys.readouterr().out


def test_solution_6_passes():
    assert ch03.check_dq_kernel(SOLUTIONS.attention_dq).passed


def test_stubs_are_not_attempted(capsys):
    assert_stubs_not_attempted((ch03.check_forward_kernel, ch03.check_key_tiles_visited, ch03.check_visited_ratio,
                                ch03.check_ds_formula, ch03.check_rowsum_do_o, ch03.check_dkdv_kernel,
                                ch03.check_dq_kernel), capsys)


# ------------------------------------------------------------------------------------------- exercise 1, wrong
@triton.jit
def _fold_no_guard(acc, m, l, q, K, V, stride_kn, offs_m, offs_d, start, stop, n_k, diag, qk_scale,
                   T_K: tl.constexpr, PRECISION: tl.constexpr):
    # The causal masked stage without the -inf guard: a row that has seen nothing computes exp2(-inf - (-inf)) = NaN.
    offs_n = tl.arange(0, T_K)
    for start_n in range(start, stop, T_K):
        offs_k = start_n + offs_n
        key_ok = offs_k < n_k
        kt = tl.load(K + offs_k[None, :] * stride_kn + offs_d[:, None], mask=key_ok[None, :], other=0.0)
        v = tl.load(V + offs_k[:, None] * stride_kn + offs_d[None, :], mask=key_ok[:, None], other=0.0)
        s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale
        s = tl.where(key_ok[None, :] & (offs_k[None, :] <= offs_m[:, None] + diag), s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m - m_new)
        l = l * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new
    return acc, m, l


@triton.jit
def _wrong_forward_kernel(Q, K, V, O, LSE, VISITS, n_q, n_k, stride_qbh, stride_qm, stride_kbh, stride_kn, qk_scale,
                          CAUSAL: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, T_Q: tl.constexpr,
                          T_K: tl.constexpr, PRECISION: tl.constexpr, MODE: tl.constexpr):
    # The solution's kernel with one slip, chosen by MODE (D == BLOCK_D in the cases that MODE 3 meets):
    #   0: one masked loop over every key tile (right answer, but loads the tiles right of the diagonal);
    #   1: one masked loop up to masked_stop (right answer and loads, but no unmasked stage);
    #   2: full_stop not rounded down to a whole tile (a partial tile runs the unmasked body);
    #   3: the masked stage without the -inf guard;
    #   4: masked_stop one key short ("the last row's last key", read as inclusive);
    #   5: the running max starts at 0 instead of -inf (the guard then never fires);
    #   6: not causal, only the whole key tiles (no masked stage for the tail).
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    Q += pid_bh * stride_qbh
    O += pid_bh * stride_qbh
    K += pid_bh * stride_kbh
    V += pid_bh * stride_kbh
    m0 = pid_m * T_Q
    offs_m = m0 + tl.arange(0, T_Q)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < n_q
    io_mask = row_ok[:, None] & (offs_d < D)[None, :]
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :], mask=io_mask, other=0.0)
    m = tl.full([T_Q], float("-inf"), dtype=tl.float32)
    if MODE == 5:
        m = tl.zeros([T_Q], dtype=tl.float32)
    l = tl.zeros([T_Q], dtype=tl.float32)
    acc = tl.zeros([T_Q, BLOCK_D], dtype=tl.float32)
    diag = n_k - n_q
    if CAUSAL:
        full_stop = tl.minimum(tl.maximum(m0 + diag + 1, 0), n_k) // T_K * T_K
        masked_stop = tl.minimum(tl.maximum(m0 + T_Q + diag, 0), n_k)
    else:
        full_stop = n_k // T_K * T_K
        masked_stop = n_k
    if MODE == 0:
        full_stop = 0
        masked_stop = n_k
    if MODE == 1:
        full_stop = 0
    if MODE == 2:
        full_stop = tl.minimum(tl.maximum(m0 + diag + 1, 0), n_k)
    if MODE == 4:
        masked_stop = tl.minimum(tl.maximum(m0 + T_Q + diag - 1, 0), n_k)
    if MODE == 6:
        if not CAUSAL:
            masked_stop = full_stop
    acc, m, l, n_full = _fold_key_tiles(acc, m, l, q, K, V, stride_kn, offs_m, offs_d, 0, full_stop, n_k, diag,
                                        qk_scale, False, CAUSAL, D, T_K, PRECISION)
    if MODE == 3:
        acc, m, l = _fold_no_guard(acc, m, l, q, K, V, stride_kn, offs_m, offs_d, full_stop, masked_stop, n_k, diag,
                                   qk_scale, T_K, PRECISION)
        n_masked = (masked_stop - full_stop + T_K - 1) // T_K
    else:
        acc, m, l, n_masked = _fold_key_tiles(acc, m, l, q, K, V, stride_kn, offs_m, offs_d, full_stop, masked_stop,
                                              n_k, diag, qk_scale, True, CAUSAL, D, T_K, PRECISION)
    seen = l > 0.0
    l_div = tl.where(seen, l, 1.0)
    o = acc / l_div[:, None]
    lse = tl.where(seen, (m + tl.math.log2(l_div)) * 0.6931471805599453, float("-inf"))
    tl.store(O + offs_m[:, None] * stride_qm + offs_d[None, :], o.to(O.dtype.element_ty), mask=io_mask)
    tl.store(LSE + pid_bh * n_q + offs_m, lse, mask=row_ok)
    visits = VISITS + (pid_bh * tl.num_programs(0) + pid_m) * 2
    tl.store(visits, n_full)
    tl.store(visits + 1, n_masked)


class _WithMode:
    """``kernel[grid](...)`` with ``MODE=mode`` added: a wrong kernel in the solution's launcher."""

    def __init__(self, kernel, mode):
        self.kernel, self.mode = kernel, mode

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.kernel[grid](*args, **kwargs, MODE=self.mode)


def _wrong_forward(mode):
    def attention_forward(q, k, v, T_q, T_k, causal=True):
        return SOLUTIONS.attention_forward(q, k, v, T_q, T_k, causal, kernel=_WithMode(_wrong_forward_kernel, mode))
    return attention_forward


def _fails(result, message):
    assert result.attempted and not result.passed
    assert message in result.message, result.message


def test_wrong_1_starts_the_running_max_at_zero():
    # Right while a row's max is above about -104 (exp2 of the score minus 0 still a float32), so only the case
    # whose scores all lie near -144 catches it.
    _fails(ch03.check_forward_kernel(_wrong_forward(5)),
           "case 'Nq=Nk=20, every score near -144 (a running max that starts at 0 underflows)' fails")


def test_wrong_1_loads_every_key_tile():
    # Right output on clean inputs (the masked body hides the future), but it loads the tiles right of the diagonal:
    # only the NaN run sees it.
    _fails(ch03.check_forward_kernel(_wrong_forward(0)),
           "case 'Nq=Nk=40, tiles 16x16' fails: o of query tile 0, with keys and values NaN from key 16 on "
           "(right of its diagonal tile): contains NaN or inf")


def test_wrong_1_has_no_unmasked_stage():
    # Right output, right loads; the stage counts show that every tile ran the masked body.
    _fails(ch03.check_forward_kernel(_wrong_forward(1)),
           "case 'Nq=Nk=40, tiles 16x16' fails: visits of query tile 1 (unmasked, masked key tiles): "
           "got (0, 2), expected (1, 1)")


def test_wrong_1_does_not_round_full_stop():
    # Its last unmasked tile may also reach past the keys (an unmasked load): wrong numbers or NaN, either way "o".
    _fails(ch03.check_forward_kernel(_wrong_forward(2)), "case 'Nq=Nk=40, tiles 16x16' fails: o: ")


def test_wrong_1_stops_one_key_short():
    # Loses a key tile only where the last row's diagonal ends on a tile's first key.
    _fails(ch03.check_forward_kernel(_wrong_forward(4)),
           "case 'Nq=20 < Nk=37, tiles 16x16 (a diagonal that ends on the first key of a key tile)' fails: o: ")


def test_wrong_1_forgets_the_guard():
    # Fine while every row sees a key; NaN as soon as a masked tile holds rows that see none.
    _fails(ch03.check_forward_kernel(_wrong_forward(3)),
           "case 'Nq=50 > Nk=20 (queries that see no key), tiles 16x16' fails: o: contains NaN or inf")


def test_wrong_1_drops_the_key_tail_when_not_causal():
    # The causal cases pass; without the mask, the keys of the partial last tile are never visited.
    _fails(ch03.check_forward_kernel(_wrong_forward(6)),
           "case 'not causal, Nq=37 > Nk=21 (a partial last key tile)' fails: o: ")


# ------------------------------------------------------------------------------------------- exercise 2, wrong
def test_wrong_2_rounds_down():
    # n_seen // T_k: right whenever the lengths are multiples of the key tile.
    def floor_tiles(n_q, n_k, T_q, T_k, causal):
        total = 0
        for m0 in range(0, n_q, T_q):
            last_row = min(m0 + T_q, n_q) - 1
            n_seen = min(max(last_row + (n_k - n_q) + 1, 0), n_k) if causal else n_k
            total += n_seen // T_k
        return total

    result = ch03.check_key_tiles_visited(floor_tiles)
    assert ("case 'Nq=Nk=37, tiles 16x16, causal' fails: key_tiles_visited(37, 37, 16, 16, True): got 5, "
            "expected 6") in result.message


def test_wrong_2_counts_from_the_first_row():
    # The tile's first row decides where the masked stage starts, not where the tile's keys end. With square
    # problems and T_q = T_k both give the same count; not when Nq < Nk.
    def first_row(n_q, n_k, T_q, T_k, causal):
        if not causal:
            return SOLUTIONS.key_tiles_visited(n_q, n_k, T_q, T_k, causal)
        return sum(triton.cdiv(min(max(m0 + (n_k - n_q) + 1, 0), n_k), T_k) for m0 in range(0, n_q, T_q))

    result = ch03.check_key_tiles_visited(first_row)
    assert ("case 'Nq=20 < Nk=50, tiles 16x16, causal' fails: key_tiles_visited(20, 50, 16, 16, True): got 5, "
            "expected 7") in result.message


def test_wrong_2_ratio_is_only_the_limit():
    result = ch03.check_visited_ratio(lambda N, T_q: 0.5)
    assert "case 'N=128, T_q=128' fails: visited_ratio(128, 128): got 0.5, expected 1.0" in result.message


# ------------------------------------------------------------------------------------------- exercise 3, wrong
def test_wrong_3_shortcut_rowsum_dp():
    def shortcut(s, v, do):
        p = torch.softmax(s, dim=-1)
        dp = do @ v.T
        return p * (dp - dp.sum(dim=-1, keepdim=True))

    result = ch03.check_ds_formula(shortcut)
    assert "case '5 queries, 7 keys, one masked score' fails: dS: max abs error" in result.message


def test_wrong_3_forgets_p():
    def no_p(s, v, do):
        p = torch.softmax(s, dim=-1)
        return do @ v.T - (do * (p @ v)).sum(-1, keepdim=True)

    result = ch03.check_ds_formula(no_p)
    assert "case '5 queries, 7 keys, one masked score' fails: dS: max abs error" in result.message


# ------------------------------------------------------------------------------------------- exercise 4, wrong
def _launch_rowsum(o, do, delta, grid_rows, strides_o, strides_do, block_d, block_n=16):
    B, H, N, D = o.shape
    SOLUTIONS.rowsum_do_o_kernel[(grid_rows, B * H)](o, do, delta, N, H, *strides_o, *strides_do,
                                                     D=D, BLOCK_D=block_d, BLOCK_N=block_n)
    return delta


def test_wrong_4_rounds_the_grid_down():
    # N // BLOCK_N programs: the rows of the last, partial tile are never written (and N = 1 gets no program).
    def floor_grid(o, do):
        B, H, N, D = o.shape
        o, do = o.contiguous(), do.contiguous()
        delta = torch.zeros(B, H, N, device=o.device, dtype=torch.float32)
        return _launch_rowsum(o, do, delta, N // 16, o.stride()[:3], do.stride()[:3],
                              max(16, triton.next_power_of_2(D)))

    result = ch03.check_rowsum_do_o(floor_grid)
    assert "case 'N=1, D=16' fails: D: max abs error" in result.message


def test_wrong_4_blocks_as_wide_as_d():
    # tl.arange needs a power of two: BLOCK_D = D fails for D = 96.
    def block_is_d(o, do):
        B, H, N, D = o.shape
        o, do = o.contiguous(), do.contiguous()
        delta = torch.empty(B, H, N, device=o.device, dtype=torch.float32)
        return _launch_rowsum(o, do, delta, triton.cdiv(N, 16), o.stride()[:3], do.stride()[:3], D)

    result = ch03.check_rowsum_do_o(block_is_d)
    assert "case 'N=50, D=96 (not a power of two)' raised" in result.message


def test_wrong_4_assumes_contiguous_inputs():
    # Strides of a contiguous [B, H, N, D] tensor, used on a transposed view.
    def contiguous_strides(o, do):
        B, H, N, D = o.shape
        delta = torch.empty(B, H, N, device=o.device, dtype=torch.float32)
        strides = (H * N * D, N * D, D)
        return _launch_rowsum(o, do, delta, triton.cdiv(N, 16), strides, strides, max(16, triton.next_power_of_2(D)))

    result = ch03.check_rowsum_do_o(contiguous_strides)
    assert "case 'B=2, H=3, N=20, D=32, [B, N, H, D] views' fails: D: max abs error" in result.message


@triton.jit
def _key_tile_bounds_probe(OUT, n_k, diag, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``OUT[t] = (full_stop, masked_stop)`` of query tile ``t``, from the shipped kernels' own function."""
    t = tl.program_id(0)
    full_stop, masked_stop = key_tile_bounds(t * BLOCK_M, n_k, diag, 0, CAUSAL, BLOCK_M, BLOCK_N)
    tl.store(OUT + 2 * t, full_stop)
    tl.store(OUT + 2 * t + 1, masked_stop)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n_q,n_k,T_q,T_k", [(40, 40, 16, 16), (50, 20, 16, 16), (20, 50, 32, 16), (1, 1, 16, 16),
                                             (64, 64, 32, 16), (40, 72, 16, 32)])
def test_stage_counts_match_the_shipped_kernel_bounds(n_q, n_k, T_q, T_k, causal):
    """The checker's (unmasked, masked) counts are the stages of mta.kernel_parts.key_tile_bounds, run in a kernel
    (not a second copy of its formula)."""
    tiles = -(-n_q // T_q)
    out = torch.zeros(2 * tiles, dtype=torch.int32, device=mta.runtime.DEVICE)
    _key_tile_bounds_probe[(tiles,)](out, n_k, n_k - n_q, CAUSAL=causal, BLOCK_M=T_q, BLOCK_N=T_k)
    bounds = out.cpu().view(tiles, 2).tolist()
    want = [(full_stop // T_k, -(-max(masked_stop - full_stop, 0) // T_k)) for full_stop, masked_stop in bounds]
    assert [tuple(r) for r in ch03.stage_counts(n_q, n_k, T_q, T_k, causal).tolist()] == want


# ---------------------------------------------------------------------------------------- exercises 5 and 6, wrong
@triton.jit
def _wrong_dkdv_kernel(Q, K, V, DO, LSE, DELTA, DK, DV, n_q, n_k, scale, stride_qbh, stride_qm, stride_kbh,
                       stride_kn, CAUSAL: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, T_Q: tl.constexpr,
                       T_K: tl.constexpr, PRECISION: tl.constexpr, MODE: tl.constexpr):
    # The solution's kernel with one slip, chosen by MODE:
    #   0: no causal mask on the recomputed P (the forward masked S; P = exp(S - lse) is not masked by itself);
    #   1: dK without the score scale;
    #   2: the first query tile rounded up instead of down (skips a tile that sees some of the keys).
    pid_n = tl.program_id(0)
    pid_bh = tl.program_id(1)
    Q += pid_bh * stride_qbh
    DO += pid_bh * stride_qbh
    K += pid_bh * stride_kbh
    V += pid_bh * stride_kbh
    DK += pid_bh * stride_kbh
    DV += pid_bh * stride_kbh
    LSE += pid_bh * n_q
    DELTA += pid_bh * n_q
    n0 = pid_n * T_K
    offs_n = n0 + tl.arange(0, T_K)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < D
    kv_mask = (offs_n < n_k)[:, None] & d_ok[None, :]
    k = tl.load(K + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
    v = tl.load(V + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
    dk = tl.zeros([T_K, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([T_K, BLOCK_D], dtype=tl.float32)
    diag = n_k - n_q
    start = 0
    if CAUSAL:
        start = tl.maximum(n0 - diag, 0) // T_Q * T_Q
        if MODE == 2:
            start = tl.cdiv(tl.maximum(n0 - diag, 0), T_Q) * T_Q
    for start_m in range(start, n_q, T_Q):
        offs_m = start_m + tl.arange(0, T_Q)
        row_ok = offs_m < n_q
        q_mask = row_ok[:, None] & d_ok[None, :]
        q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :], mask=q_mask, other=0.0)
        do = tl.load(DO + offs_m[:, None] * stride_qm + offs_d[None, :], mask=q_mask, other=0.0)
        lse = tl.load(LSE + offs_m, mask=row_ok, other=0.0)
        delta = tl.load(DELTA + offs_m, mask=row_ok, other=0.0)
        p = tl.exp(tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale - lse[:, None])
        if CAUSAL and MODE != 0:
            p = tl.where(offs_n[None, :] <= offs_m[:, None] + diag, p, 0.0)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PRECISION)
        ds = p * (tl.dot(do, tl.trans(v), input_precision=PRECISION) - delta[:, None])
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PRECISION)
    if MODE != 1:
        dk = dk * scale
    tl.store(DK + offs_n[:, None] * stride_kn + offs_d[None, :], dk.to(DK.dtype.element_ty), mask=kv_mask)
    tl.store(DV + offs_n[:, None] * stride_kn + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _wrong_dq_kernel(Q, K, V, DO, LSE, DELTA, DQ, n_q, n_k, scale, stride_qbh, stride_qm, stride_kbh, stride_kn,
                     CAUSAL: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, T_Q: tl.constexpr,
                     T_K: tl.constexpr, PRECISION: tl.constexpr, MODE: tl.constexpr):
    # The solution's kernel with one slip, chosen by MODE:
    #   0: causal, every key tile and no mask on P;
    #   1: causal, the last key its last row sees left out (the stop read as inclusive);
    #   2: dQ without the score scale.
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    Q += pid_bh * stride_qbh
    DO += pid_bh * stride_qbh
    DQ += pid_bh * stride_qbh
    K += pid_bh * stride_kbh
    V += pid_bh * stride_kbh
    m0 = pid_m * T_Q
    offs_m = m0 + tl.arange(0, T_Q)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < n_q
    d_ok = offs_d < D
    q_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :], mask=q_mask, other=0.0)
    do = tl.load(DO + offs_m[:, None] * stride_qm + offs_d[None, :], mask=q_mask, other=0.0)
    lse = tl.load(LSE + pid_bh * n_q + offs_m, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + pid_bh * n_q + offs_m, mask=row_ok, other=0.0)
    dq = tl.zeros([T_Q, BLOCK_D], dtype=tl.float32)
    diag = n_k - n_q
    stop = n_k
    if CAUSAL and MODE != 0:
        stop = tl.minimum(tl.maximum(m0 + T_Q + diag, 0), n_k)
        if MODE == 1:
            stop = tl.minimum(tl.maximum(m0 + T_Q + diag - 1, 0), n_k)
    for start_n in range(0, stop, T_K):
        offs_n = start_n + tl.arange(0, T_K)
        kv_mask = (offs_n < n_k)[:, None] & d_ok[None, :]
        k = tl.load(K + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(V + offs_n[:, None] * stride_kn + offs_d[None, :], mask=kv_mask, other=0.0)
        p = tl.exp(tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale - lse[:, None])
        if CAUSAL and MODE != 0:
            p = tl.where(offs_n[None, :] <= offs_m[:, None] + diag, p, 0.0)
        ds = p * (tl.dot(do, tl.trans(v), input_precision=PRECISION) - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)
    if MODE != 2:
        dq = dq * scale
    tl.store(DQ + offs_m[:, None] * stride_qm + offs_d[None, :], dq.to(DQ.dtype.element_ty), mask=q_mask)


def _wrong_backward(launcher, kernel, mode):
    def attention_grad(q, k, v, do, lse, delta, causal, T_q, T_k):
        return launcher(q, k, v, do, lse, delta, causal, T_q, T_k, kernel=_WithMode(kernel, mode))
    return attention_grad


def test_wrong_5_leaves_p_unmasked():
    # exp(S - lse) is positive at every masked pair (and +inf in a row that sees no key): the first causal case with
    # more than one key says so.
    _fails(ch03.check_dkdv_kernel(_wrong_backward(SOLUTIONS.attention_dkdv, _wrong_dkdv_kernel, 0)),
           "case 'causal, Nq=Nk=37' fails: dk: ")


def test_wrong_5_forgets_the_scale_of_dk():
    # With one key dS = P (dP - D) = 0, so the one-token case cannot see it; the next case does.
    _fails(ch03.check_dkdv_kernel(_wrong_backward(SOLUTIONS.attention_dkdv, _wrong_dkdv_kernel, 1)),
           "case 'not causal, Nq=Nk=37' fails: dk: ")


def test_wrong_5_starts_a_query_tile_late():
    # Rounding the first query tile up is right whenever the diagonal meets the key tile on a query tile's first
    # row: for square problems with equal tiles, not for Nq < Nk.
    _fails(ch03.check_dkdv_kernel(_wrong_backward(SOLUTIONS.attention_dkdv, _wrong_dkdv_kernel, 2)),
           "case 'causal, Nq=20 < Nk=37 (a diagonal that ends on the first key of a key tile)' fails: dk: ")


def test_wrong_6_leaves_p_unmasked():
    _fails(ch03.check_dq_kernel(_wrong_backward(SOLUTIONS.attention_dq, _wrong_dq_kernel, 0)),
           "case 'causal, Nq=Nk=37' fails: dq: ")


def test_wrong_6_stops_one_key_short():
    # Loses a key only where the last row's diagonal ends on a key tile's first key.
    _fails(ch03.check_dq_kernel(_wrong_backward(SOLUTIONS.attention_dq, _wrong_dq_kernel, 1)),
           "case 'causal, Nq=20 < Nk=37 (a diagonal that ends on the first key of a key tile)' fails: dq: ")


def test_wrong_6_forgets_the_scale():
    # As for dK, one key gives dS = 0: the second case sees it.
    _fails(ch03.check_dq_kernel(_wrong_backward(SOLUTIONS.attention_dq, _wrong_dq_kernel, 2)),
           "case 'not causal, Nq=Nk=37' fails: dq: ")


def test_backward_in_pytorch_is_not_a_kernel():
    # Autograd's answer, right to the last bit, but no Triton kernel of the learner's.
    def autograd(q, k, v, do, lse, delta, causal, T_q, T_k):
        q, k, v = (x.detach().double().requires_grad_() for x in (q, k, v))
        s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        if causal:
            s = s.masked_fill(mta.reference.causal_future(q.shape[2], k.shape[2], q.device), float("-inf"))
        p = torch.exp(s - lse.double()[..., None])
        (p @ v).backward(do.double())
        return q.grad, k.grad, v.grad
    _fails(ch03.check_dkdv_kernel(lambda *a: autograd(*a)[1:]), NO_KERNEL)
    _fails(ch03.check_dq_kernel(lambda *a: autograd(*a)[0]), NO_KERNEL)
