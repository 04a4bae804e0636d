"""Answers with the right numbers by the wrong method fail their checkers: a call of the package's finished
function or of the checker's own answer (under any name), a PyTorch answer where the exercise asks for a Triton
kernel, a whole score matrix built transposed. Each checker's message says which."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import mta
from mta.course.exercises import ch01, ch02, ch03, ch04, ch05, ch06
from mta.online_softmax import merge_states as aliased_merge

NO_KERNEL = "launched no Triton kernel of its own"
FINISHED = "the package's finished version"


def fails(result, *words):
    assert result.attempted and not result.passed, result.message
    for word in words:
        assert word in result.message, result.message


def test_refusing_restores_the_functions_and_keeps_other_errors():
    from mta.course.exercises import CaseFailed, refusing

    q = torch.randn(1, 1, 3, 8)
    before = mta.naive_attention(q, q, q)
    try:
        with refusing({mta.naive_attention: "no"}):
            mta.naive_attention(q, q, q)
    except CaseFailed as failure:
        assert str(failure) == "no"
    else:
        raise AssertionError("the refused call went through")
    assert torch.equal(mta.naive_attention(q, q, q), before)
    try:
        with refusing({mta.naive_attention: "no"}):
            raise RuntimeError("the learner's own error")
    except RuntimeError as error:
        assert str(error) == "the learner's own error"


def test_triton_launches_count_only_kernels_outside_the_package():
    import triton
    import triton.language as tl

    from mta.course.exercises import TritonLaunches

    @triton.jit
    def write_one(X):
        tl.store(X, 1.0)

    x = torch.zeros(1, device=mta.runtime.DEVICE)
    q = torch.randn(1, 1, 4, 16, device=mta.runtime.DEVICE)
    with TritonLaunches() as launches:
        mta.flash_attention(q, q, q)                 # the package's kernels: not the learner's
    assert launches.count == 0
    with TritonLaunches() as launches:
        write_one[(1,)](x)
        write_one[(1,)](x)
    assert launches.count == 2 and x.item() == 1.0


def test_ch01_the_finished_reference():
    fails(ch01.check_causal_attention(lambda q, k, v: mta.naive_attention(q, k, v, causal=True)),
          "mta.naive_attention", FINISHED)


def test_ch02_merge_under_another_name():
    fails(ch02.check_my_merge(lambda a, b: aliased_merge(a, b)), "calls mta.merge_states")


def test_ch02_block_state_through_attention_state():
    fails(ch02.check_block_state(mta.attention_state), "calls mta.attention_state")


def test_ch02_online_attention_through_blocked_attention_or_transposed_scores():
    fails(ch02.check_online_attention(lambda q, k, v, *, block_size, causal=False: mta.blocked_attention(
        q, k, v, block_size=block_size, causal=causal, return_lse=True)), "mta.blocked_attention")

    def transposed(q, k, v, *, block_size, causal=False):
        k, v = (x.repeat_interleave(q.shape[1] // k.shape[1], 1) for x in (k, v))
        st = q.shape[-1] ** -0.5 * k @ q.transpose(-1, -2)     # [.., Nk, Nq]: every score at once
        nq, nk = q.shape[-2], k.shape[-2]
        if causal:
            st = st.masked_fill(torch.ones(nq, nk, dtype=torch.bool).triu(nk - nq + 1).T, float("-inf"))
        lse = torch.logsumexp(st, -2)
        p = torch.exp(st - torch.where(torch.isneginf(lse), 0.0, lse)[..., None, :])
        return p.transpose(-1, -2) @ v, lse
    fails(ch02.check_online_attention(transposed), "never the scores of all keys at once")


def _torch_causal(q, k, v):
    """Bottom-right causal attention and its lse, plainly in PyTorch (0 and -inf for a query with no key)."""
    nq, nk = q.shape[-2], k.shape[-2]
    s = q.float() @ k.float().transpose(-1, -2) * q.shape[-1] ** -0.5
    s = s.masked_fill(torch.ones(nq, nk, dtype=torch.bool, device=q.device).triu(nk - nq + 1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isneginf(lse), 0.0, lse)[..., None])
    return (p @ v.float()).to(q.dtype), lse


def test_ch03_a_pytorch_causal_forward_or_the_checker_s_counts():
    def pytorch(q, k, v, T_q, T_k):
        o, lse = _torch_causal(q, k, v)
        rows = []
        for m0 in range(0, q.shape[2], T_q):           # the stage counts by hand, not by ch03.stage_counts
            diag = k.shape[2] - q.shape[2]
            full = min(max(m0 + diag + 1, 0), k.shape[2]) // T_k * T_k
            masked = min(max(m0 + T_q + diag, 0), k.shape[2])
            rows.append((full // T_k, -(-max(masked - full, 0) // T_k)))
        visits = torch.tensor(rows, dtype=torch.int32).expand(q.shape[0] * q.shape[1], -1, -1)
        return o, lse, visits
    fails(ch03.check_forward_kernel(pytorch), NO_KERNEL)

    def counted_by_the_checker(q, k, v, T_q, T_k):
        o, lse = _torch_causal(q, k, v)
        counts = ch03.stage_counts(q.shape[2], k.shape[2], T_q, T_k)
        return o, lse, counts.expand(q.shape[0] * q.shape[1], -1, -1)
    fails(ch03.check_forward_kernel(counted_by_the_checker), "stage_counts")


def test_ch03_a_pytorch_rowsum():
    fails(ch03.check_rowsum_do_o(lambda o, do: (o.float() * do.float()).sum(-1)), NO_KERNEL)


def test_ch04_the_checker_s_answers():
    def from_convolved(q, k, w, scale):
        C = ch04.convolved_scores(q, k, w, scale)
        E = mta.conv.diagonal_reach(*w.shape)[0]
        out = torch.zeros(q.shape[0], E, dtype=q.dtype)
        for delta in range(E):
            out[delta:, delta] = torch.diagonal(C, -delta)
        return out
    fails(ch04.check_diagonal_scores(from_convolved), "convolved_scores")
    fails(ch04.check_tile_kinds(lambda i0, j0, BM, BN, N, cq, ck: int(ch04.tile_kinds(N, cq, ck, BM, BN)[
        i0 // BM, j0 // BN])), "tile_kinds")


def test_ch04_a_pytorch_fold():
    def fold(k, w):
        pk = (w.shape[1] - 1) // 2
        k_pad = F.pad(k, (0, 0, pk, pk))
        return torch.stack([sum(w[a, b] * k_pad[b:b + k.shape[0]] for b in range(w.shape[1]))
                            for a in range(w.shape[0])])
    fails(ch04.check_fold_keys(fold), NO_KERNEL)


def test_ch05_the_checker_s_partials():
    fails(ch05.check_dw_partials(lambda u, k, ck, block_r: ch05.dw_partials_truth(u.cpu().double(), k.cpu().double(),
                                                                                   ck, block_r).float()),
          "dw_partials_truth")


def test_ch06_a_pytorch_combine_and_the_checker_s_rows():
    def combine(m, l, acc):
        state = mta.empty_state(m.shape[1:], acc.shape[-1], device=m.device)
        for s in range(m.shape[0]):
            state = mta.merge_states(state, mta.AttentionState(m=m[s], l=l[s], acc=acc[s]))
        return mta.finalize_state(state)[0]
    fails(ch06.check_combine(combine), NO_KERNEL)
    fails(ch06.check_mta_decode_rows(lambda qc, k, v, w, lens, n: ch06.mta_rows_truth(qc, k, v, w, lens, n)),
          "mta_rows_truth")

    def whole_prefix(qc, k, v, w, lens, n):
        return torch.cat([mta.conv_attention_reference(qc[b:b + 1, :, :L], k[b:b + 1, :, :L], v[b:b + 1, :, :L],
                                                       w)[:, :, L - n:] for b, L in enumerate(lens)])
    fails(ch06.check_mta_decode_rows(whole_prefix), "mta.conv_attention_reference")


def test_ch06_mta_rows_from_the_whole_prefix_by_hand():
    """All positions' convolved scores, written out (no refused call): the right rows, but [L, L] scores."""
    def whole_prefix(qc, k, v, w, lens, n):
        outs = []
        for b, L in enumerate(lens):
            kb, vb = (x[b, :, :L].repeat_interleave(qc.shape[1] // k.shape[1], 0) for x in (k, v))
            q = torch.nan_to_num(qc[b, :, :L])                       # rows before the window are NaN: unused
            s = qc.shape[-1] ** -0.5 * q @ kb.transpose(-1, -2)      # [Hq, L, L]
            future = torch.ones(L, L, dtype=torch.bool).triu(1)
            cq, ck = w.shape[1:]
            s = F.pad(s.masked_fill(future, 0.0), ((ck - 1) // 2, (ck - 1) // 2, cq - 1, 0))
            c = F.conv2d(s[None], w[:, None], groups=w.shape[0])[0].masked_fill(future, float("-inf"))
            outs.append(torch.softmax(c, -1)[:, L - n:] @ vb)
        return torch.stack(outs)
    fails(ch06.check_mta_decode_rows(whole_prefix), "only the window", "all 30 positions")


def test_ch06_mta_rows_walking_every_position():
    """Every position's row from its own cq queries, one position at a time: the kept rows are right (their
    windows hold no NaN), but the walk multiplies the query rows before the window."""
    def walk(qc, k, v, w, lens, n):
        Hq, D = qc.shape[1], qc.shape[-1]
        cq, ck = w.shape[1:]
        pk = (ck - 1) // 2
        outs = []
        for b, L in enumerate(lens):
            kb, vb = (x[b, :, :L].repeat_interleave(Hq // k.shape[1], 0) for x in (k, v))
            keys = torch.arange(L)
            rows = []
            for t in range(L):
                pos = torch.arange(t - cq + 1, t + 1)
                q = torch.where((pos >= 0)[:, None], qc[b][:, pos.clamp_min(0)], 0.0)      # [Hq, cq, D]
                s = (D ** -0.5 * q @ kb.transpose(-1, -2)).masked_fill(keys > pos[:, None], 0.0)
                c = F.conv2d(F.pad(s, (pk, pk))[None], w[:, None], groups=Hq)[0]          # [Hq, 1, L]
                rows.append(torch.softmax(c.masked_fill(keys > t, float("-inf")), -1) @ vb)
            outs.append(torch.cat(rows, 1)[:, L - n:])
        return torch.stack(outs)
    fails(ch06.check_mta_decode_rows(walk), "gave NaN", "walking every position")
