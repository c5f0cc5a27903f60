"""Conformance of workbench.blocksize with a REAL vLLM (the ``.venv-vllm`` environment).

The main environment stays light; ``scripts/vllm_env.sh`` (called by ``scripts/test.sh``) makes a
separate cached environment with a real vLLM (0.33.0) on the CPU torch. This module generates cases here
(hypothesis, deterministic), ships them as JSON to one subprocess under that environment's Python
(``workbench.blocksize.ask_real_vllm``), which answers with vLLM's own
``vllm.v1.worker.utils.select_common_block_size`` (stand-in backend classes whose
``get_supported_kernel_block_sizes`` return real ``vllm`` ``MultipleOf`` objects) and with its real
backend classes, and compares the answers exactly.

The only skip: the vLLM environment could not be created (the reason is stated).
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from workbench import blocksize as bs
from workbench.blocksize import MultipleOf

pytestmark = pytest.mark.vllm

MIN_GENERATED_CASES = 500

# Declarations that changed between vLLM v0.20.0 (the catalog's "0.20") and the vLLM in .venv-vllm.
# Each one is checked too: if the real class stops differing, the test says so.
_CHANGED_0_32 = {
    "FLEX_ATTENTION": "%16",
    "CPU_ATTN": "%32",
    "FLASHMLA_SPARSE": "%64",
    "ROCM_AITER_MLA_SPARSE": "1, %16",
}
CHANGED_AFTER_0_20 = {"0.32.0": _CHANGED_0_32, "0.33.0": _CHANGED_0_32}
# Installed versions that have a catalog table of their own (workbench.blocksize.declarations).
CATALOG_OF = {"0.33.0": "0.33"}
# Backends of the story that must import on CPU for the catalog check to mean something.
MUST_READ = ("ROCM_AITER_MLA", "ROCM_AITER_TRITON_MLA", "ROCM_ATTN", "ROCM_AITER_FA", "TRITON_ATTN", "TRITON_MLA",
             "FLASH_ATTN", "FLASHMLA")


# ---- generated cases ---------------------------------------------------------------------------

known_entry = st.one_of(
    st.sampled_from([16, 32, 1, 2, 3, 4, 6, 8, 12, 24, 48, 64, 96, 128, 256]),
    st.sampled_from([16, 1, 2, 3, 4, 8, 32, 48, 64, 128]).map(lambda b: {"multiple_of": b}),
)
unknown_entry = st.sampled_from([{"float": 16.0}, {"float": 1.5}, "16", "%16", None])


@st.composite
def case_strategy(draw):
    """One call: a manager block size and 1-4 backends; in about one case of six, one entry of an unknown type."""
    n = draw(st.one_of(st.sampled_from([16, 1, 2, 3, 32, 48, 64, 96, 128, 192, 256, 384, 768, 960, 1024]),
                       st.integers(1, 1100)))
    backends = draw(st.lists(st.lists(known_entry, min_size=1, max_size=4), min_size=1, max_size=4))
    if draw(st.sampled_from([False, False, False, False, False, True])):
        i = draw(st.integers(0, len(backends) - 1))
        backends[i].insert(draw(st.integers(0, len(backends[i]))), draw(unknown_entry))
    return {"op": "select", "n": n, "backends": backends}


def generate_cases() -> list[dict]:
    """At least MIN_GENERATED_CASES distinct cases, the same on every run (derandomized)."""
    seen: dict[str, dict] = {}

    @settings(max_examples=800, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=case_strategy())
    def collect(case):
        seen.setdefault(json.dumps(case, sort_keys=True), case)

    collect()
    return list(seen.values())


def decode(e):
    if isinstance(e, dict):
        return MultipleOf(e["multiple_of"]) if "multiple_of" in e else float(e["float"])
    return e


def ours(n, backends) -> dict:
    try:
        return {"value": bs.select_common_block_size(n, backends)}
    except ValueError as exc:
        return {"error": type(exc).__name__, "message": str(exc), "block_size_error": isinstance(exc, bs.BlockSizeError)}


def assert_same(n, mine: dict, real: dict, *, compare_listing: bool, context) -> None:
    """Same value, or the same error: vLLM's message must open ours (modulo vLLM's later wording)."""
    if "value" in real:
        assert mine == {"value": real["value"]}, context
        return
    assert "error" in mine, (context, mine, real)
    assert real["error"] == "ValueError" and mine["error"] in ("ValueError", "BlockSizeError"), (context, real)
    theirs, text = real["message"], mine["message"]
    head = f"No common block size for {n}"
    if theirs.startswith(head):
        # v0.20 wrote "No common block size for 16. "; later releases append "(A: [...]; B: [...])."
        assert theirs[len(head)] in " .", (context, theirs)
        assert mine["block_size_error"] and text.startswith(head + ". "), (context, text)
        if compare_listing and "(" in theirs:
            listing = theirs[theirs.index("("):theirs.rindex(")") + 1]
            assert text[len(head) + 2:].startswith(listing), (context, text, theirs)
    else:
        assert theirs.startswith("Unknown supported size: "), (context, theirs)
        assert text == theirs or text.startswith(theirs + " "), (context, text, theirs)


# ---- one trip to the real vLLM for the whole module ---------------------------------------------

def pairs_for_real_classes():
    cat = bs.catalog("0.20")
    targets = sorted(n for n, b in cat.items() if b.kind == "mla")
    drafts = sorted(n for n, b in cat.items() if b.kind == "full")
    return [(t, d, n) for t in targets for d in drafts for n in (1, 16, 64, 128)]


PR_SCENARIOS = [  # (n, names, override) -> the pre-PR failure, the post-PR answer, --block-size 1
    (16, ["ROCM_AITER_MLA", "ROCM_ATTN"], {"ROCM_AITER_MLA": [1]}),
    (16, ["ROCM_AITER_MLA", "ROCM_ATTN"], {}),
    (16, ["ROCM_AITER_MLA"], {"ROCM_AITER_MLA": [1]}),
    (16, ["ROCM_AITER_MLA"], {}),
    (1, ["ROCM_AITER_MLA", "ROCM_ATTN"], {}),
    (1, ["ROCM_AITER_MLA", "ROCM_ATTN"], {"ROCM_AITER_MLA": [1]}),
    (64, ["ROCM_AITER_MLA", "ROCM_AITER_FA"], {"ROCM_AITER_MLA": [1]}),
]


@pytest.fixture(scope="module")
def real(vllm_env_python):
    cases = generate_cases()
    names = sorted(set(bs.catalog("0.20")) | set(bs.catalog(bs.VLLM_VERSIONS[-1])))
    pairs = pairs_for_real_classes()
    requests = (cases
                + [{"op": "read", "names": names}, {"op": "reader"}]
                + [{"op": "select_real", "n": n, "names": [t, d]} for t, d, n in pairs]
                + [{"op": "select_real", "n": n, "names": nm, "override": ov} for n, nm, ov in PR_SCENARIOS])
    answers = bs.ask_real_vllm(requests)
    assert len(answers) == len(requests)
    i = len(cases)
    return {
        "python": vllm_env_python, "cases": cases, "select": answers[:i], "read": answers[i], "reader": answers[i + 1],
        "pairs": pairs, "select_real": answers[i + 2:i + 2 + len(pairs)], "pr": answers[i + 2 + len(pairs):],
    }


def test_generated_cases_match_real_select_common_block_size(real):
    cases, answers = real["cases"], real["select"]
    assert len(cases) >= MIN_GENERATED_CASES
    kinds = {"value": 0, "no_common": 0, "unknown": 0}
    for case, answer in zip(cases, answers):
        backends = [[decode(e) for e in entries] for entries in case["backends"]]
        assert_same(case["n"], ours(case["n"], backends), answer, compare_listing=True, context=case)
        kinds["value" if "value" in answer else
              "no_common" if answer["message"].startswith("No common") else "unknown"] += 1
    # The generator must exercise every outcome, or the comparison above proves little.
    assert kinds["value"] >= 100 and kinds["no_common"] >= 50 and kinds["unknown"] >= 20, kinds


def test_catalog_0_20_matches_the_real_classes(real):
    read = real["read"]
    version = read["version"]
    assert version in CHANGED_AFTER_0_20, (
        f"vLLM {version} in {real['python']}: list how its declarations differ from v0.20.0 in CHANGED_AFTER_0_20")
    changed = CHANGED_AFTER_0_20[version]
    cat = bs.catalog("0.20")
    missing = [n for n in MUST_READ if n not in read["sizes"]]
    assert not missing, {n: read["failures"].get(n) for n in missing}
    assert len(read["sizes"]) >= 14, read["failures"]
    for name, encoded in read["sizes"].items():
        if name not in cat:
            continue  # new after v0.20.0: test_catalog_of_the_installed_version_matches_its_classes
        got = [decode(e) for e in encoded]
        want = bs.parse_sizes(changed[name]) if name in changed else list(cat[name].sizes)
        assert got == want, (name, got, want, "catalog 0.20" if name not in changed else "CHANGED_AFTER_0_20")
    unread_changes = [n for n in changed if n not in read["sizes"]]
    assert not unread_changes, {n: read["failures"].get(n) for n in unread_changes}


def test_preferred_block_size_matches_the_real_classes(real):
    """Without --block-size, vLLM asks the first attention layer's backend: get_preferred_block_size(16)."""
    read = real["read"]
    cat = bs.catalog(CATALOG_OF.get(read["version"], "0.20"))
    compared = 0
    for name, encoded in read["sizes"].items():
        if name not in cat:
            continue
        model = dataclasses.replace(cat[name], sizes=tuple(decode(e) for e in encoded))  # the installed declaration
        assert read["preferred"][name] == bs.preferred_block_size(model), name
        compared += 1
    assert compared >= 14 and read["preferred"]["ROCM_AITER_MLA"] == 16 and read["preferred"]["FLASHMLA"] == 64


