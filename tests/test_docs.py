"""The documentation stands alone and says what the code does.

- every relative Markdown link in README.md points at a file or folder of the repository;
- nothing in the repository cites reference material that lives outside it;
- docs/mta-semantics.md's formulas (forward as F.conv2d/F.pad, backward, decode) agree
  numerically with mta.conv_attention_reference, in float64 on small inputs.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import mta

ROOT = Path(__file__).resolve().parent.parent
SEMANTICS = ROOT / "docs" / "mta-semantics.md"
F64 = torch.float64

# ---------------------------------------------------------------------------------------------
# Links


def markdown_links(text: str) -> list[str]:
    """Targets of the Markdown links ``[text](target)`` and images ``![alt](target)`` in ``text``.

    Fenced code blocks and inline code spans are dropped first: a path in backticks is not a link.
    """
    text = re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", text, flags=re.S | re.M)
    text = re.sub(r"(`+)(?:(?!\1).)+?\1", "", text, flags=re.S)
    targets = re.findall(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text)
    return targets


def is_external(target: str) -> bool:
    return target.startswith(("http://", "https://", "mailto:", "#"))


def test_link_parser_sees_links_and_skips_code():
    text = ("See [a](docs/a.md) and ![img](figures/x.png \"title\"), [web](https://x.org), "
            "`[not](a/link)`.\n```\n[nor](this/one)\n```\n")
    assert markdown_links(text) == ["docs/a.md", "figures/x.png", "https://x.org"]


def test_readme_relative_links_resolve():
    links = [t for t in markdown_links((ROOT / "README.md").read_text(encoding="utf-8")) if not is_external(t)]
    assert "docs/mta-semantics.md" in links, "README.md should link the MTA definition"
    missing = []
    for target in links:
        path = target.split("#", 1)[0].split("?", 1)[0]
        if path and not (ROOT / path).exists():
            missing.append(target)
    assert not missing, f"README.md links to paths that do not exist: {missing}"


def test_semantics_doc_relative_links_resolve():
    links = [t for t in markdown_links(SEMANTICS.read_text(encoding="utf-8")) if not is_external(t)]
    missing = [t for t in links if not (SEMANTICS.parent / t.split("#", 1)[0]).exists()]
    assert not missing, f"docs/mta-semantics.md links to paths that do not exist: {missing}"


# ---------------------------------------------------------------------------------------------
# No citations of material outside the repository

# Built from pieces so that this file does not contain the strings it looks for.
OUTSIDE_CITATIONS = ("shared" + "/mta-semantics.md", ".." + "/shared")
SCANNED = ["README.md", "mta", "notebooks", "tests", "tools", "docs"]
SKIPPED_DIRS = {"__pycache__", ".ipynb_checkpoints", ".pytest_cache"}


def scanned_files():
    for name in SCANNED:
        top = ROOT / name
        paths = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for path in paths:
            rel = path.relative_to(ROOT)
            if SKIPPED_DIRS.intersection(rel.parts) or path.resolve() == Path(__file__).resolve():
                continue
            yield path


def test_no_citation_of_files_outside_the_repository():
    offenders = []
    for path in scanned_files():
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary
        text = data.decode("utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            if any(c in line for c in OUTSIDE_CITATIONS):
                offenders.append(f"{path.relative_to(ROOT)}:{lineno}")
    assert not offenders, ("these cite a file outside the repository; cite docs/mta-semantics.md instead: "
                           + ", ".join(offenders))


# ---------------------------------------------------------------------------------------------
# The formulas of docs/mta-semantics.md, numerically

B, HQ, HKV, N, D, CQ, CK = 2, 4, 2, 7, 8, 3, 5


def test_doc_states_the_conv2d_pad_equivalence():
    text = SEMANTICS.read_text(encoding="utf-8")
    assert "C = F.conv2d(F.pad(S0, (pk, pk, cq - 1, 0)), w[:, None], groups=Hq)" in text
    assert "pk = (ck - 1) // 2" in text
    assert "arxiv.org/abs/2504.00927" in text


def inputs():
    q = torch.randn(B, HQ, N, D, dtype=F64)
    k = torch.randn(B, HKV, N, D, dtype=F64)
    v = torch.randn(B, HKV, N, D, dtype=F64)
    w = 0.2 * torch.randn(HQ, CQ, CK, dtype=F64)
    return q, k, v, w


def forward_as_documented(q, k, v, w, causal, scale):
    """Steps 1-7 of docs/mta-semantics.md, with the F.conv2d/F.pad expression for step 3."""
    G = HQ // HKV
    kx, vx = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)  # query head h reads kv head h // G
    S = scale * q @ kx.transpose(-1, -2)
    future = torch.ones(N, N, dtype=torch.bool).triu(1)  # j > i
    S0 = S.masked_fill(future, 0.0) if causal else S
    pk = (CK - 1) // 2
    C = F.conv2d(F.pad(S0, (pk, pk, CQ - 1, 0)), w[:, None], groups=HQ)
    if causal:
        C = C.masked_fill(future, float("-inf"))
    P = torch.softmax(C, dim=-1)
    return P @ vx, torch.logsumexp(C, dim=-1), dict(S0=S0, P=P, kx=kx, vx=vx, future=future)


@pytest.mark.parametrize("causal", [True, False])
def test_forward_formula_matches_reference(causal):
    q, k, v, w = inputs()
    o, lse, _ = forward_as_documented(q, k, v, w, causal, D ** -0.5)
    o_ref, lse_ref = mta.conv_attention_reference(q, k, v, w, causal=causal, return_lse=True)
    torch.testing.assert_close(o, o_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, lse_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
def test_forward_double_sum_matches_reference(causal):
    # Step 3 as the double sum of the doc, on one batch element and one head.
    q, k, v, w = inputs()
    scale, b, h = 0.37, 1, 3
    _, _, parts = forward_as_documented(q, k, v, w, causal, scale)
    S0, pk = parts["S0"][b, h], (CK - 1) // 2

    def s0(i, j):
        return S0[i, j].item() if 0 <= i < N and 0 <= j < N else 0.0

    C = torch.tensor([[sum(w[h, a, bb].item() * s0(i - (CQ - 1) + a, j - pk + bb)
                           for a in range(CQ) for bb in range(CK))
                       for j in range(N)] for i in range(N)], dtype=F64)
    if causal:
        C = C.masked_fill(parts["future"], float("-inf"))
    _, lse_ref = mta.conv_attention_reference(q, k, v, w, causal=causal, scale=scale, return_lse=True)
    torch.testing.assert_close(torch.logsumexp(C, dim=-1), lse_ref[b, h], rtol=1e-12, atol=1e-12)


def test_identity_kernel_is_plain_causal_attention():
    q, k, v, _ = inputs()
    w = torch.zeros(HQ, CQ, CK, dtype=F64)
    w[:, CQ - 1, (CK - 1) // 2] = 1.0
    torch.testing.assert_close(mta.conv_attention_reference(q, k, v, w, causal=True),
                               mta.naive_attention(q, k, v, causal=True), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("causal", [True, False])
def test_backward_formulas_match_autograd(causal):
    q, k, v, w = inputs()
    scale = D ** -0.5
    G, pk = HQ // HKV, (CK - 1) // 2
    o, _, parts = forward_as_documented(q, k, v, w, causal, scale)
    S0, P, kx, vx, future = parts["S0"], parts["P"], parts["kx"], parts["vx"], parts["future"]
    dO = torch.randn_like(o)

    # 1. through the softmax
    dP = dO @ vx.transpose(-1, -2)
    delta = (dO * o).sum(-1, keepdim=True)
    dC = P * (dP - delta)
    # 2. the transposed convolution, cropped to the unpadded grid ...
    dS0 = F.conv_transpose2d(dC, w[:, None], groups=HQ)[..., CQ - 1:, pk:pk + N]
    # ... which is the double sum of the doc
    dCp = F.pad(dC, (pk, pk, 0, CQ - 1))  # dC[i + (cq-1) - a, j + pk - b], 0 outside
    dS0_sum = sum(w[:, a, b][None, :, None, None] * dCp[..., CQ - 1 - a:CQ - 1 - a + N, 2 * pk - b:2 * pk - b + N]
                  for a in range(CQ) for b in range(CK))
    torch.testing.assert_close(dS0, dS0_sum, rtol=1e-12, atol=1e-12)
    # 3. zero the future
    dS = dS0.masked_fill(future, 0.0) if causal else dS0
    # 4. inputs, dk and dv summed over the query heads of a group
    dq = scale * dS @ kx
    dk = (scale * dS.transpose(-1, -2) @ q).unflatten(1, (HKV, G)).sum(2)
    dv = (P.transpose(-1, -2) @ dO).unflatten(1, (HKV, G)).sum(2)
    # 5. kernel, summed over the batch
    S0p = F.pad(S0, (pk, pk, CQ - 1, 0))
    dw = torch.stack([torch.stack([(dC * S0p[..., a:a + N, b:b + N]).sum((0, 2, 3)) for b in range(CK)], -1)
                      for a in range(CQ)], -2)

    leaves = [t.clone().requires_grad_() for t in (q, k, v, w)]
    mta.conv_attention_reference(*leaves, causal=causal, scale=scale).backward(dO)
    for name, mine, leaf in zip(("dq", "dk", "dv", "dweight"), (dq, dk, dv, dw), leaves):
        torch.testing.assert_close(mine, leaf.grad, rtol=1e-10, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")


def test_decode_rows_are_rows_of_the_full_forward():
    q, k, v, w = inputs()
    L, n = 5, 2  # the first L = 5 of N = 7 tokens, the newest n = 2 need outputs
    full = mta.conv_attention_reference(q[:, :, :L], k[:, :, :L], v[:, :, :L], w)
    # Tokens after L - 1 change nothing in rows up to L - 1 (causality, nothing past L - 1 read).
    longer = mta.conv_attention_reference(q, k, v, w)
    torch.testing.assert_close(longer[:, :, :L], full, rtol=1e-12, atol=1e-12)
    # Row t reads only the queries t - cq + 1 .. t and the keys 0 .. t.
    for t in range(L - n, L):
        lo = max(0, t - CQ + 1)
        # Zero the queries before lo and scramble the keys and values after t: row t must not move.
        q2, k2, v2 = q[:, :, :L].clone(), k[:, :, :L].clone(), v[:, :, :L].clone()
        q2[:, :, :lo] = 0.0
        k2[:, :, t + 1:] = torch.randn_like(k2[:, :, t + 1:])
        v2[:, :, t + 1:] = torch.randn_like(v2[:, :, t + 1:])
        row = mta.conv_attention_reference(q2, k2, v2, w)[:, :, t]
        torch.testing.assert_close(row, full[:, :, t], rtol=1e-12, atol=1e-12)
    # Plain attention (cq = ck = 1, weight 1): bottom-right aligned causal attention of n queries on L keys.
    ones = torch.ones(HQ, 1, 1, dtype=F64)
    plain = mta.conv_attention_reference(q[:, :, :L], k[:, :, :L], v[:, :, :L], ones)
    torch.testing.assert_close(mta.naive_attention(q[:, :, L - n:L], k[:, :, :L], v[:, :, :L], causal=True),
                               plain[:, :, L - n:], rtol=1e-12, atol=1e-12)
