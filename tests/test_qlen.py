"""workbench.qlen: the power-of-two limitation (aiter #2720) — fault emulation, padding, probe, speculative decoding.

What must hold, and is checked here:

* the emulated fault is real: for every non-power-of-two query length it returns position 0's output
  at every position (and that differs from the golden); for powers of two it is exact;
* padding to the next power of two leaves every real row's output unchanged, for every query length
  and both placements, on the golden, on the fault backend and on the Triton kernel;
* speculative decoding of the tiny MLA model is lossless on a correct backend for every k in 1..15,
  is NOT lossless on the fault backend exactly when k + 1 is not a power of two (with inflated
  acceptance), and padded verification restores losslessness for every k in 1..15;
* probe classifications, CLI exit codes, and a clear error for every bad input.

Long runs use the fp32 golden ("torch"); the Triton interpreter runs only a small probe and a short
speculative run.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

import workbench  # noqa: F401  (sets TRITON_INTERPRET on CPU before kernels import)
from mla_cases import offsets
from workbench import cli, device, mla, perfmodel, qlen
from workbench.decode_metadata import DecodeMetadata

D = mla.QK_HEAD_DIM
ON_GPU = device.on_gpu()
DEV = device.default_device()
AITER = device.aiter_status().available
FAULT = qlen.FAULT_BACKEND
KS = list(range(1, 16))


# ----------------------------------------------------------------------------------------------
# fixtures: a flat cache with permuted rows, NaN in every row nobody owns, row 0 reserved
# ----------------------------------------------------------------------------------------------


def make_case(qo_lens, kv_lens, heads=2, dtype=torch.float32, seed=0):
    """q, a flat cache (unused rows NaN) and its DecodeMetadata; request b owns kv_lens[b] random rows."""
    g = torch.Generator().manual_seed(seed)
    total_kv = sum(kv_lens)
    num_rows = 1 + total_kv + 5
    cache = torch.full((num_rows, D), float("nan"))
    rows = 1 + torch.randperm(num_rows - 1, generator=g)[:total_kv]
    cache[rows] = torch.randn(total_kv, D, generator=g)
    q = torch.randn(sum(qo_lens), heads, D, generator=g)
    md = DecodeMetadata(qo_indptr=offsets(qo_lens).to(DEV), kv_indptr=offsets(kv_lens).to(DEV),
                        kv_indices=rows.to(torch.int32).to(DEV),
                        kv_last_page_lens=torch.ones(len(qo_lens), dtype=torch.int32, device=DEV),
                        max_qo_len=max(qo_lens))
    return q.to(dtype).to(DEV), cache.to(dtype).to(DEV), md


def golden(q, cache, md, scale=0.1):
    return mla.mla_decode_ref(q, cache, md.qo_indptr, md.kv_indptr, md.kv_indices, scale)


# ----------------------------------------------------------------------------------------------
# 1. powers of two
# ----------------------------------------------------------------------------------------------


def test_pow2_helpers_match_a_plain_loop():
    pows = {1 << i for i in range(12)}
    for n in range(1, 2049):
        assert qlen.is_pow2(n) == (n in pows)
        assert qlen.next_pow2(n) == min(p for p in pows if p >= n)
    assert qlen.safe_num_spec_tokens(15) == [k for k in range(1, 16) if k + 1 in pows] == [1, 3, 7, 15]
    assert qlen.safe_num_spec_tokens(0) == [] and qlen.safe_num_spec_tokens(2) == [1]


@pytest.mark.parametrize("fn,arg", [(qlen.is_pow2, 0), (qlen.next_pow2, -3), (qlen.next_pow2, 2.5),
                                    (qlen.is_pow2, True), (qlen.safe_num_spec_tokens, -1)])
def test_pow2_helpers_refuse_bad_input(fn, arg):
    with pytest.raises(ValueError, match="must be an int >="):
        fn(arg)


# ----------------------------------------------------------------------------------------------
# 2. the emulated fault
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("s_q", range(1, 17))
def test_fault_broadcasts_position_0_exactly_when_qlen_is_not_a_power_of_two(s_q):
    q, cache, md = make_case([s_q, s_q, s_q], [s_q, s_q + 9, 40], seed=s_q)
    gold, gold_lse = golden(q, cache, md)
    res = qlen.decode(q, cache, md, sm_scale=0.1, backend=FAULT)
    assert res.backend == FAULT and "emulated aiter #2720" in res.reason
    if qlen.is_pow2(s_q):
        torch.testing.assert_close(res.out, gold, rtol=0, atol=0)
        assert "exact" in res.reason
        return
    per_req = res.out.view(3, s_q, 2, -1)
    for b in range(3):  # every position of request b holds request b's golden position-0 row
        for i in range(s_q):
            torch.testing.assert_close(per_req[b, i], gold[b * s_q], rtol=0, atol=0)
            torch.testing.assert_close(res.lse.view(3, s_q, 2)[b, i], gold_lse[b * s_q], rtol=0, atol=0)
    assert (res.out - gold).abs().max() > 0.1  # the fault is real: positions 1.. differ from the golden
    assert "broadcast" in res.reason


def test_fault_over_triton_inner_and_uniform_rule():
    q, cache, md = make_case([3, 3], [5, 20], dtype=torch.float32, seed=3)
    res = qlen.mla_decode_pow2_fault(q, cache, md, sm_scale=0.1, inner="triton")
    gold, _ = golden(q, cache, md)
    torch.testing.assert_close(res.out.view(2, 3, 2, -1)[:, 2], gold.view(2, 3, 2, -1)[:, 0], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="inner is 'aiter'"):
        qlen.mla_decode_pow2_fault(q, cache, md, inner="aiter")
    q2, cache2, md2 = make_case([2, 3], [5, 20])
    with pytest.raises(ValueError, match="same query length"):
        qlen.decode(q2, cache2, md2, backend=FAULT)


def test_decode_refuses_unknown_backend_and_names_aiter_reason():
    q, cache, md = make_case([1], [4])
    with pytest.raises(ValueError, match="backend is 'flash'"):
        qlen.decode(q, cache, md, backend="flash")
    if not AITER:
        with pytest.raises(qlen.BackendUnavailable, match="ROCm"):
            qlen.decode(q, cache, md, backend="aiter")


# ----------------------------------------------------------------------------------------------
# 3. padding to the next power of two
# ----------------------------------------------------------------------------------------------

# (qo_lens, kv_lens): uniform and ragged query lengths, minimal and long KV, one request or several
PAD_SCENARIOS = {
    "qlen3_uniform": ([3, 3], [7, 30]),
    "qlen6_reported_case": ([6, 6, 6], [8, 6 + 13, 50]),
    "qlen5_minimal_kv": ([5], [5]),  # kv_len < 8: front impossible, auto chooses back
    "ragged_1_2_7": ([1, 2, 7], [9, 2, 33]),
    "qlen9_to_16": ([9, 9], [16, 41]),
    "qlen15": ([15], [15 + 2]),
    "already_pow2_qlen8": ([8, 8], [8, 20]),
    "single_token": ([1, 1], [1, 3]),
}


def _check_windows_preserved(pq, md):
    """Spec of the invariant: real row i of request b sees keys 0 .. s_k - s_q + i, before and after."""
    qo, kv = md.qo_indptr.tolist(), md.kv_indptr.tolist()
    kv2 = pq.metadata.kv_indptr.tolist()
    P = pq.pad_len
    for b in range(md.num_reqs):
        s_q, s_k = qo[b + 1] - qo[b], kv[b + 1] - kv[b]
        s_k2 = kv2[b + 1] - kv2[b]
        for i in range(s_q):
            row = int(pq.real_rows[qo[b] + i]) - b * P  # position within the padded request
            assert s_k2 - P + row == s_k - s_q + i  # last visible key unchanged
        own = md.kv_indices[kv[b]:kv[b + 1]]
        assert torch.equal(pq.metadata.kv_indices[kv2[b]:kv2[b] + s_k], own)  # real keys unchanged, in order


@pytest.mark.parametrize("placement", ["auto", "front", "back"])
@pytest.mark.parametrize("name", list(PAD_SCENARIOS))
def test_padding_keeps_every_real_row_exact(name, placement):
    qo, kv = PAD_SCENARIOS[name]
    q, cache, md = make_case(qo, kv, seed=len(name))
    P = qlen.next_pow2(max(qo))
    if placement == "front" and min(kv) < P:
        with pytest.raises(ValueError, match="placement='back'"):
            qlen.pad_queries_to_pow2(q, md, placement=placement)
        return
    pq = qlen.pad_queries_to_pow2(q, md, placement=placement)
    assert pq.pad_len == P == pq.metadata.max_qo_len and pq.q.shape[0] == md.num_reqs * P
    assert pq.extra_rows == md.num_reqs * P - sum(qo)
    assert (pq.metadata.qo_indptr[1:] - pq.metadata.qo_indptr[:-1]).tolist() == [P] * md.num_reqs
    _check_windows_preserved(pq, md)
    gold, gold_lse = golden(q, cache, md)
    for backend in ("torch", FAULT):  # padded to a power of two, the fault backend is exact
        res = qlen.decode(pq.q, cache, pq.metadata, sm_scale=0.1, backend=backend)
        torch.testing.assert_close(pq.unpad(res.out), gold, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(pq.unpad(res.lse), gold_lse, atol=1e-5, rtol=1e-5)
        assert not torch.isnan(res.out).any()  # pad rows read only real keys too


@pytest.mark.parametrize("s_q", range(1, 17))
def test_padded_fault_backend_is_exact_for_every_qlen(s_q):
    q, cache, md = make_case([s_q, s_q], [s_q, s_q + 17], seed=100 + s_q)
    gold, _ = golden(q, cache, md)
    res = qlen.decode(q, cache, md, sm_scale=0.1, backend=FAULT, pad_to_pow2=True)
    torch.testing.assert_close(res.out, gold, atol=1e-5, rtol=1e-5)
    assert "padded" in res.reason


def test_padding_on_the_triton_kernel():
    q, cache, md = make_case([5, 5], [5, 26], dtype=torch.float16, seed=9)
    gold, _ = golden(q, cache, md)
    res = qlen.decode(q, cache, md, sm_scale=0.1, backend="triton", pad_to_pow2=True)
    assert res.backend == "triton"
    assert (res.out.float() - gold).abs().max() < 5e-3  # fp16 rounding of a 512-wide average


def test_naive_padding_without_extra_keys_moves_the_windows():
    """Why placement matters: appending pad rows *without* extra keys shifts every real row's window left."""
    q, cache, md = make_case([6], [20], seed=4)
    gold, _ = golden(q, cache, md)
    naive_q = torch.cat([q, q[-1:].expand(2, -1, -1)])
    naive_md = DecodeMetadata(torch.tensor([0, 8], dtype=torch.int32, device=md.kv_indptr.device), md.kv_indptr,
                              md.kv_indices,
                              md.kv_last_page_lens, 8)
    naive, _ = golden(naive_q, cache, naive_md)
    assert (naive[:6] - gold).abs().max() > 0.1


