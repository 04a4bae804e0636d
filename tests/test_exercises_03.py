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


# ------------------------------------------------------------------------------------------- solutions pass
def test_solution_1_passes(capsys):
    result = ch03.check_causal_kernel(SOLUTIONS.attention_causal)
    assert result.passed and result.attempted
    assert f"all {len(ch03.CAUSAL_CASES) + 1} cases pass" in capsys.readouterr().out  # and the batched case


def test_solution_2_passes():
    assert ch03.check_key_tiles_visited(SOLUTIONS.key_tiles_visited).passed
    assert ch03.check_visited_ratio(SOLUTIONS.visited_ratio).passed


def test_solution_3_passes():
    assert ch03.check_ds_formula(SOLUTIONS.ds_from_formula).passed


def test_solution_4_passes():
    assert ch03.check_rowsum_do_o(SOLUTIONS.rowsum_do_o).passed


def test_stubs_are_not_attempted(capsys):
    assert_stubs_not_attempted((ch03.check_causal_kernel, ch03.check_key_tiles_visited, ch03.check_visited_ratio,
                                ch03.check_ds_formula, ch03.check_rowsum_do_o), capsys)


# ------------------------------------------------------------------------------------------- exercise 1, wrong
@triton.jit
def _fold_no_guard(acc, m, l, q, K, V, stride_kn, offs_m, start, stop, n_k, diag, qk_scale,
                   D: tl.constexpr, T_K: tl.constexpr, PRECISION: tl.constexpr):
    # The masked stage without the -inf guard: a row that has seen nothing computes exp2(-inf - (-inf)) = NaN.
    offs_n = tl.arange(0, T_K)
    offs_d = tl.arange(0, D)
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
def _wrong_causal_kernel(Q, K, V, O, LSE, VISITS, n_q, n_k, stride_qbh, stride_qm, stride_kbh, stride_kn, qk_scale,
                         D: tl.constexpr, T_Q: tl.constexpr, T_K: tl.constexpr, PRECISION: tl.constexpr,
                         MODE: tl.constexpr):
    # The solution's kernel with one slip, chosen by MODE:
    #   0: one masked loop over every key tile (right answer, but loads the tiles right of the diagonal);
    #   1: one masked loop up to masked_stop (right answer and loads, but no unmasked stage);
    #   2: full_stop not rounded down to a whole tile (a partial tile runs the unmasked body);
    #   3: the masked stage without the -inf guard;
    #   4: masked_stop one key short ("the last row's last key", read as inclusive);
    #   5: the running max starts at 0 instead of -inf (the guard then never fires).
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    Q += pid_bh * stride_qbh
    O += pid_bh * stride_qbh
    K += pid_bh * stride_kbh
    V += pid_bh * stride_kbh
    m0 = pid_m * T_Q
    offs_m = m0 + tl.arange(0, T_Q)
    offs_d = tl.arange(0, D)
    row_ok = offs_m < n_q
    q = tl.load(Q + offs_m[:, None] * stride_qm + offs_d[None, :], mask=row_ok[:, None], other=0.0)
    m = tl.full([T_Q], float("-inf"), dtype=tl.float32)
    if MODE == 5:
        m = tl.zeros([T_Q], dtype=tl.float32)
    l = tl.zeros([T_Q], dtype=tl.float32)
    acc = tl.zeros([T_Q, D], dtype=tl.float32)
    diag = n_k - n_q
    full_stop = tl.minimum(tl.maximum(m0 + diag + 1, 0), n_k) // T_K * T_K
    masked_stop = tl.minimum(tl.maximum(m0 + T_Q + diag, 0), n_k)
    if MODE == 0:
        full_stop = 0
        masked_stop = n_k
    if MODE == 1:
        full_stop = 0
    if MODE == 2:
        full_stop = tl.minimum(tl.maximum(m0 + diag + 1, 0), n_k)
    if MODE == 4:
        masked_stop = tl.minimum(tl.maximum(m0 + T_Q + diag - 1, 0), n_k)
    acc, m, l, n_full = _fold_key_tiles(acc, m, l, q, K, V, stride_kn, offs_m, 0, full_stop, n_k, diag, qk_scale,
                                        False, D, T_K, PRECISION)
    if MODE == 3:
        acc, m, l = _fold_no_guard(acc, m, l, q, K, V, stride_kn, offs_m, full_stop, masked_stop, n_k, diag,
                                   qk_scale, D, T_K, PRECISION)
        n_masked = (masked_stop - full_stop + T_K - 1) // T_K
    else:
        acc, m, l, n_masked = _fold_key_tiles(acc, m, l, q, K, V, stride_kn, offs_m, full_stop, masked_stop, n_k,
                                              diag, qk_scale, True, D, T_K, PRECISION)
    seen = l > 0.0
    l_div = tl.where(seen, l, 1.0)
    o = acc / l_div[:, None]
    lse = tl.where(seen, (m + tl.math.log2(l_div)) * 0.6931471805599453, float("-inf"))
    tl.store(O + offs_m[:, None] * stride_qm + offs_d[None, :], o.to(O.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LSE + pid_bh * n_q + offs_m, lse, mask=row_ok)
    visits = VISITS + (pid_bh * tl.num_programs(0) + pid_m) * 2
    tl.store(visits, n_full)
    tl.store(visits + 1, n_masked)


def _wrong_causal(mode):
    def attention_causal(q, k, v, T_q, T_k):
        B, H, Nq, D = q.shape
        Nk = k.shape[2]
        q3, k3, v3 = (x.reshape(B * H, -1, D).contiguous() for x in (q, k, v))
        o3 = torch.empty_like(q3)
        lse = torch.empty(B * H, Nq, device=q.device, dtype=torch.float32)
        grid = (triton.cdiv(Nq, T_q), B * H)
        visits = torch.zeros(B * H, grid[0], 2, device=q.device, dtype=torch.int32)
        _wrong_causal_kernel[grid](q3, k3, v3, o3, lse, visits, Nq, Nk, q3.stride(0), q3.stride(1), k3.stride(0),
                                   k3.stride(1), D ** -0.5 * SOLUTIONS.LOG2E, D=D, T_Q=T_q, T_K=T_k,
                                   PRECISION=SOLUTIONS.precision(q.dtype), MODE=mode)
        return o3.reshape(B, H, Nq, D), lse.reshape(B, H, Nq), visits
    return attention_causal


def test_wrong_1_starts_the_running_max_at_zero():
    # Right while a row's max is above about -104 (exp2 of the score minus 0 still a float32), so only the case
    # whose scores all lie near -144 catches it.
    result = ch03.check_causal_kernel(_wrong_causal(5))
    assert result.attempted and not result.passed
    assert "case 'Nq=Nk=20, every score near -144 (a running max that starts at 0 underflows)' fails" \
        in result.message, result.message


def test_wrong_1_loads_every_key_tile():
    # Right output on clean inputs (the masked body hides the future), but it loads the tiles right of the diagonal:
    # only the NaN run sees it.
    result = ch03.check_causal_kernel(_wrong_causal(0))
    assert result.attempted and not result.passed
    assert ("case 'Nq=Nk=40, tiles 16x16' fails: o of query tile 0, with keys and values NaN from key 16 on "
            "(right of its diagonal tile): contains NaN or inf") in result.message


def test_wrong_1_has_no_unmasked_stage():
    # Right output, right loads; the stage counts show that every tile ran the masked body.
    result = ch03.check_causal_kernel(_wrong_causal(1))
    assert ("case 'Nq=Nk=40, tiles 16x16' fails: visits of query tile 1 (unmasked, masked key tiles): "
            "got (0, 2), expected (1, 1)") in result.message


def test_wrong_1_does_not_round_full_stop():
    # Its last unmasked tile may also reach past the keys (an unmasked load): wrong numbers or NaN, either way "o".
    result = ch03.check_causal_kernel(_wrong_causal(2))
    assert "case 'Nq=Nk=40, tiles 16x16' fails: o: " in result.message


def test_wrong_1_stops_one_key_short():
    # Loses a key tile only where the last row's diagonal ends on a tile's first key.
    result = ch03.check_causal_kernel(_wrong_causal(4))
    assert ("case 'Nq=20 < Nk=37, tiles 16x16 (a diagonal that ends on the first key of a key tile)' fails: o: "
            in result.message), result.message


def test_wrong_1_forgets_the_guard():
    # Fine while every row sees a key; NaN as soon as a masked tile holds rows that see none.
    result = ch03.check_causal_kernel(_wrong_causal(3))
    assert "case 'Nq=50 > Nk=20 (queries that see no key), tiles 16x16' fails: o: contains NaN or inf" \
        in result.message


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
def _key_tile_bounds_probe(OUT, n_k, diag, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``OUT[t] = (full_stop, masked_stop)`` of query tile ``t``, from the shipped kernels' own function."""
    t = tl.program_id(0)
    full_stop, masked_stop = key_tile_bounds(t * BLOCK_M, n_k, diag, 0, True, BLOCK_M, BLOCK_N)
    tl.store(OUT + 2 * t, full_stop)
    tl.store(OUT + 2 * t + 1, masked_stop)


@pytest.mark.parametrize("n_q,n_k,T_q,T_k", [(40, 40, 16, 16), (50, 20, 16, 16), (20, 50, 32, 16), (1, 1, 16, 16),
                                             (64, 64, 32, 16), (40, 72, 16, 32)])
def test_stage_counts_match_the_shipped_kernel_bounds(n_q, n_k, T_q, T_k):
    """The checker's (unmasked, masked) counts are the stages of mta.kernel_parts.key_tile_bounds, run in a kernel
    (not a second copy of its formula)."""
    tiles = -(-n_q // T_q)
    out = torch.zeros(2 * tiles, dtype=torch.int32, device=mta.runtime.DEVICE)
    _key_tile_bounds_probe[(tiles,)](out, n_k, n_k - n_q, BLOCK_M=T_q, BLOCK_N=T_k)
    bounds = out.cpu().view(tiles, 2).tolist()
    want = [(full_stop // T_k, -(-max(masked_stop - full_stop, 0) // T_k)) for full_stop, masked_stop in bounds]
    assert [tuple(r) for r in ch03.stage_counts(n_q, n_k, T_q, T_k).tolist()] == want
