"""Every number in README.md, docs/measurements.md and results/diagnostics/README.md comes from a results
record (harness/docs.py says what counts): found, at the precision shown, among the values of the records its
paragraph names (``<!-- numbers: RECORD: KEY -->``), derived from recorded numbers of its paragraph, or written
by ``python -m harness.docs write`` into a generated block. An invented number, or a record changed under an
unchanged text, fails.

Run alone: ``python -m pytest -q tests/test_doc_numbers.py``; ``python -m harness.docs check`` lists the same."""

import json
import pathlib

import pytest

from harness import docs


def test_every_number_of_the_docs_has_a_record():
    found = docs.unrecorded(docs.DOCS)
    assert not found, (f"{len(found)} numbers in the docs have no results record: {docs.FIX} "
                       "(python -m harness.docs check lists them):\n" + docs.report(found))


def test_generated_blocks_are_what_the_records_make():
    assert docs.stale(docs.DOCS) == [], "run: python -m harness.docs write"


def test_the_headline_compares_t_fixup_with_baselines_only():
    """T-Fixup's variants (its arch with flags, e.g. tfixup_zb) are the method under test: README's headline
    table, T-Fixup against each baseline, has no row for them (README's own paragraph reports them)."""
    from tfixup import methods

    block = docs.block_headline(docs.REPO / "results", docs.REPO)
    labels = {line.split("|")[1].strip() for line in block.splitlines()[2:]}
    assert labels and not labels & {m.label for n, m in methods.METHODS.items() if methods.is_tfixup(n)}


def test_a_headline_ratio_short_of_its_seeds_says_so(tmp_path):
    """The lr column's ratio of a method whose best lr has fewer seeds than the study plans says how many it has."""
    bench = tmp_path / "bench"
    bench.mkdir()
    method = {"best_lr_seeds": [1], "grid_closed": True, "lr_range": [5e-4, 1e-3], "best_valid_mean": 8.2}
    (bench / "lr.json").write_text(json.dumps({
        "runs_recorded": 3, "config": {"seeds": [1, 2], "n_runs": 4},
        "parts": {"translation": {"methods": {"tfixup": {**method, "best_lr_seeds": [1, 2]}, "dyt_matched": method,
                                                         "rezero": {**method, "best_lr_seeds": [1, 2]}},
                                  "versus": {"dyt_matched": {"ratio_mean": 0.5}, "rezero": {"ratio_mean": 0.6}}}}}))
    rows = {line.split("|")[1].strip(): line.split("|")[4].strip()
            for line in docs.block_headline(tmp_path, tmp_path).splitlines()[2:]}
    assert rows["DyT"] == "0.50x (1 of 2 seeds)" and rows["ReZero"] == "0.60x", rows


# ---------------------------------------------------------------- the rules, on a doc and records of a test's own


@pytest.fixture
def repo(tmp_path):
    """A repository with one study report, its run records and a doc."""
    bench = tmp_path / "results" / "bench"
    (bench / "toy" / "runs").mkdir(parents=True)
    for i in (1, 2, 3):
        (bench / "toy" / "runs" / f"r{i}.json").write_text(json.dumps({"id": f"r{i}", "wall_s": 600.0 + i}))
    (bench / "toy.json").write_text(json.dumps({
        "runs_recorded": 3, "config": {"n_runs": 5, "lr": 0.0005},
        "rows": [{"best": 8.2237, "ppl_loss": 5.266, "ratio": 0.4375}, {"best": 7.0912}],
        "oracle_ppl": 176.65, "unk": 0.0191, "n_params": 876032, "stuck": "0/3",
        "command": "fairseq-train d --lr 5e-4 --warmup-init-lr 1e-7"}))
    return tmp_path


SOURCE = "<!-- numbers: bench/toy.json; bench/toy/runs/*.json -->"


def check(repo, text, source=SOURCE):
    """The numbers of TEXT the records do not hold, each of its paragraphs naming SOURCE."""
    text = "\n\n".join(p.rstrip("\n") + ("\n" + source if source else "") for p in text.split("\n\n"))
    (repo / "doc.md").write_text(text + "\n")
    return [n.text for n, _, _ in docs.unrecorded(["doc.md"], repo)]