def test_padding_refuses_bad_input():
    q, cache, md = make_case([3], [4])
    with pytest.raises(ValueError, match="placement is 'middle'"):
        qlen.pad_queries_to_pow2(q, md, placement="middle")
    with pytest.raises(ValueError, match="qo_indptr"):
        qlen.pad_queries_to_pow2(q[:2], md)
    pq = qlen.pad_queries_to_pow2(q, md)
    with pytest.raises(ValueError, match="pass its output"):
        pq.unpad(q)
    with pytest.raises(TypeError, match="metadata must be a DecodeMetadata"):
        qlen.pad_queries_to_pow2(q, {"qo_indptr": md.qo_indptr})
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        qlen.pad_queries_to_pow2(q.tolist(), md)


@pytest.mark.parametrize("pad", [False, True])
def test_kv_len_below_qo_len_is_refused_naming_the_request(pad):
    # issue #32: a request with more queries than keys got an unrelated error from the padding (an empty key list
    # expanded) or one about the padded call's numbers; now the rule, naming the request, as the decode states it.
    q, cache, md = make_case([2, 3], [4, 2])
    with pytest.raises(ValueError, match=r"request 1 has qo_len 3 but kv_len 2; a request with query tokens needs "
                                         r"kv_len >= qo_len"):
        if pad:
            qlen.decode(q, cache, md, sm_scale=0.1, backend="torch", pad_to_pow2=True)
        else:
            qlen.pad_queries_to_pow2(q, md)
    q, cache, md = make_case([1, 2], [3, 0])  # no keys at all under 2 queries
    with pytest.raises(ValueError, match="request 1 has qo_len 2 but kv_len 0"):
        qlen.pad_queries_to_pow2(q, md, placement="back")


