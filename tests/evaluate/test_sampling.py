"""Rejection sampling at T > 0 preserves the target's distribution (statistical test).

Constructed case: vocabulary of 4, a Markov target p(x_t | x_{t-1}) and a
different Markov draft q(x_t | x_{t-1}) (the draft conditions on its own
samples, as DSpark's Markov head does), blocks of n = 3. 40,000 sequences of
3 tokens are decoded speculatively, in batch, round after round; the 64
possible sequences must follow prod_t p(x_t | x_{t-1}). Pearson chi-square
with 63 degrees of freedom at significance level alpha = 0.001, seeded (so
the test is deterministic). A control run with a classic bug (the sampler is
told the draft's distribution without its Markov term, i.e. the wrong q)
must be rejected at the same level: the test has power.
"""

from __future__ import annotations

import itertools

import torch

from pipeline.evaluate.sampling import rejection_sample

ALPHA = 0.001
V, N_DRAFT, LENGTH, NUM = 4, 3, 3, 40_000


def chi_square_sf(stat: float, dof: int) -> float:
    """P(X >= stat) for X ~ chi-square(dof): the regularized upper incomplete gamma."""
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), torch.tensor(stat / 2.0)))


def _chains(seed: int):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(V, V, generator=g) * 1.5, -1)  # target p[prev] -> next
    q = torch.softmax(torch.randn(V, V, generator=g) * 1.5, -1)  # draft q[prev] -> next
    return p, q


def speculative_sequences(p, q, *, told_q, seed: int) -> torch.Tensor:
    """(NUM, LENGTH) tokens decoded with rejection sampling, starting after token 0."""
    g = torch.Generator().manual_seed(seed)
    cap = LENGTH + N_DRAFT + 1
    out = torch.zeros(NUM, cap, dtype=torch.long)
    lens = torch.zeros(NUM, dtype=torch.long)
    last = torch.zeros(NUM, dtype=torch.long)  # the prompt's last token
    rows = torch.arange(NUM)
    while int(lens.min()) < LENGTH:
        prev, drafted, told = last, [], []
        for _ in range(N_DRAFT):
            tok = torch.multinomial(q[prev], 1, generator=g).squeeze(-1)
            drafted.append(tok)
            told.append(told_q[prev])
            prev = tok
        drafted_t = torch.stack(drafted, 1)  # (NUM, n)
        context = torch.cat([last[:, None], drafted_t], 1)  # token before each position
        verdict = rejection_sample(
            draft_tokens=drafted_t,
            draft_probs=torch.stack(told, 1),
            target_probs=p[context],  # (NUM, n+1, V)
            generator=g,
        )
        emitted = torch.cat([drafted_t, drafted_t[:, :1]], 1)
        emitted[rows, verdict.accepted] = verdict.next_token
        for j in range(N_DRAFT + 1):
            write = (j <= verdict.accepted) & (lens + j < cap)
            out[rows[write], (lens + j)[write]] = emitted[write, j]
        lens = lens + verdict.accepted + 1
        last = out[rows, (lens - 1).clamp(max=cap - 1)]
    return out[:, :LENGTH]


def chi_square_p_value(seqs: torch.Tensor, p: torch.Tensor) -> float:
    counts = torch.zeros(V**LENGTH)
    codes = (seqs * torch.tensor([V**2, V, 1])).sum(-1)
    counts.index_add_(0, codes, torch.ones(len(codes)))
    expected = torch.zeros(V**LENGTH)
    for x in itertools.product(range(V), repeat=LENGTH):
        prob, prev = 1.0, 0
        for tok in x:
            prob *= float(p[prev, tok])
            prev = tok
        expected[x[0] * V**2 + x[1] * V + x[2]] = prob * NUM
    stat = float(((counts - expected) ** 2 / expected).sum())
    return chi_square_sf(stat, V**LENGTH - 1)


def test_chi_square_helper_matches_known_quantiles():
    assert abs(chi_square_sf(3.841, 1) - 0.05) < 1e-3
    assert abs(chi_square_sf(124.84, 99) - 0.04) < 5e-3  # tabulated: 0.04 at ~124.8


def test_rejection_sampling_preserves_the_target_distribution():
    p, q = _chains(0)
    seqs = speculative_sequences(p, q, told_q=q, seed=1)
    assert chi_square_p_value(seqs, p) > ALPHA


def test_wrong_draft_probabilities_are_detected():
    p, q = _chains(0)
    wrong = torch.softmax(torch.zeros(V, V), -1)  # uniform: q without its Markov term
    seqs = speculative_sequences(p, q, told_q=wrong, seed=1)
    assert chi_square_p_value(seqs, p) < ALPHA


def test_greedy_limit_accepts_exactly_the_matching_prefix():
    drafted = torch.tensor([[1, 2, 3], [1, 0, 3]])
    q = torch.nn.functional.one_hot(drafted, V).float()
    target = torch.nn.functional.one_hot(torch.tensor([[1, 2, 3, 0], [1, 2, 3, 0]]), V).float()
    verdict = rejection_sample(draft_tokens=drafted, draft_probs=q, target_probs=target)
    assert verdict.accepted.tolist() == [3, 1]
    assert verdict.next_token.tolist() == [0, 2]  # bonus, then the target's correction


def test_the_verifiers_kv_cache_gives_the_full_forward(trained_target_dir):
    """The live loop feeds each round's anchor and block against a cache cropped to
    the committed prefix: its logits and features equal a full forward's."""
    from pipeline.evaluate.sampling import HFVerifier

    verifier = HFVerifier(str(trained_target_dir), (1, 2))
    ids = torch.randint(4, 200, (40,), generator=torch.Generator().manual_seed(0)).tolist()
    full_logits, full_feats = verifier.forward(ids)
    cache = verifier.new_cache()
    verifier.forward(ids[:20], cache)
    verifier.forward(ids[:20] + [7, 8, 9, 10], cache)  # a drafted block, then rejected
    cache.crop(-4)
    logits, feats = verifier.forward(ids, cache)
    assert logits.shape[0] == feats.shape[0] == 20
    torch.testing.assert_close(logits, full_logits[20:], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(feats, full_feats[20:], atol=1e-4, rtol=1e-4)
    assert cache.get_seq_length() == 40
    verifier.target.close()