def test_a_number_matches_a_record_at_the_precision_it_shows(repo):
    assert check(repo, "best 8.22 and 8.224 and 8.2 bits; ratio 0.44x\n") == []
    assert check(repo, "best 8.23 bits\n") == ["8.23"]
    # 176.65 shows as 176.7 (half up, and as Python formats it), not 176.6
    assert check(repo, "fit on valid 176.7\n") == []
    assert check(repo, "fit on valid 176.6\n") == ["176.6"]


def test_units_percent_millions_minutes_and_perplexity(repo):
    assert check(repo, "1.91 % unknown; 0.88M parameters; 10.0-10.1 min each; perplexity 38.5\n") == []
    assert check(repo, "0.87M parameters\n") == ["0.87M"]
    # a time matches only a record of time: 0.4375 is no duration
    assert check(repo, "it took 10 min 2 s\n") == []
    assert check(repo, "it took 0.44 s\n") == ["0.44 s"]


def test_counts_of_runs_are_a_studys(repo):
    assert check(repo, "PARTIAL (3 of 5 runs), 0/3 stuck\n") == []
    assert check(repo, "PARTIAL (31 of 50 runs)\n") == ["31 of 50 runs"]


def test_a_difference_or_ratio_of_recorded_numbers_of_its_paragraph(repo):
    derived = SOURCE.replace(" -->", "; derived -->")
    assert check(repo, "8.22 against 7.09: 1.13 lower\n", derived) == []
    assert check(repo, "8.22 against 7.09.\n\nLater: 1.13 lower\n", derived) == ["1.13"]  # another paragraph
    assert check(repo, "8.22 against 7.09: 1.13 lower\n") == ["1.13"]  # its source does not say derived


def test_exemptions_are_code_dates_versions_sections_sizes_and_the_papers_constants(repo):
    text = ("On 2026-11-24 at 13:41 (torch 2.13.0, Python 3.8-3.12, fairseq 0.12), paper §3.2, Table 2, Fig. 4b,\n"
            "Huang et al., 2020; 128-256-4 models; 0.67 N^-1/4 and (9N)^-1/4 with P = 4000; IWSLT'14.\n\n"
            "    fairseq-train --lr 123.456\n\n`--max-tokens 777` and [a link](results/x-999.md)\n")
    assert check(repo, text) == []
    assert check(repo, "lr 5e-4, from 1e-7; 3e-4\n") == ["3e-4"]  # flags' values in a record's command count
    # a code span may wrap onto the next line of its paragraph, as Markdown's do; a blank line ends it
    assert check(repo, "run `python x.py --jobs 1\n--threads 3` now\n") == []
    assert check(repo, "a ` tick\n\nthen 3e-4 and ` another\n") == ["3e-4"]


def test_a_generated_block_is_written_from_the_records_and_not_checked(repo):
    doc = repo / "docs" / "m.md"
    doc.parent.mkdir()
    doc.write_text("Intro.\n\n<!-- generated: python -m harness.docs write (studies) -->\nold 999\n"
                   "<!-- end generated -->\n\nEnd.\n")
    assert docs.stale(["docs/m.md"], repo) == ["docs/m.md"]
    assert docs.write(["docs/m.md"], repo) == ["docs/m.md"]
    text = doc.read_text()
    assert "| toy | 3 | 5 | [**PARTIAL**](../results/bench/toy.md) |" in text and "999" not in text
    assert text.startswith("Intro.\n\n") and text.endswith("<!-- end generated -->\n\nEnd.\n")
    assert docs.stale(["docs/m.md"], repo) == [] and docs.write(["docs/m.md"], repo) == []
    assert [n.text for n, _, _ in docs.unrecorded(["docs/m.md"], repo)] == []
    assert not list(doc.parent.glob(".*.tmp"))  # written atomically: no temp file left


def test_check_lists_each_number_with_its_file_line_why_and_nearest_records(repo):
    (repo / "doc.md").write_text("line one\nbest 8.23 bits\n" + SOURCE + "\n")
    line = docs.report(docs.unrecorded(["doc.md"], repo))
    assert line.startswith("doc.md:2: 8.23: not in its block's source (bench/toy.json; bench/toy/runs/*.json); "
                           "records with values near it: 8.2237 (results/bench/toy.json:rows[0].best)")