def test_catalog_of_the_installed_version_matches_its_classes(real):
    """The catalog table of the installed release (e.g. "0.33" for vLLM 0.33.0) row by row against its classes.

    A class that does not import on this CPU machine (needs CUDA or ROCm at import) must say in its note that
    its row was read from the source; every other row must equal what the class declares.
    """
    version = real["read"]["version"]
    if version not in CATALOG_OF:
        pytest.fail(f"vLLM {version} has no catalog table: add one to workbench.blocksize.declarations "
                    f"(read its classes, as the 0.33 table was) and to CATALOG_OF")
    cat = bs.catalog(CATALOG_OF[version])
    installed = {**real["reader"]["sizes"], **real["read"]["sizes"]}  # either reading (import order varies)
    from_source = []
    for name, backend in cat.items():
        if name in installed:
            assert [decode(e) for e in installed[name]] == list(backend.sizes), name
        else:
            assert "read from the source" in backend.note, (name, real["read"]["failures"].get(name))
            from_source.append(name)
    assert len(from_source) <= 6, from_source
    readable = set(real["reader"]["sizes"])
    assert readable <= set(cat), sorted(readable - set(cat))  # nothing the installed vLLM declares is missing
    for name in ("ROCM_AITER_MLA", "ROCM_AITER_TRITON_MLA"):
        assert cat[name].sizes_text == "%1", name
    # The answer of the story is the same with the installed catalog: Eagle3 on AITER MLA at 16.
    report = bs.check_spec_decode("ROCM_AITER_MLA", "ROCM_ATTN", 16, CATALOG_OF[version])
    assert report.compatible and report.kernel_block_size == 16


