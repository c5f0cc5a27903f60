"""workbench.metadata: the persistent schedule (coverage, balance, merge = golden, refusals), the two
builder designs (CUDA-graph buffers, deterministic interleavings, threaded stress test).

Index work is checked exactly. Attention outputs: the executor and the golden both compute in fp32 and
differ only in summation order and the LSE merge of partials (a few ulps on O(1) values), so they must
agree to 1e-5; NaN anywhere is a failure (unused cache rows are NaN: a stray read cannot hide).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import workbench  # noqa: F401  (sets TRITON_INTERPRET on CPU before kernels import)
from workbench import metadata as M
from workbench import mla

D = mla.QK_HEAD_DIM
TOL = dict(atol=1e-5, rtol=1e-5)


def indptr(lens):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32)


def flat_case(kv_lens, heads=2, seed=0, spare_rows=5):
    """q (one token per request), a NaN-filled cache with permuted rows (row 0 reserved), metadata."""
    g = torch.Generator().manual_seed(seed)
    total = sum(kv_lens)
    cache = torch.full((1 + total + spare_rows, D), float("nan"))
    rows = 1 + torch.randperm(total + spare_rows, generator=g)[:total]
    cache[rows] = torch.randn(total, D, generator=g)
    q = torch.randn(len(kv_lens), heads, D, generator=g)
    md = M.DecodeMetadata(indptr([1] * len(kv_lens)), indptr(kv_lens), rows.to(torch.int32),
                          torch.ones(len(kv_lens), dtype=torch.int32), 1 if kv_lens else 0)
    return q, cache, md


def check_schedule_invariants(s: M.PersistentSchedule, kv_lens):
    """Coverage exactly once, items inside their request, loads within one granule, buffers well formed."""
    kv = indptr(kv_lens).tolist()
    G, N = s.kv_granularity, s.num_units
    covered = torch.zeros(kv[-1], dtype=torch.int32)
    items = s.work_items()
    for it in items:
        r = it.request
        assert kv[r] <= it.kv_start < it.kv_end <= kv[r + 1], it
        assert (it.kv_start - kv[r]) % G == 0, "items start on granule boundaries"
        assert (it.q_start, it.q_end) == (r, r + 1)
        assert it.kv_offset == kv[r + 1] - it.kv_end
        covered[it.kv_start:it.kv_end] += 1
    assert bool((covered == 1).all()), "every KV token is covered exactly once"
    loads = s.unit_loads()
    assert sum(loads) == sum(-(-n // G) for n in kv_lens)
    assert max(loads) - min(loads) <= 1, loads
    # items are contiguous per unit and in request / KV order
    assert [it.unit for it in items] == sorted(it.unit for it in items)
    # buffers: sizes, padding, reduce maps
    assert s.num_work == len(items) <= s.sizes.max_work
    assert bool((s.work_info_set[s.num_work:] == -1).all())
    ptr = s.reduce_indptr.tolist()
    assert ptr[0] == 0 and all(b >= a for a, b in zip(ptr, ptr[1:]))
    assert all(v == ptr[len(kv_lens)] for v in ptr[len(kv_lens):]), "reduce_indptr tail padded with its last value"
    assert s.num_partials == ptr[len(kv_lens)] <= s.sizes.max_partials
    assert bool((s.reduce_partial_map[s.num_partials:] == -1).all())
    slots = sorted(it.partial for it in items if it.partial >= 0)
    assert slots == list(range(s.num_partials)), "each partial slot written by exactly one item"
    pieces = {r: [it for it in items if it.request == r] for r in range(len(kv_lens))}
    for r, its in pieces.items():
        if len(its) > 1:  # split: every piece is a partial, listed in the reduce map in KV order
            assert s.reduce_partial_map[ptr[r]:ptr[r + 1]].tolist() == [it.partial for it in its]
            assert s.reduce_final_map[r].tolist() == [r, r + 1]
        else:
            assert its[0].partial == -1 and ptr[r + 1] == ptr[r]
    assert bool((s.reduce_final_map[len(kv_lens):] == -1).all())


# ----------------------------------------------------------------------------------------------
# the schedule: named batches, then random ones
# ----------------------------------------------------------------------------------------------

BATCHES = {
    "one token": [1],
    "one long request": [1000],
    "granule edges": [15, 16, 17, 32, 33],
    "mixed": [1, 17, 40, 3, 100, 16, 33],
    "many short": [2] * 23,
    "awkward": [113, 203, 1, 239, 7],
}
UNITS = [1, 2, 3, 7, 16, 80]


@pytest.mark.parametrize("units", UNITS)
@pytest.mark.parametrize("name", list(BATCHES))
def test_schedule_named_batches(name, units):
    kv_lens = BATCHES[name]
    q, cache, md = flat_case(kv_lens, seed=len(name) + units)
    s = M.PersistentSchedule.build(md.qo_indptr, md.kv_indptr, units)
    check_schedule_invariants(s, kv_lens)
    out, lse = M.execute_schedule(s, md, q, cache)
    gold_out, gold_lse = mla.mla_decode_ref(q, cache, md.qo_indptr, md.kv_indptr, md.kv_indices)
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out, gold_out, **TOL)
    torch.testing.assert_close(lse, gold_lse, **TOL)


def test_one_long_request_is_split_over_every_unit():
    s = M.PersistentSchedule.build(indptr([1]), indptr([1000]), 7)  # 63 granules over 7 units: 9 each
    assert s.unit_loads() == [9] * 7
    assert s.split_requests() == [0] and s.num_partials == 7


def test_unbalanced_batch_is_balanced_to_one_granule():
    s = M.PersistentSchedule.build(indptr([1] * 5), indptr([16 * 20, 16, 16, 16, 16]), 4)  # 24 granules
    assert s.unit_loads() == [6, 6, 6, 6]


@settings(max_examples=60, deadline=None)
@given(kv_lens=st.lists(st.integers(1, 300), min_size=1, max_size=12), units=st.integers(1, 40),
       granularity=st.sampled_from([1, 7, 16]))
def test_schedule_properties_random(kv_lens, units, granularity):
    s = M.PersistentSchedule.empty(M.persistent_buffer_sizes(len(kv_lens) + 3, units), granularity)
    s.fill_(indptr([1] * len(kv_lens)), indptr(kv_lens))
    check_schedule_invariants(s, kv_lens)


@settings(max_examples=15, deadline=None)
@given(kv_lens=st.lists(st.integers(1, 120), min_size=1, max_size=6), units=st.integers(1, 12),
       seed=st.integers(0, 10**6))
def test_partials_merge_to_golden_random(kv_lens, units, seed):
    q, cache, md = flat_case(kv_lens, heads=2, seed=seed)
    s = M.PersistentSchedule.build(md.qo_indptr, md.kv_indptr, units)
    out, lse = M.execute_schedule(s, md, q, cache)
    gold_out, gold_lse = mla.mla_decode_ref(q, cache, md.qo_indptr, md.kv_indptr, md.kv_indices)
    torch.testing.assert_close(out, gold_out, **TOL)
    torch.testing.assert_close(lse, gold_lse, **TOL)


def test_empty_step_schedules_nothing():
    s = M.PersistentSchedule.build(indptr([]), indptr([]), 4)
    assert s.work_items() == [] and s.unit_loads() == [0, 0, 0, 0] and s.num_partials == 0


def test_refill_reuses_buffers_and_pads():
    s = M.PersistentSchedule.empty(M.persistent_buffer_sizes(6, 3))
    addresses = [t.data_ptr() for t in (s.work_indptr, s.work_info_set, s.reduce_indptr, s.reduce_partial_map)]
    s.fill_(indptr([1] * 6), indptr([50, 1, 1, 1, 1, 90]))
    s.fill_(indptr([1, 1]), indptr([3, 4]))  # a smaller step: nothing of the first may survive
    assert [t.data_ptr() for t in (s.work_indptr, s.work_info_set, s.reduce_indptr, s.reduce_partial_map)] == addresses
    check_schedule_invariants(s, [3, 4])
    assert s.generation == 2


def test_buffer_size_bounds():
    sz = M.persistent_buffer_sizes(10, 4)
    assert (sz.max_work, sz.max_partials) == (13, 6)
    assert M.persistent_buffer_sizes(1, 80).max_partials == 80
    assert M.persistent_buffer_sizes(0, 1).max_partials == 0


# ----------------------------------------------------------------------------------------------
# refusals
# ----------------------------------------------------------------------------------------------


def test_schedule_refuses_qlen_above_one():
    with pytest.raises(ValueError, match=r"query length 4 .*persistent schedule is for query length 1 only.*"
                                         r"sized for one query token.*no persistent kernel"):
        M.PersistentSchedule.build(indptr([4, 4]), indptr([10, 20]), 4)
    with pytest.raises(ValueError, match="max_qo_len is 8; the persistent schedule is for query length 1 only"):
        M.persistent_buffer_sizes(4, 8, max_qo_len=8)


@pytest.mark.parametrize("qo, kv, units, match", [
    ([0, 1, 1], [0, 5, 9], 2, "query length 0 for request 1"),
    ([0, 1, 2], [0, 5, 5], 2, "request 1 0 KV tokens"),
    ([0, 1, 2], [0, 5], 2, "both must be num_reqs"),
    ([1, 2], [0, 5], 2, r"qo_indptr\[0\] is 1"),
    ([0, 1], [0, 5], 0, "num_units must be >= 1"),
])
def test_schedule_refuses_bad_input(qo, kv, units, match):
    with pytest.raises(ValueError, match=match):
        M.PersistentSchedule.build(torch.tensor(qo, dtype=torch.int32), torch.tensor(kv, dtype=torch.int32), units)


def test_schedule_refuses_more_requests_than_sized():
    s = M.PersistentSchedule.empty(M.persistent_buffer_sizes(2, 4))
    with pytest.raises(ValueError, match="3 requests but the buffers were sized for max_num_reqs = 2"):
        s.fill_(indptr([1] * 3), indptr([4, 4, 4]))


def test_executor_refuses_a_schedule_of_another_step():
    q, cache, md = flat_case([30, 40, 50])
    other = M.PersistentSchedule.build(indptr([1] * 3), indptr([31, 40, 50]), 4)
    with pytest.raises(ValueError, match="this schedule was built for another step"):
        M.execute_schedule(other, md, q, cache)
    out, _ = M.execute_schedule(other, md, q, cache, check=False)  # the GPU kernel would not notice ...
    gold, _ = mla.mla_decode_ref(q, cache, md.qo_indptr, md.kv_indptr, md.kv_indices)
    assert not torch.allclose(out, gold, **TOL)  # ... and its output would differ from the golden


def test_executor_refuses_qlen_above_one():
    q, cache, md = flat_case([30, 40])
    s = M.PersistentSchedule.build(md.qo_indptr, md.kv_indptr, 4)
    md2 = M.DecodeMetadata(indptr([2, 2]), md.kv_indptr, md.kv_indices, md.kv_last_page_lens, 2)
    with pytest.raises(ValueError, match="max_qo_len = 2 .*query length 1 only"):
        M.execute_schedule(s, md2, torch.cat([q, q]), cache)


# ----------------------------------------------------------------------------------------------
# builders: CUDA-graph buffers and flags
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scenario():
    return M.make_steps(seed=3)


@pytest.mark.parametrize("design", list(M.DESIGNS))
def test_builder_fills_fixed_buffers_with_padding(design, scenario):
    cache, steps = scenario
    builder = M.DESIGNS[design](max_num_reqs=5, max_num_kv_tokens=400, num_units=4, num_buffer_sets=1)
    bufs = builder.buffer_sets[0]
    addresses = [bufs.kv_indptr.data_ptr(), bufs.kv_indices.data_ptr(), bufs.schedule.work_info_set.data_ptr()]
    for name in ("D", "V", "D"):
        step = steps[name]
        md = builder.build(step.block_table, step.seq_lens, step.query_lens)
        R, total = md.num_reqs, int(md.kv_indptr[-1])
        assert bufs.kv_indptr[R + 1:].tolist() == [total] * (5 - R)
        assert bufs.qo_indptr[R + 1:].tolist() == [int(md.qo_indptr[-1])] * (5 - R)
        assert bool((bufs.kv_indices[total:] == -1).all()) and bool((md.kv_indices >= 0).all())
        assert md.kv_indptr.data_ptr() == bufs.kv_indptr.data_ptr()  # views of the fixed buffers
        builder.release(md)
    assert [bufs.kv_indptr.data_ptr(), bufs.kv_indices.data_ptr(), bufs.schedule.work_info_set.data_ptr()] == addresses


def test_metadata_builder_flag_follows_the_step(scenario):
    cache, steps = scenario
    builder = M.MetadataFlagBuilder()
    flags = {}
    for name in ("D", "V", "N", "D"):
        s = steps[name]
        md = builder.build(s.block_table, s.seq_lens, s.query_lens)
        flags[s.kind] = md.has_persistent_metadata
        assert md.has_persistent_metadata == M.step_supports_persistent(md)
        builder.release(md)
    assert flags == {"decode": True, "verify": False, "none": False}


def test_builder_refuses_when_every_buffer_set_is_in_flight(scenario):
    cache, steps = scenario
    builder = M.MetadataFlagBuilder(num_buffer_sets=2)
    d = steps["D"]
    built = [builder.build(d.block_table, d.seq_lens, d.query_lens) for _ in range(2)]
    with pytest.raises(RuntimeError, match="all 2 buffer sets are held by steps that were built but have not run"):
        builder.build(d.block_table, d.seq_lens, d.query_lens)
    builder.release(built[0])
    builder.build(d.block_table, d.seq_lens, d.query_lens)  # a set is free again


def test_builder_refuses_steps_larger_than_its_buffers(scenario):
    cache, steps = scenario
    d = steps["D"]
    with pytest.raises(ValueError, match="larger max_num_kv_tokens"):
        M.InstanceFlagBuilder(max_num_kv_tokens=10).build(d.block_table, d.seq_lens, d.query_lens)
    with pytest.raises(ValueError, match="persistent_buffer_sizes|max_num_reqs"):
        M.InstanceFlagBuilder(max_num_reqs=2).build(d.block_table, d.seq_lens, d.query_lens)


# ----------------------------------------------------------------------------------------------
# deterministic interleavings: the instance design goes wrong, detected; the metadata design does not
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def replays(scenario):
    cache, steps = scenario
    return M.replay_all(steps, cache)


def runs(events, design):
    found = {e.step: e for e in events if e.action == "run" and e.design == design}
    assert found, f"no run events of design {design!r}"  # never let a selection pass vacuously
    return found


def test_metadata_design_is_right_in_every_interleaving(replays):
    for name, events in replays.items():
        for e in runs(events, "metadata").values():
            assert e.flag == e.truth and e.outcome == "ok", (name, e)


def test_verify_run_after_a_decode_build_is_refused_by_the_schedule(replays):
    v = runs(replays["verify built, decode built, verify runs"], "instance")["V"]
    assert (v.flag, v.truth, v.outcome) == (True, False, "refused")
    assert "query length 1 only" in v.detail


def test_verify_run_after_a_decode_build_without_checks_gives_wrong_output(scenario):
    cache, steps = scenario
    events = M.replay("instance", "verify built, decode built, verify runs", steps, cache, check=False)
    v = runs(events, "instance")["V"]
    assert v.outcome == "output differs"
    ok = runs(M.replay("metadata", "verify built, decode built, verify runs", steps, cache, check=False),
              "metadata")
    assert all(e.outcome == "ok" for e in ok.values())


def test_decode_run_after_a_verify_build_takes_the_slow_path(replays):
    d = runs(replays["decode built, verify built, decode runs"], "instance")["D"]
    assert (d.flag, d.truth, d.outcome) == (False, True, "slow path")


def test_stale_flag_after_a_step_without_decodes_is_refused(replays):
    events = replays["a step without decodes after a decode"]
    build_n = next(e for e in events if e.design == "instance" and e.action == "build" and e.step == "N")
    assert build_n.flag is True and build_n.truth is False  # the stale flag
    n = runs(events, "instance")["N"]
    assert n.outcome == "refused" and "built for another step" in n.detail


def test_in_order_both_designs_agree(replays):
    for design in M.DESIGNS:
        assert all(e.outcome == "ok" for e in runs(replays["in order"], design).values())


def test_replay_refuses_bad_events(scenario):
    cache, steps = scenario
    with pytest.raises(ValueError, match="before it was built"):
        M.replay("metadata", [("run", "D")], steps, cache)
    with pytest.raises(ValueError, match="no interleaving named"):
        M.replay("metadata", "sideways", steps, cache)
    with pytest.raises(ValueError, match="choose one of"):
        M.replay("global", "in order", steps, cache)


# ----------------------------------------------------------------------------------------------
# the threaded stress test (small counts here; the chapter runs 8 threads x 10,000 builds)
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["natural", "barrier"])
def test_stress_metadata_design_has_zero_mismatches(mode):
    r = M.stress_test("metadata", threads=8, builds_per_thread=300, mode=mode, seed=1)
    assert r.builds == 2400 and r.mismatches == 0 and r.wrong_flag == 0


def test_stress_instance_design_goes_wrong_when_forced():
    r = M.stress_test("instance", threads=8, builds_per_thread=300, mode="barrier", seed=1)
    assert r.mismatches > 0 and r.persistent_on_verify > 0
    assert r.wrong_flag == r.persistent_on_verify + r.persistent_on_no_decode + r.skipped_on_decode


def test_stress_instance_design_single_thread_is_deterministic_stale_flags():
    a = M.stress_test("instance", threads=1, builds_per_thread=400, seed=2)
    b = M.stress_test("instance", threads=1, builds_per_thread=400, seed=2)
    assert a.mismatches == b.mismatches == a.persistent_on_no_decode > 0  # only the stale-flag kind, alone
    assert a.persistent_on_verify == a.skipped_on_decode == a.foreign_schedule == 0


def test_stress_table_lists_every_run():
    rs = [M.stress_test(d, threads=2, builds_per_thread=20, seed=0) for d in ("instance", "metadata")]
    table = M.format_stress_table(rs)
    assert "instance flag" in table and "metadata flag" in table and len(table.splitlines()) == 4


# ----------------------------------------------------------------------------------------------
# figures (deterministic, built from the library's data)
# ----------------------------------------------------------------------------------------------


def test_schedule_figure_draws_every_work_item_and_is_deterministic(viz):

    s = M.PersistentSchedule.build(indptr([1] * 7), indptr(BATCHES["mixed"]), 5)
    fig = viz.schedule_figure(s)
    bars = sum(len(t.x) for t in fig.data)
    assert bars == s.num_work and len(fig.data) == 7  # one trace per request
    hatched = sum(p == "/" for t in fig.data for p in t.marker.pattern.shape)
    assert hatched == s.num_partials
    assert fig.to_json() == viz.schedule_figure(s).to_json()


def test_interleaving_figure_has_a_panel_per_interleaving(replays, viz):

    fig = viz.interleaving_figure(replays)
    buttons = fig.layout.updatemenus[0].buttons
    assert [b.label for b in buttons] == list(M.INTERLEAVINGS)
    assert buttons[fig.layout.updatemenus[0].active].label == "verify built, decode built, verify runs"  # 1st failing
    with pytest.raises(ValueError, match="choose one of"):
        viz.interleaving_figure(replays, active="sideways")
    events = sum(len(t.x) for t in fig.data if t.x and t.x[0] is not None)
    assert events == sum(len(v) for v in replays.values())


def test_stress_figure_stacks_the_counts(viz):

    rs = [M.stress_test("instance", threads=1, builds_per_thread=200, seed=2)]
    fig = viz.stress_figure(rs)
    assert sum(t.y[0] for t in fig.data if t.type == "bar") == rs[0].wrong_flag + rs[0].foreign_schedule