@pytest.mark.parametrize("backend", ["torch", FAULT, "triton"])
def test_padding_an_empty_batch(backend):
    # issue #32: an empty batch is valid decode input; padded, it is an empty call (pad_len 1) with empty results.
    q = torch.empty(0, 2, D, dtype=torch.float32, device=DEV)
    cache = torch.full((4, D), float("nan"), device=DEV)
    zero = torch.zeros(1, dtype=torch.int32, device=DEV)
    md = DecodeMetadata(qo_indptr=zero, kv_indptr=zero.clone(), kv_indices=torch.zeros(0, dtype=torch.int32,
                                                                                       device=DEV),
                        kv_last_page_lens=torch.ones(0, dtype=torch.int32, device=DEV), max_qo_len=1)
    pq = qlen.pad_queries_to_pow2(q, md)
    assert (pq.query_len, pq.pad_len, pq.placements, pq.extra_rows) == (0, 1, [], 0)
    assert pq.q.shape == (0, 2, D) and pq.metadata.qo_indptr.tolist() == [0] and pq.metadata.num_reqs == 0
    res = qlen.decode(q, cache, md, sm_scale=0.1, backend=backend, pad_to_pow2=True)
    assert res.out.shape == (0, 2, mla.KV_LORA_RANK) and res.lse.shape == (0, 2)