def test_installed_catalog_reads_the_conformance_environment_from_here(real):
    """``catalog("installed")`` (``workbench check --vllm installed``) in a process without vLLM reads the
    conformance environment's classes: the same declarations as the reader run there."""
    from workbench import device

    if device.vllm_status().available:
        pytest.skip("this process imports vLLM itself: the in-process reader is what it uses")
    bs.read_installed_backends.cache_clear()
    try:
        cat = bs.catalog("installed")
        reading = bs.read_installed_backends()
    finally:
        bs.read_installed_backends.cache_clear()
    assert reading.available and reading.vllm_version == real["reader"]["version"]
    # which classes import on CPU depends on what the process imported before, so compare what both read
    declared = {**real["reader"]["sizes"], **real["read"]["sizes"]}
    assert cat and set(cat) <= set(declared), sorted(set(cat) - set(declared))
    for name, backend in cat.items():
        assert list(backend.sizes) == [decode(e) for e in declared[name]], name
    assert all(reason for reason in reading.failures.values())
    assert cat["ROCM_AITER_MLA"].sizes_text == "%1" and cat["ROCM_AITER_MLA"].kind == "mla"
    report = bs.check_spec_decode("ROCM_AITER_MLA", "ROCM_ATTN", 16, "installed")
    assert report.compatible and report.kernel_block_size == 16