def test_the_check_command_says_what_to_do(repo, monkeypatch, capsys):
    monkeypatch.setattr(docs, "REPO", repo)
    (repo / "doc.md").write_text("best 8.22 bits\n")
    assert docs.main(["check", "doc.md"]) == 1
    out, err = capsys.readouterr()
    assert out.startswith("doc.md:1: 8.22: its block has no <!-- numbers: RECORD: KEY --> line; records with "
                          "values near it: 8.2237 (results/bench/toy.json:rows[0].best)")
    assert "<!-- numbers: bench/STUDY.json: KEY" in err and "generated block" in err and "take it out" in err


# ---------------------------------------------------------------- invented numbers fail


def test_invented_numbers_fail_though_some_record_holds_a_value_like_them(repo):
    """A ratio, a perplexity and a time, each made up: the toy records hold values that round to each
    (0.4375 -> 0.44x, 2 ** 5.266 -> 38.5, 601-603 s -> 10.0-10.1 min), but not where the paragraph says its
    numbers come from."""
    text = "T-Fixup needs 0.44x the updates, ends at perplexity 38.5, each run 10.0 min.\n"
    assert check(repo, text, "<!-- numbers: bench/toy.json: best -->") == ["0.44x", "38.5", "10.0 min"]
    assert check(repo, text, source="") == ["0.44x", "38.5", "10.0 min"]  # no source named: nothing is recorded
    # the rule shown in `code` (as README shows it) names no source
    assert check(repo, "Written `<!-- numbers: bench/toy.json -->`: 0.44x.\n", source="") == ["0.44x"]
    # named where they come from, the same numbers are recorded
    assert check(repo, text, "<!-- numbers: bench/toy.json: ratio, ppl_loss; bench/toy/runs/*.json: wall_s -->") == []


def test_invented_numbers_fail_under_a_broad_key_pattern(repo):
    """A source may name keys by pattern (``methods.*.lr_range``): a made-up ratio, perplexity, time and percentage
    still fail, though other keys of the same methods hold values like them (0.4375, 2 ** 5.266, 602 s, 12.03);
    a value as it is reads as a percentage only from a key or prose that says percent (a loss of 12.03 is no 12 %)."""
    toy = repo / "results" / "bench" / "toy.json"
    res = json.loads(toy.read_text())
    res["methods"] = {m: {"lr_range": [0.0001, lo], "ratio": 0.4375, "loss": 5.266, "wall_s": 602.0,
                          "first_loss": 12.03, "unk_percent": 3.2, "note": "4.8% of tokens"}
                      for m, lo in (("a", 0.002), ("b", 0.004))}
    toy.write_text(json.dumps(res))
    text = "lrs 1e-4 to 2e-3 and 4e-3: T-Fixup 0.44x, perplexity 38.5, 10.0 min, 12 % stuck.\n"
    assert check(repo, text, "<!-- numbers: bench/toy.json: methods.*.lr_range -->") == [
        "0.44x", "38.5", "10.0 min", "12 %"]
    # the whole of each method named: the ratio, perplexity and time are its values; 12 % is still no percentage
    assert check(repo, text + "\n3.2 % and 4.8 % unknown.\n", "<!-- numbers: bench/toy.json: methods.* -->") == [
        "12 %"]


def test_a_record_changed_under_an_unchanged_text_fails(repo):
    text = "T-Fixup needs 0.44x the updates, ends at perplexity 38.5, each run 10.0 min.\n"
    source = "<!-- numbers: bench/toy.json: ratio, ppl_loss; bench/toy/runs/*.json: wall_s -->"
    assert check(repo, text, source) == []
    toy = repo / "results" / "bench" / "toy.json"
    res = json.loads(toy.read_text())
    res["rows"][0].update(ratio=0.5, ppl_loss=5.5)
    toy.write_text(json.dumps(res))
    for i in (1, 2, 3):
        (repo / "results" / "bench" / "toy" / "runs" / f"r{i}.json").write_text(json.dumps({"wall_s": 700.0}))
    assert check(repo, text, source) == ["0.44x", "38.5", "10.0 min"]


def unrecorded_in_copy(doc: str, lines: list) -> list:
    """The check's findings on a copy of DOC holding LINES (written under results/, so that its records resolve as
    the doc's own do; removed after)."""
    copy = docs.REPO / "results" / f".invented-{pathlib.Path(doc).name}"
    try:
        copy.write_text("\n".join(lines), encoding="utf-8")
        return docs.unrecorded([str(copy.relative_to(docs.REPO))])
    finally:
        copy.unlink()