def test_padding_leaves_requests_without_queries_out():
    # A request with no query tokens (any kv_len, 0 included) is valid decode input with no output rows: the padded
    # call leaves it out ("none"), and the real rows of the others are exact.
    q, cache, md = make_case([0, 3, 0, 5], [7, 4, 0, 9], seed=8)
    pq = qlen.pad_queries_to_pow2(q, md)
    assert pq.placements == ["none", "back", "none", "front"] and pq.pad_len == 8
    assert pq.metadata.num_reqs == 2 and pq.q.shape[0] == 16 and pq.metadata.kv_last_page_lens.tolist() == [1, 1]
    gold, gold_lse = golden(q, cache, md)
    for backend in ("torch", FAULT):
        res = qlen.decode(q, cache, md, sm_scale=0.1, backend=backend, pad_to_pow2=True)
        torch.testing.assert_close(res.out, gold, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(res.lse, gold_lse, atol=1e-5, rtol=1e-5)
    q, cache, md = make_case([0, 0], [3, 0])  # no queries at all: an empty padded call
    pq = qlen.pad_queries_to_pow2(q, md)
    assert pq.q.shape[0] == 0 and pq.placements == ["none", "none"] and pq.metadata.kv_indptr.tolist() == [0]


# ----------------------------------------------------------------------------------------------
# 4. the probe
# ----------------------------------------------------------------------------------------------


def test_classify_output_spec():
    g = torch.randn(6, 2, 8, generator=torch.Generator().manual_seed(0))
    bcast = g.view(2, 3, 2, 8)[:, :1].expand(-1, 3, -1, -1).reshape(6, 2, 8)
    assert qlen.classify_output(g, g, 1e-5, 2)[0] == "ok"
    assert qlen.classify_output(bcast, g, 1e-5, 2)[0] == "broadcast-fault"
    assert qlen.classify_output(g + 0.5, g, 1e-5, 2)[0] == "wrong"
    nan = g.clone()
    nan[0, 0, 0] = float("nan")
    assert qlen.classify_output(nan, g, 1e-5, 2)[0] == "wrong"
    assert qlen.classify_output(g[:2] + 1, g[:2], 1e-5, 2)[0] == "wrong"  # qlen 1 cannot be a broadcast fault
    with pytest.raises(ValueError, match="must match"):
        qlen.classify_output(g[:4], g, 1e-5, 2)


def test_probe_torch_and_fault_classifications():
    ok = qlen.probe_qlen("torch", heads=2)
    assert ok.all_ok and [r.qlen for r in ok.rows] == list(range(1, 17))
    fault = qlen.probe_qlen(FAULT, heads=2)
    assert fault.backend_ran == FAULT and "emulation" in fault.reason
    for r in fault.rows:
        expected = "ok" if qlen.is_pow2(r.qlen) else "broadcast-fault"
        assert r.verdict == expected, r
        assert r.pow2 == qlen.is_pow2(r.qlen)
    assert fault.faulty_qlens == [3, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15]
    assert "NOT ok at qlen [3, 5" in str(fault)
    d = json.loads(fault.to_json())
    assert d["rows"][2]["verdict"] == "broadcast-fault" and d["kv_lens"] == [40, 63]


def _reject_constant(name):
    raise ValueError(f"{name} is not JSON")


def test_probe_report_json_is_strict():
    # issue #32: a NaN output gives max_err NaN; JSON has no NaN, so to_json writes null (and parses strictly).
    row = qlen.ProbeRow(3, False, float("nan"), float("inf"), 1e-3, "wrong", 0.5)
    rep = qlen.ProbeReport("torch", "torch", "why", 2, [40], "float32", "cpu", [row])
    text = rep.to_json()
    d = json.loads(text, parse_constant=_reject_constant)
    assert d["rows"][0]["max_err"] is None and d["rows"][0]["max_err_broadcast"] is None
    assert d["rows"][0]["tol"] == 1e-3 and d["rows"][0]["verdict"] == "wrong"
    assert json.dumps(d, allow_nan=False)
    assert rep.to_dict()["rows"][0]["max_err"] != rep.to_dict()["rows"][0]["max_err"]  # to_dict keeps the NaN


def test_probe_triton_small():
    rep = qlen.probe_qlen("triton", qlens=[1, 3, 6, 8], heads=2, kv_len=20,
                          dtype=None if ON_GPU else torch.float16)
    assert rep.backend_ran == "triton" and rep.all_ok, str(rep)
    assert all(r.max_err_broadcast > 10 * r.tol for r in rep.rows if r.qlen > 1)  # positions really differ


@pytest.mark.parametrize("kwargs,match", [
    (dict(backend="flash"), "backend is 'flash'"),
    (dict(backend="torch", qlens=[]), "qlens is empty"),
    (dict(backend="torch", qlens=[17]), "in 1..16"),
    (dict(backend="torch", qlens=[0]), "in 1..16"),
    (dict(backend="torch", qlens=[8], kv_len=4), "kv_len is 4"),
    (dict(backend="torch", heads=0), "heads is 0"),
])
def test_probe_refuses_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        qlen.probe_qlen(**kwargs)


@pytest.mark.skipif(AITER, reason="aiter is available here: the probe runs it live instead")
def test_probe_aiter_says_why_not():
    with pytest.raises(qlen.BackendUnavailable, match="ROCm"):
        qlen.probe_qlen("aiter")


@pytest.mark.parametrize("text,expected", [("1-16", list(range(1, 17))), ("3,6,8", [3, 6, 8]),
                                           ("1-3, 6,2", [1, 2, 3, 6])])
def test_parse_qlens(text, expected):
    assert qlen.parse_qlens(text) == expected


@pytest.mark.parametrize("text", ["", "a", "5-2", "0-3", "1-17"])
def test_parse_qlens_refuses(text):
    with pytest.raises(ValueError, match="qlens"):
        qlen.parse_qlens(text)


# ----------------------------------------------------------------------------------------------
# 5. the CLI
# ----------------------------------------------------------------------------------------------


def test_cli_exit_codes(capsys):
    assert cli.main(["probe-qlen", "--backend", "torch", "--qlens", "1-4", "--heads", "2"]) == 0
    assert "all ok" in capsys.readouterr().out
    assert cli.main(["probe-qlen", "--backend", FAULT, "--qlens", "5,6,8", "--heads", "2", "--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert [r["verdict"] for r in d["rows"]] == ["broadcast-fault", "broadcast-fault", "ok"]
    assert cli.main(["probe-qlen", "--backend", "torch", "--qlens", "0-3"]) == 2
    assert "qlens '0-3'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["probe-qlen", "--backend", "flash"])
    assert exc.value.code == 2
    if not AITER:
        assert cli.main(["probe-qlen", "--backend", "aiter"]) == 2
        assert "runs only on ROCm" in capsys.readouterr().err


def test_cli_probe_qlen_allocation_failure_exits_3(monkeypatch, capsys):
    # issue #32: an allocation that fails (here the probe's cache: torch.full raises as the allocator does) used to
    # escape with a traceback and exit 1, the code of a negative verdict. Now one line on stderr and exit 3.
    from workbench.qlen import probe

    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                                     "92233720368 bytes.\nError code 12 (Cannot allocate memory)")

    monkeypatch.setattr(probe.torch, "full", no_memory)
    assert cli.main(["probe-qlen", "--backend", "torch", "--qlens", "1", "--heads", "2"]) == 3
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ("workbench probe-qlen: unexpected error: OutOfMemoryError: DefaultCPUAllocator: can't "
                            "allocate memory: you tried to allocate 92233720368 bytes. Error code 12 (Cannot "
                            "allocate memory)\n")


@pytest.mark.parametrize("exc", [RuntimeError("boom\nsecond line"), KeyError("x"), ZeroDivisionError("z")])
def test_cli_catches_unexpected_exceptions(monkeypatch, capsys, exc):
    # Any exception other than bad input (ValueError/TypeError: exit 2): one line, exit 3, no traceback.
    from workbench import device as dev_module

    def broken():
        raise exc

    monkeypatch.setattr(dev_module, "describe", broken)
    assert cli.main(["info"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"workbench info: unexpected error: {type(exc).__name__}: ")
    monkeypatch.setattr(dev_module, "describe", lambda: (_ for _ in ()).throw(ValueError("bad")))
    assert cli.main(["info"]) == 2 and "workbench info: error: bad" in capsys.readouterr().err


def test_cli_results_json_is_strict(monkeypatch, capsys):
    # A bar that was not measured has the value NaN; `workbench results --json` writes it as null.
    from workbench.bench import results

    row = results.BarRow("decode", "1 x 4k: <= 2 us", "not measured", float("nan"), "MISS")
    monkeypatch.setattr(results, "committed_bars", lambda device: ([row], ["provenance line"]))
    assert cli.main(["results", "--json"]) == 0
    d = json.loads(capsys.readouterr().out, parse_constant=_reject_constant)
    assert d["bars"][0]["value"] is None and d["provenance"] == ["provenance line"]


# ----------------------------------------------------------------------------------------------
# 6. the tiny model and speculative decoding
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model():
    return qlen.TinyMLA()


@pytest.fixture(scope="module")
def sweeps(model):
    """k = 1..15 on the correct backend, on the fault backend, and on the fault backend padded."""
    return {
        "correct": qlen.sweep_k(KS, backend="torch", model=model),
        "faulty": qlen.sweep_k(KS, backend=FAULT, model=model),
        "padded": qlen.sweep_k(KS, backend=FAULT, pad_to_pow2=True, model=model),
    }


def test_frozen_forward_is_the_targets_token_local_path(model):
    """The draft's token-local pass, given the target's attention outputs, reproduces the target exactly."""
    state = model.new_state(2, 32)
    toks = torch.tensor([[3, 9, 4], [7, 7, 1]], device=model.device)
    for t in range(3):
        out = model.forward(state, [0, 1], toks[:, t:t + 1])
        for r in (0, 1):
            state.seq_lens[r] += 1
    pos = torch.tensor(state.seq_lens, device=model.device) - 1
    h = model.forward_frozen(toks[:, 2], pos, [a[:, 0] for a in out.attn])
    torch.testing.assert_close(h, out.hidden[:, 0], atol=1e-5, rtol=1e-5)
    assert torch.isfinite(out.logits).all()


def test_under_the_fault_every_verified_position_sees_position_0s_context(model):
    """The mechanism of the inflated acceptance: with the fault, position i of a non-power-of-two verification
    computes exactly the frozen-context draft's function of its own token (position 0's attention everywhere)."""
    state = model.new_state(1, 32)
    for t in [5, 2, 8, 1]:
        model.forward(state, [0], torch.tensor([[t]], device=model.device))
        state.seq_lens[0] += 1
    verify = torch.tensor([[6, 11, 0, 6, 30, 2]], device=model.device)  # qlen 6
    faulty = model.forward(state, [0], verify, backend=FAULT)
    correct = model.forward(state, [0], verify, backend="torch")
    frozen = [a[:, 0] for a in faulty.attn]
    for i in range(1, 6):
        h = model.forward_frozen(verify[:, i], torch.tensor([4 + i], device=model.device), frozen)
        torch.testing.assert_close(faulty.hidden[:, i], h, atol=1e-5, rtol=1e-5)
        assert (correct.hidden[:, i] - h).abs().max() > 1e-2
    torch.testing.assert_close(faulty.hidden[:, 0], correct.hidden[:, 0], atol=1e-6, rtol=1e-6)


def test_reference_is_computed_correctly_even_on_the_fault_backend(model):
    """Plain greedy decoding only ever calls the decode with qlen 1 = 2^0: the fault never fires."""
    prompts = qlen.default_prompts()
    torch_ref, margin = qlen.greedy_decode(model, prompts, 40, backend="torch")
    fault_ref, _ = qlen.greedy_decode(model, prompts, 40, backend=FAULT)
    assert torch_ref == fault_ref and all(len(t) == 40 for t in torch_ref)
    assert margin > 1e-4  # far from a tie: fp32 reordering (~1e-6) cannot flip a choice


def test_correct_backend_is_lossless_for_every_k(sweeps):
    for rep in sweeps["correct"]:
        assert rep.lossless, rep.summary()
        assert rep.raise_if_lossy() is rep
        counts = rep.run.accepted_per_pos
        assert all(a >= b for a, b in zip(counts, counts[1:]))  # acceptance is a prefix: non-increasing
        assert rep.run.num_drafts > 0 and len(counts) == rep.run.k


def test_fault_breaks_losslessness_exactly_when_k_plus_1_is_not_a_power_of_two(sweeps):
    for rep in sweeps["faulty"]:
        k = rep.run.k
        if qlen.is_pow2(k + 1):
            assert rep.lossless, rep.summary()
            assert rep.run.tokens == next(r for r in sweeps["correct"] if r.run.k == k).run.tokens
        else:
            div = rep.first_divergence
            assert div is not None and not rep.lossless, rep.summary()
            assert rep.reference[div.request][div.index] == div.expected != div.got
            assert rep.reference[div.request][:div.index] == rep.run.tokens[div.request][:div.index]
            with pytest.raises(qlen.LossyDecoding, match=f"k={k} .* diverges from greedy decoding"):
                rep.raise_if_lossy()


def test_fault_inflates_acceptance(sweeps):
    """Every non-power-of-two k: the faulty target accepts more (mean acceptance length), and from position 2 on
    its per-position rates exceed the correct ones; the k = 5 case of aiter #2720 in particular."""
    for bad, good in zip(sweeps["faulty"], sweeps["correct"]):
        k = bad.run.k
        if qlen.is_pow2(k + 1):
            continue
        assert bad.run.mean_acceptance_length > good.run.mean_acceptance_length, (k, bad.summary(), good.summary())
        assert all(b > g for b, g in zip(bad.run.acceptance_rates[1:], good.run.acceptance_rates[1:])), k


def test_padded_verification_is_lossless_for_every_k(sweeps):
    for rep, good in zip(sweeps["padded"], sweeps["correct"]):
        assert rep.lossless, rep.summary()
        assert qlen.is_pow2(rep.run.call_qlen) and rep.run.call_qlen == qlen.next_pow2(rep.run.k + 1)
        assert rep.run.accepted_per_pos == good.run.accepted_per_pos  # same drafts, same verdicts


def test_ngram_draft_also_loses_losslessness_under_the_fault(model):
    assert qlen.check_lossless(5, backend="torch", draft="ngram", model=model).lossless
    assert not qlen.check_lossless(5, backend=FAULT, draft="ngram", model=model).lossless
    assert qlen.check_lossless(5, backend=FAULT, pad_to_pow2=True, draft="ngram", model=model).lossless


def test_triton_backend_speculative_run_is_lossless():
    """The Triton path end to end (interpreter on CPU: a short run)."""
    cfg = qlen.TinyMLAConfig(num_heads=2, dtype=torch.float16 if not ON_GPU else torch.float32)
    m = qlen.TinyMLA(cfg)
    prompts = qlen.default_prompts(num_prompts=2, prompt_len=5)
    rep = qlen.check_lossless(2, backend="triton", model=m, prompts=prompts, max_new_tokens=6)
    assert rep.lossless, rep.summary()
    ref_torch, _ = qlen.greedy_decode(m, prompts, 6, backend="torch")
    assert rep.reference == ref_torch  # the fp16 kernel makes the same choices as the fp32 golden here


def test_vllm_log_line_and_statistics(sweeps):
    run = next(r for r in sweeps["faulty"] if r.run.k == 5).run
    line = run.vllm_log_line()
    m = re.search(r"Mean acceptance length: ([\d.]+), Accepted: (\d+) tokens, Drafted: (\d+) tokens, "
                  r"Per-position acceptance rate: ([\d., ]+), Avg Draft acceptance rate: ([\d.]+)%", line)
    assert m, line
    rates = [float(x) for x in m.group(4).split(", ")]
    assert len(rates) == 5 and int(m.group(2)) == run.num_accepted_tokens == sum(run.accepted_per_pos)
    assert int(m.group(3)) == 5 * run.num_drafts
    assert abs(run.mean_acceptance_length - (1 + sum(run.acceptance_rates))) < 1e-12  # vLLM's identity
    assert abs(float(m.group(1)) - run.mean_acceptance_length) < 0.006


@pytest.mark.parametrize("kwargs,match", [
    (dict(k=0), "k is 0"),
    (dict(k=16), "k \\+ 1 = 17"),
    (dict(k=2, draft="medusa"), "draft is 'medusa'"),
    (dict(k=2, backend="flash"), "backend is 'flash'"),
    (dict(k=2, prompts=[]), "prompts is empty"),
    (dict(k=2, prompts=[[1, 64]]), "0..63"),
    (dict(k=2, prompts=[[]]), "prompts\\[0\\] is empty"),
    (dict(k=2, max_new_tokens=0), "max_new_tokens is 0"),
])
def test_speculative_decode_refuses_bad_input(model, kwargs, match):
    kwargs = {"prompts": [[1, 2, 3]], "max_new_tokens": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        qlen.speculative_decode(model, **kwargs)


def test_model_refuses_overflowing_cache(model):
    state = model.new_state(1, 16)
    with pytest.raises(ValueError, match="make new_state"):
        model.forward(state, [0], torch.zeros(1, 17, dtype=torch.long, device=model.device))
    with pytest.raises(ValueError, match="one row per request"):
        model.forward(state, [0, 1], torch.zeros(1, 2, dtype=torch.long, device=model.device))


# ----------------------------------------------------------------------------------------------
# 7. guidance and the sweep table
# ----------------------------------------------------------------------------------------------


def test_guidance_rules():
    rows = qlen.guidance(15)
    assert [r.k for r in rows] == KS
    for r in rows:
        assert r.qlen == r.k + 1 and r.padded_qlen == qlen.next_pow2(r.qlen)
        assert (r.advice == "safe as is") == qlen.is_pow2(r.qlen)
        assert r.fp8_ok == (r.qlen <= qlen.FP8_MAX_QLEN)
        assert qlen.is_pow2(r.safe_k_below + 1) and r.safe_k_below <= r.k
        assert r.extra_rows_pct == pytest.approx(100 * (r.padded_qlen - r.qlen) / r.qlen)
    md = qlen.format_guidance(rows, markdown=True)
    assert md.count("\n") == 16 and "pad to 8 (+2 rows) or use k=3" in md
    with pytest.raises(ValueError, match="k \\+ 1 <= 16"):
        qlen.guidance(16)


def test_format_sweep_lists_every_k(sweeps):
    text = qlen.format_sweep(sweeps["faulty"])
    assert len(text.splitlines()) == 16
    assert "diverges" in text.splitlines()[5] and "lossless" in text.splitlines()[7]  # k = 5, k = 7


# ----------------------------------------------------------------------------------------------
# 8. figures and the cost model
# ----------------------------------------------------------------------------------------------


def test_figures_build(sweeps, vq):
    groups = {"correct": sweeps["correct"], "faulty": sweeps["faulty"], "padded": sweeps["padded"]}
    fig = vq.acceptance_figure(groups)
    assert len(fig.data) == 3 * len(KS) and len(fig.layout.updatemenus[0].buttons) == len(KS)
    assert sum(t.visible for t in fig.data) == 3 and "k = 5" in fig.layout.title.text
    assert vq.acceptance_length_figure(groups).data[1].marker.symbol[4] == "x"  # k = 5 faulty: lossy
    with pytest.raises(ValueError, match="same k values"):
        vq.acceptance_figure({"a": sweeps["correct"], "b": sweeps["faulty"][:3]})
    with pytest.raises(ValueError, match="k is 99"):
        vq.acceptance_figure(groups, k=99)
    probe = qlen.probe_qlen(FAULT, qlens=[1, 2, 3], heads=2)
    heat = vq.probe_figure([probe])
    assert list(heat.data[0].z[0]) == [0, 0, 1]
    with pytest.raises(ValueError, match="reports is empty"):
        vq.probe_figure([])


def test_padding_cost_model_uses_perfmodel(vq):
    rows = perfmodel.padding_cost_rows(KS, heads=16, batch=64, context=4096, hardware="H200")
    for r in rows:
        b0 = perfmodel.mla_decode_bytes(16, 64, 4096, r["qlen"])
        b1 = perfmodel.mla_decode_bytes(16, 64, 4096, r["padded_qlen"])
        assert r["bytes_pct"] == pytest.approx(100 * (b1 / b0 - 1))
        assert r["extra_rows"] == 64 * (r["padded_qlen"] - r["qlen"])
        if qlen.is_pow2(r["qlen"]):
            assert r["bytes_pct"] == r["time_pct"] == 0
        else:
            assert 0 < r["bytes_pct"] < 5  # nearly no extra bytes: the KV read dominates
        if r["bound"] == r["padded_bound"] == "memory":
            assert r["time_pct"] == pytest.approx(r["bytes_pct"])  # memory-bound: time follows bytes
    assert len(vq.padding_cost_figure().data) == 6
    with pytest.raises(ValueError, match="hardware is 'TPU'"):
        perfmodel.padding_cost_rows(hardware="TPU")


def test_measured_padding_overhead_reads_only_measured_pairs(tmp_path, vq):
    rows, note = perfmodel.measured_padding_overhead(tmp_path / "missing.json")
    assert rows == [] and "not in the repository" in note
    payload = {"provenance": {"device": "NVIDIA H200", "date_utc": "2026-01-01"}, "results": [
        dict(heads=16, batch=64, context=4096, qlen=q, triton_us=us)
        for q, us in [(1, 10.0), (6, 12.0), (8, 12.6), (4, 11.0)]
    ] + [dict(heads=16, batch=16, context=4096, qlen=6, triton_us=5.0)]}  # no qlen 8 partner: not reported
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(payload))
    rows, note = perfmodel.measured_padding_overhead(path)
    assert len(rows) == 1 and rows[0]["qlen"] == 6 and rows[0]["padded_qlen"] == 8
    assert rows[0]["overhead_pct"] == pytest.approx(5.0)
    assert "NVIDIA H200" in note and "1 measured" in note
    assert rows[0]["model_pct"] == perfmodel.padding_cost_rows([5], heads=16, batch=64, context=4096)[0]["time_pct"]
    assert "model_measured_pct" not in rows[0]  # no ceilings in this file: no measured-ceiling model
    payload["ceilings"] = {"read_only": {"gb_s": 3000.0}, "matmul_bf16": {"tflops": 600.0}}
    path.write_text(json.dumps(payload))
    rows, _ = perfmodel.measured_padding_overhead(path)
    hw = perfmodel.Hardware("measured", "", 0, 3.0, 600.0, "test")
    expected = perfmodel.padding_cost_rows([5], heads=16, batch=64, context=4096, hardware=hw)[0]["time_pct"]
    assert rows[0]["model_measured_pct"] == expected
    fig = vq.measured_padding_figure(rows, note)
    assert [t.name for t in fig.data] == ["measured (workbench kernel)", "roofline, measured ceilings",
                                          "roofline, H200 datasheet"]
    with pytest.raises(ValueError, match="rows is empty"):
        vq.measured_padding_figure([])


def test_committed_h200_padding_measurement_if_present():
    """The committed benchmark, when present, yields only real (qlen, next power of two) pairs."""
    rows, note = perfmodel.measured_padding_overhead()
    if not (perfmodel.DATA_DIR / "bench_decode_h200.json").exists():
        assert rows == [] and "not in the repository" in note
        return
    assert rows, note
    for r in rows:
        assert not qlen.is_pow2(r["qlen"]) and r["padded_qlen"] == qlen.next_pow2(r["qlen"])
        assert r["padded_us"] > 0 and r["us"] > 0