def test_installed_reader_reads_what_the_classes_declare(real):
    reader, read = real["reader"], real["read"]
    assert reader["available"] and reader["version"] == read["version"]
    for name, encoded in read["sizes"].items():
        assert reader["sizes"][name] == encoded, name
    # Backends that cannot be read on CPU are reported with a reason, never a crash.
    assert reader["failures"] and all(reason for reason in reader["failures"].values())
    assert set(reader["sizes"]).isdisjoint(reader["failures"])


def test_real_classes_pairwise_match_the_model(real):
    installed = {n: [decode(e) for e in enc] for n, enc in real["read"]["sizes"].items()}
    compared = 0
    for (t, d, n), answer in zip(real["pairs"], real["select_real"]):
        if t not in installed or d not in installed:
            assert "error" in answer  # the class does not import here; vLLM's call failed for that reason
            continue
        assert_same(n, ours(n, [installed[t], installed[d]]), answer, compare_listing=False, context=(t, d, n))
        compared += 1
    assert compared >= 100


def test_pre_pr_failure_reproduced_with_the_real_classes(real):
    answers = dict(zip(range(len(PR_SCENARIOS)), real["pr"]))
    # Overriding the AITER MLA declaration with [1] (what it was before PR #39616) brings the failure back ...
    assert answers[0]["message"].startswith("No common block size for 16")
    assert_same(16, ours(16, [bs.get_backend("ROCM_AITER_MLA", "0.19"), bs.get_backend("ROCM_ATTN", "0.19")]),
                answers[0], compare_listing=True, context="pre-PR")
    # ... and the real, post-PR classes agree on 16.
    assert answers[1] == {"value": 16}
    assert bs.check_spec_decode("ROCM_AITER_MLA", "ROCM_ATTN", 16, "0.20").kernel_block_size == 16
    # Alone, pre-PR AITER MLA ran with kernel block 1; post-PR it keeps the manager's 16.
    assert answers[2] == {"value": 1} and answers[3] == {"value": 16}
    # --block-size 1 with an Eagle3 draft fails before and after.
    assert answers[4]["message"].startswith("No common block size for 1") and answers[5]["message"].startswith(
        "No common block size for 1")
    assert not bs.check_spec_decode("ROCM_AITER_MLA", "ROCM_ATTN", 1, "0.20").compatible
    assert_same(64, ours(64, [bs.get_backend("ROCM_AITER_MLA", "0.19"), [16, 32]]), answers[6],
                compare_listing=False, context="pre-PR with AITER FA")
