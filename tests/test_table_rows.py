"""The reproduction tables against the paper's Tables 1-3 (read from the paper's text, no number
restated here): every cell whose method this project implements is a config that its table script
runs, carrying that cell's number and depth; every config naming a paper cell carries its number;
and each table script's --dry-run lists a command for every config of its table that fairseq's
parser accepts as the config's method."""

import os
import pathlib
import re
import shlex
import subprocess

import pytest

from conftest import REPO
from harness import config
from conftest import TABLE_SCRIPTS, check_method_flags, parse_train_command, script_experiments
from tfixup import methods

PAPERS = pathlib.Path(os.environ.get("TFIXUP_SHARED_DATA", REPO.parent / "shared" / "data")).parent / "papers"

# The paper's row labels (the cell text up to the citation) of the methods of tfixup/methods.py, from
# their rows; a method of no table row (DeepNorm and Admin came after the paper) is beyond the paper,
# unless it is one of the Fig. 3c ablations, which have no configs.
PAPER_LABEL = {m: row.paper_label for m, row in methods.METHODS.items() if row.paper_label}
BEYOND_THE_PAPER = {m for m, row in methods.METHODS.items() if not row.paper_label} - set(methods.ABLATIONS)
# DLCL's paper deepens the encoder only (Wang et al. 2019); fairseq's 6-layer decoder
DEEP_ENCODER_ONLY = {"dlcl", "dlcl_preln"}


@pytest.fixture(scope="module")
def paper():
    """(cells, columns): cells maps (table, row label, column) to the BLEU as the paper prints it;
    the column is the dataset for Table 1 ("IWSLT'14 De-En small", the way configs' ROW starts)
    and the layer count for Tables 2 and 3. columns: Table 1's datasets."""
    found = sorted(PAPERS.glob("000_*.txt"))
    if not found:
        if os.environ.get("CI"):
            pytest.fail(f"paper text not found in {PAPERS}")
        pytest.skip(f"paper text not found in {PAPERS} (set TFIXUP_SHARED_DATA)")
    text = found[0].read_text(encoding="utf-8")
    cells, columns = {}, []
    blocks = re.findall(r"^(Model\t.*?)\n\nTable (\d)\.", text, re.M | re.S)
    assert sorted(int(n) for _, n in blocks) == [1, 2, 3], "the paper's tables are not where this test reads them"
    for block, number in blocks:
        header, *rows = block.splitlines()
        heads = [re.sub(r"(\S+) <sub>(\w+)</sub> (\S+)", r"\1 \3 \2", h) for h in header.split("\t")[1:]]
        if number == "1":
            columns = heads
        label = None
        for row in rows:
            first, *values = row.split("\t")
            # a row with an empty first cell continues the method above it (Tables 2, 3: more depths)
            label = re.match(r"[\w-]+(, no warmup)?", first).group(0) if first else label
            keyed = {values[0]: values[1]} if heads == ["Layers", "BLEU"] else dict(zip(heads, values))
            for column, cell in keyed.items():
                m = re.match(r"(?:<b>)?(\d+\.\d+)", cell)
                if m:
                    cells[(int(number), label, column)] = m.group(1)
    return cells, columns


def paper_tables(values):
    """The paper tables a config names (TABLE "Table 1/2": 1 and 2; Fig. 4b: none)."""
    return [int(n) for n in re.findall(r"\d", values["TABLE"])] if values["TABLE"].startswith("Table") else []


def cell_key(values, table, columns):
    """The paper cell (table, label, column) this config reproduces; label None beyond the paper."""
    if table == 1:
        matching = [c for c in columns if values["ROW"].startswith(c)]
        assert len(matching) == 1, f"ROW {values['ROW']!r} names none of Table 1's columns {columns}"
        column = matching[0]
    else:
        column = values["ENCODER_LAYERS"]
    return table, PAPER_LABEL.get(values["METHOD"]), column


def test_every_paper_row_label_names_a_method_and_every_config_a_row(paper):
    """Every row label of the paper's tables is the paper label of a method row, so every method of the
    paper's tables is implemented; every config's METHOD is a row, and no ablation is a config's."""
    cells, _ = paper
    assert {label for _, label, _ in cells} <= set(PAPER_LABEL.values())
    used = {config.resolve(name, environ={}).values["METHOD"] for name in config.experiment_names()}
    assert used <= set(methods.METHODS) - set(methods.ABLATIONS)


def test_every_config_of_a_table_carries_its_cells_number_and_depth(paper):
    """A config naming a paper table reproduces one cell: its PAPER_BLEU is exactly that cell's number
    (empty where the paper prints none, '–' or no row), at the cell's depth."""
    cells, columns = paper
    labels = {label for _, label, _ in cells}
    assert labels <= set(PAPER_LABEL.values()), labels
    for name in config.experiment_names():
        v = config.resolve(name, environ={}).values
        for table in paper_tables(v):
            key = cell_key(v, table, columns)
            assert cells.get(key, "") == v["PAPER_BLEU"], (name, key, cells.get(key), v["PAPER_BLEU"])
            if v["METHOD"] in BEYOND_THE_PAPER:
                assert "beyond the paper" in v["ROW"], name
            if table == 1:  # "All models have 6 layers in both encoder and decoder" (paper §4)
                assert (v["ENCODER_LAYERS"], v["DECODER_LAYERS"]) == ("6", "6"), name
            else:  # the cell's depth is the encoder's; the decoder's is 6 or the same
                assert v["DECODER_LAYERS"] == ("6" if v["METHOD"] in DEEP_ENCODER_ONLY else v["ENCODER_LAYERS"]), name


def test_every_implemented_cell_of_the_paper_is_a_row_of_its_table_script(paper):
    """The issue's 'done when': each numbered cell whose method is implemented is run by tableN.sh."""
    cells, columns = paper
    for table in (1, 2, 3):
        listed = set()
        for name in script_experiments(f"table{table}.sh"):
            v = config.resolve(name, environ={}).values
            assert table in paper_tables(v), (name, v["TABLE"])
            listed.add(cell_key(v, table, columns))
        wanted = {key for key in cells if key[0] == table}
        assert wanted <= listed, sorted(wanted - listed)


def dry_run_rows(script):
    """{experiment: its fairseq-train argv} from ``script --dry-run -- --cpu``."""
    proc = subprocess.run(["bash", str(REPO / "scripts" / script), "--dry-run", "--", "--cpu"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "report.sh" in lines[-1]
    rows, name = {}, None
    for line in lines:
        if line.startswith("# "):
            name = line[2:].split(":")[0]
            assert name not in rows, f"{name} listed twice"
            rows[name] = None
        elif line.startswith("fairseq-train"):
            assert name is not None and rows[name] is None, line
            rows[name] = shlex.split(line)
    return rows


@pytest.mark.parametrize("script", TABLE_SCRIPTS)
def test_table_dry_run_lists_a_runnable_command_per_config_of_its_table(script):
    rows = dry_run_rows(script)
    table = re.fullmatch(r"table(\d)\.sh", script)
    mine = {n for n in config.experiment_names()
            if (int(table.group(1)) in paper_tables(config.resolve(n, environ={}).values) if table
                else config.resolve(n, environ={}).values["TABLE"] == "Fig. 4b")}
    assert set(rows) == mine
    for name, argv in rows.items():
        assert argv, f"{name}: no fairseq-train line"
        check_method_flags(parse_train_command(argv), config.resolve(name, environ={}).values)