def test_numbers_made_up_and_written_into_the_readme_fail():
    """The numbers a maintainer made up and wrote into README (issue 50), in a paragraph of their own and inside
    the README's paragraphs that already name their records: each fails."""
    invented = ["48 layers", "44.2", "0.81x", "2.6 hours", "41.7", "3.9 h", "12 %", "perplexity 47.3"]
    raw = (docs.REPO / "README.md").read_text(encoding="utf-8").split("\n")
    sources = [i for i, line in enumerate(raw) if line.lstrip().startswith("<!-- numbers:")]
    assert sources
    for i in [len(raw)] + sources:
        sentence = "Invented: " + ", ".join(invented) + "."
        found = unrecorded_in_copy("README.md", raw[:i] + ([""] if i == len(raw) else []) + [sentence] + raw[i:])
        flagged = [n.text for n, _, _ in found if n.line == (i + 2 if i == len(raw) else i + 1)]
        assert flagged == ["48", "44.2", "0.81x", "2.6 hours", "41.7", "3.9 h", "12 %", "47.3"], (i, flagged)


def test_a_source_that_would_take_any_number_like_it_fails(repo):
    """A source naming a whole long curve holds a value near almost any loss: a number it names is not tied to a
    record, and fails until the block names where it comes from (list indices kept: ``curve[337]``)."""
    toy = repo / "results" / "bench" / "toy.json"
    res = json.loads(toy.read_text())
    res["curve"] = [[i, round(5 + i * 0.01, 4)] for i in range(1000)]
    toy.write_text(json.dumps(res))
    assert check(repo, "It ends at 8.37 bits.\n", "<!-- numbers: bench/toy.json: curve -->") == ["8.37"]
    assert check(repo, "It ends at 8.37 bits.\n", "<!-- numbers: bench/toy.json: curve[337] -->") == []
    assert check(repo, "It ends at 8.38 bits.\n", "<!-- numbers: bench/toy.json: curve[337] -->") == ["8.38"]


def test_a_time_reads_a_record_in_the_unit_its_key_names(repo):
    """Seconds (wall_s, s_per_update) read as seconds, hours (train_wall_hours) as hours: 1.25 s per update is no
    75 min, and 601 s is no 36060 min."""
    toy = repo / "results" / "bench" / "toy.json"
    res = json.loads(toy.read_text())
    res.update(s_per_update=1.25, train_wall_hours=1.25)
    toy.write_text(json.dumps(res))
    assert check(repo, "A run took 75 min.\n", "<!-- numbers: bench/toy.json: s_per_update -->") == ["75 min"]
    assert check(repo, "A run took 75 min.\n", "<!-- numbers: bench/toy.json: train_wall_hours -->") == []
    assert check(repo, "A run took 36060 min.\n") == ["36060 min"]
    assert check(repo, "A run took 10.0 min.\n") == []


INVENTED = ["0.8137x", "44.27", "2.63 hours", "perplexity 47.93", "12.7 %", "3.917 h", "41.73"]


@pytest.mark.parametrize("doc", docs.DOCS)
def test_invented_numbers_fail_in_every_block_of_the_docs(doc):
    """A ratio, perplexities, times and a percentage, made up and written under every block's source line of
    each doc (one run of the check): each fails there, but for a chance value of a block's own (a ratio of two
    of its numbers, say): at most one of them in a block, and in at most 2 % of the (block, number) pairs."""
    raw = (docs.REPO / doc).read_text(encoding="utf-8").split("\n")
    out, marks = [], []
    for line in raw:
        out.append(line)
        if line.lstrip().startswith("<!-- numbers:"):
            out.append("Invented: " + ", ".join(INVENTED) + ".")
            marks.append(len(out))
    assert marks
    flagged = {}
    for n, _, _ in unrecorded_in_copy(doc, out):
        flagged.setdefault(n.line, set()).add(n.text)
    shown = [i.split()[-1] if i.startswith("perplexity") else i for i in INVENTED]
    passed = {m: [i for i in shown if i not in flagged.get(m, set())] for m in marks}
    assert max(len(p) for p in passed.values()) <= 1, {m: p for m, p in passed.items() if len(p) > 1}
    assert sum(map(len, passed.values())) <= 0.02 * len(marks) * len(INVENTED), {m: p for m, p in passed.items() if p}
